"""Planning: an evaluation's batches become a program over row buffers.

Bookkeeping on integers, no TensorFlow ops: ``plan(graph, batches)`` turns the
scheduler's batches into a ``Program``, which ``program.py`` runs as one
compiled TensorFlow call (and one for its backward).

Every per-instance value lives in a *buffer*, one per (dtype, row shape):
the results of the steps, in step order, followed by the program's inputs
(the values of nodes evaluated in an earlier evaluation, and Python lists
stacked).  A step is one batch: a node *kind* (op or pattern, attributes,
which operands are shared and which are rows of which buffer), the number of
instances, where its operands' rows start in one flat row array (each
per-instance operand's rows in turn), and where its outputs' rows start in
their buffers (each output's rows are consecutive).

A compiled program pays off only if later minibatches reuse it, so what it
is compiled for -- the ``key`` -- holds the kinds and the buffers' specs,
never the steps' order, counts or rows: those are the program's arguments.
The Tree-LSTM's minibatches of any trees run one compiled program; one
that lacks a rare kind runs a program of more kinds (``Program.adopt``).
The loops over every node (``fill``, and which outputs are read) are C:
``native/plan.c``.
"""

import copy

import numpy as np
import tensorflow as tf

from .. import _native
from ..ir.node import VirtualNode
from ..ir.spec import TENSOR, VARIABLE, classify_operand
from ..ir.table import ACCESS

# The NumPy type Python lists and numbers of each kind are stacked as (as
# TensorFlow converts them where the op does not say otherwise).
NUMPY_OF_PYTHON = {int: np.int32, float: np.float32, bool: np.bool_}

# Operand kinds of a step.
SHARED = "shared"   # one value for every instance: a variable, tensor or number
ROWS = "rows"       # one row per instance, of a buffer


class Kind:
    """What the steps of one node type run: ``entry`` with ``attrs``;
    ``operands``, per position, (SHARED, value) or (ROWS, buffer);
    ``outputs``, the buffer of each output, None for one not kept."""

    __slots__ = ("entry", "attrs", "spec", "operands", "outputs")

    def key(self, buffers):
        """What a compiled program depends on: never rows or tensor values;
        buffers by their (dtype, row shape), not their number, so that
        the key is the same in programs of other kinds."""
        operands = []
        for kind, value in self.operands:
            if kind == ROWS:
                operands.append((ROWS, buffers[value]))
                continue
            operand_class = classify_operand(value)
            if operand_class == VARIABLE:
                operands.append((SHARED, "variable", id(value)))  # kept alive by the cache
            elif operand_class == TENSOR:
                operands.append((SHARED, "tensor", value.dtype, tuple(value.shape)))
            else:
                operands.append((SHARED, type(value), value))
        return (self.entry, self.attrs, tuple(map(type, self.attrs)),
                tuple(operands),
                tuple(None if buffer is None else buffers[buffer]
                      for buffer in self.outputs))

    def relative_key(self, key):
        """This kind's ``key`` without its operands' count and order or the
        values of its Python numbers: the kinds of an epoch's last, smaller
        minibatch (the losses' ``add_n`` of fewer operands, divided by
        another count) are relatives of the others'."""
        entry, attrs, attr_types, operands, outputs = key
        return (entry, attrs, attr_types, outputs, frozenset(
            operand[:2] if operand[0] == SHARED and operand[1] not in ("variable", "tensor")
            else operand for operand in operands))


class Key(tuple):
    """A program's key: a tuple that computes its hash once.  Keys are
    nested tuples of kinds and specs (8 us a hash, for the Tree-LSTM's),
    and the program cache looks a key up several times an evaluation."""

    def __hash__(self):
        try:
            return self._hash
        except AttributeError:
            self._hash = tuple.__hash__(self)
            return self._hash


class Program:
    """``kinds`` and ``buffers`` (the (dtype, row shape) of each; both in a
    fixed order, so that equal keys mean equal programs); ``steps``: per
    step, [kind, instance count, where its rows start in ``rows``, where
    each output's rows start in its buffer] (an int32 array); ``rows``: per
    step, the rows of each per-instance operand in turn, flat; per buffer,
    how many rows the steps compute (``computed``) and the inputs that
    follow them (``input_nodes``, ``input_values``).  ``places``: each
    node's place, as ``_native.fill`` gives it (see ``location``)."""

    def __init__(self, kinds, buffers):
        self.kinds = kinds
        self.buffers = buffers
        self.kind_keys = tuple(kind.key(buffers) for kind in kinds)
        self.key = Key((tuple(buffers), self.kind_keys))
        self.relatives = (tuple(buffers), frozenset(
            kind.relative_key(key) for kind, key in zip(kinds, self.kind_keys)))
        self.computed = [0] * len(buffers)
        self.steps = self.rows = self.places = None
        self.input_values = self.input_nodes = None
        # Each node type's kind number (by the graph's type numbers).
        self.kind_of_type = None
        # What ``fill`` reads, until it has: (graph, batches).
        self.to_fill = None
        # What the modules that run a program compute from its kinds alone,
        # once for the programs of a structure (``again``), by their key.
        self.derived = {}

    def adopt(self, other):
        """Renumber this program's kinds and buffers as those of ``other``
        (a compiled program whose kinds include all of this one's, with
        ``kind_place`` and ``buffer_place``: program.py), so that it runs
        this one.  Kinds this program lacks are ``other``'s, with no steps;
        before ``fill``.  (Only this program's own kinds and buffers are
        looked up, in dicts ``other`` made once.)"""
        renumbered = [other.buffer_place[spec] for spec in self.buffers]
        for kind in self.kinds:
            kind.operands = [(ROWS, renumbered[value]) if operand_kind == ROWS
                             else (operand_kind, value)
                             for operand_kind, value in kind.operands]
            kind.outputs = [None if buffer is None else renumbered[buffer]
                            for buffer in kind.outputs]
        place = [other.kind_place[key] for key in self.kind_keys]
        self.kind_of_type = {node_type: place[number]
                             for node_type, number in self.kind_of_type.items()}
        kinds = list(other.kinds)
        for number, kind in enumerate(self.kinds):
            kinds[place[number]] = kind
        self.kinds = kinds
        computed = [0] * len(other.buffers)
        for buffer, count in enumerate(self.computed):
            computed[renumbered[buffer]] = count
        self.buffers, self.computed = list(other.buffers), computed
        self.kind_keys, self.key = other.kind_keys, other.key

    def again(self, graph, batches):
        """A program of this one's kinds and buffers (adopted ones too) for
        ``batches`` of another ``graph`` of the same structure
        (``structure``): its counts made, its steps and rows to ``fill``.
        (With no graph and no batches: a copy to keep, which holds none.)"""
        program = copy.copy(self)
        program.steps = program.rows = program.places = None
        program.input_values = program.input_nodes = None
        program.to_fill = (graph, batches)
        program.computed = _computed(graph, self.kinds, len(self.buffers),
                                     self.kind_of_type, batches)
        return program

    def fill(self):
        """The steps and rows, the inputs, and every node's place.  (The
        graph is held until then and let go after, never in a reference
        cycle: a cycle would leave the whole graph to the cyclic collector,
        hundreds of thousands of objects per large minibatch.)"""
        graph, batches = self.to_fill
        self.to_fill = None
        _fill(graph, self, batches)

    def location(self, index):
        """(buffer, row) of graph node ``index``'s result (a list of them,
        None for an output not kept, for a multi-output node); None for a
        node no step ran."""
        where, outputs, slots = (np.frombuffer(part, np.int32) for part in self.places)
        slot, count = int(where[index]), int(outputs[index])
        if slot < 0:
            return None
        places = [None if slots[2 * n] < 0 else (int(slots[2 * n]), int(slots[2 * n + 1]))
                  for n in range(slot, slot + max(count, 1))]
        return places if count >= 0 else places[0]


def plan(graph, batches, required=()):
    """The program running ``batches`` (lists of graph indices, one node
    type each, in an order that respects dependencies)."""
    program = outline(graph, batches, required)
    program.fill()
    return program


def outline(graph, batches, required=(), max_kinds=None, read=None):
    """The program's kinds, buffers and key, without its steps and rows
    (``Program.fill``): enough to look its compiled form up; None if it
    would have more than ``max_kinds`` kinds.  An output that no node of
    the graph reads, of nodes neither in ``required`` nor results (nodes
    nothing consumes), is not kept (``Kind.outputs``; ``read``: as
    ``read_outputs(graph, required)`` gives it, if made before)."""
    first_of_type = {graph.type_of[batch[0]]: batch[0] for batch in reversed(batches)}
    if max_kinds is not None and len(first_of_type) > max_kinds:
        return None
    # In an order every minibatch gives again: by name, then (types of one
    # name, such as two tensors' of one shape) by first appearance.
    types = sorted(first_of_type, key=lambda node_type: (
        graph.type_name(first_of_type[node_type]), node_type))
    read = read_outputs(graph, required) if read is None else read
    specs = set()
    for node_type in types:
        example = first_of_type[node_type]
        specs.update(_output_specs(graph.nodes[example]))
        operand_specs = graph.types[node_type].operands
        for position, is_shared in enumerate(graph.shared_operand[node_type]):
            if not is_shared:
                specs.add(_buffer_spec(operand_specs[position]))
    buffers = sorted(specs, key=lambda spec: (spec[0].name, spec[1]))
    buffer_of = {spec: number for number, spec in enumerate(buffers)}
    kinds, kind_of_type = [], {}
    for node_type in types:
        example = first_of_type[node_type]
        node = graph.nodes[example]
        operand_specs = graph.types[node_type].operands
        kind = Kind()
        kind.entry, kind.attrs, kind.spec = node.entry, node.attrs, node.spec
        kind.operands = [
            (SHARED, graph.operands[example][position]) if is_shared
            else (ROWS, buffer_of[_buffer_spec(operand_specs[position])])
            for position, is_shared in enumerate(graph.shared_operand[node_type])]
        kind.outputs = [buffer_of[spec] if (node_type, number) in read else None
                        for number, spec in enumerate(_output_specs(node))]
        kind_of_type[node_type] = len(kinds)
        kinds.append(kind)
    program = Program(kinds, buffers)
    program.kind_of_type = kind_of_type
    program.computed = _computed(graph, kinds, len(buffers), kind_of_type, batches)
    program.to_fill = (graph, batches)
    return program


def _computed(graph, kinds, buffer_count, kind_of_type, batches):
    """Per buffer, how many rows the steps compute (they come first)."""
    computed = [0] * buffer_count
    for batch in batches:
        for buffer in kinds[kind_of_type[graph.type_of[batch[0]]]].outputs:
            if buffer is not None:
                computed[buffer] += len(batch)
    return computed


def structure(graph, read):
    """What the program of a graph (of types not joined over varying
    lengths) depends on but its batches: its batching types, in order,
    and the outputs read (``read_outputs``).  Graphs of one structure have
    one program, which ``Program.again`` makes without ``outline``, whose
    Python took about 0.15 ms an evaluation.  (The types name shared
    tensors and variables by id: the program kept for a structure holds
    them, so that no other takes the id meanwhile.)"""
    return tuple(graph.types), frozenset(read)


def read_outputs(graph, required):
    """(node type, output number) of every output some node needs: read by
    a node of the graph, asked for by the caller, or a result nothing else
    consumes (what the user holds).  The gates a Tree-LSTM pattern splits
    off and uses inside itself are none of these.  (In C: a loop over
    every node and operand.)"""
    required = {node.id for node in required if type(node) is VirtualNode}
    return _native.read_outputs(graph.nodes, graph.type_of, graph.duplicate_of,
                                graph.operands, len(graph.types), required,
                                ACCESS)


def _fill(graph, program, batches):
    """The program's steps and rows, its inputs, and every node's place
    (in C: loops over every node and operand).  A duplicate shares its
    original's place, an access node its multi-output node's output's;
    inputs' rows follow the computed ones, Python values then nodes."""
    # What fill reads of the kinds and ``kind_of_type``: the same for every
    # program of a structure (``again`` copies share ``derived``, kinds and
    # types), so made once for them.
    described = program.derived.get(_fill)
    if described is None:
        kinds = [(tuple((position, buffer) for position, (operand_kind, buffer)
                        in enumerate(kind.operands) if operand_kind == ROWS),
                  tuple(kind.outputs), kind.entry.multi_output)
                 for kind in program.kinds]
        type_kinds = [-1] * len(graph.types)
        for node_type, kind_number in program.kind_of_type.items():
            type_kinds[node_type] = kind_number
        described = program.derived[_fill] = kinds, type_kinds
    kinds, type_kinds = described
    (steps, rows, program.input_values, program.input_nodes, where, outputs, slots,
     width) = _native.fill(batches, graph.nodes, graph.type_of, graph.duplicate_of,
                           graph.operands, len(graph.types), type_kinds, kinds,
                           program.computed, ACCESS)
    program.steps = np.frombuffer(steps, np.int32).reshape(-1, width)
    program.rows = np.frombuffer(rows, np.int32)
    program.places = (where, outputs, slots)


def _output_specs(node):
    specs = node.spec if node.entry.multi_output else (node.spec,)
    return [_buffer_spec(spec) for spec in specs]


def _buffer_spec(spec):
    """(dtype, row shape) of a value's buffer; Python values are stacked as
    NUMPY_OF_PYTHON says."""
    if spec.python_type is not None:
        return tf.as_dtype(NUMPY_OF_PYTHON[spec.python_type]), spec.shape
    return spec.dtype, spec.shape
