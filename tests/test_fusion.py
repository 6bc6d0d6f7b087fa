"""Joined patterns: a pattern reading a multi-output pattern's outputs runs
with it in one compiled call, only where that delays nothing, with eager
TensorFlow's values and gradients."""

import numpy as np
import pytest
import tensorflow

import subgraphjit as tf
from experiments.example_models import MODELS
from test_patterns import assert_matches_eager
from gradients import assert_loss_and_gradients_equal


def run_twice(model, rng, count=4):
    """Collect on one minibatch, then replace (and join) in another; the
    statistics of the second."""
    assert_matches_eager(model, model.random_examples(rng, count))
    tf.reset_stats()
    assert_matches_eager(model, model.random_examples(rng, count))
    return tf.stats()


@pytest.mark.parametrize("model_name", ["tree_lstm", "bilstm_tagger"])
def test_a_cell_cut_in_two_runs_as_one_call(model_name, parameters):
    """The Tree-LSTM's cell is cut at its gate split (the parent reads the
    output gate) and at its memory: joined, it is one launch per level."""
    launches = {}
    for fuse in (False, True):
        parameters(granularity="subgraph", collect=1, fuse=fuse)
        rng = np.random.default_rng(3)
        stats = run_twice(MODELS[model_name](rng), rng)
        launches[fuse] = stats["batches"]
        assert (stats["pattern_fusions"] > 0) == fuse
    assert launches[True] < launches[False]
    joined = [pattern for pattern in tf.patterns() if "_then_" in pattern.function_name]
    assert joined and all("return (*v, w)" in pattern.source for pattern in joined)


def test_a_join_that_would_wait_is_not_made(parameters):
    """The consumer also reads ``late``, which the producer does not: joined,
    the producer would wait for it, so the two stay apart."""
    parameters(granularity="subgraph", collect=1, depth=4, scheduler="agenda")
    weight = tensorflow.Variable(np.linspace(-1, 1, 12, dtype=np.float32).reshape(3, 4))
    values = np.random.default_rng(0).standard_normal((3, 1, 3)).astype(np.float32)

    def instances():
        results = []
        for value in values:
            late = tf.identity(value[:, :2])
            for _ in range(4):  # a chain the producer does not wait for
                late = tf.exp(tf.tanh(late))
            gate, other = tf.split(tf.matmul(tf.identity(value), weight), 2, axis=1)
            results.append(tf.sigmoid(gate) * late + other)
        return results

    def expected(value):
        late = value[:, :2]
        for _ in range(4):
            late = np.exp(np.tanh(late))
        gate, other = np.split(value @ weight.numpy(), 2, axis=1)
        return 1 / (1 + np.exp(-gate)) * late + other

    tf.build(instances())
    tf.reset_stats()
    results = tf.build(instances())
    assert tf.stats()["pattern_matches"] > 0
    assert tf.stats()["pattern_fusions"] == 0
    for result, value in zip(results, values):
        np.testing.assert_allclose(result.numpy(), expected(value), rtol=1e-5)


def cell(o, c, weight):
    """A Tree-LSTM cell with one child: the gates' pattern reads the child's
    ``o`` and ``c``, the memory's pattern the gates and ``c`` again."""
    h = tf.sigmoid(o) * tf.tanh(c)
    i, o, u = tf.split(tf.matmul(h, weight), 3, axis=1)
    return o, tf.sigmoid(i) * tf.tanh(u) + c


def numpy_cell(o, c, weight):
    def sigmoid(x):
        return 1 / (1 + np.exp(-x))

    i, o, u = np.split(sigmoid(o) * np.tanh(c) @ weight, 3, axis=1)
    return o, sigmoid(i) * np.tanh(u) + c


@pytest.mark.parametrize("scheduler", ["none", "agenda"])
def test_every_value_of_a_joined_pair_is_there_when_asked(parameters, scheduler):
    """In a batching scope nothing is required: the producer's outputs, the
    consumer's result and the nodes inside either are all right when read."""
    parameters(granularity="subgraph", collect=1, depth=4, scheduler=scheduler)
    weight = tensorflow.Variable(
        np.random.default_rng(1).standard_normal((2, 6)).astype(np.float32))
    starts = np.random.default_rng(2).standard_normal((3, 1, 2)).astype(np.float32)
    for _ in range(2):
        with tf.batching():
            chains = []
            for start in starts:
                o, c = cell(tf.identity(start), tf.identity(start), weight)
                steps = [(o, c)]
                for _ in range(3):
                    o, c = cell(o, c, weight)
                    steps.append((o, c))
                chains.append(steps)
    assert tf.stats()["pattern_fusions"] > 0
    # A joined consumer (a cell's memory) that a later cell reads left the
    # evaluation, to take its output when read (below); the last is a root.
    for steps in chains:
        assert all(c.swallowed for _, c in steps[:-1])
        assert steps[-1][1].evaluated and not steps[-1][1].swallowed
    for start, steps in zip(starts, chains):
        o, c = start, start
        for node_o, node_c in steps:
            o, c = numpy_cell(o, c, weight.numpy())
            np.testing.assert_allclose(node_o.numpy(), o, rtol=1e-5, atol=1e-6)
            np.testing.assert_allclose(node_c.numpy(), c, rtol=1e-5, atol=1e-6)


def test_a_joined_pair_without_a_batch_rule_runs_per_instance(parameters):
    """A cumsum in the consumer (outside the op table, recorded through
    dispatch): the pair runs instance by instance as its compiled function,
    with the right values and gradients."""
    parameters(granularity="subgraph", collect=1, depth=5, scheduler="agenda")
    weight = tensorflow.Variable(
        np.random.default_rng(4).standard_normal((2, 4)).astype(np.float32))
    mix = tensorflow.Variable(np.eye(2, dtype=np.float32) * 0.5)
    values = np.random.default_rng(5).standard_normal((3, 1, 2)).astype(np.float32)

    def losses(module):
        with module.GradientTape() as tape:
            results = []
            for value in values:
                gate, other = module.split(
                    module.matmul(module.identity(value), weight), 2, axis=1)
                results.append(module.reduce_sum(
                    tensorflow.math.cumsum(module.matmul(module.sigmoid(gate), mix),
                                           axis=1) * other))
            if hasattr(module, "build"):  # each result a root of its own
                results = module.build(results)
            loss = tensorflow.add_n(results)
        return loss, tape.gradient(loss, [weight, mix])

    losses(tf)
    tf.reset_stats()
    loss, gradients = losses(tf)
    expected_loss, expected_gradients = losses(tensorflow)
    stats = tf.stats()
    assert stats["pattern_fusions"] > 0
    assert any("+" in reason and "cumsum has no batch rule" in reason
               for reason in stats["unbatched"]), stats["unbatched"]
    assert_loss_and_gradients_equal((loss, gradients), (expected_loss, expected_gradients))
