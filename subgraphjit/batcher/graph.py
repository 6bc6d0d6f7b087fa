"""The batching view of a recorded DAG: node types, operands, duplicates.

Two nodes may run in one batched op when they have the same *batching
type*: the op entry, its attributes (with their types), and for each
operand either its spec (a per-instance operand, stacked along a new leading
axis) or its identity (a shared operand: the same tf.Variable or tensor, or
the same Python number, given to every instance once).  Each batching type
is interned to a small integer, the node *type* the schedulers work with.

Identical work is done once: a node with the same batching type as an earlier
node and the very same operands (the same constant, the same function of
the same nodes) becomes a *duplicate* and reuses its value.  Lookups of
rows of a variable are the exception where a tape could record them
(``own_rows``): eager TensorFlow gives the variable's gradient as an
IndexedSlices with a slice per lookup, and optimizers such as Adam apply
those slices one by one (the square of a sum is not the sum of squares),
so each lookup keeps its own row.  In inference they are shared too, and
so is the work that reads them: a Tree-LSTM's leaves of one word are
computed once per evaluation (41% of an SST minibatch's leaves at 25
trees, 63% at 256, repeat a word).

Multi-output ops (``tf.split``) are one node; the ``access`` nodes that pick
their outputs are not scheduled, their consumers read the picked output.
"""

import typing

import numpy as np

from .. import _native
from ..ir.spec import (NUMBER, NUMPY_SCALAR, TENSOR, VARIABLE, classify_operand,
                       spec_of_foreign)
from ..ir.node import take_output
from ..ir.table import ACCESS, PATTERN_KINDS, OpEntry


class BatchingType(typing.NamedTuple):
    """What every node of one type has in common (module docstring): nodes
    of equal batching types may run as one batched op."""

    entry: OpEntry       # the op entry
    attrs: tuple         # the op's other arguments, hashable
    attr_types: tuple    # their types (1 and True are equal; they differ here)
    # Per operand: a Spec if it is per-instance (stacked along a new leading
    # axis), else a tuple: ("shared", id) for a tensor or variable given to
    # every instance once, (type, number) for a Python number.
    operands: tuple


class BatchGraph:
    """Nodes to evaluate, in recording order, with what batching needs.

    ``nodes[i]`` is a VirtualNode; ``operands[i]`` lists, per operand, a
    ``NodeOperand`` or the foreign value itself (``operands`` is a C table,
    ``_native.OperandTable``: the passes after this one read its arrays, and
    Python is given each node's list when it asks); ``type_of[i]`` is the node's
    type (an index into ``types``) or -1 for nodes that are not
    scheduled (duplicates and access nodes); ``duplicate_of[i]`` is the index
    whose value node i reuses, or i; ``duplicates`` counts the i for which
    that is not i.
    """

    def __init__(self, nodes, own_rows=True):
        self.nodes = nodes if type(nodes) is list else list(nodes)
        self._type_names = None
        # The loop over the nodes is in C (describe_graph in
        # native/analysis.c): for each node, in order (operands come before
        # their consumers), its operands, batching type and identity,
        # as described in the module docstring.  Rare cases call back here:
        # an operand's kind (by type), an op entry's index positions and
        # whether its lookups keep their own rows, foreign operands' specs
        # and value keys, and access nodes of ops evaluated earlier.
        # ``shared_operand``, per type: which operand positions are shared;
        # ``sources``: in-graph operand nodes of each node (canonical
        # indices), for the schedulers' dependency bookkeeping (a view of
        # the operand table: a tuple per node when Python asks).
        (self.type_of, self.duplicate_of, self.operands, self.sources,
         self.types, self.shared_operand,
         self.duplicates) = _native.describe_graph(
            self.nodes, ACCESS, _entry_info, _kind_of, spec_of_foreign, _value_key,
            take_output, own_rows)
        # describe_graph gives each batching type as one flat tuple (entry,
        # attrs, attr types, then a part per operand); named here, once per
        # type.
        self.types = [BatchingType(flat[0], flat[1], flat[2], flat[3:])
                      for flat in self.types]

        # Types joined over varying lengths (varying.merge_types) -> kind.
        self.varying = {}

    def __len__(self):
        return len(self.nodes)

    @property
    def type_names(self):
        """A name per type that is the same in every minibatch and every run
        (batching types hold object ids): what a learned schedule is keyed by.
        Shared variables are named by TensorFlow's per-process unique id
        ("Variable_7"), which a program that creates its variables in the
        same order gets again in every run."""
        if self._type_names is None:
            first_of_type = {}
            for index, node_type in enumerate(self.type_of):
                if node_type >= 0:
                    first_of_type.setdefault(node_type, index)
            self._type_names = [self.type_name(first_of_type[node_type])
                                for node_type in range(len(self.types))]
        return self._type_names

    def type_name(self, index):
        """The stable name (``type_names``) of node ``index``'s type."""
        return _stable_name(self.nodes[index], self.operands[index])


def _stable_name(node, operands):
    parts = [node.entry.name, repr(node.attrs)]
    for operand in operands:
        if isinstance(operand, NodeOperand):
            spec = operand.node.spec
            spec = spec if operand.pick is None else spec[operand.pick]
            parts.append(f"{spec.dtype.name}{list(spec.shape)}")
            continue
        operand_class = classify_operand(operand)
        if operand_class == VARIABLE:
            parts.append(f"{getattr(operand, '_unique_id', operand.name)}"
                         f"{list(operand.shape)}")
        elif operand_class == TENSOR:
            parts.append(f"tensor{list(operand.shape)}")
        elif operand_class == NUMBER:
            parts.append(repr(operand))
        else:
            parts.append(type(operand).__name__)
    return " ".join(parts)


def _entry_info(entry):
    """(index positions, which lookups keep their own row): ``gathers`` is
    True/False for a pattern, else the operand position whose being a
    variable makes the node a lookup of its rows (module docstring), or
    None."""
    if entry.node_kind in PATTERN_KINDS:
        return entry.index_positions, bool(entry.pattern.gathers_variable_rows)
    return entry.index_positions, entry.gathers_from


# Kinds of a foreign operand (by its type), as describe_graph reads them: a
# NumPy scalar is shared by value, as a Python number is.
_NUMBER, _TENSOR, _VARIABLE, _OTHER = range(4)
_KIND_OF_CLASS = {NUMBER: _NUMBER, NUMPY_SCALAR: _NUMBER, TENSOR: _TENSOR,
                  VARIABLE: _VARIABLE}


def _kind_of(operand):
    return _KIND_OF_CLASS.get(classify_operand(operand), _OTHER)


def _value_key(value):
    """A hashable key for a Python list or NumPy array operand's value."""
    array = np.asarray(value)
    return (array.dtype.str, array.shape, array.tobytes())


# An operand that is a recorded node: in this graph (``index`` >= 0) or
# evaluated earlier (``index`` == -1); ``pick`` selects one output of a
# multi-output node.  A C type (native/_native.c): graphs hold hundreds of
# thousands, which the planner's C reads as fields.
NodeOperand = _native.NodeOperand
