"""The eager fast paths (dropin/fast.py) against TensorFlow's own
functions, on random inputs: values, dtypes and shapes, and the gradients
of every operand and variable with their types (an embedding's gradient an
IndexedSlices); the calls each fast path must leave to TensorFlow's
function; and the wrapper taking it only where nothing records."""

import contextlib
import linecache

import numpy as np
import pytest
import tensorflow as tf
from hypothesis import given, settings, strategies as st

import subgraphjit
from subgraphjit.dropin.fast import FAST
from subgraphjit.ir.table import ALL_ENTRIES
from gradients import assert_gradient_equal

seeds = st.integers(0, 2**31 - 1)


@contextlib.contextmanager
def eager_mode():
    """Nothing records: every wrapper passes its call on.  (A context, not
    a fixture: hypothesis runs a test's examples in one fixture.)"""
    subgraphjit.set_parameter("mode", "eager")
    try:
        yield
    finally:
        subgraphjit.set_parameter("mode", "lazy")


def _normal(rng, shape, dtype=tf.float32):
    return tf.constant(rng.standard_normal(shape), dtype)


def _run(function, operands):
    """(result, gradient of a weighted sum of it per operand) under a tape."""
    with tf.GradientTape(persistent=True) as tape:
        for operand in operands:
            if isinstance(operand, tf.Tensor) and operand.dtype.is_floating:
                tape.watch(operand)
        result = function()
        weights = tf.reshape(tf.range(tf.size(result), dtype=result.dtype) + 1.0,
                             tf.shape(result))
        loss = tf.reduce_sum(result * weights)
    return result, [tape.gradient(loss, operand) for operand in operands]


def assert_same_as_tensorflow(ours, theirs, operands):
    """``ours`` (a wrapper, with nothing recording) as ``theirs``."""
    with eager_mode():
        result, gradients = _run(ours, operands)
    expected, expected_gradients = _run(theirs, operands)
    assert type(result) is type(expected)
    assert result.dtype == expected.dtype and result.shape == expected.shape
    np.testing.assert_allclose(result.numpy(), expected.numpy(), rtol=1e-6, atol=1e-6)
    for got, want in zip(gradients, expected_gradients):
        assert_gradient_equal(got, want)


def _taken(name, *arguments):
    """The fast path of ``name`` applies to these arguments."""
    return FAST[name](*arguments) is not NotImplemented


def test_every_fast_path_is_installed_in_its_wrapper():
    """A fast path whose parameters do not match TensorFlow's function (a
    TensorFlow of another signature) would be left out silently."""
    for name in FAST:
        source = "".join(linecache.getlines(f"<subgraphjit wrapper {name}>"))
        assert "_fast(" in source, name


@settings(max_examples=15, deadline=None)
@given(seeds, st.booleans(), st.booleans(), st.sampled_from(["tensor", "a", "b", "both"]))
def test_matmul(seed, transpose_a, transpose_b, variables):
    rng = np.random.default_rng(seed)
    m, k, n = rng.integers(1, 5, size=3)
    a = _normal(rng, (k, m) if transpose_a else (m, k))
    b = _normal(rng, (n, k) if transpose_b else (k, n))
    if variables in ("a", "both"):
        a = tf.Variable(a)
    if variables in ("b", "both"):
        b = tf.Variable(b)
    assert _taken("linalg.matmul", a, b, transpose_a, transpose_b,
                  False, False, False, False, None, False, False)
    assert_same_as_tensorflow(
        lambda: subgraphjit.matmul(a, b, transpose_a=transpose_a, transpose_b=transpose_b),
        lambda: tf.matmul(a, b, transpose_a=transpose_a, transpose_b=transpose_b), [a, b])


@settings(max_examples=15, deadline=None)
@given(seeds, st.sampled_from([None, 0, -1, (0, 1), [1]]), st.sampled_from([False, True, None]),
       st.sampled_from(["reduce_sum", "reduce_mean"]))
def test_reductions(seed, axis, keepdims, op):
    rng = np.random.default_rng(seed)
    x = _normal(rng, tuple(rng.integers(1, 4, size=2)))
    assert _taken(f"math.{op}", x, axis, keepdims)
    assert_same_as_tensorflow(lambda: getattr(subgraphjit, op)(x, axis, keepdims),
                              lambda: getattr(tf, op)(x, axis, keepdims), [x])


@settings(max_examples=10, deadline=None)
@given(seeds, st.integers(2, 4), st.sampled_from([0, 1, -1]))
def test_add_n_concat_and_sigmoid(seed, count, axis):
    rng = np.random.default_rng(seed)
    shape = tuple(rng.integers(1, 4, size=2))
    values = [_normal(rng, shape) for _ in range(count)]
    assert _taken("math.add_n", values) and _taken("concat", values, axis)
    assert _taken("math.sigmoid", values[0])
    assert_same_as_tensorflow(lambda: subgraphjit.add_n(values), lambda: tf.add_n(values),
                              values)
    assert_same_as_tensorflow(lambda: subgraphjit.concat(values, axis),
                              lambda: tf.concat(values, axis), values)
    assert_same_as_tensorflow(lambda: subgraphjit.sigmoid(values[0]),
                              lambda: tf.sigmoid(values[0]), values[:1])


@pytest.mark.parametrize("dtype", [tf.float32, tf.float64, tf.int32, tf.int64])
@pytest.mark.parametrize("shape", [(1, 1), [2, 3, 0], (), [4]])
def test_zeros_and_ones(dtype, shape):
    for name in ("zeros", "ones"):
        assert _taken(name, shape, dtype, None)
        with eager_mode():
            got = getattr(subgraphjit, name)(shape, dtype)
        want = getattr(tf, name)(shape, dtype)
        assert got.dtype == want.dtype and got.shape == want.shape
        assert got.device == want.device
        np.testing.assert_array_equal(got.numpy(), want.numpy())
    # Each call is a tensor of its own: a tape watching one sees no other.
    with eager_mode():
        first, second = subgraphjit.zeros((1, 1)), subgraphjit.zeros((1, 1))
    with tf.GradientTape() as tape:
        tape.watch(first)
        loss = tf.reduce_sum(second * 2.0)
    assert first is not second and tape.gradient(loss, first) is None


@settings(max_examples=10, deadline=None)
@given(seeds, st.sampled_from(["list", "int32", "int64"]))
def test_embedding_lookup_gives_the_same_indexed_slices(seed, ids_kind):
    rng = np.random.default_rng(seed)
    table = tf.Variable(_normal(rng, (7, 3)))
    rows = rng.integers(0, 7, size=int(rng.integers(1, 6))).tolist()   # repeats too
    ids = rows if ids_kind == "list" else tf.constant(rows, getattr(tf, ids_kind))
    assert _taken("nn.embedding_lookup", table, ids, None)
    assert_same_as_tensorflow(lambda: subgraphjit.nn.embedding_lookup(table, ids),
                              lambda: tf.nn.embedding_lookup(table, ids), [table])


@settings(max_examples=10, deadline=None)
@given(seeds, st.sampled_from(["list", "int32", "int64"]), st.sampled_from(["float32", "float64"]))
def test_sparse_cross_entropy(seed, labels_kind, dtype):
    rng = np.random.default_rng(seed)
    rows, classes = (int(size) for size in rng.integers(1, 5, size=2))
    logits = _normal(rng, (rows, classes), getattr(tf, dtype))
    labels = rng.integers(0, classes, size=rows).tolist()
    if labels_kind != "list":
        labels = tf.constant(labels, getattr(tf, labels_kind))
    assert _taken("nn.sparse_softmax_cross_entropy_with_logits", labels, logits)
    assert_same_as_tensorflow(
        lambda: subgraphjit.nn.sparse_softmax_cross_entropy_with_logits(labels=labels,
                                                                        logits=logits),
        lambda: tf.nn.sparse_softmax_cross_entropy_with_logits(labels=labels, logits=logits),
        [logits])


def test_what_the_fast_paths_leave_to_tensorflow():
    """Calls outside the common case take TensorFlow's function, whatever
    they give (a result, or TensorFlow's own error)."""
    x, ints = tf.ones((2, 2)), tf.ones((2, 2), tf.int32)
    left = [
        ("linalg.matmul", (x, x, False, False, True, False, False, False, None, False, False)),
        ("linalg.matmul", (tf.ones((2, 2, 2)), x, False, False, False, False, False, False,
                           None, False, False)),
        ("linalg.matmul", (x, tf.ones((2, 2), tf.float64), False, False, False, False, False,
                           False, None, False, False)),
        ("linalg.matmul", ([[1.0]], [[2.0]], False, False, False, False, False, False, None,
                           False, False)),
        ("linalg.matmul", (x, tf.Variable(x, shape=tf.TensorShape(None)), False, False, False,
                           False, False, False, None, False, False)),
        ("math.reduce_sum", (ints, None, False)),
        ("math.reduce_sum", (tf.constant(3.0), None, False)),
        ("math.add_n", ([x],)),
        ("concat", ([x, x], tf.constant(0))),
        ("zeros", ((2, -1), tf.float32, None)),
        ("zeros", ((2,), tf.bool, None)),
        ("zeros", (x, tf.float32, None)),
        ("nn.embedding_lookup", (tf.Variable(x), [0], 1.0)),
        ("nn.embedding_lookup", (x, [0], None)),
        ("nn.embedding_lookup", (tf.Variable(x), [-1], None)),
        ("nn.sparse_softmax_cross_entropy_with_logits", ([0, 1, 0], x)),
        ("nn.sparse_softmax_cross_entropy_with_logits", ([[0, 1]], x)),
        ("nn.sparse_softmax_cross_entropy_with_logits", ([0], tf.ones((1, 2), tf.float16))),
        ("nn.sparse_softmax_cross_entropy_with_logits", (tf.constant([0, 1]),
                                                          tf.ones((2, 2, 2)))),
    ]
    for name, arguments in left:
        assert FAST[name](*arguments) is NotImplemented, (name, arguments)
    with eager_mode():
        # (As TensorFlow: the wrapper gives what tf.reduce_sum does for ints.)
        assert subgraphjit.reduce_sum(ints).dtype == tf.int32
        with pytest.raises(tf.errors.InvalidArgumentError):
            subgraphjit.matmul(x, tf.ones((3, 3)))


def test_inside_a_tf_function_and_with_a_name_tensorflow_runs():
    @tf.function
    def traced(a, b):
        assert FAST["linalg.matmul"](a, b, False, False, False, False, False, False,
                                     None, False, False) is NotImplemented
        return subgraphjit.matmul(a, b), subgraphjit.zeros((2, 2))
    x = tf.constant([[1.0, 2.0], [3.0, 4.0]])
    with eager_mode():
        product, zeros = traced(x, x)
        named = subgraphjit.matmul(x, x, name="named")
    np.testing.assert_allclose(product.numpy(), tf.matmul(x, x).numpy())
    assert zeros.numpy().sum() == 0
    assert named.numpy().tolist() == tf.matmul(x, x).numpy().tolist()


def test_a_recording_wrapper_records_rather_than_runs():
    """In lazy mode, within a scope, the wrapper records a node: the fast
    path is only for calls that nothing records."""
    x = tf.ones((1, 2))
    with subgraphjit.batching():
        node = subgraphjit.matmul(x, tf.ones((2, 2)))
        assert isinstance(node, subgraphjit.VirtualNode)
    np.testing.assert_allclose(np.asarray(node), [[2.0, 2.0]])


@settings(max_examples=10, deadline=None)
@given(seeds, st.booleans())
def test_an_entrys_call_takes_the_fast_path_too(seed, transpose_b):
    """What the executors run on stacked rows (``OpEntry.call``) tries
    the fast path first, with the node's attributes."""
    entry = next(entry for entry in ALL_ENTRIES if entry.name == "linalg.matmul")
    assert entry.call.__globals__["_fast"] is FAST["linalg.matmul"]
    rng = np.random.default_rng(seed)
    a, b = _normal(rng, (3, 4)), tf.Variable(_normal(rng, (5, 4) if transpose_b else (4, 5)))
    attrs = (False, transpose_b, False, False, False, False, None, False, False)
    assert_same_as_tensorflow(lambda: entry.call([a, b], attrs),
                              lambda: tf.matmul(a, b, transpose_b=transpose_b), [a, b])
