"""Depth-limited subgraph signatures (thesis sections 4.2, 4.4 and 5.3).

``H'(n, d)`` describes the subgraph rooted at node ``n`` down to depth ``d``:
the node's label (its op and attributes, and at the ``shape`` level its
output spec) combined with the signatures of its operands at depth ``d - 1``.
At depth 0, or at an operand that is not a recorded node, the walk stops at
an *input* of the subgraph: a constant marker for nodes, and for other
operands their identity (a tf.Variable, so that subgraphs over different
weights never share code), their value (a Python number) or their spec (a
tensor or array fed per instance).

A node already evaluated is an input too (its operands are gone; its value
is what counts).

A node reached a second time in one walk is not walked again: it becomes
``shared(k, H(n))`` (section 5.3), where ``k`` is the node's position in the
walk's visiting order, so a diamond and a tree of the same ops get different
signatures, two diamonds whose shared edges point at different (if equal)
nodes do too, and code generation names the node once.

Section 5.5 keeps optimized subgraphs from computing anything twice: a node
with more than one consumer may only be the root or an input of a subgraph.
A ``Signer`` made ``for_patterns`` stops at them (counting every consumer
ever recorded), at the ``required`` nodes the caller needs values of, and at
nodes fed a NumPy or list operand: such a value's dtype is decided by the op
that meets it (``x * np.float64(2)`` is float32 when x is), so it cannot
become an argument of compiled code.

A ``Signature`` is a value with two parts: a 128-bit xxhash digest that finds
candidates fast, and the structural key it was hashed from, which decides
equality.  Two subgraphs compare equal only if they are structurally equal,
so a hash collision can never make different subgraphs share compiled code.

Walks are memoized per (node, depth) within one ``Signer`` (one evaluation):
no subgraph is hashed twice, except where a ``shared`` marker makes the
result depend on the walk that found it.
"""

import itertools

import xxhash

from .. import _native
from ..ir.node import VirtualNode
from ..ir.spec import (NUMBER, NUMPY_SCALAR, TENSOR, VALUE, VARIABLE, classify_operand,
                       spec_of_foreign)
from ..ir.table import ACCESS

LEVELS = ("shape", "structure", "signature")

# The hash function, a module attribute so that tests can force collisions.
digest_of = xxhash.xxh3_128_intdigest


class Signature:
    """A subgraph signature: ``digest`` to find, ``key`` to decide."""

    __slots__ = ("digest", "key")

    def __init__(self, digest, key):
        self.digest = digest
        self.key = key

    def __hash__(self):
        return self.digest

    def __eq__(self, other):
        return (isinstance(other, Signature) and self.digest == other.digest
                and self.key == other.key)

    def __repr__(self):
        return f"Signature({self.digest:032x})"


class Walk:
    """One subgraph's signature, with the inputs it stopped at, in order."""

    __slots__ = ("signature", "inputs", "nodes")

    def __init__(self, signature, inputs, nodes):
        self.signature = signature
        self.inputs = inputs    # operands at the boundary, first-visit order
        self.nodes = nodes      # the subgraph's own nodes, operands first


class Signer:
    """Computes H'(n, d) at one equivalence level, memoized per (node, depth).

    ``shape``: labels include every node's output dtype and shape;
    ``structure``: op, attributes and dtypes, not shapes (subgraphs that differ
    only in sizes match; their compiled code retraces per shape);
    ``signature``: as ``structure``, and per-instance inputs are described by
    dtype alone -- the thesis's constant leaf -- so the widest sharing.
    """

    def __init__(self, level="signature", for_patterns=False, required=frozenset(),
                 labels=None):
        if level not in LEVELS:
            raise ValueError(f"unknown equivalence level {level!r}; "
                             f"choose one of {LEVELS}")
        self.level = level
        self.for_patterns = for_patterns
        self.required = required      # ids of nodes walks stop at (not roots)
        self._memo = {}
        self._labels = {}
        # The caches match programs read (native/match.c) depend on the
        # level alone (their keys are interned specs and operand types):
        # ``labels``, from ``label_caches()``, carries them from one Signer
        # to the next of the same level, so that each evaluation's search
        # does not ask Python for the same labels again (about 0.1 ms an
        # evaluation).  (Not ``_labels``, which only walks read: its keys
        # hold ops' attributes, which may be a minibatch's own values.)
        (self._spec_labels, self._input_labels,
         self._operand_kinds) = labels if labels is not None else self.label_caches()
        self.nodes_hashed = 0  # label hashes computed: the work done

    @staticmethod
    def label_caches():
        """Empty label caches for ``Signer(labels=...)``: by spec, by spec
        for inputs, and by operand type (match.c)."""
        return {}, {}, {}

    def walk(self, root, depth):
        """The signature of the subgraph under ``root`` to ``depth``."""
        walk = _WalkState(root)
        signature = self._signature(root, depth, walk)[0]
        return Walk(signature, walk.inputs, walk.nodes)

    def _signature(self, node, depth, walk):
        """(signature, whether it used a shared marker)."""
        if node.id in walk.visited:
            ordinal, first = walk.visited[node.id]
            return self._combine(("shared", ordinal), (first,)), True
        if self._stops_at(node, depth, walk):
            boundary = self._boundary(node)
            walk.visit(node, boundary)
            walk.inputs.append(node)
            return boundary, False
        if node.entry.node_kind == "access":  # an output of a multi-output op: look through
            source, index = node.inputs[0], node.attrs[0]
            inner, shared = self._signature(source, depth, walk)
            return self._combine(("output", index), (inner,)), shared
        memo_key = (node.id, depth)
        remembered = self._memo.get(memo_key)
        if remembered is not None and not any(
                member.id in walk.visited for member, _ in remembered.members):
            for member, member_signature in remembered.members:
                walk.visit(member, member_signature)
            walk.inputs.extend(remembered.inputs)
            walk.nodes.extend(remembered.nodes)
            return remembered.signature, False
        start = (len(walk.trail), len(walk.inputs), len(walk.nodes))
        children, any_shared = [], False
        for operand in node.inputs:
            if type(operand) is VirtualNode:
                child, shared = self._signature(operand, depth - 1, walk)
                any_shared = any_shared or shared
            else:
                child = self._operand(operand)
                walk.inputs.append(operand)
            children.append(child)
        signature = self._combine(self._label(node), children)
        walk.visit(node, signature)
        walk.nodes.append(node)
        if not any_shared:
            self._memo[memo_key] = _Memo(
                signature, walk.trail[start[0]:], walk.inputs[start[1]:],
                walk.nodes[start[2]:])
        return signature, any_shared

    def _stops_at(self, node, depth, walk):
        """Is ``node`` an input of the subgraph rather than part of it?"""
        if node.entry.node_kind == "access":
            # Looking through is free; the multi-output op decides, but an
            # output of one that must stay outside is itself the input.
            if not node.inputs:
                return True
            source = node.inputs[0]
            return (depth == 0 or not source.inputs
                    or self.for_patterns and self._outside(source)
                    ) and source.id not in walk.visited
        if node is walk.root:
            return not node.inputs
        return (depth == 0 or not node.inputs
                or self.for_patterns and (self._outside(node) or has_value_operand(node)))

    def _outside(self, node):
        """Must ``node`` stay outside any pattern but as its root (5.5)?"""
        return node.consumers > 1 or node.id in self.required

    # -- labels and leaves -----------------------------------------------------
    def _label(self, node):
        label_key = (node.entry, node.attrs, node.spec)
        label = self._labels.get(label_key)
        if label is None:
            label = self._labels[label_key] = (
                "op", node.entry.name, node.attrs, tuple(map(type, node.attrs)),
                self._spec_label(node.spec))
        return label

    # -- matching a known signature ----------------------------------------------
    def match(self, root, depth, template):
        """The walk from ``root`` if its signature's key equals the
        template's (see ``Template``), else None.  It compares structure
        top-down and stops at the first difference, hashing nothing: the
        cheap way to find known patterns (``_match_program``).  Matches stop
        where a pattern's walk stops (section 5.5).  ``walk`` is the
        specification; a property test checks the two agree."""
        if not self.for_patterns:
            raise ValueError("matching needs a Signer made for_patterns")
        found = _native.match(template.program(depth), root, self.match_labels())
        return None if found is None else Walk(template.signature, *found)

    def match_labels(self):
        """What match programs read of this Signer (native/match.c): the
        required node ids, and each label cache with what fills it."""
        return (self.required, self._spec_labels, self._spec_label,
                self._input_labels, self._boundary_label, self._operand_kinds,
                self._operand_label)

    def _spec_label(self, spec):
        """The spec part of a node's label, cached per (interned) spec."""
        found = self._spec_labels.get(spec)
        if found is None:
            found = self._spec_labels[spec] = _describe_spec(spec, self.level == "shape")
        return found

    def _boundary(self, node):
        return self._combine(self._boundary_label(node), ())

    def _boundary_label(self, node):
        found = self._input_labels.get(node.spec)
        if found is None:
            found = self._input_labels[node.spec] = ("input", self._spec_label(node.spec))
        return found

    def _operand(self, operand):
        return self._combine(self._operand_label(operand), ())

    def _operand_label(self, operand):
        operand_class = classify_operand(operand)
        if operand_class == VARIABLE:
            # The identity of a shared parameter: W and U never share code.
            return ("parameter", id(operand))
        if operand_class == NUMBER:
            return ("constant", type(operand).__name__, operand)
        if operand_class == TENSOR:
            return ("tensor", id(operand))
        # A NumPy or list value (a NumPy scalar too): by its kind and shape.
        operand_spec = spec_of_foreign(operand)
        kind = operand_spec.python_type or operand_spec.dtype
        if self.level == "shape":
            return ("value", kind, operand_spec.shape)
        return ("value", kind)

    def _combine(self, label, children):
        self.nodes_hashed += 1
        key = (label, tuple(child.key for child in children))
        text = repr(label).encode() + b"".join(
            child.digest.to_bytes(16, "little") for child in children)
        return Signature(digest_of(text), key)


class Template:
    """A signature's key as a tree to match nodes against (``Signer.match``):
    ``kind`` is ``op``, ``output``, ``shared`` or a leaf kind; ``detail`` the
    op entry, the output index or the shared node's position."""

    __slots__ = ("signature", "key", "kind", "label", "detail", "attrs",
                 "attr_types", "spec_label", "arity", "children", "programs")

    def __init__(self, key, entries, signature=None):
        self.signature = signature
        self.key = key
        label, children = key
        self.kind = label[0]
        self.label = label
        self.detail = (entries[label[1]] if self.kind == "op"
                       else label[1] if self.kind in ("output", "shared") else None)
        self.attrs = label[2] if self.kind == "op" else None
        self.attr_types = label[3] if self.kind == "op" else None
        self.spec_label = label[4] if self.kind == "op" else None
        self.children = [Template(child, entries) for child in children]
        self.arity = len(self.children)
        self.programs = {}  # depth -> MatchProgram (``_match_program``)

    def program(self, depth):
        """The ``MatchProgram`` matching this template at ``depth``."""
        found = self.programs.get(depth)
        if found is None:
            found = self.programs[depth] = _match_program(self, depth)
        return found


_OPERAND_KINDS = ("parameter", "constant", "tensor", "value")


def _match_program(template, depth):
    """The comparison ``walk`` implies for ``template`` at ``depth``, with
    every depth, label and visiting position decided here, once: a
    ``MatchProgram`` that native/match.c runs (its instructions are
    described there).  Matching runs for every node of every minibatch, so
    this is the search's hot loop."""
    code = []
    trail = []                   # the register of each visiting position
    registers = itertools.count(1)  # register 0 holds the root

    def node(t, register, depth, is_root):
        if t.kind == "shared":  # the very node visited at that position
            code.append(("same", register, trail[t.detail]))
            return
        if not is_root and t.kind != "op":  # (an op has one consumer: reached once)
            code.append(("unseen", register))
        if t.kind == "input":  # the walk must stop here (Signer._stops_at)
            code.append(("input", register, ACCESS, depth > 0, t.label))
            trail.append(register)
        elif t.kind == "output":
            source = next(registers)
            code.append(("output", register, ACCESS, t.detail, depth > 0, source))
            node(t.children[0], source, depth, False)
        elif t.kind == "op" and depth > 0:
            code.append(("op", register, t.detail, t.arity, t.attrs,
                         t.attr_types if t.attrs else None, not is_root,
                         t.spec_label))
            for position, child in enumerate(t.children):
                if child.kind in _OPERAND_KINDS:  # not a recorded node
                    code.append(_operand_check(register, position, child.label, t))
                else:
                    operand = next(registers)
                    code.append(("child", register, position, operand))
                    node(child, operand, depth - 1, False)
            code.append(("node", register))
            trail.append(register)
        else:  # an op at depth 0, or a leaf kind where a node must be
            code.append(("fail",))

    node(template, 0, depth, True)
    return _native.MatchProgram(tuple(code))


def _operand_check(register, position, label, op):
    """The check of an operand that is no node against its label (see
    ``Signer._operand_label``), operand ``position`` of the ``op``
    template's node: a shared parameter or tensor is that very object, a
    Python number that value of that exact type; a NumPy or list value's
    label is asked for, and a lookup's list of rows must be rows of its
    table (``looked_up_rows``)."""
    kind = label[0]
    if kind in ("parameter", "tensor"):
        return ("identity", register, position, kind, label[1])
    if kind == "constant":
        return ("constant", register, position, _NUMBER_TYPES[label[1]], label[2])
    entry = op.detail
    if position in entry.index_positions and entry.looks_up_rows(op.attrs):
        return ("rows", register, position, entry.gathers_from, label)
    return ("label", register, position, label)


def has_value_operand(node):
    """Is an operand of ``node`` a NumPy or list value (not a node, tensor,
    variable or Python number), other than a lookup's row numbers?"""
    for position, operand in enumerate(node.inputs):
        if classify_operand(operand) in (NUMPY_SCALAR, VALUE) \
                and not looked_up_rows(node, position, operand):
            return True
    return False


def looked_up_rows(node, position, operand):
    """Is ``operand``, operand ``position`` of ``node``, a list or tuple of
    the rows a lookup reads (``tf.nn.embedding_lookup(table, [word])``),
    each a row of its table?  Such a node may be inside a pattern, the
    list an argument of it, as a node's output would be: the Tree-LSTM's
    leaves each ran as two nodes and two steps (the lookup's, then the
    cell's) before.  A row out of its table's range keeps the lookup a
    node of its own, so that TensorFlow's error names the lookup's line,
    not the pattern's.  (native/match.c's "rows" check is the same.)"""
    entry = node.entry
    if type(operand) not in (list, tuple) or position not in entry.index_positions \
            or not entry.looks_up_rows(node.attrs):
        return False
    rows = table_rows(node.inputs[entry.gathers_from])
    return rows is not None and all(type(row) is int and 0 <= row < rows for row in operand)


def table_rows(table):
    """The number of rows of a lookup's table (a node's, by its spec), or
    None if unknown."""
    holder = table.spec if type(table) is VirtualNode else table
    try:
        first = holder.shape[0]
    except (AttributeError, TypeError, IndexError):
        return None
    return first if type(first) is int else None


_NUMBER_TYPES = {kind.__name__: kind for kind in (int, float, bool)}


def _dtypes(spec):
    if isinstance(spec, tuple):
        return tuple(_dtypes(s) for s in spec)
    return spec.dtype.name if spec.dtype is not None else spec.python_type.__name__


def _describe_spec(spec, with_shape):
    if isinstance(spec, tuple):
        return tuple(_describe_spec(s, with_shape) for s in spec)
    return (_dtypes(spec), spec.shape) if with_shape else _dtypes(spec)


class _WalkState:
    """What one walk has seen: signatures by node id, in visiting order."""

    __slots__ = ("root", "visited", "trail", "inputs", "nodes")

    def __init__(self, root):
        self.root = root
        self.visited = {}   # node id -> (position in the trail, signature)
        self.trail = []     # (node, signature) in visiting order
        self.inputs = []
        self.nodes = []

    def visit(self, node, signature):
        self.visited[node.id] = (len(self.trail), signature)
        self.trail.append((node, signature))


class _Memo:
    __slots__ = ("signature", "members", "inputs", "nodes")

    def __init__(self, signature, members, inputs, nodes):
        self.signature = signature
        self.members = members
        self.inputs = inputs
        self.nodes = nodes
