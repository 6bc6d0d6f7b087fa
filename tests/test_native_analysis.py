"""The batching analysis in C (native/analysis.c) against small pure-Python
references kept here (the package has one implementation, the native one):
random DAGs, graphs recorded from the example models, and bad input, which
must raise clean exceptions."""


import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import subgraphjit as tf
from subgraphjit import VirtualNode, _native
from subgraphjit.batch.graph import BatchGraph
from subgraphjit.batch.schedulers import (AgendaScheduler, DepthScheduler,
                                          depths, schedule)
from subgraphjit.context import context
from subgraphjit.evaluate import unevaluated_ancestors
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
                    and operand.batch is None and operand.id not in found:
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


def reference_agenda_schedule(graph):
    """DyNet's rule as the Python scheduler had it: ties go to the first
    type in the ready dict's insertion order."""
    type_of, depth = graph.type_of, reference_depths(graph)
    remaining = [0] * len(graph.signatures)
    depth_sum = [0] * len(graph.signatures)
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
        chosen = min(ready, key=lambda t: depth_sum[t] / remaining[t])
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


def step_by_step(graph, scheduler):
    """A schedule through init / next_batch / post_process (the FSM's way)."""
    scheduler.init(graph)
    batches = []
    while (batch := scheduler.next_batch()) is not None:
        scheduler.post_process(batch)
        batches.append(batch)
    return batches


# -- helpers ----------------------------------------------------------------

def make_node(node_id, inputs, state=0):
    """A bare node: ``state`` 0 unevaluated, 1 with a result, 2 in a batch."""
    node = VirtualNode(node_id, None, tuple(inputs), (), None, None)
    if state == 1:
        node.result = "value"
    elif state == 2:
        node.batch, node.batch_row = "batch", 0
    return node


@st.composite
def random_dags(draw):
    """Nodes with operands among earlier nodes and foreign values, some
    evaluated, ids a random permutation (the result is sorted by id, not by
    position), and targets mixing nodes with other values."""
    count = draw(st.integers(0, 40))
    ids = draw(st.permutations(range(1000, 1000 + count)))
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
        self.signatures = [None] * type_count

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
    odd = make_node(1, [])
    odd.inputs = 3   # not a tuple or list
    with pytest.raises(TypeError):
        unevaluated_ancestors([make_node(2, [odd])])
    del odd.inputs
    with pytest.raises(TypeError):
        unevaluated_ancestors([odd])
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
    assert schedule(graph, AgendaScheduler()) == expected
    assert step_by_step(graph, AgendaScheduler()) == expected
    expected = reference_depth_schedule(graph)
    assert schedule(graph, DepthScheduler()) == expected
    assert step_by_step(graph, DepthScheduler()) == expected


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
    assert schedule(graph, AgendaScheduler()) == [[i] for i in range(count)]


@pytest.mark.parametrize("function", [_native.agenda_schedule, _native.depth_schedule])
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
    if function is _native.agenda_schedule:   # arrays per type
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
