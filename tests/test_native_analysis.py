"""The batching analysis in C (native/analysis.c) against small pure-Python
references kept here (the package has one implementation, the native one):
random DAGs, graphs recorded from the example models, and bad input, which
must raise clean exceptions."""

import gc
import weakref

import numpy as np
import pytest
import tensorflow
from hypothesis import given, settings, strategies as st

import subgraphjit as tf
from subgraphjit import VirtualNode, _native
from subgraphjit.batcher import graph as graph_module
from subgraphjit.batcher.graph import BatchGraph, BatchingType, NodeOperand
from subgraphjit.batcher.schedulers import (AgendaScheduler, CriticalScheduler,
                                            DepthScheduler, depths)
from subgraphjit.context import context
from subgraphjit.evaluate import unevaluated_ancestors
from subgraphjit.ir.node import take_output
from subgraphjit.ir.spec import is_variable, spec_of_foreign
from subgraphjit.ir.table import ACCESS
from experiments.example_models import MODELS


# -- references ---------------------------------------------------------------

def reference_ancestors(targets):
    """The Python this replaced (evaluate.py before issue 17)."""
    found = {}
    stack = [node for node in targets
             if type(node) is VirtualNode and not node.evaluated]
    while stack:
        node = stack.pop()
        if node.id in found:
            continue
        found[node.id] = node
        for operand in node.inputs:
            if type(operand) is VirtualNode and operand.result is None \
                    and operand.batched is None and operand.id not in found:
                stack.append(operand)
    return [found[node_id] for node_id in sorted(found)]


def reference_depths(graph):
    depth = [0] * len(graph.type_of)
    for index, sources in enumerate(graph.sources):
        deepest = max((depth[source] for source in sources), default=0)
        depth[index] = deepest + (graph.type_of[index] >= 0)
    return depth


def reference_depth_schedule(graph):
    depth = reference_depths(graph)
    groups = {}
    for index, node_type in enumerate(graph.type_of):
        if node_type >= 0:
            groups.setdefault((depth[index], node_type), []).append(index)
    return [groups[key] for key in sorted(groups)]


def reference_heights(graph):
    """Scheduled nodes on the longest chain from each node to a result."""
    height = [0] * len(graph.type_of)
    for index in reversed(range(len(graph.type_of))):
        if graph.type_of[index] >= 0:
            height[index] += 1
            for source in graph.sources[index]:
                height[source] = max(height[source], height[index])
    return height


def reference_agenda_schedule(graph, critical=False):
    """DyNet's rule as the Python scheduler had it: ties go to the first
    type in the ready dict's insertion order.  ``critical``: the type of
    the highest ready node instead."""
    type_of, depth = graph.type_of, reference_depths(graph)
    height = reference_heights(graph)
    remaining = [0] * len(graph.types)
    depth_sum = [0] * len(graph.types)
    waiting, consumers, ready = {}, {}, {}
    for index, node_type in enumerate(type_of):
        if node_type < 0:
            continue
        remaining[node_type] += 1
        depth_sum[node_type] += depth[index]
        if graph.sources[index]:
            waiting[index] = len(graph.sources[index])
            for source in graph.sources[index]:
                consumers.setdefault(source, []).append(index)
        else:
            ready.setdefault(node_type, []).append(index)
    batches = []
    while ready:
        chosen = (max(ready, key=lambda t: max(height[i] for i in ready[t])) if critical
                  else min(ready, key=lambda t: depth_sum[t] / remaining[t]))
        batch = ready.pop(chosen)
        for index in batch:
            remaining[type_of[index]] -= 1
            depth_sum[type_of[index]] -= depth[index]
            for consumer in consumers.pop(index, ()):
                waiting[consumer] -= 1
                if waiting[consumer] == 0:
                    del waiting[consumer]
                    ready.setdefault(type_of[consumer], []).append(consumer)
        batches.append(batch)
    return batches


# -- helpers ----------------------------------------------------------------

def make_node(node_id, inputs, state=0):
    """A bare node: ``state`` 0 unevaluated, 1 with a result, 2 a row of a
    batched value."""
    node = VirtualNode(node_id, None, tuple(inputs), (), None, None)
    if state == 1:
        node.result = "value"
    elif state == 2:
        node.batched, node.row = "batched", 0
    return node


@st.composite
def random_dags(draw):
    """Nodes with operands among earlier nodes and foreign values, some
    evaluated, ids a random permutation (the result is sorted by id, not by
    position), and targets mixing nodes with other values."""
    count = draw(st.integers(0, 40))
    # Ids usually consecutive; gaps make the native walk's bit set widen
    # (above and below) and, past 64M ids, turn into a hash set.
    gaps = draw(st.lists(st.sampled_from([1, 1, 1, 1, 70, 70_000, 1 << 27]),
                         min_size=count, max_size=count))
    first = draw(st.integers(0, 1 << 40))
    ids = draw(st.permutations([first + sum(gaps[:k + 1]) for k in range(count)]))
    nodes = []
    for position in range(count):
        picks = draw(st.lists(st.integers(-2, position - 1), max_size=4))
        inputs = [nodes[pick] if pick >= 0 else [1.0, "x"][pick] for pick in picks]
        nodes.append(make_node(ids[position], inputs, draw(st.sampled_from([0, 0, 0, 1, 2]))))
    chosen = draw(st.lists(st.integers(-1, count - 1), max_size=6))
    targets = [nodes[pick] if pick >= 0 else 3 for pick in chosen]
    return nodes, targets


class Structure:
    """What the schedulers read of a BatchGraph."""

    def __init__(self, type_of, sources, type_count):
        self.type_of, self.sources = type_of, sources
        self.types = [None] * type_count

    def __len__(self):
        return len(self.type_of)


@st.composite
def random_structures(draw):
    """Types (-1: not scheduled) and sources among earlier nodes, repeats
    included; few types and shallow graphs, so ties are common."""
    type_count = draw(st.integers(1, 5))
    count = draw(st.integers(0, 40))
    type_of = [draw(st.integers(-1, type_count - 1)) for _ in range(count)]
    sources = [tuple(draw(st.lists(st.integers(0, index - 1), max_size=3)))
               if index else () for index in range(count)]
    return Structure(type_of, sources, type_count)


def recorded_losses(name, seed, count=4):
    rng = np.random.default_rng(seed)
    model = MODELS[name](rng)
    return [model.loss(tf, example) for example in model.random_examples(rng, count)]


# -- unevaluated_ancestors ------------------------------------------------------

def test_the_python_name_is_the_native_function():
    assert unevaluated_ancestors is _native.unevaluated_ancestors


@settings(max_examples=300, deadline=None)
@given(random_dags())
def test_ancestors_of_random_dags_match_the_reference(dag):
    _, targets = dag
    assert unevaluated_ancestors(targets) == reference_ancestors(targets)
    assert unevaluated_ancestors(iter(targets)) == reference_ancestors(targets)


@pytest.mark.parametrize("name", sorted(MODELS))
def test_ancestors_of_recorded_graphs_match_the_reference(name):
    with tf.GradientTape():
        losses = recorded_losses(name, seed=len(name))
        pending = list(context.pending)
        assert unevaluated_ancestors(losses) == reference_ancestors(losses)
        # Partly evaluated: the walk stops at values.
        losses[0].value()
        middle = pending[len(pending) // 2]
        targets = losses[1:] + [middle, 7, None]
        assert unevaluated_ancestors(targets) == reference_ancestors(targets)
        assert unevaluated_ancestors(pending) == reference_ancestors(pending)


def test_a_100000_long_chain_needs_no_recursion():
    node = make_node(0, [])
    nodes = [node]
    for node_id in range(1, 100_000):
        node = make_node(node_id, [node, 2.0])
        nodes.append(node)
    assert unevaluated_ancestors([node]) == nodes
    nodes[50_000].result = "value"
    assert unevaluated_ancestors([node]) == nodes[50_001:]


def test_ancestors_of_bad_input_raise_clean_errors():
    with pytest.raises(TypeError):
        unevaluated_ancestors(5)
    with pytest.raises(TypeError):
        unevaluated_ancestors()
    assert unevaluated_ancestors([1, "x", None]) == []
    odd = make_node(1, [make_node(0, [])])
    with pytest.raises(TypeError):
        odd.inputs = 3   # inputs are a tuple or list, nothing else
    del odd.inputs       # none
    assert unevaluated_ancestors([odd]) == [odd]
    # A deleted result is not None: the node counts as evaluated (Python
    # raised AttributeError reading it).
    gone = make_node(3, [])
    del gone.result
    consumer = make_node(4, [gone])
    assert unevaluated_ancestors([gone, consumer]) == [consumer]


# -- schedulers ---------------------------------------------------------------

def check_schedules(graph):
    assert depths(graph) == reference_depths(graph)
    expected = reference_agenda_schedule(graph)
    assert AgendaScheduler().schedule(graph) == expected
    assert DepthScheduler().schedule(graph) == reference_depth_schedule(graph)
    expected = reference_agenda_schedule(graph, critical=True)
    assert CriticalScheduler().schedule(graph) == expected
    # The nodes agenda runs, each once, after its sources, with nodes of
    # its type.
    done = set()
    for batch in expected:
        assert len({graph.type_of[index] for index in batch}) == 1
        assert all(source in done for index in batch for source in graph.sources[index])
        assert done.isdisjoint(batch)
        done.update(batch)
    assert done == {index for batch in AgendaScheduler().schedule(graph) for index in batch}


@settings(max_examples=500, deadline=None)
@given(random_structures())
def test_schedules_of_random_graphs_match_the_reference(graph):
    check_schedules(graph)


@pytest.mark.parametrize("name", sorted(MODELS))
def test_schedules_of_recorded_graphs_match_the_reference(name):
    with tf.GradientTape():
        losses = recorded_losses(name, seed=len(name), count=6)
        graph = BatchGraph(unevaluated_ancestors(losses))
        check_schedules(graph)


def test_a_deep_chain_schedules_without_recursion():
    count = 100_000
    graph = Structure([0, 1] * (count // 2), [()] + [(i,) for i in range(count - 1)], 2)
    assert depths(graph) == list(range(1, count + 1))
    assert AgendaScheduler().schedule(graph) == [[i] for i in range(count)]


@pytest.mark.parametrize("function", [_native.agenda_schedule, _native.depth_schedule,
                                      _native.critical_schedule])
def test_schedules_of_bad_input_raise_clean_errors(function):
    def call(type_of, sources, type_count=2):
        return function(type_of, sources, type_count)
    assert call([], []) == []
    assert call((0, 1), ((), (0,))) == call([0, 1], [(), [0]])
    with pytest.raises(TypeError):
        function([0], [()])                    # no type count
    with pytest.raises(TypeError):
        call(5, [()])
    with pytest.raises(TypeError):
        call([0], 5)
    with pytest.raises(TypeError):
        call([0.5], [()])
    with pytest.raises(TypeError):
        call([0], [None])
    with pytest.raises(TypeError):
        call([0, 0], [(), ("0",)])
    with pytest.raises(ValueError):
        call([0, 0], [()])                     # lengths differ
    with pytest.raises(ValueError):
        call([2], [()])                        # type out of range
    with pytest.raises(ValueError):
        call([-2], [()])
    with pytest.raises(ValueError):
        call([0], [()], type_count=-1)
    with pytest.raises(ValueError):
        call([0, 0], [(), (2,)])               # no such node
    with pytest.raises(ValueError):
        call([0, 0], [(), (-1,)])
    with pytest.raises(ValueError):
        call([0, 0], [(1,), ()])               # a later node: could be a cycle
    with pytest.raises(ValueError):
        call([0], [(0,)])                      # itself
    with pytest.raises(ValueError):
        call([0, 0], [(), (2 ** 80,)])
    if function is not _native.depth_schedule:   # arrays per type
        with pytest.raises(MemoryError):
            call([0], [()], type_count=2 ** 62)
    with pytest.raises(OverflowError):
        call([0], [()], type_count=2 ** 80)


def test_depths_of_bad_input_raise_clean_errors():
    assert _native.depths([-1, 0, 7], [(), (0,), (1, 0)]) == [0, 1, 2]
    with pytest.raises(TypeError):
        _native.depths([0])
    with pytest.raises(ValueError):
        _native.depths([0, 0], [(), (1,)])
    with pytest.raises(TypeError):
        _native.depths([None], [()])


# -- a closing scope's leftovers ---------------------------------------------------

def test_scope_leftovers_drop_unreferenced_nodes_and_skip_evaluated_and_swallowed():
    held = make_node(1, [])
    dropped_only_here = make_node(2, [held])     # read by nothing: dropped
    evaluated = make_node(3, [held], state=1)
    batched = make_node(4, [held], state=2)
    swallowed = make_node(5, [held])
    swallowed.swallowed = True
    access = VirtualNode(6, ACCESS, (swallowed,), (0,), None, None)
    other_access = VirtualNode(7, ACCESS, (held,), (0,), None, None)
    reader = make_node(8, [dropped_only_here])   # only the list holds it too
    probe = weakref.ref(dropped_only_here)
    recorded = [held, dropped_only_here, evaluated, batched, swallowed, access,
                other_access, reader, "not a node"]
    del dropped_only_here, reader
    keep = [held, evaluated, batched, swallowed, access, other_access]
    left = _native.scope_leftovers(recorded)
    assert left == [held, other_access]
    # (Lists of nodes only: never in a cycle the collector could find.)
    assert not gc.is_tracked(left)
    assert probe() is None   # freed once its only reader was
    assert recorded[1] is None and recorded[7] is None
    swallowed.swallowed = False
    assert _native.scope_leftovers(list(keep)) == [held, swallowed, access, other_access]
    for bad in [(tuple(keep),), (keep, set()), ()]:
        with pytest.raises(TypeError):
            _native.scope_leftovers(*bad)


def test_scope_leftovers_of_a_part_take_it_out_of_the_list():
    """With ``upto``: the leftovers of the first ``upto`` items, as of the
    slice, which leaves the list (a pipelined part of a scope)."""
    held = make_node(1, [])
    only_listed = make_node(2, [held])          # dropped, freed: only the list had it
    evaluated = make_node(3, [held], state=1)
    later = make_node(4, [held])
    probe = weakref.ref(only_listed)
    recorded = [held, only_listed, "a value", evaluated, later]
    del only_listed
    assert _native.scope_leftovers(recorded, 4) == [held]
    assert recorded == [later] and probe() is None
    assert not gc.is_tracked(_native.scope_leftovers([held, later], 1))
    assert _native.scope_leftovers(recorded, 0) == [] and recorded == [later]
    assert _native.scope_leftovers(recorded, 1) == [later] and recorded == []
    for upto, error in [(-1, ValueError), (3, ValueError), (2 ** 70, OverflowError),
                        ("1", TypeError), (1.0, TypeError)]:
        recorded = [held, later]
        with pytest.raises(error):
            _native.scope_leftovers(recorded, upto)
        assert recorded == [held, later]   # (untouched)


@settings(max_examples=50, deadline=None)
@given(random_dags(), st.data())
def test_scope_leftovers_of_a_part_equal_those_of_its_slice(dag, data):
    nodes, _ = dag
    recorded = list(nodes) + ["a value"]
    upto = data.draw(st.integers(0, len(recorded)))
    for node in data.draw(st.lists(st.sampled_from(nodes)) if nodes else st.just([])):
        node.swallowed = True
    expected_rest = recorded[upto:]
    expected = _native.scope_leftovers(recorded[:upto])   # (the nodes stay referenced)
    assert _native.scope_leftovers(recorded, upto) == expected
    assert recorded == expected_rest


def reference_search_roots(targets, required):
    return sorted({node.id: node for node in targets if type(node) is VirtualNode
                   and not node.evaluated
                   and (not node.consumers or node.id in required)}.values(),
                  key=lambda node: node.id)


@settings(max_examples=50, deadline=None)
@given(random_dags(), st.data())
def test_search_roots_match_the_reference(dag, data):
    nodes, targets = dag
    chosen = data.draw(st.lists(st.sampled_from(nodes), max_size=len(nodes))
                       if nodes else st.just([]))
    given_targets = list(targets) + chosen + chosen[:2] + ["a value", 3]
    for node in nodes:
        node.consumers = sum(node is operand for other in nodes for operand in other.inputs)
    required = {node.id for node in chosen[::2]}
    assert _native.search_roots(given_targets, required) == \
        reference_search_roots(given_targets, required)
    with pytest.raises(TypeError):
        _native.search_roots(given_targets, list(required))
    with pytest.raises(TypeError):
        _native.search_roots(5, set())


# -- BatchGraph -----------------------------------------------------------------

class ReferenceGraph:
    """BatchGraph's description of its nodes as the Python before issue 17
    gave it (batcher/graph.py)."""

    def __init__(self, nodes):
        index_of, type_numbers, work_seen = {}, {}, {}
        self.types, self.type_of, self.operands = [], [], []
        self.duplicate_of, self.shared_operand, self.sources = [], [], []
        for index, node in enumerate(nodes):
            if node.entry is ACCESS:
                source = node.inputs[0]
                source_index = index_of.get(source.id, -1)
                if source_index < 0:
                    take_output(node, source)
                else:
                    index_of[node.id] = index
                self.operands.append([(source_index, None, source)])
                self.sources.append(
                    (self.duplicate_of[source_index],) if source_index >= 0 else ())
                self.type_of.append(-1)
                self.duplicate_of.append(index)
                continue
            index_of[node.id] = index
            operands, batching_type, identity, sources = self._describe(node, index_of)
            self.operands.append(operands)
            self.sources.append(sources)
            identity_key = (batching_type, identity)
            if reference_gathers_variable_rows(node):
                identity_key = index
            earlier = work_seen.get(identity_key)
            if earlier is not None:
                self.type_of.append(-1)
                self.duplicate_of.append(earlier)
                continue
            work_seen[identity_key] = index
            node_type = type_numbers.get(batching_type)
            if node_type is None:
                node_type = type_numbers[batching_type] = len(self.types)
                self.types.append(batching_type)
                self.shared_operand.append(tuple(
                    not isinstance(operand, tuple)
                    and reference_is_shared(operand, position in node.entry.index_positions)
                    for position, operand in enumerate(operands)))
            self.type_of.append(node_type)
            self.duplicate_of.append(index)

    def _describe(self, node, index_of):
        operands = []
        parts = []
        identity = []
        sources = ()
        for position, operand in enumerate(node.inputs):
            if type(operand) is VirtualNode:
                operand_index = index_of.get(operand.id, -1)
                pick = None
                if operand.entry is ACCESS and operand_index >= 0:
                    pick = operand.attrs[0]
                    operand = operand.inputs[0]
                    operand_index = index_of[operand.id]
                if operand_index >= 0:
                    operand_index = self.duplicate_of[operand_index]
                    if operand_index not in sources:
                        sources += (operand_index,)
                operands.append((operand_index, pick, operand))
                parts.append(operand.spec if pick is None else operand.spec[pick])
                identity.append((operand_index, pick) if operand_index >= 0
                                else id(operand))
            elif reference_is_number(operand) \
                    and position not in node.entry.index_positions:
                operands.append(operand)
                parts.append((type(operand), operand))
                identity.append(None)
            elif isinstance(operand, tensorflow.Tensor) or is_variable(operand):
                operands.append(operand)
                parts.append(("shared", id(operand)))
                identity.append(None)
            else:
                operands.append(operand)
                parts.append(spec_of_foreign(operand))
                identity.append(graph_module._value_key(operand))
        batching_type = BatchingType(node.entry, node.attrs, tuple(map(type, node.attrs)),
                                     tuple(parts))
        return operands, batching_type, tuple(identity), sources


def reference_gathers_variable_rows(node):
    entry = node.entry
    if entry.family == "pattern":
        return entry.pattern.gathers_variable_rows
    return entry.gathers_from is not None and is_variable(node.inputs[entry.gathers_from])


def reference_is_number(operand):
    """A Python number or NumPy scalar: shared by value (as batcher/graph.py
    decided before issue 17 gave ir/spec.py classify_operand)."""
    return type(operand) in (int, float, bool) or isinstance(operand, np.generic)


def reference_is_shared(operand, is_index):
    if reference_is_number(operand):
        return not is_index
    return isinstance(operand, tensorflow.Tensor) or is_variable(operand)


def assert_same_description(nodes):
    graph, reference = BatchGraph(nodes), ReferenceGraph(nodes)
    for field in ("type_of", "duplicate_of", "types", "shared_operand"):
        assert getattr(graph, field) == getattr(reference, field), field
    assert list(graph.sources) == reference.sources
    assert graph.duplicates == sum(
        canonical != index for index, canonical in enumerate(reference.duplicate_of))
    assert len(graph.operands) == len(reference.operands)
    for node_operands, expected in zip(graph.operands, reference.operands):
        assert len(node_operands) == len(expected)
        for operand, wanted in zip(node_operands, expected):
            if isinstance(wanted, tuple):
                assert isinstance(operand, NodeOperand)
                assert (operand.index, operand.pick) == wanted[:2]
                assert operand.node is wanted[2]
            else:
                assert operand is wanted
    return graph


@pytest.mark.parametrize("name", sorted(MODELS))
def test_descriptions_of_recorded_graphs_match_the_reference(name):
    with tf.GradientTape():
        losses = recorded_losses(name, seed=len(name), count=6)
        assert_same_description(unevaluated_ancestors(losses))


def test_descriptions_of_pattern_graphs_match_the_reference(parameters):
    """Subgraph granularity: pattern entries, joined multi-output patterns,
    and access nodes of ops evaluated earlier."""
    parameters(granularity="subgraph", collect=1, fuse=True)
    rng = np.random.default_rng(5)
    model = MODELS["tree_lstm"](rng)
    for _ in range(2):
        with tf.GradientTape():
            losses = [model.loss(tf, example) for example in model.random_examples(rng, 5)]
            nodes = unevaluated_ancestors(losses)
            assert_same_description(nodes)
    assert tf.stats()["pattern_matches"] > 0


def test_foreign_operands_and_duplicates_match_the_reference():
    x = tensorflow.constant(np.ones((2, 3), np.float32))
    w = tensorflow.Variable(np.ones((3, 3), np.float32))
    with tf.GradientTape():
        a = tf.matmul(x, w)
        # Lists of ints take a native fast path (their items are their
        # value); lists of floats and nested lists do not.
        ints, same_ints, other_ints = a + [1, 2, 3], a + [1, 2, 3], a + [1, 2, 4]
        nodes = [a, tf.matmul(x, w), a * 0.5, a * np.float32(0.5), a * 0.5,
                 tf.gather(a, [1, 0]), tf.gather(a, [1, 0]), tf.gather(a, np.array([0])),
                 tf.nn.embedding_lookup(w, [1]), tf.nn.embedding_lookup(w, [1]),
                 a + x, tf.split(a, 3, axis=1)[1] * 2.0,
                 tf.gather(a, [0, 1]), ints, same_ints, other_ints,
                 a + [1.0, 2.0, 3.0], a + [1.0, 2.0, 3.0], a + [[1, 2, 3], [4, 5, 6]]]
        nodes = unevaluated_ancestors(nodes)
        graph = assert_same_description(nodes)
        assert -1 in graph.type_of
        index = {node.id: number for number, node in enumerate(nodes)}
        assert graph.duplicate_of[index[same_ints.id]] == index[ints.id]
        assert graph.duplicate_of[index[other_ints.id]] == index[other_ints.id]


def test_describe_graph_bad_input_raises_clean_errors():
    helpers = (ACCESS, graph_module._entry_info, graph_module._kind_of,
               spec_of_foreign, graph_module._value_key, take_output)
    with pytest.raises(TypeError):
        _native.describe_graph((), *helpers)           # not a list
    with pytest.raises(TypeError):
        _native.describe_graph([1], *helpers)
    with pytest.raises(TypeError):
        _native.describe_graph([])
    empty = _native.describe_graph([], *helpers)
    assert [list(part) for part in empty[:6]] == [[]] * 6 and empty[6] == 0
    odd = make_node(1, [])
    odd.entry = tf.tanh(tensorflow.constant([1.0])).entry
    odd.attrs = [2]                                    # not a tuple
    with pytest.raises(TypeError):
        _native.describe_graph([odd], *helpers)
    del odd.entry
    with pytest.raises(TypeError):
        _native.describe_graph([odd], *helpers)
    with pytest.raises(AttributeError):                # entry_info's error
        _native.describe_graph([make_node(2, [object()])], *helpers)
    entry = tf.tanh(tensorflow.constant([1.0])).entry
    node = VirtualNode(3, entry, (object(),), (), None, None)
    bad_kind = helpers[:2] + (lambda operand: 9,) + helpers[3:]
    with pytest.raises(ValueError):
        _native.describe_graph([node], *bad_kind)


def test_operand_table_gives_python_the_same_lists_every_time():
    """describe_graph keeps operands and sources as C arrays; Python's
    ``operands[i]`` and ``sources[i]`` are made on request, once."""
    x = tensorflow.constant(np.ones((2, 3), np.float32))
    with tf.GradientTape():
        a = tf.tanh(x)
        b, c = tf.split(a * 2.0, [1, 2], axis=1)
        nodes = unevaluated_ancestors([b + c[:, :1], a * 0.5])
        graph = BatchGraph(nodes)
    assert len(graph.operands) == len(graph.sources) == len(nodes)
    for index in range(len(nodes)):
        assert graph.operands[index] is graph.operands[index]
        assert graph.sources[index] is graph.sources[index]
        assert graph.sources[index] == tuple(sorted(set(graph.sources[index]),
                                                    key=graph.sources[index].index))
    picks = [operand.pick for node_operands in graph.operands for operand in node_operands
             if isinstance(operand, NodeOperand)]
    assert 0 in picks and 1 in picks and None in picks
    assert any(operand is x for node_operands in graph.operands for operand in node_operands)
    for sequence in (graph.operands, graph.sources):
        with pytest.raises(IndexError):
            sequence[len(nodes)]
        assert len(list(sequence)) == len(nodes)
    for native_type in (type(graph.operands), type(graph.sources)):
        with pytest.raises(TypeError):
            native_type()
