"""The batching view of a recorded DAG: node types, operands, duplicates.

Two nodes may run in one batched op when they have the same *batching
signature*: the op-table row, its attributes (with their types), and for each
operand either its spec (a per-instance operand, stacked along a new leading
axis) or its identity (a shared operand: the same tf.Variable or tensor, or
the same Python number, given to every instance once).  Signatures are
interned to small integers, the node *types* the schedulers work with.

Identical work is done once: a node with the same signature as an earlier
node and the very same operands (the same constant, the same function of
the same nodes) becomes a *duplicate* and reuses its value.  Lookups of
rows of a variable are the exception: eager TensorFlow gives the variable's
gradient as an IndexedSlices with an entry per lookup, and optimizers such
as Adam apply those entries one by one (the square of a sum is not the sum
of squares), so each lookup keeps its own row.

Multi-output ops (``tf.split``) are one node; the ``access`` nodes that pick
their outputs are not scheduled, their consumers read the picked output.
"""

import numpy as np
import tensorflow as tf

from ..patch.node import VirtualNode
from ..patch.record import ACCESS
from ..patch.spec import is_variable, spec_of_foreign

_PYTHON_NUMBERS = (int, float, bool)


class BatchGraph:
    """Nodes to evaluate, in recording order, with what batching needs.

    ``nodes[i]`` is a VirtualNode; ``operands[i]`` lists, per operand, a
    ``NodeOperand`` or the foreign value itself; ``type_of[i]`` is the node's
    type (an index into ``signatures``) or -1 for nodes that are not
    scheduled (duplicates and access nodes); ``duplicate_of[i]`` is the index
    whose value node i reuses, or i.
    """

    def __init__(self, nodes):
        self.nodes = nodes
        # Filled as we go: operands always come before their consumers.
        index_of = {}
        self.signatures = []
        signature_types = {}
        work_seen = {}
        self.type_of = []
        self.operands = []
        self.duplicate_of = []
        self.shared_operand = []   # per type: which operand positions are shared
        # In-graph operand nodes of each node (canonical indices), for the
        # schedulers' dependency bookkeeping.
        self.sources = []
        self._type_names = None
        for index, node in enumerate(nodes):
            if node.row is ACCESS:
                source = node.inputs[0]
                source_index = index_of.get(source.id, -1)
                if source_index < 0:  # its op ran in an earlier evaluation
                    _take_output(node, source)
                else:
                    index_of[node.id] = index
                self.operands.append([NodeOperand(source_index, None, source)])
                self.sources.append(
                    (self.duplicate_of[source_index],) if source_index >= 0 else ())
                self.type_of.append(-1)
                self.duplicate_of.append(index)
                continue
            index_of[node.id] = index
            operands, signature, identity, sources = self._describe(node, index_of)
            self.operands.append(operands)
            self.sources.append(sources)
            identity_key = (signature, identity)
            if _gathers_variable_rows(node):
                identity_key = index   # never a duplicate (module docstring)
            earlier = work_seen.get(identity_key)
            if earlier is not None:
                self.type_of.append(-1)
                self.duplicate_of.append(earlier)
                continue
            work_seen[identity_key] = index
            node_type = signature_types.get(signature)
            if node_type is None:
                node_type = signature_types[signature] = len(self.signatures)
                self.signatures.append(signature)
                self.shared_operand.append(tuple(
                    not isinstance(operand, NodeOperand)
                    and _is_shared(operand, position in node.row.index_positions)
                    for position, operand in enumerate(operands)))
            self.type_of.append(node_type)
            self.duplicate_of.append(index)

    def _describe(self, node, index_of):
        """Operands, batching signature, identity of the node's work, and
        the in-graph nodes it reads."""
        operands = []
        signature = [node.row, node.attrs, tuple(map(type, node.attrs))]
        identity = []
        sources = ()
        index_positions = node.row.index_positions
        for position, operand in enumerate(node.inputs):
            if type(operand) is VirtualNode:
                operand_index = index_of.get(operand.id, -1)
                pick = None
                if operand.row is ACCESS and operand_index >= 0:
                    # Read the picked output of the multi-output node directly.
                    pick = operand.attrs[0]
                    operand = operand.inputs[0]
                    operand_index = index_of[operand.id]
                if operand_index >= 0:
                    operand_index = self.duplicate_of[operand_index]
                    if operand_index not in sources:
                        sources += (operand_index,)
                operands.append(NodeOperand(operand_index, pick, operand))
                signature.append(operand.spec if pick is None
                                 else operand.spec[pick])
                identity.append((operand_index, pick) if operand_index >= 0
                                else id(operand))
            elif _is_number(operand) and position not in index_positions:
                # A constant such as the 0.5 in ``x * 0.5`` (or a NumPy
                # scalar, ``x / np.sqrt(d)``): shared by value.
                operands.append(operand)
                signature.append((type(operand), operand))
                identity.append(None)
            elif isinstance(operand, tf.Tensor) or is_variable(operand):
                operands.append(operand)
                signature.append(("shared", id(operand)))
                identity.append(None)
            else:  # lists, arrays and indices: per instance, stacked
                operands.append(operand)
                signature.append(spec_of_foreign(operand))
                identity.append(_value_key(operand))
        return operands, tuple(signature), tuple(identity), sources

    def __len__(self):
        return len(self.nodes)

    @property
    def type_names(self):
        """A name per type that is the same in every minibatch and every run
        (signatures hold object ids): what a learned schedule is keyed by.
        Shared variables are named by TensorFlow's per-process unique id
        ("Variable_7"), which a program that creates its variables in the
        same order gets again in every run."""
        if self._type_names is None:
            first_of_type = {}
            for index, node_type in enumerate(self.type_of):
                if node_type >= 0:
                    first_of_type.setdefault(node_type, index)
            self._type_names = [
                _stable_name(self.nodes[first_of_type[node_type]],
                             self.operands[first_of_type[node_type]])
                for node_type in range(len(self.signatures))]
        return self._type_names


def _take_output(access_node, source):
    """Evaluate an access node whose multi-output op is evaluated already."""
    index = access_node.attrs[0]
    if source.result is None and source.batch is not None:
        access_node.batch = source.batch[index]
        access_node.batch_row = source.batch_row
        if isinstance(access_node.batch_row, tuple):   # a row per output
            access_node.batch_row = access_node.batch_row[index]
    else:
        access_node.result = source.value()[index]


def _stable_name(node, operands):
    parts = [node.row.name, repr(node.attrs)]
    for operand in operands:
        if isinstance(operand, NodeOperand):
            spec = operand.node.spec
            spec = spec if operand.pick is None else spec[operand.pick]
            parts.append(f"{spec.dtype.name}{list(spec.shape)}")
        elif is_variable(operand):
            parts.append(f"{getattr(operand, '_unique_id', operand.name)}"
                         f"{list(operand.shape)}")
        elif isinstance(operand, tf.Tensor):
            parts.append(f"tensor{list(operand.shape)}")
        elif type(operand) in _PYTHON_NUMBERS:
            parts.append(repr(operand))
        else:
            parts.append(type(operand).__name__)
    return " ".join(parts)


def _gathers_variable_rows(node):
    row = node.row
    if row.family == "pattern":
        return row.pattern.gathers_variable_rows
    return row.gathers_from is not None and is_variable(node.inputs[row.gathers_from])


def _value_key(value):
    """A hashable key for a Python list or NumPy array operand's value."""
    array = np.asarray(value)
    return (array.dtype.str, array.shape, array.tobytes())


def _is_number(operand):
    return type(operand) in _PYTHON_NUMBERS or isinstance(operand, np.generic)


def _is_shared(operand, is_index):
    if _is_number(operand):
        return not is_index
    return isinstance(operand, tf.Tensor) or is_variable(operand)


class NodeOperand:
    """An operand that is a recorded node: in this graph (``index`` >= 0) or
    evaluated earlier (``index`` == -1); ``pick`` selects one output of a
    multi-output node."""

    __slots__ = ("index", "pick", "node")

    def __init__(self, index, pick, node):
        self.index = index
        self.pick = pick
        self.node = node
