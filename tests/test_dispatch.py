"""TensorFlow's own functions and operators given a VirtualNode record it
(subgraphjit/dropin/dispatch.py): differential tests against eager
TensorFlow -- values, gradients and gradient types -- for ``tensor + node``
and the other operators, the real ``tensorflow`` module's table ops, APIs
outside the table (recorded per instance), the APIs that must still
evaluate, and a Tree-LSTM cell written in real TensorFlow that batches."""

import operator
import sys

import keras
import numpy as np
import pytest
import tensorflow

import subgraphjit
from subgraphjit import VirtualNode
from gradients import assert_gradient_equal


def forced():
    """Evaluations forced by a read (named ``fallback_ops`` before)."""
    stats = subgraphjit.stats()
    return stats.get("forced_evaluations", stats.get("fallback_ops"))


@pytest.fixture
def op_granularity():
    """Single ops, each batch its own launch: batches are counted exactly."""
    previous = {key: subgraphjit.get_parameter(key)
                for key in ("granularity", "compile")}
    subgraphjit.set_parameter("granularity", "op")
    subgraphjit.set_parameter("compile", 0)
    yield
    for key, value in previous.items():
        subgraphjit.set_parameter(key, value)


def run(function, arrays, lazy, nodes=None):
    """``function(*operands)`` where each array is a variable read as a
    VirtualNode (lazy; only the operands numbered in ``nodes`` if given) or
    as a tensor; its outputs, and the gradients of a weighted sum of its
    float outputs."""
    variables = [tensorflow.Variable(array) for array in arrays]
    nodes = range(len(arrays)) if nodes is None else nodes
    with tensorflow.GradientTape(persistent=True) as tape:
        operands = [subgraphjit.identity(v) if lazy and i in nodes
                    else tensorflow.identity(v) for i, v in enumerate(variables)]
        result = function(*operands)
        outputs = list(result) if isinstance(result, (list, tuple)) else [result]
        if lazy:
            assert all(type(o) is VirtualNode for o in outputs), outputs
            assert not forced(), forced()
            outputs = subgraphjit.build(outputs)
        floats = [tensorflow.reduce_sum(o * (1.0 + np.arange(o.shape.num_elements())
                                             .reshape(o.shape) % 3))
                  for o in outputs if o.dtype.is_floating]
        total = tensorflow.add_n(floats) if floats else None
    gradients = ([tape.gradient(total, v) for v in variables]
                 if total is not None else [])
    return outputs, gradients


def assert_lazy_equals_eager(function, arrays, tolerance=1e-5, nodes=None):
    subgraphjit.reset_stats()
    lazy_outputs, lazy_gradients = run(function, arrays, lazy=True, nodes=nodes)
    eager_outputs, eager_gradients = run(function, arrays, lazy=False)
    for got, want in zip(lazy_outputs, eager_outputs, strict=True):
        assert got.dtype == want.dtype and got.shape == want.shape
        np.testing.assert_allclose(np.asarray(got, np.float64),
                                   np.asarray(want, np.float64),
                                   rtol=tolerance, atol=tolerance)
    for got, want in zip(lazy_gradients, eager_gradients, strict=True):
        assert_gradient_equal(got, want, atol=tolerance)


def floats(rng, *shape, positive=False):
    values = rng.standard_normal(shape).astype(np.float32)
    return np.abs(values) + 0.5 if positive else values


# -- tf.Tensor operators with a node on the right --------------------------------

FLOAT_OPERATORS = ["add", "sub", "mul", "truediv", "pow", "lt", "le", "gt",
                   "ge", "eq", "ne", "floordiv", "mod"]
INTEGER_OPERATORS = ["and_", "or_", "xor", "floordiv", "mod", "add", "mul"]


@pytest.mark.parametrize("name", FLOAT_OPERATORS)
@pytest.mark.parametrize("seed", [0, 1])
def test_tensor_operator_with_a_node_on_the_right_records(name, seed):
    rng = np.random.default_rng(seed)
    python_operator = getattr(operator, name)
    left = floats(rng, 2, 3, positive=True)
    right = floats(rng, 2, 3, positive=True) if name != "pow" else \
        floats(rng, 3, positive=True)

    def function(left_operand, right_operand):
        # A real tensor on the left: TensorFlow's own operator runs first.
        assert isinstance(left_operand, tensorflow.Tensor)
        return python_operator(left_operand, right_operand)

    assert_lazy_equals_eager(function, [left, right], nodes={1})


@pytest.mark.parametrize("name", INTEGER_OPERATORS)
def test_integer_and_bool_operators_with_a_node_on_the_right(name):
    rng = np.random.default_rng(len(name))
    python_operator = getattr(operator, name)
    for make in (lambda: rng.integers(1, 6, (2, 3)).astype(np.int32),
                 lambda: rng.random((2, 3)) < 0.5):
        left, right = make(), make()
        if left.dtype == bool and name in ("floordiv", "mod", "add", "mul"):
            continue
        subgraphjit.reset_stats()
        node = subgraphjit.identity(tensorflow.constant(right))
        result = python_operator(tensorflow.constant(left), node)
        assert type(result) is VirtualNode and not forced()
        np.testing.assert_array_equal(
            result.numpy(), python_operator(tensorflow.constant(left),
                                            tensorflow.constant(right)).numpy())


def test_matmul_and_in_place_add_with_a_real_tensor_on_the_left():
    rng = np.random.default_rng(3)

    def function(weights, x):
        total = tensorflow.zeros([4, 1])
        total += weights @ x                # tf.Tensor.__matmul__(node)
        total += tensorflow.ones([4, 1])
        return total

    assert_lazy_equals_eager(function, [floats(rng, 4, 3), floats(rng, 3, 1)],
                             nodes={1})


def test_variable_on_the_left_records_and_gets_its_gradient():
    rng = np.random.default_rng(4)
    weights = tensorflow.Variable(floats(rng, 3, 3))
    x = floats(rng, 3, 3)
    results = {}
    for lazy in (True, False):
        with tensorflow.GradientTape() as tape:
            operand = subgraphjit.tanh(x) if lazy else tensorflow.tanh(x)
            result = weights * operand + weights @ operand
            if lazy:
                assert type(result) is VirtualNode
                result = subgraphjit.build(result)
            total = tensorflow.reduce_sum(result)
        results[lazy] = result, tape.gradient(total, weights)
    np.testing.assert_allclose(results[True][0], results[False][0], rtol=1e-5)
    assert_gradient_equal(results[True][1], results[False][1])


# -- the real tensorflow module's table ops ----------------------------------

TABLE_CALLS = {
    "add": (lambda x, y: tensorflow.add(x, y), [(2, 3), (2, 3)]),
    "math.multiply": (lambda x, y: tensorflow.math.multiply(x, y), [(2, 3), (3,)]),
    "matmul": (lambda x, y: tensorflow.matmul(x, y), [(2, 3), (3, 4)]),
    "concat with a tensor": (lambda x, y: tensorflow.concat(
        [tensorflow.ones([1, 3]), x, y], 0), [(2, 3), (1, 3)]),
    "add_n": (lambda x, y: tensorflow.add_n([x, tensorflow.ones([2, 3]), y]),
              [(2, 3), (2, 3)]),
    "stack": (lambda x, y: tensorflow.stack([x, y], axis=1), [(2, 3), (2, 3)]),
    "tensordot": (lambda w, x: tensorflow.tensordot(w, x, axes=1), [(4, 3), (3,)]),
    "reduce_sum": (lambda x, y: tensorflow.reduce_sum(x * y, axis=1), [(2, 3), (2, 3)]),
    "nn.softmax": (lambda x, y: tensorflow.nn.softmax(x + y), [(2, 3), (2, 3)]),
    "split": (lambda x, y: tensorflow.split(x - y, 3, axis=1), [(2, 3), (2, 3)]),
    "reshape": (lambda x, y: tensorflow.reshape(x / y, [3, 2]), [(2, 3), (2, 3)]),
}


@pytest.mark.parametrize("name", sorted(TABLE_CALLS))
def test_real_tensorflow_table_ops_record(name):
    function, shapes = TABLE_CALLS[name]
    rng = np.random.default_rng(len(name))
    assert_lazy_equals_eager(function, [floats(rng, *s, positive=True) for s in shapes])


def test_real_gather_of_a_variable_keeps_indexed_slices_gradients():
    rng = np.random.default_rng(5)
    table = tensorflow.Variable(floats(rng, 5, 3))
    ids = [[0, 3], [3, 3], [1, 4]]
    results = {}
    for lazy in (True, False):
        with tensorflow.GradientTape() as tape:
            rows = [tensorflow.gather(table, subgraphjit.identity(i) if lazy else i)
                    for i in ids]
            rows += [tensorflow.nn.embedding_lookup(
                table, subgraphjit.identity([2]) if lazy else [2])]
            if lazy:
                assert all(type(r) is VirtualNode for r in rows) and not forced()
                rows = subgraphjit.build(rows)
            total = tensorflow.add_n([tensorflow.reduce_sum(r * r) for r in rows])
        results[lazy] = rows, tape.gradient(total, table)
    for got, want in zip(results[True][0], results[False][0]):
        np.testing.assert_allclose(got, want, rtol=1e-6)
    assert isinstance(results[False][1], tensorflow.IndexedSlices)
    assert_gradient_equal(results[True][1], results[False][1])


def test_shape_errors_through_tensorflow_name_the_users_line():
    x = subgraphjit.tanh(tensorflow.ones([2, 3]))
    with pytest.raises(tensorflow.errors.InvalidArgumentError) as raised:
        tensorflow.matmul(tensorflow.ones([2, 3]), x)
    line = sys._getframe().f_lineno - 1
    assert any(f"{__file__}:{line}" in note for note in raised.value.__notes__)


def test_evaluation_errors_through_tensorflow_name_the_users_line():
    indices = subgraphjit.identity([7])
    lookup = tensorflow.gather(tensorflow.ones([3, 2]), indices)
    line = sys._getframe().f_lineno - 1
    with pytest.raises(tensorflow.errors.InvalidArgumentError) as raised:
        subgraphjit.build(lookup)
    assert any(f"{__file__}:{line}" in note for note in raised.value.__notes__)


# -- APIs outside the op table: recorded, run per instance ------------------------

OUTSIDE_CALLS = {
    "math.cumsum": (lambda x, y: tensorflow.math.cumsum(x * y, axis=1), [(2, 3), (2, 3)]),
    "nn.l2_normalize": (lambda x, y: tensorflow.nn.l2_normalize(x + y, axis=1),
                        [(2, 3), (2, 3)]),
    "where": (lambda x, y: tensorflow.where(x > y, x, y * 2.0), [(2, 3), (2, 3)]),
    "math.top_k": (lambda x, y: tensorflow.math.top_k(x + y, k=2).values, [(2, 4), (2, 4)]),
    "linalg.norm": (lambda x, y: tensorflow.linalg.norm(x - y, axis=1), [(2, 3), (2, 3)]),
    "math.log_softmax via tensorflow.math.xlogy": (
        lambda x, y: tensorflow.math.xlogy(x, y), [(2, 3), (2, 3)]),
    "pad": (lambda x, y: tensorflow.pad(x * y, [[1, 0], [0, 2]]), [(2, 3), (2, 3)]),
    "roll": (lambda x, y: tensorflow.roll(x + y, shift=1, axis=1), [(2, 3), (2, 3)]),
}


@pytest.mark.parametrize("name", sorted(OUTSIDE_CALLS))
def test_apis_outside_the_table_record_and_equal_eager(name):
    function, shapes = OUTSIDE_CALLS[name]
    rng = np.random.default_rng(len(name))
    assert_lazy_equals_eager(function, [floats(rng, *s, positive=True) for s in shapes])


def test_multi_output_api_outside_the_table_keeps_its_result_type():
    x = subgraphjit.tanh(tensorflow.constant([[0.1, 0.5, -0.2]]))
    result = tensorflow.math.top_k(x, k=2)
    assert type(result).__name__ == "TopKV2"
    assert all(type(output) is VirtualNode for output in result)
    expected = tensorflow.math.top_k(tensorflow.tanh([[0.1, 0.5, -0.2]]), k=2)
    np.testing.assert_allclose(result.values.numpy(), expected.values.numpy(), rtol=1e-6)
    np.testing.assert_array_equal(result.indices.numpy(), expected.indices.numpy())


def test_api_outside_the_table_runs_per_instance(op_granularity):
    rng = np.random.default_rng(6)
    arrays = [floats(rng, 2, 3) for _ in range(4)]
    subgraphjit.reset_stats()
    nodes = [tensorflow.math.cumsum(subgraphjit.tanh(a), axis=1) for a in arrays]
    values = subgraphjit.build(nodes)
    assert not forced()
    (reason, count), = subgraphjit.stats()["unbatched"].items()
    assert reason.endswith("cumsum: no batch rule") and count == 4
    for value, array in zip(values, arrays):
        np.testing.assert_allclose(value, tensorflow.math.cumsum(np.tanh(array), axis=1),
                                   rtol=1e-6)


VALUE_DEPENDENT_OR_STATEFUL = {
    # output shapes that need the operands' values
    "range": lambda node: tensorflow.range(tensorflow.cast(node[0, 0], tensorflow.int32) + 3),
    "unique": lambda node: tensorflow.unique(tensorflow.reshape(node, [-1])).y,
    "boolean_mask": lambda node: tensorflow.boolean_mask(node, node > 0.0),
    # random draws and checks happen when called
    "random.shuffle": lambda node: tensorflow.random.shuffle(node, seed=3),
    "debugging.check_numerics": lambda node: tensorflow.debugging.check_numerics(node, "x"),
}


@pytest.mark.parametrize("name", sorted(VALUE_DEPENDENT_OR_STATEFUL))
def test_value_dependent_and_stateful_apis_evaluate_as_before(name):
    function = VALUE_DEPENDENT_OR_STATEFUL[name]
    array = np.random.default_rng(7).standard_normal((3, 4)).astype(np.float32)
    tensorflow.random.set_seed(11)
    subgraphjit.reset_stats()
    result = function(subgraphjit.identity(array))
    assert isinstance(result, tensorflow.Tensor) and forced()
    tensorflow.random.set_seed(11)
    np.testing.assert_allclose(result.numpy(), function(tensorflow.constant(array)).numpy())


def test_keras_code_gets_tensors_not_nodes():
    # Keras sets attributes on what TensorFlow returns (_keras_logits), which
    # a node cannot hold: TensorFlow called by Keras evaluates, as before.
    x = np.random.default_rng(8).standard_normal((2, 3)).astype(np.float32)
    # (Other layers record as one node instead: test_layers.py.  Batch
    # normalization in training updates its statistics, so its call is
    # refused and Keras's own runs.)
    layer = keras.layers.BatchNormalization()
    subgraphjit.reset_stats()
    lazy_output = layer(subgraphjit.tanh(x), training=True)
    eager_output = layer(tensorflow.tanh(x), training=True)
    assert isinstance(lazy_output, tensorflow.Tensor) and forced()
    np.testing.assert_allclose(lazy_output.numpy(), eager_output.numpy(), rtol=1e-6)


# -- modes and tracing ---------------------------------------------------------

def test_eager_mode_gives_tensors_from_real_tensorflow():
    rng = np.random.default_rng(9)
    x, w = floats(rng, 2, 3), floats(rng, 3, 3)
    leftover = subgraphjit.tanh(x)   # recorded before the switch
    subgraphjit.set_parameter("mode", "eager")
    try:
        total = tensorflow.zeros([2, 3]) + subgraphjit.tanh(x)
        product = tensorflow.tensordot(leftover, w, axes=1)
        assert isinstance(total, tensorflow.Tensor)
        assert isinstance(product, tensorflow.Tensor)
    finally:
        subgraphjit.set_parameter("mode", "lazy")
    np.testing.assert_allclose(total, np.tanh(x), rtol=1e-6)
    np.testing.assert_allclose(product, np.tanh(x) @ w, rtol=1e-5, atol=1e-6)


def test_tf_function_tracing_is_unchanged():
    traced = []

    @tensorflow.function
    def shifted(t):
        hidden = tensorflow.add(t, 1.0) + tensorflow.ones([2])
        traced.append(type(hidden))
        return hidden

    node = subgraphjit.tanh(tensorflow.constant([0.5, -0.5]))
    np.testing.assert_allclose(shifted(node).numpy(), np.tanh([0.5, -0.5]) + 2,
                               rtol=1e-6)
    assert traced and VirtualNode not in traced


# -- a Tree-LSTM cell written in real TensorFlow batches ---------------------------

HIDDEN, EMBEDDING = 4, 3


def tree_lstm_state(weights, tree, embed):
    """(c, h) of a binary tree: leaves are words, inner nodes pairs; every op
    is the real ``tensorflow`` module's, with real tensors on the left."""
    W, U, b = weights
    if isinstance(tree, int):
        x, children = embed(tree), []
    else:
        x = tensorflow.zeros([EMBEDDING])
        children = [tree_lstm_state(weights, child, embed) for child in tree]
    h_sum = tensorflow.zeros([HIDDEN])
    for _, h in children:
        h_sum = h_sum + h                          # tf.Tensor.__add__(node)
    gates = tensorflow.zeros([3 * HIDDEN])[:] + b
    gates += tensorflow.tensordot(W, x, axes=1)    # the matrix-vector idiom
    gates += tensorflow.tensordot(U, h_sum, axes=1)
    i, o, u = tensorflow.split(gates, 3)
    c = tensorflow.sigmoid(i) * tensorflow.tanh(u)
    for child_c, _ in children:
        c = c + child_c
    return c, tensorflow.sigmoid(o) * tensorflow.tanh(c)


TREES = [((0, 1), 2), (3, (4, (5, 0))), (1, 2), ((2, 3), (4, 5))]


def test_tree_lstm_cell_in_real_tensorflow_batches(op_granularity):
    rng = np.random.default_rng(10)
    weights = [tensorflow.Variable(floats(rng, 3 * HIDDEN, EMBEDDING)),
               tensorflow.Variable(floats(rng, 3 * HIDDEN, HIDDEN)),
               tensorflow.Variable(floats(rng, 3 * HIDDEN))]
    embeddings = tensorflow.Variable(floats(rng, 6, EMBEDDING))
    variables = weights + [embeddings]

    def loss_and_gradients(lazy):
        def embed(word):
            lookup = subgraphjit.gather if lazy else tensorflow.gather
            return lookup(embeddings, word)
        with tensorflow.GradientTape() as tape:
            roots = [tree_lstm_state(weights, tree, embed)[1] for tree in TREES]
            loss = tensorflow.reduce_sum(tensorflow.add_n(roots))
            if lazy:
                assert type(loss) is VirtualNode and not forced()
                loss = subgraphjit.build(loss)
        return loss, tape.gradient(loss, variables)

    subgraphjit.reset_stats()
    lazy_loss, lazy_gradients = loss_and_gradients(lazy=True)
    stats = subgraphjit.stats()
    eager_loss, eager_gradients = loss_and_gradients(lazy=False)
    np.testing.assert_allclose(lazy_loss, eager_loss, rtol=1e-5)
    for got, want in zip(lazy_gradients, eager_gradients):
        assert_gradient_equal(got, want, atol=1e-5)
    assert isinstance(lazy_gradients[-1], tensorflow.IndexedSlices)
    # Every node recorded, evaluated once, in far fewer launches than nodes.
    assert stats["evaluations"] == 1 and not stats["unbatched"]
    assert stats["batches"] < stats["nodes_evaluated"] / 3, stats


def test_tensordot_batches_over_instances(op_granularity):
    rng = np.random.default_rng(11)
    weights = tensorflow.Variable(floats(rng, 5, 3))
    xs = [floats(rng, 3) for _ in range(4)]
    subgraphjit.reset_stats()
    nodes = [subgraphjit.tensordot(weights, subgraphjit.tanh(x), axes=1) for x in xs]
    nodes += [subgraphjit.tensordot(subgraphjit.tanh(x), subgraphjit.tanh(x), axes=0)
              for x in xs]
    values = subgraphjit.build(nodes)
    stats = subgraphjit.stats()
    assert not stats["unbatched"] and stats["batches"] == 3
    for value, x in zip(values, xs + xs):
        want = (weights.numpy() @ np.tanh(x) if value.shape == (5,)
                else np.outer(np.tanh(x), np.tanh(x)))
        np.testing.assert_allclose(value, want, rtol=1e-5, atol=1e-6)


def test_a_node_beside_a_ragged_or_sparse_tensor_evaluates_as_before():
    # TensorFlow's own targets for RaggedTensor and SparseTensor take these
    # calls (two matching targets would be an error): the node is evaluated.
    node = subgraphjit.tanh(tensorflow.constant([[0.5], [1.0]]))
    ragged = tensorflow.ragged.constant([[1.0], [2.0]])
    result = tensorflow.add(node, ragged)
    expected = tensorflow.add(tensorflow.tanh([[0.5], [1.0]]), ragged)
    np.testing.assert_allclose(result.flat_values, expected.flat_values, rtol=1e-6)
    sparse = tensorflow.sparse.from_dense([[1.0, 0.0], [0.0, 2.0]])
    product = tensorflow.sparse.sparse_dense_matmul(sparse, node)
    np.testing.assert_allclose(product, tensorflow.sparse.sparse_dense_matmul(
        sparse, tensorflow.tanh([[0.5], [1.0]])), rtol=1e-6)
