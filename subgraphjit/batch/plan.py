"""Planning: a schedule becomes a program of steps over integer row arrays.

Pure bookkeeping, no TensorFlow ops: ``plan(graph, batches)`` turns the
scheduler's batches into a ``Program``, which ``program.py`` runs as one
compiled TensorFlow call.

Each batch becomes a ``Step``: one op-table row (or pattern) over the rows
of its instances.  Every per-instance operand that is a recorded node reads
rows of a *buffer*: the results of all earlier steps with the operand's
spec, concatenated in step order, followed by the values of any operand
nodes evaluated in an earlier evaluation.  Reading whole buffers, rather
than exactly the steps an operand's rows come from, is what makes a
program's ``key`` depend on the sequence of step kinds only: minibatches of
different trees whose schedules have the same kinds of steps (the same
tree height, for a Tree-LSTM) run one compiled program with other row
arrays.
"""

import numpy as np
import tensorflow as tf

from ..patch.record import ACCESS
from ..patch.spec import is_variable
from .graph import NodeOperand
from .rules import rule_for

_NUMPY_OF_PYTHON = {int: np.int32, float: np.float32, bool: np.bool_}

# Operand kinds of a step.
SHARED = "shared"   # one value for every instance: a variable, tensor or number
VALUES = "values"   # Python lists or arrays, one per instance, stacked
ROWS = "rows"       # recorded nodes: rows of a buffer


class Operand:
    """One operand position of a step.  ``value``: the shared value, or the
    stacked Python values; ``buffer``, ``rows``, ``externals``: for ROWS,
    the buffer read, the row of each instance in it, and the nodes of
    earlier evaluations appended to it (their rows follow the buffer's)."""

    __slots__ = ("kind", "value", "buffer", "rows", "externals")

    def __init__(self, kind, value=None, buffer=None, rows=None, externals=()):
        self.kind = kind
        self.value = value
        self.buffer = buffer
        self.rows = rows
        self.externals = externals

    def key(self):
        """What a compiled program depends on: kinds, specs and the numbers
        and variables it holds as constants, never rows or tensor values."""
        if self.kind == SHARED:
            value = self.value
            if is_variable(value):
                return (SHARED, "variable", id(value))   # kept alive by the cache
            if isinstance(value, tf.Tensor):
                return (SHARED, "tensor", value.dtype, tuple(value.shape))
            return (SHARED, type(value), value)
        if self.kind == VALUES:
            return (VALUES, self.value.dtype.str, self.value.shape[1:])
        return (ROWS, self.buffer, bool(self.externals))


class Step:
    """One batch: ``indices`` (graph nodes, one per instance) running
    ``row`` with ``attrs``.  ``per_instance``: the op has no batch rule for
    these operands (every operand shared, or no rule at all), so it runs
    once per instance; ``outputs``: (buffer, offset) of each output."""

    __slots__ = ("indices", "row", "attrs", "spec", "operands", "per_instance",
                 "outputs")

    def key(self):
        return (self.row, self.attrs, tuple(map(type, self.attrs)),
                tuple(operand.key() for operand in self.operands),
                len(self.indices) if self.per_instance else None)


class Program:
    """``steps`` in order; ``buffers``: the spec of each buffer; ``key``:
    equal for programs that one compiled function runs."""

    def __init__(self, steps, buffers, locations):
        self.steps = steps
        self.buffers = buffers
        self._locations = locations
        self.key = (tuple(buffers), tuple(step.key() for step in steps))

    def location(self, index):
        """(buffer, row) of graph node ``index``'s result (a list of them for
        a multi-output node); None for a node no step ran."""
        return self._locations[index]


def plan(graph, batches):
    """The program running ``batches`` (lists of graph indices) in order."""
    return _Planner(graph).plan(batches)


class _Planner:
    def __init__(self, graph):
        self.graph = graph
        self.buffers = []            # spec of each buffer
        self.buffer_of_spec = {}
        self.filled = []             # rows written to each buffer so far
        # Per graph index: (buffer, row) of its result, a list of them for a
        # multi-output node, None while (or if never) computed.
        self.locations = [None] * len(graph)

    def plan(self, batches):
        graph = self.graph
        steps = []
        for indices in batches:
            first = graph.nodes[indices[0]]
            node_type = graph.type_of[indices[0]]
            shared = graph.shared_operand[node_type]
            operand_specs = graph.signatures[node_type][3:]
            step = Step()
            step.indices = indices
            step.row, step.attrs, step.spec = first.row, first.attrs, first.spec
            step.operands = [self._operand(indices, position, is_shared,
                                           operand_specs[position])
                             for position, is_shared in enumerate(shared)]
            step.per_instance = all(shared) or rule_for(first.row) is None
            multi_output = first.row.multi_output
            step.outputs = []
            for output_spec in (first.spec if multi_output else (first.spec,)):
                buffer = self._buffer(output_spec)
                step.outputs.append((buffer, self.filled[buffer]))
                self.filled[buffer] += len(indices)
            for row, index in enumerate(indices):
                places = [(buffer, offset + row) for buffer, offset in step.outputs]
                self.locations[index] = places if multi_output else places[0]
            steps.append(step)
        self._locate_the_rest()
        return Program(steps, self.buffers, self.locations)

    def _buffer(self, spec):
        buffer = self.buffer_of_spec.get(spec)
        if buffer is None:
            buffer = self.buffer_of_spec[spec] = len(self.buffers)
            self.buffers.append(spec)
            self.filled.append(0)
        return buffer

    def _operand(self, indices, position, is_shared, operand_spec):
        all_operands = self.graph.operands
        first = all_operands[indices[0]][position]
        if is_shared:
            return Operand(SHARED, value=first)
        if not isinstance(first, NodeOperand):   # Python lists, arrays, indices
            kind = _NUMPY_OF_PYTHON.get(operand_spec.python_type)
            return Operand(VALUES, value=np.array(
                [all_operands[index][position] for index in indices], dtype=kind))
        buffer = self._buffer(operand_spec)
        size = self.filled[buffer]
        rows, externals = [], []
        for index in indices:
            operand = all_operands[index][position]
            if operand.index >= 0:
                location = self.locations[operand.index]
                rows.append((location if operand.pick is None
                             else location[operand.pick])[1])
            else:   # evaluated earlier: its value follows the buffer's rows
                rows.append(size + len(externals))
                externals.append(operand.node)
        return Operand(ROWS, buffer=buffer, rows=np.array(rows, np.int32),
                       externals=externals)

    def _locate_the_rest(self):
        """Duplicates share their canonical node's place; an access node has
        its multi-output node's output's."""
        graph, locations = self.graph, self.locations
        for index, node in enumerate(graph.nodes):
            if locations[index] is not None:
                continue
            if node.row is ACCESS:
                source = graph.operands[index][0].index
                if source >= 0:
                    locations[index] = locations[graph.duplicate_of[source]][
                        node.attrs[0]]
            else:
                locations[index] = locations[graph.duplicate_of[index]]
