"""A user's ``tf.function`` called with nodes records its body
(subgraphjit/dropin/functions.py): differential tests against eager
TensorFlow's traced calls (values, gradients and their types), methods,
keyword and nested arguments, ``input_signature``, and every call that
stays TensorFlow's own."""

import os

import numpy as np
import pytest
import tensorflow

import subgraphjit as tf
from subgraphjit import VirtualNode
from gradients import assert_gradient_equal
import recorded_trees
from recorded_trees import forced, random_tree

HIDDEN = 4


class Cells:
    """A leaf and an internal cell as ``tf.function`` methods, the weights
    read inside (captured variables), the embedding looked up outside."""

    def __init__(self, module, rng):
        self.embedding = tensorflow.Variable(rng.standard_normal((9, HIDDEN)), dtype=tf.float32)
        self.weight = tensorflow.Variable(rng.standard_normal((2 * HIDDEN, HIDDEN)) * 0.5,
                                          dtype=tf.float32)
        self.bias = tensorflow.Variable(rng.standard_normal((HIDDEN,)), dtype=tf.float32)
        self.module = module
        self.traces = 0

    @tf.function
    def combine(self, children, scale=1.0):
        self.traces += 1   # Python: per trace in TensorFlow, per call when recording
        left, right = children
        return tf.tanh(tf.matmul(tf.concat([left, right], 1), self.weight) + self.bias) * scale

    def encode(self, tree):
        if isinstance(tree, int):
            return tf.nn.embedding_lookup(self.embedding, [tree])
        return self.combine([self.encode(tree[0]), self.encode(tree[1])], scale=0.5)


def loss_and_gradients(cells, trees, lazy):
    return recorded_trees.loss_and_gradients(
        cells.encode, trees, lambda: [cells.embedding, cells.weight, cells.bias], lazy)


@pytest.mark.parametrize("granularity", ["op", "subgraph"])
def test_function_cells_batch_and_equal_eager(granularity):
    previous = tf.get_parameter("granularity"), tf.get_parameter("collect")
    tf.set_parameter("granularity", granularity)
    tf.set_parameter("collect", 1)
    try:
        rng = np.random.default_rng(7)
        cells = Cells(tf, rng)
        for _ in range(3):
            trees = [random_tree(rng, 4, 9, 0.3) for _ in range(6)]
            tf.set_parameter("mode", "eager")
            try:
                expected, expected_gradients = loss_and_gradients(cells, trees, False)
            finally:
                tf.set_parameter("mode", "lazy")
            traced = cells.traces
            tf.reset_stats()
            loss, gradients = loss_and_gradients(cells, trees, True)
            np.testing.assert_allclose(float(loss), float(expected), rtol=1e-5)
            for got, want in zip(gradients, expected_gradients, strict=True):
                assert_gradient_equal(got, want, atol=1e-5)   # IndexedSlices for the lookup
            calls = sum(str(tree).count("(") for tree in trees)
            # The body ran once per call, recorded; its ops batched across calls.
            assert cells.traces - traced == calls
            assert tf.stats()["batches"] < tf.stats()["nodes_evaluated"] / 2
    finally:
        tf.set_parameter("granularity", previous[0])
        tf.set_parameter("collect", previous[1])


def test_a_function_stays_tensorflows_own():
    @tf.function
    def double(x):
        return x * 2.0

    assert isinstance(double, tensorflow.types.experimental.PolymorphicFunction)
    assert double.python_function(3.0) == 6.0
    concrete = double.get_concrete_function(tf.TensorSpec([2], tf.float32))
    np.testing.assert_allclose(concrete(tf.constant([1.0, 2.0])).numpy(), [2.0, 4.0])
    # Tensors (no node): TensorFlow's traced call, an eager tensor back.
    result = double(tf.constant([1.0]))
    assert type(result) is not VirtualNode and result.numpy().tolist() == [2.0]
    # Options pass through, as does the decorator form.
    assert tf.function(jit_compile=False)(lambda x: x + 1.0)(tf.constant(1.0)).numpy() == 2.0
    # Given a node in eager mode (the debugging twin): TensorFlow's call.
    tf.set_parameter("mode", "eager")
    try:
        assert type(double(tf.tanh(tf.constant([0.5])))) is not VirtualNode
    finally:
        tf.set_parameter("mode", "lazy")


def test_inside_another_trace_the_function_is_traced_as_tensorflow_does():
    @tf.function
    def inner(x):
        return tf.tanh(x) + 1.0

    @tf.function
    def outer(x):
        return inner(x) * 2.0

    np.testing.assert_allclose(outer(tf.constant([0.25])).numpy(),
                               (np.tanh(0.25) + 1.0) * 2.0, rtol=1e-6)


def test_input_signature_checks_nodes_as_tensorflow_checks_tensors():
    @tf.function(input_signature=[tf.TensorSpec([None, 3], tf.float32)])
    def total(x):
        return tf.reduce_sum(x, axis=1)

    tf.reset_stats()
    node = tf.tanh(tf.ones([2, 3]))
    result = total(node)
    assert type(result) is VirtualNode and forced() == 0
    np.testing.assert_allclose(result.numpy(), np.tanh(1.0) * 3 * np.ones(2), rtol=1e-6)
    # A node the signature refuses: TensorFlow's own call, and its own error.
    wrong = tf.tanh(tf.ones([2, 4]))
    with pytest.raises((TypeError, ValueError)):
        total(wrong)
    with pytest.raises((TypeError, ValueError)):
        total(tensorflow.ones([2, 4]))


def test_python_control_flow_on_a_value_reads_it_at_the_users_line():
    @tf.function
    def clipped(x):
        if tf.reduce_max(x) > 0.5:   # AutoGraph would build a tf.cond
            return x * 0.5
        return x

    tf.reset_stats()
    big, small = clipped(tf.tanh(tf.constant([2.0]))), clipped(tf.tanh(tf.constant([0.1])))
    np.testing.assert_allclose(big.numpy(), np.tanh([2.0]) * 0.5, rtol=1e-6)
    np.testing.assert_allclose(small.numpy(), np.tanh([0.1]), rtol=1e-6)
    line = next(number for number, text in enumerate(open(__file__).read().splitlines(), 1)
                if text.endswith("# AutoGraph would build a tf.cond"))
    sites = {key: count for key, count in tf.stats()["forced_evaluations"].items()
             if key.startswith("if (")}
    shown = os.path.relpath(__file__)
    shown = __file__ if shown.startswith(os.pardir) else shown
    assert sites == {f"if ({shown}:{line})": 2}, tf.stats()["forced_evaluations"]
