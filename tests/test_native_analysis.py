"""The batching analysis in C (native/analysis.c) against small pure-Python
references kept here (the package has one implementation, the native one):
random DAGs, graphs recorded from the example models, and bad input, which
must raise clean exceptions."""

import random

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import subgraphjit as tf
from subgraphjit import VirtualNode, _native
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

