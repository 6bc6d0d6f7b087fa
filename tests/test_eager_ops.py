"""The executor's eager ops (batcher/eager_ops.py) against the TensorFlow
calls they stand for, on random tables: values, gradients and gradient
types, eagerly (with and without a tape) and inside a tf.function."""

import numpy as np
import pytest
import tensorflow as tf
from hypothesis import given, settings, strategies as st

from subgraphjit.batcher import eager_ops

tables = st.tuples(st.integers(1, 6), st.integers(0, 3), st.integers(0, 2**31 - 1))


def _table(rows, width, seed):
    shape = (rows, width) if width else (rows,)
    return tf.constant(np.random.default_rng(seed).standard_normal(shape), tf.float32)


def _both(ours, theirs, table):
    """(value, gradient) of ``ours`` and ``theirs`` on ``table``, under a tape
    whose loss weighs every element differently."""
    results = []
    for function in (ours, theirs):
        with tf.GradientTape() as tape:
            tape.watch(table)
            value = function(table)
            weights = tf.reshape(tf.range(tf.size(value), dtype=tf.float32) + 1.0,
                                 tf.shape(value))
            loss = tf.reduce_sum(value * weights)
        results.append((value, tape.gradient(loss, table)))
    return results


def _assert_same(results):
    (value, gradient), (expected, expected_gradient) = results
    np.testing.assert_allclose(value.numpy(), expected.numpy(), rtol=1e-6)
    assert value.dtype == expected.dtype and value.shape == expected.shape
    assert type(gradient) is type(expected_gradient)
    np.testing.assert_allclose(tf.convert_to_tensor(gradient).numpy(),
                               tf.convert_to_tensor(expected_gradient).numpy(), rtol=1e-6)


@settings(max_examples=25, deadline=None)
@given(tables, st.data())
def test_rows_row_stack_concat_and_reshape_are_the_ops_they_replace(table, data):
    table = _table(*table)
    rows = table.shape[0]
    start = data.draw(st.integers(0, rows))
    stop = data.draw(st.integers(start, rows))
    number = data.draw(st.integers(0, rows - 1))
    _assert_same(_both(lambda t: eager_ops.rows(t, start, stop),
                       lambda t: t[start:stop], table))
    _assert_same(_both(lambda t: eager_ops.row(t, number),
                       lambda t: t[number], table))
    _assert_same(_both(lambda t: eager_ops.stack([t, 2 * t, t[::-1]]),
                       lambda t: tf.stack([t, 2 * t, t[::-1]]), table))
    _assert_same(_both(lambda t: eager_ops.concat([t, 2 * t, t[::-1]]),
                       lambda t: tf.concat([t, 2 * t, t[::-1]], 0), table))
    _assert_same(_both(lambda t: eager_ops.reshape(t, (-1,)),
                       lambda t: tf.reshape(t, (-1,)), table))
    np.testing.assert_array_equal(eager_ops.row_numbers(start, stop).numpy(),
                                  tf.range(start, stop).numpy())
    for dtype in (tf.float32, tf.float64, tf.int32, tf.bfloat16):
        zeros, expected = eager_ops.zeros((start, stop), dtype), tf.zeros((start, stop), dtype)
        assert zeros.dtype == expected.dtype and zeros.shape == expected.shape
        np.testing.assert_array_equal(zeros.numpy(), expected.numpy())


@settings(max_examples=25, deadline=None)
@given(tables, st.data())
def test_gather_rows_gives_a_dense_gradient_with_or_without_a_tape(table, data):
    table = _table(*table)
    picked = data.draw(st.lists(st.integers(0, table.shape[0] - 1), min_size=1, max_size=8))
    indices = tf.constant(picked, tf.int32)
    (value, gradient), (expected, sparse) = _both(
        lambda t: eager_ops.gather_rows(t, indices), lambda t: tf.gather(t, indices), table)
    np.testing.assert_array_equal(value.numpy(), expected.numpy())
    # tf.gather's gradient is an IndexedSlices; gather_rows sums it densely.
    assert isinstance(sparse, tf.IndexedSlices) and isinstance(gradient, tf.Tensor)
    np.testing.assert_allclose(gradient.numpy(), tf.convert_to_tensor(sparse).numpy(),
                               rtol=1e-6)
    # No tape: the gather alone, the same value.
    np.testing.assert_array_equal(eager_ops.gather_rows(table, indices).numpy(),
                                  expected.numpy())


def test_gather_rows_inside_a_function_and_a_persistent_tape():
    table = tf.Variable(np.arange(12, dtype=np.float32).reshape(4, 3))
    indices = tf.constant([3, 0, 3], tf.int32)

    @tf.function
    def loss():
        return tf.reduce_sum(eager_ops.gather_rows(table * 1.0, indices) ** 2)

    with tf.GradientTape(persistent=True) as tape:
        traced = loss()
        eager = tf.reduce_sum(eager_ops.gather_rows(table * 1.0, indices) ** 2)
    expected = np.zeros((4, 3), np.float32)
    for i in [3, 0, 3]:
        expected[i] += 2 * table.numpy()[i]
    for value in (traced, eager):
        assert float(value) == pytest.approx(float(np.sum(table.numpy()[[3, 0, 3]] ** 2)))
        gradient = tape.gradient(value, table)
        assert isinstance(gradient, tf.Tensor)
        np.testing.assert_allclose(gradient.numpy(), expected)


def test_the_graph_mode_fallbacks_trace():
    @tf.function
    def run(table):
        return (eager_ops.rows(table, 1, 3), eager_ops.row(table, 2),
                eager_ops.reshape(table, (-1,)), eager_ops.row_numbers(0, 2),
                eager_ops.concat([table, table]), eager_ops.zeros((1, 3), table.dtype))

    table = tf.reshape(tf.range(12.0), (4, 3))
    slice_, row, flat, numbers, twice, zeros = run(table)
    np.testing.assert_array_equal(zeros.numpy(), np.zeros((1, 3)))
    np.testing.assert_array_equal(twice.numpy(), np.concatenate([table.numpy()] * 2))
    np.testing.assert_array_equal(slice_.numpy(), table.numpy()[1:3])
    np.testing.assert_array_equal(row.numpy(), table.numpy()[2])
    np.testing.assert_array_equal(flat.numpy(), np.arange(12.0))
    np.testing.assert_array_equal(numbers.numpy(), [0, 1])
