"""Batching over varying lengths (batcher/varying.py): instances whose operands
differ only in their first axis run as one op on their rows concatenated,
and give eager TensorFlow's values, gradients and gradient types.

Each case is a function of one instance, ``case(tf, x, y, ids)``: ``x`` and
``y`` are ``[n, d]`` values of that instance (``y`` of the same n), ``ids``
a list of n word ids; random n per instance."""

import numpy as np
import pytest
import tensorflow

import subgraphjit as tf
from subgraphjit.batcher import varying
from subgraphjit.batcher.graph import BatchGraph
from subgraphjit.evaluate import unevaluated_ancestors
from experiments.example_models import MODELS
from gradients import assert_gradient_equal, assert_loss_and_gradients_equal

WIDTH, CLASSES, VOCABULARY = 5, 3, 11


class Weights:
    def __init__(self, rng):
        def weight(*shape):
            return tensorflow.Variable(rng.standard_normal(shape).astype(np.float32))
        self.W = weight(WIDTH, WIDTH)
        self.V = weight(WIDTH, CLASSES)
        self.bias = weight(WIDTH)
        self.row = weight(1, WIDTH)
        self.table = weight(VOCABULARY, WIDTH)
        self.all = [self.W, self.V, self.bias, self.row, self.table]


# name -> (case, the op names that must batch over varying lengths)
CASES = {
    "matmul": (lambda tf, w, x, y, ids: tf.matmul(x, w.W), {"linalg.matmul"}),
    "matmul operator": (lambda tf, w, x, y, ids: x @ w.W, {"operator.matmul"}),
    "matmul transpose_b": (lambda tf, w, x, y, ids: tf.matmul(x, w.W, transpose_b=True),
                           {"linalg.matmul"}),
    "tanh": (lambda tf, w, x, y, ids: tf.tanh(x), {"math.tanh"}),
    "sigmoid, relu, exp": (lambda tf, w, x, y, ids: tf.exp(tf.nn.relu(tf.sigmoid(x))),
                           {"math.sigmoid", "nn.relu", "math.exp"}),
    "cast": (lambda tf, w, x, y, ids: tf.cast(x, tf.float64) * 2.0, {"cast"}),
    "product of equal lengths": (lambda tf, w, x, y, ids: x * y, {"operator.mul"}),
    "maximum": (lambda tf, w, x, y, ids: tf.maximum(x, y), {"math.maximum"}),
    "shared vector broadcast": (lambda tf, w, x, y, ids: x + w.bias, {"operator.add"}),
    "shared row broadcast": (lambda tf, w, x, y, ids: tf.subtract(x, w.row),
                             {"math.subtract"}),
    "number": (lambda tf, w, x, y, ids: x * 0.5 - 1.0, {"operator.mul", "operator.sub"}),
    "bias_add": (lambda tf, w, x, y, ids: tf.nn.bias_add(x, w.bias), {"nn.bias_add"}),
    "reduce_sum axis 0": (lambda tf, w, x, y, ids: tf.reduce_sum(x, axis=0),
                          {"math.reduce_sum"}),
    "reduce_mean axis 0 keepdims": (
        lambda tf, w, x, y, ids: tf.reduce_mean(x, axis=0, keepdims=True),
        {"math.reduce_mean"}),
    "reduce_max axis -2": (lambda tf, w, x, y, ids: tf.reduce_max(x, axis=-2),
                           {"math.reduce_max"}),
    "reduce_min axis (0,)": (lambda tf, w, x, y, ids: tf.reduce_min(x, axis=(0,)),
                             {"math.reduce_min"}),
    "reduce_sum of a vector": (lambda tf, w, x, y, ids: tf.reduce_sum(x[:, 0] * 1.0),
                               set()),   # vectors only: per length (see _kind)
    "reduce_sum axis 1 (rows)": (lambda tf, w, x, y, ids: tf.reduce_sum(x, axis=1),
                                 {"math.reduce_sum"}),
    "softmax axis 0": (lambda tf, w, x, y, ids: tf.nn.softmax(x, axis=0) * y,
                       {"nn.softmax"}),
    "log_softmax axis 0": (lambda tf, w, x, y, ids: tf.nn.log_softmax(x, axis=0) * y,
                           {"nn.log_softmax"}),
    "softmax of a vector": (lambda tf, w, x, y, ids: tf.nn.softmax(
        tf.reduce_sum(x, axis=1)) * y[:, 1] * 1.0, {"math.reduce_sum"}),
    "softmax over rows": (lambda tf, w, x, y, ids: tf.nn.softmax(x) * y, {"nn.softmax"}),
    "embedding lookup": (lambda tf, w, x, y, ids: tf.nn.embedding_lookup(w.table, ids) * x,
                         {"nn.embedding_lookup"}),
    "gather": (lambda tf, w, x, y, ids: tf.gather(w.table, ids) + y, {"gather"}),
    "loss over rows": (lambda tf, w, x, y, ids: tf.nn.sparse_softmax_cross_entropy_with_logits(
        labels=[i % CLASSES for i in ids], logits=tf.matmul(x, w.V)),
        {"nn.sparse_softmax_cross_entropy_with_logits", "linalg.matmul"}),
    # Score matrices [n, n]: padded to the largest instance.
    "scores, softmax, weighted sum": (lambda tf, w, x, y, ids: tf.matmul(tf.nn.softmax(
        tf.matmul(x, y, transpose_b=True) / 2.0), y),
        {"linalg.matmul", "operator.truediv", "nn.softmax"}),
    "softmax of scores over axis 0": (lambda tf, w, x, y, ids: tf.nn.log_softmax(
        tf.matmul(x, tf.transpose(y)) * 0.5, axis=0), {"nn.log_softmax", "operator.mul"}),
    # inf in the padding (1 / sqrt(0)), and NaN in its gradient: neither may
    # reach a value or gradient of an instance.
    "infinite padding": (lambda tf, w, x, y, ids: tf.matmul(tf.math.reciprocal(tf.sqrt(
        tf.square(tf.matmul(x, y, transpose_b=True)))) * 0.01 - 1.0, y),
        {"linalg.matmul", "math.reciprocal", "math.sqrt", "math.square", "operator.mul",
         "operator.sub"}),
    "attention pooling": (lambda tf, w, x, y, ids: tf.reduce_sum(
        tf.nn.softmax(tf.matmul(tf.tanh(x @ w.W), w.V), axis=0) * tf.matmul(y, w.V), axis=0),
        {"operator.matmul", "math.tanh", "nn.softmax", "linalg.matmul", "operator.mul",
         "math.reduce_sum"}),
}


def instances(rng, count, lengths=(1, 9)):
    """Per instance: values x, y of [n, WIDTH] as variables (their gradients
    are checked too) and n ids; n random in ``lengths``."""
    made = []
    for _ in range(count):
        n = int(rng.integers(*lengths))
        made.append((tensorflow.Variable(rng.standard_normal((n, WIDTH)).astype(np.float32)),
                     tensorflow.Variable(rng.standard_normal((n, WIDTH)).astype(np.float32)),
                     rng.integers(VOCABULARY, size=n).tolist()))
    return made


def run(module, case, weights, data):
    """Every instance's result (summed into a loss), and the gradients of
    the loss for the weights and every instance's x and y."""
    sources = weights.all + [v for x, y, _ in data for v in (x, y)]
    with module.GradientTape() as tape:
        results = [case(module, weights, module.identity(x), module.identity(y), ids)
                   for x, y, ids in data]
        loss = module.add_n([module.reduce_sum(tensorflow.cast(r, tensorflow.float32))
                             if module is tensorflow else
                             module.reduce_sum(module.cast(r, tf.float32))
                             for r in results])
        if module is tf:
            results, loss = tf.build((results, loss))
    return results, loss, tape.gradient(loss, sources)


def assert_equals_eager(case, weights, data):
    expected = run(tensorflow, case, weights, data)
    got = run(tf, case, weights, data)
    for value, wanted in zip(got[0], expected[0]):
        assert value.shape == wanted.shape and value.dtype == wanted.dtype
        np.testing.assert_allclose(value.numpy(), wanted.numpy(), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(float(got[1]), float(expected[1]), rtol=1e-5, atol=1e-5)
    for gradient, wanted in zip(got[2], expected[2]):
        assert_gradient_equal(gradient, wanted)


@pytest.fixture(params=["agenda", "critical", "depth", "fsm"])
def step_by_step(request):
    """Each batch its own op (compiled programs refuse varying lengths)."""
    keys = ("scheduler", "compile", "granularity")
    previous = [tf.get_parameter(key) for key in keys]
    for key, value in zip(keys, (request.param, 0, "op")):
        tf.set_parameter(key, value)
    yield request.param
    for key, value in zip(keys, previous):
        tf.set_parameter(key, value)


@pytest.mark.parametrize("name", sorted(CASES))
def test_varying_lengths_batch_and_equal_eager(name, step_by_step):
    case, op_names = CASES[name]
    rng = np.random.default_rng(sum(map(ord, name)))
    weights = Weights(rng)
    data = instances(rng, 7)
    while len({int(x.shape[0]) for x, _, _ in data}) < 3:   # lengths really vary
        data = instances(rng, 7)
    tf.reset_stats()
    assert_equals_eager(case, weights, data)
    stats = tf.stats()
    # Each op ran once for all 7 instances, whatever their lengths.
    for op_name in op_names:
        assert stats["varying_instances"].get(op_name, 0) >= 7, (op_name, stats)
        assert stats["varying_batches"][op_name] * 7 <= stats["varying_instances"][op_name]
    padded = "scores" in name or "padding" in name
    assert (stats["padding_elements"] > 0) == padded, stats["padding_elements"]
    assert not stats["unbatched"], stats["unbatched"]


def test_one_launch_for_every_length():
    """A tanh of 10 instances of 10 lengths: one batch, not ten."""
    rng = np.random.default_rng(1)
    weights = Weights(rng)
    data = [(tensorflow.Variable(rng.standard_normal((n, WIDTH)).astype(np.float32)),
             tensorflow.Variable(rng.standard_normal((n, WIDTH)).astype(np.float32)),
             list(range(n))) for n in range(1, 11)]
    tf.reset_stats()
    assert_equals_eager(lambda tf, w, x, y, ids: tf.tanh(tf.matmul(x, w.W)), weights, data)
    stats = tf.stats()
    for op_name in ("linalg.matmul", "math.tanh"):
        assert stats["varying_batches"][op_name] == 1
        assert stats["varying_instances"][op_name] == 10


def recorded_graph(case, weights, data):
    with tf.GradientTape():
        results = [case(tf, weights, tf.identity(x), tf.identity(y), ids)
                   for x, y, ids in data]
        graph = BatchGraph(unevaluated_ancestors(results))
        tf.build(results)   # (evaluated before the tape closes)
    return graph


def test_which_types_join():
    """Equal lengths keep their single type, untouched; ops of score
    matrices [n, n] (two axes vary) join padded, those around them by
    rows; a reduction of score matrices keeps a type per length."""
    rng = np.random.default_rng(2)
    weights = Weights(rng)
    same = [(x, y, ids) for x, y, ids in instances(rng, 4, lengths=(4, 5))]
    graph = recorded_graph(CASES["matmul"][0], weights, same)
    types = list(graph.type_of)
    varying.merge_types(graph)
    assert graph.varying == {} and graph.type_of == types

    def scores(tf, w, x, y, ids):
        s = tf.matmul(x, y, transpose_b=True)          # [n, n]: padded
        return tf.tanh(tf.matmul(tf.nn.softmax(s), y)) + tf.reduce_sum(s, axis=1,
                                                                       keepdims=True)
    data = [(tensorflow.Variable(rng.standard_normal((n, WIDTH)).astype(np.float32)),
             tensorflow.Variable(rng.standard_normal((n, WIDTH)).astype(np.float32)),
             list(range(n))) for n in (2, 3, 3, 5)]
    graph = recorded_graph(scores, weights, data)
    varying.merge_types(graph)
    joined = sorted((graph.types[t][0].name, kind) for t, kind in graph.varying.items())
    assert joined == [("linalg.matmul", varying.PADDED), ("linalg.matmul", varying.PADDED),
                      ("math.tanh", varying.ROWS), ("nn.softmax", varying.PADDED_SOFTMAX),
                      ("operator.add", varying.ROWS)]
    reduction_types = {t for t in graph.type_of
                       if t >= 0 and graph.types[t][0].name == "math.reduce_sum"}
    assert len(reduction_types) == 3   # lengths 2, 3 (twice) and 5
    tf.reset_stats()
    assert_equals_eager(scores, weights, data)


def test_mixed_varying_and_fixed_shapes_equal_eager(step_by_step):
    """Instances of fixed shapes ([1, d] vectors, per-instance weights)
    between joined ones, and a joined result read by fixed-shape ops."""
    rng = np.random.default_rng(3)
    weights = Weights(rng)

    def mixed(tf, w, x, y, ids):
        h = tf.tanh(x @ w.W)                          # varying
        first = h[:1]                                 # fixed [1, d] of a varying row
        pooled = tf.reduce_max(h, axis=0, keepdims=True)   # segments -> [1, d]
        v = tf.sigmoid(pooled + first) @ w.W          # fixed [1, d] ops
        gate = tf.matmul(x, tf.transpose(y))          # [n, n]: per length
        return tf.reduce_sum(tf.matmul(gate, h) * v, axis=0) + tf.reduce_mean(h * y)
    data = instances(rng, 8)
    tf.reset_stats()
    assert_equals_eager(mixed, weights, data)
    stats = tf.stats()
    assert stats["varying_instances"]["math.tanh"] == 8


def test_later_evaluations_read_joined_rows():
    """A value computed in a batch over varying lengths, read by a later
    evaluation (as a node evaluated earlier) and by the user."""
    rng = np.random.default_rng(4)
    weights = Weights(rng)
    data = instances(rng, 5)
    with tf.GradientTape():
        hidden = [tf.tanh(tf.matmul(tf.identity(x), weights.W)) for x, _, _ in data]
        tf.build(hidden)
    assert tf.stats()["varying_batches"]
    with tf.GradientTape():
        pooled = tf.build([tf.reduce_sum(h * 2.0, axis=0) for h in hidden])
    for h, p, (x, _, _) in zip(hidden, pooled, data):
        expected = tensorflow.tanh(tensorflow.matmul(x, weights.W))
        np.testing.assert_allclose(h.numpy(), expected.numpy(), rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(p.numpy(), tensorflow.reduce_sum(expected * 2.0, 0).numpy(),
                                   rtol=1e-5, atol=1e-6)


def test_compiled_programs_refuse_varying_lengths():
    keys = ("compile", "granularity")
    previous = [tf.get_parameter(key) for key in keys]
    tf.set_parameter("compile", 1)
    tf.set_parameter("granularity", "op")
    try:
        rng = np.random.default_rng(5)
        weights = Weights(rng)
        tf.reset_stats()
        for _ in range(2):
            assert_equals_eager(CASES["attention pooling"][0], weights, instances(rng, 6))
        stats = tf.stats()
        assert stats["programs_not_compiled"].get("batches over varying lengths") == 2
        assert stats["program_runs"] == 0
    finally:
        for key, value in zip(keys, previous):
            tf.set_parameter(key, value)


def test_an_error_in_one_instance_names_its_line():
    """A bad id in one instance's lookup: the batch reruns per instance and
    the error is TensorFlow's, from that instance."""
    rng = np.random.default_rng(6)
    weights = Weights(rng)
    with pytest.raises(tensorflow.errors.InvalidArgumentError):
        with tf.GradientTape():
            looked_up = [tf.nn.embedding_lookup(weights.table, ids)
                         for ids in ([1, 2], [3, 4, 5], [VOCABULARY + 3])]
            tf.build(looked_up)


@pytest.mark.parametrize("model_name", sorted(MODELS))
def test_models_of_fixed_shapes_join_nothing(model_name):
    """Trees, taggers, lattices: vectors of several feature sizes ([h] and
    [3h] in the child-sum cell) and [1, d] rows are not lengths, and keep
    their types (and their compiled programs); the attention models join."""
    rng = np.random.default_rng(7)
    model = MODELS[model_name](rng)
    with tf.GradientTape():
        losses = [model.loss(tf, example) for example in model.random_examples(rng, 8)]
        graph = BatchGraph(unevaluated_ancestors(losses))
        tf.build(losses)
    varying.merge_types(graph)
    assert bool(graph.varying) == (model_name in ("attention", "self_attention_varlen"))


def test_graphs_with_patterns_are_not_joined():
    """Granularity "subgraph": once patterns replace subgraphs, nothing
    joins (patterns run per input shape; joining around them was slower),
    and results still equal eager's."""
    from test_batching import minibatch_loss_and_gradients
    keys = ("granularity", "collect", "compile")
    previous = [tf.get_parameter(key) for key in keys]
    for key, value in zip(keys, ("subgraph", 1, 0)):
        tf.set_parameter(key, value)
    tf.reset_patterns()
    try:
        rng = np.random.default_rng(8)
        model = MODELS["self_attention_varlen"](rng)
        minibatch_loss_and_gradients(tf, model, model.random_examples(rng, 6))   # collect
        tf.reset_stats()
        examples = model.random_examples(rng, 6)
        loss, gradients = minibatch_loss_and_gradients(tf, model, examples)
        expected_loss, expected_gradients = minibatch_loss_and_gradients(
            tensorflow, model, examples)
        assert_loss_and_gradients_equal((loss, gradients), (expected_loss, expected_gradients))
        stats = tf.stats()
        assert stats["pattern_matches"] > 0 and stats["varying_batches"] == {}, stats
    finally:
        for key, value in zip(keys, previous):
            tf.set_parameter(key, value)
        tf.reset_patterns()
