"""Keras layers called with VirtualNodes record one node and batch
(subgraphjit/dropin/layers.py): differential tests against eager TensorFlow
-- values, gradients and gradient types of the layers' variables and of
upstream variables -- for recursive tree models built from Keras layers
known to be row-wise and from a user's own layers (one tf.vectorized_map,
or per instance where that fails), under single ops, patterns and compiled
programs; refused layers, counted; and a subclassed keras.Model trained
with an optimizer."""

import collections
import contextlib
import io

import keras
import numpy as np
import pytest
import tensorflow

import subgraphjit as sj
from subgraphjit import VirtualNode
from subgraphjit.batcher import program, rules
from gradients import assert_gradient_equal, assert_loss_and_gradients_equal
import recorded_trees
from recorded_trees import forced, random_tree

VOCAB, EMBEDDING, HIDDEN, CLASSES = 7, 3, 4, 2


@pytest.fixture(params=["op", "subgraph", "compiled"])
def parameters(request, monkeypatch):
    """Single ops, patterns, or programs compiled from the first minibatch."""
    keys = ("granularity", "compile", "collect", "mode")
    previous = [sj.get_parameter(key) for key in keys]
    if request.param == "compiled":
        monkeypatch.setattr(program, "MAX_KINDS", 10**6)
        settings = ("subgraph", 1, 1)
    else:
        settings = (request.param, 0, 1)
    for key, value in zip(keys, settings):
        sj.set_parameter(key, value)
    sj.reset_patterns()
    program.PROGRAMS.clear()
    yield request.param
    for key, value in zip(keys, previous):
        sj.set_parameter(key, value)
    sj.reset_patterns()


@contextlib.contextmanager
def eager():
    """The reference: subgraphjit's functions are TensorFlow's own."""
    sj.set_parameter("mode", "eager")
    try:
        yield
    finally:
        sj.set_parameter("mode", "lazy")


def count_calls(layer):
    """Count the runs of ``layer.call`` (one per launch: a batched call runs
    it once for many instances)."""
    original = layer.call
    counter = [0]

    def call(*args, **kwargs):
        counter[0] += 1
        return original(*args, **kwargs)
    object.__setattr__(layer, "call", call)
    return counter


# -- a Tree-GRU whose gates are Dense layers ------------------------------------------

class DenseTreeGRU:
    """Leaves: an upstream embedding variable looked up with tf.gather (its
    gradient an IndexedSlices), then a Dense layer; inner nodes: GRU-like
    gates from Dense layers over both children."""

    def __init__(self, rng):
        self.embeddings = tensorflow.Variable(
            rng.standard_normal((VOCAB, EMBEDDING)).astype(np.float32))
        self.scale = tensorflow.Variable(np.float32(1.5))   # upstream, dense
        self.leaf = keras.layers.Dense(HIDDEN, activation="tanh")
        self.gates = keras.layers.Dense(2 * HIDDEN, activation="sigmoid")
        self.candidate = keras.layers.Dense(HIDDEN)
        self.activation = keras.layers.Activation("tanh")
        self.layers = [self.leaf, self.gates, self.candidate, self.activation]

    def state(self, tree):
        if isinstance(tree, int):
            return self.leaf(sj.gather(self.embeddings, [tree]) * self.scale)
        left, right = self.state(tree[0]), self.state(tree[1])
        both = sj.concat([left, right], axis=1)
        z, r = sj.split(self.gates(both), 2, axis=1)
        candidate = self.activation(self.candidate(sj.concat([r * left, r * right], 1)))
        return z * (left + right) * 0.5 + (1 - z) * candidate

    def variables(self):
        return [self.embeddings, self.scale] + [
            v for layer in self.layers for v in layer.trainable_variables]


class CellTree:
    """A chain over each tree's leaves in order through a GRUCell (states a
    list, as Keras's RNN gives them), the first state a shared zero tensor."""

    def __init__(self, rng):
        self.embeddings = tensorflow.Variable(
            rng.standard_normal((VOCAB, EMBEDDING)).astype(np.float32))
        self.cell = keras.layers.GRUCell(HIDDEN)
        self.project = keras.layers.Dense(HIDDEN, activation="relu")
        self.layers = [self.cell, self.project]
        self.zeros = tensorflow.zeros([1, HIDDEN])

    def state(self, tree):
        words = []

        def leaves(t):
            if isinstance(t, int):
                words.append(t)
            else:
                leaves(t[0])
                leaves(t[1])
        leaves(tree)
        states = [self.zeros]
        for word in words:
            x = self.project(sj.gather(self.embeddings, [word]))
            output, states = self.cell(x, states)
        return output

    def variables(self):
        return [self.embeddings] + [
            v for layer in self.layers for v in layer.trainable_variables]


def loss_and_gradients(model, trees, lazy):
    return recorded_trees.loss_and_gradients(model.state, trees, model.variables, lazy)


@pytest.mark.parametrize("model_class", [DenseTreeGRU, CellTree])
def test_tree_models_of_keras_layers_equal_eager(model_class, parameters):
    rng = np.random.default_rng(3)
    model = model_class(rng)
    minibatches = [[random_tree(rng, 4, VOCAB, 0.25) for _ in range(6)] for _ in range(3)]
    counters = [count_calls(layer) for layer in model.layers]
    refusals = set()
    for trees in minibatches:
        sj.reset_stats()
        for counter in counters:
            counter[0] = 0
        loss, gradients = loss_and_gradients(model, trees, lazy=True)
        assert forced() == 0, sj.stats()["forced_evaluations"]
        launches = [counter[0] for counter in counters]
        refusals.update(sj.stats()["programs_not_compiled"])
        with eager():
            for counter in counters:
                counter[0] = 0
            expected_loss, expected_gradients = loss_and_gradients(model, trees, lazy=False)
        calls = [counter[0] for counter in counters]
        assert_loss_and_gradients_equal((loss, gradients),
                                        (expected_loss, expected_gradients), atol=1e-5)
        # Each layer ran as fewer launches than it was called.
        for launched, called in zip(launches, calls):
            assert launched < called, (launches, calls)
    if parameters == "compiled":   # compiled programs refused, so exact
        assert any("Keras layer" in reason for reason in refusals), refusals
    assert model.layers[0].built and model.layers[0].trainable_variables


def test_layers_are_built_as_keras_builds_them():
    """Weights, trainable_variables and summary() are Keras's own after a
    lazy first call."""
    dense = keras.layers.Dense(5, name="lazy_dense")
    x = sj.identity(tensorflow.ones([1, 3]))
    y = dense(x)
    assert type(y) is VirtualNode and y.shape == (1, 5)
    assert dense.built and [tuple(v.shape) for v in dense.trainable_variables] == [(3, 5), (5,)]
    model = keras.Sequential([keras.Input((3,)), dense])
    text = io.StringIO()
    model.summary(print_fn=lambda line, **_: text.write(line + "\n"))
    assert "lazy_dense" in text.getvalue() and "20" in text.getvalue()
    np.testing.assert_allclose(y.numpy(), dense(tensorflow.ones([1, 3])).numpy(), rtol=1e-6)


def test_outside_lazy_recording_layers_behave_as_before():
    dense = keras.layers.Dense(2)
    tensor = tensorflow.ones([1, 3])
    assert not isinstance(dense(tensor), VirtualNode)   # a real tensor
    traced = tensorflow.function(lambda t: dense(t))(tensor)
    np.testing.assert_allclose(traced.numpy(), dense(tensor).numpy())
    with eager():
        assert not isinstance(dense(sj.identity(tensor)), VirtualNode)


# -- a user's own layers: one tf.vectorized_map, or per instance ----------------------

class UserCell(keras.layers.Layer):
    """A user's own layer, written as with ``import subgraphjit as tf``: a
    tanh over the concatenated inputs (a list), weights from add_weight."""

    def build(self, shapes):
        width = sum(shape[-1] for shape in shapes)
        self.w = self.add_weight(shape=(width, HIDDEN), name="w")
        self.b = self.add_weight(shape=(HIDDEN,), initializer="random_normal", name="b")

    def call(self, inputs):
        return sj.tanh(sj.matmul(sj.concat(inputs, 1), self.w) + self.b)


class Spectral(keras.layers.Layer):
    """pfor has no converter for its Svd: vectorized_map fails."""

    def build(self, shape):
        self.w = self.add_weight(shape=(shape[-1], HIDDEN), name="w")

    def call(self, x):
        h = sj.matmul(x, self.w)
        return h * sj.reduce_sum(sj.linalg.svd(sj.reshape(h, [2, 2]), compute_uv=False))


class ReadsAValue(keras.layers.Layer):
    """Reads a value in Python: no trace can take it."""

    def build(self, shape):
        self.w = self.add_weight(shape=(shape[-1], HIDDEN), name="w")

    def call(self, x):
        h = sj.matmul(x, self.w)
        return h / (1.0 + float(sj.reduce_max(sj.abs(h))))


class UserTree:
    """Leaves: a user's cell over an upstream embedding (looked up with
    tf.gather: an IndexedSlices gradient) and a zero state every leaf
    shares; inner nodes: another over both children, then ``top``."""

    def __init__(self, rng, top=None):
        self.embeddings = tensorflow.Variable(
            rng.standard_normal((VOCAB, EMBEDDING)).astype(np.float32))
        self.leaf, self.combine = UserCell(), UserCell()
        self.top = top or keras.layers.Identity()
        self.layers = [self.leaf, self.combine, self.top]
        self.zeros = tensorflow.zeros([1, HIDDEN])

    def state(self, tree):
        if isinstance(tree, int):
            return self.leaf([sj.gather(self.embeddings, [tree]), self.zeros])
        return self.top(self.combine([self.state(tree[0]), self.state(tree[1])]))

    def variables(self):
        return [self.embeddings] + [
            v for layer in self.layers for v in layer.trainable_variables]


@pytest.fixture
def layer_launches(monkeypatch):
    """Launches of each layer's batched call (the family rule's runs that
    did not raise NoRule), by layer."""
    launches = collections.Counter()
    rule = rules._FAMILY_RULES["layer"]

    def counted(entry, *args):
        result = rule(entry, *args)
        launches[entry.layer()] += 1
        return result
    monkeypatch.setitem(rules._FAMILY_RULES, "layer", counted)
    return launches


def layer_unbatched(layer):
    """Instances of ``layer``'s calls that ran one by one, by reason."""
    prefix = f"({layer.name})#"
    return {key: count for key, count in sj.stats()["unbatched"].items()
            if prefix in key.split(":")[0]}


def test_a_users_layer_runs_as_one_vectorized_call(parameters, layer_launches):
    rng = np.random.default_rng(11)
    model = UserTree(rng)
    minibatches = [[random_tree(rng, 4, VOCAB, 0.25) for _ in range(6)] for _ in range(3)]
    for trees in minibatches:
        sj.reset_stats()
        layer_launches.clear()
        loss, gradients = loss_and_gradients(model, trees, lazy=True)
        assert forced() == 0, sj.stats()["forced_evaluations"]
        assert sj.stats()["layers_not_recorded"] == {}
        counters = [count_calls(layer) for layer in model.layers[:2]]
        with eager():
            expected = loss_and_gradients(model, trees, lazy=False)
        assert_loss_and_gradients_equal((loss, gradients), expected, atol=1e-5)
        assert type(gradients[0]) is tensorflow.IndexedSlices
        for layer, counter in zip(model.layers, counters):
            assert layer_unbatched(layer) == {}
            assert 0 < layer_launches[layer] < counter[0], (layer_launches, counter)
            object.__delattr__(layer, "call")   # count_calls's


@pytest.mark.parametrize("top, cause", [
    (Spectral, "No pfor vectorization defined for Svd"),
    (ReadsAValue, "float() argument must be"),
])
def test_a_layer_vectorized_map_cannot_take_runs_per_instance(top, cause, parameters):
    rng = np.random.default_rng(12)
    model = UserTree(rng, top())
    minibatches = [[random_tree(rng, 3, VOCAB, 0.2) for _ in range(5)] for _ in range(3)]
    for number, trees in enumerate(minibatches):
        sj.reset_stats()
        counter = count_calls(model.top)
        loss, gradients = loss_and_gradients(model, trees, lazy=True)
        assert forced() == 0, sj.stats()["forced_evaluations"]
        # Evaluated: the layer's own calls of subgraphjit did not record.
        assert type(loss) is not VirtualNode
        launched, counter[0] = counter[0], 0
        unbatched = layer_unbatched(model.top)
        with eager():
            expected = loss_and_gradients(model, trees, lazy=False)
        assert_loss_and_gradients_equal((loss, gradients), expected, atol=1e-5)
        (reason, instances), = unbatched.items()
        assert f"vectorized_map failed: {cause}" in reason
        assert instances == counter[0]   # every call, one by one
        if number:   # remembered: no trace tries vectorized_map again
            assert launched == counter[0]
        object.__delattr__(model.top, "call")


class AddsALoss(keras.layers.Layer):
    def call(self, x):
        self.add_loss(sj.reduce_sum(x))
        return x * 2.0


class Counts(keras.layers.Layer):
    """Assigns a TensorFlow variable of its own when called."""

    def __init__(self):
        super().__init__()
        self.calls = tensorflow.Variable(0.0, trainable=False)

    def call(self, x):
        self.calls.assign_add(1.0)
        return x + self.calls


@pytest.mark.parametrize("make_layer, kwargs, reason", [
    (lambda: keras.layers.Dropout(0.5), {"training": True},
     "Dropout: it draws random numbers when called"),
    (lambda: keras.layers.Dense(2, activity_regularizer="l2"), {},
     "Dense: an activity regularizer adds a loss when called"),
    (lambda: keras.layers.BatchNormalization(), {"training": True},
     "BatchNormalization: its call assigns batch_normalization"),
    (lambda: keras.layers.Embedding(VOCAB, 2, mask_zero=True), {},
     "Embedding: the output carries a Keras mask"),
    (lambda: keras.layers.GRUCell(2, dropout=0.5), {"training": True},
     "GRUCell: dropout draws random masks when called"),
    (AddsALoss, {}, "AddsALoss: its call adds a loss"),
    (Counts, {}, "Counts: its call has stateful ops ['AssignAddVariableOp']"),
])
def test_refused_layers_run_as_eager_and_are_counted(make_layer, kwargs, reason):
    """Keras's own call runs, as before (a user's layer may record the ops
    of its call), with eager's values, losses, updated statistics and
    variables; each call is counted with the reason."""
    is_ids = "Embedding" in reason
    value = tensorflow.constant([[1, 2]]) if is_ids else tensorflow.ones([2, 3])
    args = (value, [tensorflow.zeros([2, 2])]) if "GRUCell" in reason else (value,)
    layer, reference = make_layer(), make_layer()
    for built in (layer, reference):
        built(*args)   # built, in inference: nothing random, nothing updated
    reference.set_weights(layer.get_weights())
    sj.reset_stats()
    for call in range(2):
        result = layer(sj.identity(args[0]), *args[1:], **kwargs)
        expected = reference(*args, **kwargs)
    (counted, calls), = sj.stats()["layers_not_recorded"].items()
    assert counted.startswith(f"keras.layers.{reason}") and calls == 2, counted
    if isinstance(layer, (keras.layers.Dropout, keras.layers.GRUCell)):   # random
        return
    np.testing.assert_allclose(np.asarray(result), expected.numpy(), rtol=1e-6)
    own = [getattr(layer, "calls", 0)] + layer.losses + layer.weights
    want = [getattr(reference, "calls", 0)] + reference.losses + reference.weights
    for got, wanted in zip(own, want, strict=True):
        np.testing.assert_allclose(np.asarray(got), np.asarray(wanted), rtol=1e-6)


@pytest.mark.parametrize("make_layer", [
    lambda: keras.layers.Dense(2, activation=lambda t: t - tensorflow.reduce_mean(t)),
    keras.layers.LayerNormalization,
    keras.layers.BatchNormalization,   # in inference: no statistics update
    lambda: keras.layers.Dropout(0.5),   # not training: no random mask
    lambda: keras.layers.Lambda(lambda t: t / tensorflow.reduce_sum(tensorflow.abs(t))),
])
def test_other_layers_record_per_instance(make_layer):
    """A Dense of an activation that may not be row-wise, and layers not
    known to be row-wise, record one node per call, run per instance (one
    tf.vectorized_map: each call sees its own operand, as the Lambda's
    sum over all of it shows), as eager."""
    layer = make_layer()
    values = [tensorflow.constant(np.random.default_rng(row).standard_normal((1, 3)),
                                  tensorflow.float32) for row in range(3)]
    sj.reset_stats()
    nodes = [layer(sj.identity(value)) for value in values]
    assert all(type(node) is VirtualNode for node in nodes)
    got = sj.build(sj.concat(nodes, 0)).numpy()
    assert forced() == 0 and sj.stats()["layers_not_recorded"] == {}
    assert layer_unbatched(layer) == {}
    expected = np.concatenate([layer(value).numpy() for value in values])
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6)


class TrainingAware(keras.layers.Layer):
    def call(self, x, training=None):
        return x * (3.0 if training else 1.0)


class Encoder(keras.Model):
    """Called with a tree in a keyword argument (Keras's own call, whose
    ``training`` its layers inherit), and recording its layers' calls."""

    def __init__(self):
        super().__init__()
        self.scale = TrainingAware()

    def call(self, leaves):
        return sj.concat([self.scale(sj.identity(leaf)) for leaf in leaves], 0)


@pytest.mark.parametrize("training", [True, False])
def test_a_recorded_call_keeps_the_training_it_inherited(training):
    """Keras gives a layer called in another's call that call's
    ``training``; the recorded call, evaluated after, keeps it."""
    leaves = [tensorflow.ones([1, 2]), 2 * tensorflow.ones([1, 2])]
    result = Encoder()(leaves=leaves, training=training)
    assert type(result) is VirtualNode
    np.testing.assert_allclose(result.numpy(), (3.0 if training else 1.0)
                               * np.array([[1, 1], [2, 2]], np.float32))


# -- a subclassed keras.Model recursing over a tree, trained ---------------------------

class Tree:
    """A tree Keras leaves alone as an argument (not a nest of numbers)."""

    def __init__(self, shape):
        self.shape = shape


class TreeModel(keras.Model):
    def __init__(self):
        super().__init__()
        self.embed = keras.layers.Embedding(VOCAB, EMBEDDING)
        self.leaf = keras.layers.Dense(HIDDEN, activation="tanh")
        self.combine = keras.layers.Dense(HIDDEN, activation="tanh")
        self.classify = keras.layers.Dense(CLASSES)

    def node(self, tree):
        if isinstance(tree, int):
            return self.leaf(self.embed(sj.identity(tensorflow.constant([tree]))))
        left, right = self.node(tree[0]), self.node(tree[1])
        return self.combine(sj.concat([left, right], axis=1))

    def call(self, trees):
        return self.classify(sj.concat([self.node(tree.shape) for tree in trees], 0))


def train(model, minibatches, lazy):
    optimizer = keras.optimizers.Adam(0.05)
    first_gradients = None
    for trees, labels in minibatches:
        with tensorflow.GradientTape() as tape:
            logits = model(trees=trees)
            loss = sj.reduce_mean(sj.nn.sparse_softmax_cross_entropy_with_logits(
                labels, logits))
            if lazy:
                assert type(loss) is VirtualNode and forced() == 0
                loss = sj.build(loss)
        gradients = tape.gradient(loss, model.trainable_variables)
        first_gradients = first_gradients or gradients
        optimizer.apply_gradients(zip(gradients, model.trainable_variables))
    return [v.numpy() for v in model.trainable_variables], first_gradients


def test_subclassed_model_recursing_over_trees_trains_as_eager(parameters):
    rng = np.random.default_rng(5)
    model = TreeModel()
    minibatches = [([Tree(random_tree(rng, 3, VOCAB, 0.25)) for _ in range(5)],
                    rng.integers(CLASSES, size=5).astype(np.int32)) for _ in range(3)]
    with eager():
        model(trees=minibatches[0][0])   # build, then keep the initial weights
    initial = model.get_weights()
    sj.reset_stats()
    trained, gradients = train(model, minibatches, lazy=True)
    assert forced() == 0, sj.stats()["forced_evaluations"]
    model.set_weights(initial)
    with eager():
        expected, expected_gradients = train(model, minibatches, lazy=False)
    for got, want in zip(gradients, expected_gradients, strict=True):
        assert_gradient_equal(got, want, atol=1e-5)   # types too
    assert len(trained) == len(model.trainable_variables) == 7
    for got, want in zip(trained, expected, strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


def test_a_layer_lives_while_its_recorded_calls_do_and_no_longer():
    """A layer the user drops before its calls are evaluated still runs
    them (eager TensorFlow would have run them already); once those nodes
    are gone too, the layer is freed (caches hold its op entry, which
    holds the layer only while a node of it lives)."""
    import gc
    import weakref

    def record():
        layer = keras.layers.Dense(HIDDEN, activation="tanh")
        node = layer(sj.tanh(tensorflow.ones([1, EMBEDDING])))
        assert type(node) is VirtualNode
        expected = layer(tensorflow.tanh(tensorflow.ones([1, EMBEDDING])))
        return node, expected.numpy(), weakref.ref(layer)

    node, expected, layer = record()
    gc.collect()
    assert layer() is not None
    np.testing.assert_allclose(node.numpy(), expected, rtol=1e-6)
    del node
    gc.collect()
    assert layer() is None


def test_keras_keeps_the_note_naming_the_users_line_when_it_re_raises():
    """Keras re-raises an error from a model's ``call`` as a new exception
    (the call's arguments added to its message); the note naming the
    user's line of the recorded op that failed survives it, whether the
    op failed as it was recorded (a shape error) or when a read in
    ``call`` evaluated it."""
    class Failing(keras.Model):
        def call(self, tree, at_evaluation=False):
            x = sj.tanh(tensorflow.ones([1, 5]))
            if not at_evaluation:
                return sj.matmul(x, tensorflow.ones([3, 2]))
            rows = sj.nn.embedding_lookup(tensorflow.ones([3, 2]),
                                          sj.cast(x * 0 + 7, tensorflow.int32))
            return float(sj.reduce_sum(rows))

    first = Failing.call.__code__.co_firstlineno
    for at_evaluation, op, line in ((False, "linalg.matmul", first + 3),
                                    (True, "nn.embedding_lookup", first + 4)):
        with pytest.raises(tensorflow.errors.InvalidArgumentError) as raised:
            Failing()(tree=("a", "b"), at_evaluation=at_evaluation)
        assert "Exception encountered when calling" in str(raised.value)   # Keras's
        assert f"raised by {op}, recorded at {__file__}:{line} in call" in \
            "\n".join(getattr(raised.value, "__notes__", [])), raised.value


def test_our_functions_as_activations_save_and_load_as_tensorflows(tmp_path):
    """Keras names an activation by its function (it must be a Python
    function: a native callable in its place saved but did not load)."""
    def build(module):
        return module.keras.Sequential([
            module.keras.Input((2,)),
            module.keras.layers.Dense(3, activation=module.nn.relu),
            module.keras.layers.Dense(2, activation=module.tanh)])

    ours, theirs = build(sj), build(tensorflow)
    assert ([layer.get_config()["activation"] for layer in ours.layers]
            == [layer.get_config()["activation"] for layer in theirs.layers])
    ours.save(tmp_path / "model.keras")
    loaded = keras.models.load_model(tmp_path / "model.keras")
    x = np.random.default_rng(0).normal(size=(4, 2)).astype(np.float32)
    np.testing.assert_allclose(loaded(x).numpy(), np.asarray(ours(x)), rtol=1e-6)
