"""Planning: an evaluation's graph becomes a program of steps over row arrays.

Bookkeeping on integers, no TensorFlow ops: ``plan(graph)`` turns the graph into
a ``Program``, which ``program.py`` runs as one compiled TensorFlow call.

A compiled program pays off only if later minibatches reuse it, so its
shape must not depend on the details of one minibatch's trees.  The
program runs in *rounds*: round d runs the nodes at depth d (1 + their
deepest operand), one step per node type, the types in one fixed order
(their stable names).  A type met at one depth only (an input lookup, a
final sum) has a step in that round; any other type has one in every
round of the blocks of ``ROUNDS`` rounds its depths span, with no rows
where it has no nodes.  A program's ``key`` is the sequence of step kinds,
never rows or sizes: minibatches of other trees whose depths fall in the
same blocks (a Tree-LSTM's heights, rounded up to four) run one compiled
program with other row arrays.  Inside a compiled call a step with no
rows costs microseconds, not the tens of microseconds of an eager launch.

Every per-instance operand that is a recorded node reads rows of a
*buffer*: the results of all earlier steps with the operand's spec,
concatenated in step order, followed by the values of any operand nodes
evaluated in an earlier evaluation.
"""

import numpy as np
import tensorflow as tf

from ..patch.record import ACCESS
from ..patch.spec import is_variable
from .graph import NodeOperand
from .schedulers import depths

# Rounds are rounded up to a multiple of this: fewer distinct programs to
# compile, for a few rounds of empty steps.
ROUNDS = 4

# The NumPy type Python lists and numbers of each kind are stacked as (as
# TensorFlow converts them where the op does not say otherwise).
NUMPY_OF_PYTHON = {int: np.int32, float: np.float32, bool: np.bool_}

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
    """Some nodes of one type: ``indices`` (graph nodes, one per instance,
    perhaps none) running ``row`` with ``attrs``.  ``every_operand_shared``:
    the step runs once per instance (its count is part of the key);
    ``outputs``: (buffer, offset) of each output."""

    __slots__ = ("indices", "row", "attrs", "spec", "operands",
                 "every_operand_shared", "outputs")

    def key(self):
        return (self.row, self.attrs, tuple(map(type, self.attrs)),
                tuple(operand.key() for operand in self.operands),
                len(self.indices) if self.every_operand_shared else None)


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


def plan(graph):
    """The program computing every node of ``graph`` in depth rounds."""
    return _Planner(graph).plan()


def rounds(graph):
    """(node type, graph indices) of each step: per round, in the order of
    their stable names, every type whose depths span that round, the span
    widened to multiples of ``ROUNDS`` (see the module docstring)."""
    depth = depths(graph)
    first, last = {}, {}
    for index, node_type in enumerate(graph.type_of):
        if node_type >= 0:
            d = depth[index]
            first[node_type] = min(first.get(node_type, d), d)
            last[node_type] = max(last.get(node_type, d), d)
    types = sorted(first, key=graph.type_names.__getitem__)
    count = -(-max(last.values(), default=0) // ROUNDS) * ROUNDS
    members = [[[] for _ in graph.signatures] for _ in range(count + 1)]
    for index, node_type in enumerate(graph.type_of):
        if node_type >= 0:
            members[depth[index]][node_type].append(index)
    steps = []
    for d in range(1, count + 1):
        for node_type in types:
            # A type met at one depth only (an input, a final sum) keeps to
            # it; others span whole blocks of rounds.
            if first[node_type] == last[node_type]:
                spanned = d == first[node_type]
            else:
                spanned = ((first[node_type] - 1) // ROUNDS * ROUNDS < d
                           <= -(-last[node_type] // ROUNDS) * ROUNDS)
            if spanned:
                steps.append((node_type, members[d][node_type]))
    return steps


class _Planner:
    def __init__(self, graph):
        self.graph = graph
        self.buffers = []            # spec of each buffer
        self.buffer_of_spec = {}
        self.filled = []             # rows written to each buffer so far
        # Per graph index: (buffer, row) of its result, a list of them for a
        # multi-output node, None while (or if never) computed.
        self.locations = [None] * len(graph)
        # A node of each type, whose operands tell those of an empty step.
        self.example = {}
        for index, node_type in enumerate(graph.type_of):
            if node_type >= 0:
                self.example.setdefault(node_type, index)

    def plan(self):
        graph = self.graph
        steps = []
        for node_type, indices in rounds(graph):
            example = self.example[node_type]
            first = graph.nodes[example]
            shared = graph.shared_operand[node_type]
            operand_specs = graph.signatures[node_type][3:]
            step = Step()
            step.indices = indices
            step.row, step.attrs, step.spec = first.row, first.attrs, first.spec
            step.operands = [
                self._operand(indices, example, position, is_shared,
                              operand_specs[position])
                for position, is_shared in enumerate(shared)]
            step.every_operand_shared = all(shared)
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

    def _operand(self, indices, example, position, is_shared, operand_spec):
        all_operands = self.graph.operands
        first = all_operands[example][position]
        if is_shared:
            return Operand(SHARED, value=first)
        if not isinstance(first, NodeOperand):   # Python lists, arrays, indices
            kind = NUMPY_OF_PYTHON.get(operand_spec.python_type)
            values = np.array([all_operands[index][position] for index in indices]
                              or [first], dtype=kind)
            return Operand(VALUES, value=values[:len(indices)])
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
