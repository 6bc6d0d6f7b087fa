"""The program planner's loops in C (native/plan.c): which outputs are read,
the step table and every node's place, and the write-back, against the
Python they replaced (kept here as the reference), on every example model
under op and subgraph granularity; and bad input raises, never crashes."""

import numpy as np
import pytest
import tensorflow

import subgraphjit as tf
from subgraphjit import _native
from subgraphjit.batcher import plan as plans
from subgraphjit.batcher.graph import BatchGraph, NodeOperand
from subgraphjit.batcher.schedulers import SCHEDULERS
from subgraphjit.evaluate import unevaluated_ancestors
from subgraphjit.ir.node import VirtualNode
from subgraphjit.ir.table import ACCESS
from experiments.example_models import MODELS


# -- the reference: batcher/plan.py and program.run before issue 17 moved them --

def reference_read_outputs(graph, required):
    required = {node.id for node in required if type(node) is VirtualNode}
    type_of, duplicate_of, operands = graph.type_of, graph.duplicate_of, graph.operands
    read = set()
    for index, node_type in enumerate(type_of):
        if node_type >= 0:
            for operand in operands[index]:
                if type(operand) is NodeOperand and operand.index >= 0:
                    read.add((type_of[operand.index], operand.pick or 0))
    for index, node in enumerate(graph.nodes):
        if node.consumers == 0 or node.id in required:
            if node.entry is ACCESS:
                source = operands[index][0].index
                if source >= 0:
                    read.add((type_of[duplicate_of[source]], node.attrs[0]))
            else:
                source = duplicate_of[index]
                read.update((type_of[source], number)
                            for number in range(len(plans._output_specs(node))))
    return read


class ReferenceFill:
    def __init__(self, graph, program, kind_of_type):
        self.graph, self.program, self.kind_of_type = graph, program, kind_of_type
        self.filled = [0] * len(program.buffers)
        self.input_row = {}
        self.locations = [None] * len(graph)
        self.steps, self.rows = [], []
        self.input_values = [[] for _ in program.buffers]
        self.input_nodes = [[] for _ in program.buffers]

    def fill(self, batches):
        graph, program = self.graph, self.program
        outputs_width = max(len(kind.outputs) for kind in program.kinds)
        for batch in batches:
            kind_number = self.kind_of_type[graph.type_of[batch[0]]]
            kind = program.kinds[kind_number]
            step = [kind_number, len(batch), len(self.rows)]
            read = []   # (buffer, row) of each operand row
            for position, (operand_kind, buffer) in enumerate(kind.operands):
                if operand_kind == plans.ROWS:
                    rows = self._rows(batch, position, buffer)
                    self.rows.extend(rows)
                    read += [(buffer, row) for row in rows]
            step.append(len(self.rows))   # the end of its operand rows
            step.append(int(len(set(read)) == len(read)))   # distinct
            output_starts = [0] * outputs_width
            output_ranges = [0] * (2 * outputs_width)   # (start, end) per output
            for number, buffer in enumerate(kind.outputs):
                if buffer is not None:
                    output_starts[number] = self.filled[buffer]
                    self.filled[buffer] += len(batch)
                    output_ranges[2 * number:2 * number + 2] = (
                        output_starts[number], self.filled[buffer])
            for offset, index in enumerate(batch):
                places = [None if buffer is None else
                          (buffer, output_starts[number] + offset)
                          for number, buffer in enumerate(kind.outputs)]
                self.locations[index] = places if kind.entry.multi_output else places[0]
            self.steps.append(step + output_ranges)
        self._locate_the_rest()
        return self

    def _rows(self, batch, position, buffer):
        rows = []
        for index in batch:
            operand = self.graph.operands[index][position]
            if not isinstance(operand, NodeOperand):
                rows.append(("value", buffer, len(self.input_values[buffer])))
                self.input_values[buffer].append(operand)
            elif operand.index >= 0:
                location = self.locations[operand.index]
                rows.append((location if operand.pick is None
                             else location[operand.pick])[1])
            else:
                number = self.input_row.get(id(operand.node))
                if number is None:
                    number = self.input_row[id(operand.node)] = len(
                        self.input_nodes[buffer])
                    self.input_nodes[buffer].append(operand.node)
                rows.append(("node", buffer, number))
        return rows

    def _locate_the_rest(self):
        graph, locations = self.graph, self.locations
        for index, node in enumerate(graph.nodes):
            if locations[index] is not None:
                continue
            if node.entry is ACCESS:
                source = graph.operands[index][0].index
                if source >= 0 and locations[graph.duplicate_of[source]] is not None:
                    locations[index] = locations[graph.duplicate_of[source]][node.attrs[0]]
            else:
                locations[index] = locations[graph.duplicate_of[index]]
        for place, row in enumerate(self.rows):
            if type(row) is tuple:
                what, buffer, number = row
                if what == "node":
                    number += len(self.input_values[buffer])
                self.rows[place] = self.program.computed[buffer] + number


def reference_write_back(program, graph, outputs):
    """What each node would be left with: (batched, row, dropped
    inputs) per index, the swallowed indices and the nodes whose value is
    taken."""
    left, swallowed, taken = {}, set(), []
    for index, node in enumerate(graph.nodes):
        location = program.location(index)
        batched = row = None
        if isinstance(location, list):
            if None in location:
                swallowed.add(index)
                continue
            batched = [outputs[buffer] for buffer, _ in location]
            row = tuple(number for _, number in location)
        elif location is not None:
            batched, row = outputs[location[0]], location[1]
        elif node.entry is not ACCESS or graph.operands[index][0].index >= 0:
            swallowed.add(index)
            continue
        left[index] = (batched, row)
        if node.consumers == 0 and (batched is not None or node.batched is not None):
            taken.append(index)
    return left, swallowed, taken


# -- graphs -----------------------------------------------------------------------

def recorded_graph(name, seed, granularity, parameters, required_count=0):
    """A model's graph, recorded under a tape (patterns collected from an
    earlier minibatch at subgraph granularity)."""
    parameters(granularity=granularity, collect=1, fuse=True, compile=0)
    rng = np.random.default_rng(seed)
    model = MODELS[name](rng)
    if granularity == "subgraph":   # collect
        with tf.GradientTape():
            tf.build(tf.add_n([model.loss(tf, e) for e in model.random_examples(rng, 3)]))
    tape = tf.GradientTape()
    tape.__enter__()
    losses = [model.loss(tf, e) for e in model.random_examples(rng, 4)]
    # A node whose only consumer is outside the evaluation: its output is
    # not kept, so it stays unevaluated.
    hanging = tf.math.sin(losses[0] * 3.0)
    tf.exp(hanging)
    nodes = unevaluated_ancestors(losses + [hanging])
    if granularity == "subgraph":
        from subgraphjit.patterns import search
        nodes = search.optimize(losses + [hanging], losses)
    graph = BatchGraph(nodes)
    batches = SCHEDULERS["agenda"]().schedule(graph)
    required = [node for node in graph.nodes[::7]][:required_count]
    return tape, losses + [hanging], graph, batches, required


CASES = [(name, granularity) for name in sorted(MODELS) for granularity in ("op", "subgraph")]


@pytest.mark.parametrize("name,granularity", CASES)
def test_programs_match_the_reference(name, granularity, parameters):
    tape, (*losses, hanging), graph, batches, required = recorded_graph(
        name, len(name), granularity, parameters, required_count=3)
    try:
        for asked in ((), required):
            assert plans.read_outputs(graph, asked) == reference_read_outputs(graph, asked)
        program = plans.outline(graph, batches, required)
        program.fill()
        kind_of_type = {node_type: number for number, node_type in enumerate(
            sorted({graph.type_of[batch[0]] for batch in batches},
                   key=lambda node_type: (graph.type_names[node_type], node_type)))}
        reference = ReferenceFill(graph, program, kind_of_type).fill(batches)
        assert program.steps.tolist() == reference.steps
        assert program.rows.tolist() == reference.rows
        assert program.input_values == reference.input_values
        assert [[id(node) for node in nodes] for nodes in program.input_nodes] == \
            [[id(node) for node in nodes] for nodes in reference.input_nodes]
        assert [program.location(index) for index in range(len(graph))] == \
            reference.locations

        # The write-back, with stand-ins for the buffers.
        outputs = [f"buffer {number}" for number in range(len(program.buffers))]
        expected_left, expected_swallowed, _ = reference_write_back(program, graph, outputs)
        before = [node.batched for node in graph.nodes]
        flagged = {index for index, node in enumerate(graph.nodes) if node.swallowed}
        taken = _native.write_back(graph.nodes, graph.operands, *program.places,
                                   outputs, ACCESS)
        assert {index for index, node in enumerate(graph.nodes)
                if node.swallowed} - flagged == expected_swallowed - flagged
        for index, node in enumerate(graph.nodes):
            if index in expected_left:
                batched, row = expected_left[index]
                if batched is None:   # an access node given its value earlier
                    assert node.batched is before[index]
                else:
                    assert node.batched == batched and node.row == row
                assert node.inputs == () and node.site is None
        assert [node.id for node in taken] == [
            node.id for index, node in enumerate(graph.nodes)
            if index in expected_left and node.consumers == 0
            and (expected_left[index][0] is not None or before[index] is not None)]
        assert {id(node) for node in taken} >= {id(loss) for loss in losses[1:]}
        if any(node is hanging for node in graph.nodes):   # (not in a pattern)
            assert hanging.swallowed
    finally:
        for node in graph.nodes:   # nothing evaluates the stand-ins
            node.batched, node.row, node.result = None, None, tensorflow.zeros(())
        tape.__exit__(None, None, None)


# -- bad input ----------------------------------------------------------------------

def small_graph():
    x = tensorflow.constant(np.ones((2, 3), np.float32))
    with tf.GradientTape():
        a = tf.tanh(x)
        b, c = tf.split(a * 2.0, [1, 2], axis=1)
        loss = tf.reduce_sum(b) + tf.reduce_sum(c)
        graph = BatchGraph(unevaluated_ancestors([loss]))
    return graph, SCHEDULERS["agenda"]().schedule(graph)


def fill_arguments(graph, batches):
    program = plans.outline(graph, batches)
    kinds = [(tuple((p, b) for p, (k, b) in enumerate(kind.operands) if k == plans.ROWS),
              tuple(kind.outputs), kind.entry.multi_output) for kind in program.kinds]
    kind_of_type = [-1] * len(graph.types)
    for number, kind_type in enumerate(sorted({graph.type_of[b[0]] for b in batches},
                                              key=lambda t: (graph.type_names[t], t))):
        kind_of_type[kind_type] = number
    return [batches, graph.nodes, graph.type_of, graph.duplicate_of, graph.operands,
            len(graph.types), kind_of_type, kinds, program.computed, ACCESS]


def test_fill_of_bad_input_raises_clean_errors():
    graph, batches = small_graph()
    arguments = fill_arguments(graph, batches)
    assert _native.fill(*arguments)   # well formed

    def broken(position, value):
        changed = list(arguments)
        changed[position] = value
        return changed

    count = len(graph.nodes)
    for position, value, error in [
            (0, [[count + 5]], ValueError),               # a node out of range
            (0, [[]], ValueError),                        # an empty batch
            (0, [batches[0], batches[0]] + batches[1:], ValueError),   # twice
            (0, list(reversed(batches)), ValueError),     # reads before written
            (0, [["x"]], TypeError),
            (1, graph.nodes[:-1], ValueError),
            (1, [1] * count, TypeError),
            (2, [99] * count, ValueError),                # types out of range
            (3, [-1] * count, ValueError),
            (4, [[]] * count, ValueError),                # operands missing
            (6, [5] * len(graph.types), ValueError),  # a kind out of range
            (7, [("no",)], TypeError),
            (7, [[(), (0,), False]] * 5, TypeError),            # a kind not a tuple
            (7, [([0, 1], (0,), False)] * 5, TypeError),
            (7, [((( 0, 99),), (0,), False)] * 5, ValueError),   # a buffer out of range
            (8, [0] * len(arguments[8]), ValueError)]:    # computed disagrees
        with pytest.raises(error):
            _native.fill(*broken(position, value))
    # Operands are the graph's own table (describe_graph's, whose indices
    # are checked as they are read): lists of them, or another graph's
    # table, are refused.
    with tf.GradientTape():
        other = BatchGraph(unevaluated_ancestors([tf.tanh(tensorflow.constant([1.0]))]))
    for operands in ([list(node_operands) for node_operands in graph.operands],
                     other.operands):
        with pytest.raises(ValueError):
            _native.fill(*broken(4, operands))


def test_node_operands_made_in_python_are_checked():
    graph, _ = small_graph()
    node = graph.nodes[0]
    operand = NodeOperand(3, None, node)
    assert (operand.index, operand.pick, operand.node) == (3, None, node)
    assert NodeOperand(index=-1, pick=1, node=node).pick == 1
    for arguments in [(-2, None, node), (0, "x", node), (0, None, "not a node"), (0,)]:
        with pytest.raises(TypeError):
            NodeOperand(*arguments)
    with pytest.raises(AttributeError):
        operand.index = 4


def test_read_outputs_and_write_back_of_bad_input_raise_clean_errors():
    graph, batches = small_graph()
    program = plans.outline(graph, batches)
    program.fill()
    base = [graph.nodes, graph.type_of, graph.duplicate_of, graph.operands,
            len(graph.types), set(), ACCESS]
    assert _native.read_outputs(*base)
    for position, value, error in [(0, [None] * len(graph.nodes), TypeError),
                                   (1, [-5] * len(graph.nodes), ValueError),
                                   (2, [], ValueError),
                                   (4, -1, ValueError),
                                   (5, [], TypeError),
                                   (5, {"not an id"}, TypeError),
                                   (5, {2 ** 80}, TypeError)]:
        changed = list(base)
        changed[position] = value
        with pytest.raises(error):
            _native.read_outputs(*changed)
    where, outputs, slots = program.places
    buffers = [None] * len(program.buffers)
    # (The scope's close evaluated the nodes, compiled or step by step.)
    def state(node):
        return (id(node.result), id(node.batched), id(node.row), tuple(map(id, node.inputs)))
    before = [state(node) for node in graph.nodes]
    for arguments, error in [
            ((graph.nodes, graph.operands, where[:-4], outputs, slots, buffers), ValueError),
            ((graph.nodes, graph.operands, where, outputs, slots[:-8], buffers), ValueError),
            ((graph.nodes, graph.operands, where, outputs, slots, []), ValueError),
            ((graph.nodes, graph.operands, where, outputs, "slots", buffers), TypeError),
            ((graph.nodes, list(graph.operands), where, outputs, slots, buffers), TypeError),
            ((graph.nodes[:-1], graph.operands, where, outputs, slots, buffers), ValueError)]:
        with pytest.raises(error):
            _native.write_back(*arguments, ACCESS)
    assert [state(node) for node in graph.nodes] == before   # untouched by the failed calls


def test_per_node_integers_are_arrays_that_read_like_lists():
    """describe_graph gives ``type_of`` and ``duplicate_of`` as C arrays
    (``_native.Indices``), which the passes after it read without a list
    conversion; the passes give the same results for lists of the same
    ints, and check the arrays' values as they checked the lists'."""
    graph, batches = small_graph()
    count = len(graph.nodes)
    for indices in (graph.type_of, graph.duplicate_of):
        assert type(indices) is _native.Indices
        as_list = list(indices)
        assert len(indices) == count and indices == as_list and repr(as_list) in repr(indices)
        assert [indices[i] for i in range(count)] == as_list and indices[-1] == as_list[-1]
        with pytest.raises(IndexError):
            indices[count]
        with pytest.raises(TypeError):
            hash(indices)
        with pytest.raises(TypeError):
            _native.Indices()
    assert -1 in graph.type_of

    # The same results from the arrays and from lists of their ints.
    arguments = fill_arguments(graph, batches)
    as_lists = list(arguments)
    as_lists[2], as_lists[3] = list(graph.type_of), list(graph.duplicate_of)
    assert repr(_native.fill(*arguments)) == repr(_native.fill(*as_lists))
    read = [graph.nodes, graph.type_of, graph.duplicate_of, graph.operands,
            len(graph.types), set(), ACCESS]
    assert _native.read_outputs(*read) == _native.read_outputs(
        graph.nodes, list(graph.type_of), list(graph.duplicate_of), *read[3:])
    for schedule in (_native.critical_schedule, _native.agenda_schedule):
        assert schedule(graph.type_of, graph.sources, len(graph.types)) == \
            schedule(list(graph.type_of), graph.sources, len(graph.types))

    # An array's values are checked against the counts the call gives.
    with pytest.raises(ValueError):
        _native.critical_schedule(graph.type_of, graph.sources, 0)
    with pytest.raises(ValueError):
        _native.read_outputs(graph.nodes, graph.type_of, graph.duplicate_of,
                             graph.operands, 0, set(), ACCESS)
    with tf.GradientTape():   # another graph's array, of another length
        other = BatchGraph(unevaluated_ancestors([tf.tanh(tensorflow.constant([1.0]))]))
    with pytest.raises(ValueError):
        _native.fill(*arguments[:3], other.duplicate_of, *arguments[4:])
    # The nodes the table describes need no check of their own; a list
    # that differs from them anywhere is checked from there on.
    with pytest.raises(TypeError):
        _native.read_outputs(graph.nodes[:-1] + [None], *read[1:])
