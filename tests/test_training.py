"""Several optimizer steps under subgraphjit leave the variables where eager
TensorFlow leaves them.  Adam, Adagrad and RMSprop apply an IndexedSlices
gradient entry by entry, so this fails whenever a gradient's type or its
entries differ from eager's, even when its dense value is the same.  Under
subgraphjit, ``tf.keras.optimizers`` run their update as one compiled call;
it too must leave the variables where Keras's eager update does."""

import numpy as np
import pytest
import tensorflow

import subgraphjit as tf
from subgraphjit.dropin import optimizers
from experiments.example_models import CONTROL_FLOW_MODELS, MODELS

OPTIMIZERS = ["SGD", "Adam", "Adagrad", "RMSprop"]


def train(module, model, minibatches, optimizer):
    losses = []
    for examples in minibatches:
        with module.GradientTape() as tape:
            loss = module.add_n([model.loss(module, e) for e in examples])
        gradients = tape.gradient(loss, model.variables)
        optimizer.apply_gradients(zip(gradients, model.variables))
        losses.append(float(loss))
    return losses


@pytest.fixture(params=["op", "subgraph"])
def granularity(request):
    previous = tf.get_parameter("granularity"), tf.get_parameter("collect")
    tf.set_parameter("granularity", request.param)
    tf.set_parameter("collect", 1)   # patterns replace from the second step on
    tf.reset_patterns()
    yield request.param
    tf.set_parameter("granularity", previous[0])
    tf.set_parameter("collect", previous[1])
    tf.reset_patterns()


def assert_steps_equal_eager(make_model, optimizer, seed):
    rng = np.random.default_rng(seed)
    eager_model = make_model(rng)
    minibatches = [eager_model.random_examples(rng, 4) for _ in range(4)]
    lazy_model = make_model(np.random.default_rng(seed))
    # Each module's own optimizer class: subgraphjit's runs its update as
    # one compiled call (dropin/optimizers.py).
    expected = train(tensorflow, eager_model, minibatches,
                     getattr(tensorflow.keras.optimizers, optimizer)(0.05))
    got = train(tf, lazy_model, minibatches, getattr(tf.keras.optimizers, optimizer)(0.05))
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)
    for lazy, eager in zip(lazy_model.variables, eager_model.variables, strict=True):
        np.testing.assert_allclose(lazy.numpy(), eager.numpy(), rtol=1e-4, atol=1e-5)


FOUR = ["bilstm_tagger", "tree_lstm", "mv_rnn", "lattice_lstm"]


@pytest.mark.parametrize("optimizer", OPTIMIZERS)
@pytest.mark.parametrize("model_name", FOUR)
def test_optimizer_steps_equal_eager(model_name, optimizer, granularity):
    assert_steps_equal_eager(MODELS[model_name], optimizer, seed=7)


# The other example models, with patterns only (each optimizer's four
# steps cost a few seconds per model and granularity).  (RMSprop's first
# step is about the learning rate times the sign of each gradient entry,
# so an entry near zero turns float noise into a step: with seed 7 the
# adaptive-computation model's first gradients agree to 9e-8, its
# variables after four steps to 1.4e-5, just over the tolerance.)
# (The control-flow models read a value per instance by design: whether
# the reads force most of a run's work, and so warn, depends on which
# tests ran before in the worker; test_forced.py tests the warning.)
@pytest.mark.filterwarnings("ignore::subgraphjit.forced.ForcedEvaluationWarning")
@pytest.mark.parametrize("granularity", ["subgraph"], indirect=True)
@pytest.mark.parametrize("optimizer", OPTIMIZERS)
@pytest.mark.parametrize("model_name", sorted(set(MODELS) - set(FOUR))
                         + sorted(CONTROL_FLOW_MODELS))
def test_every_example_models_optimizer_steps_equal_eager(model_name, optimizer,
                                                          granularity):
    assert_steps_equal_eager({**MODELS, **CONTROL_FLOW_MODELS}[model_name], optimizer,
                             seed=11)


@pytest.mark.filterwarnings("ignore:Gradients do not exist")   # the None step
@pytest.mark.parametrize("optimizer", OPTIMIZERS)
def test_compiled_updates_equal_keras_eager_updates(optimizer):
    """tf.keras.optimizers under subgraphjit: Keras's class (isinstance
    holds), its update compiled once the optimizer is built, the variables
    bit for bit where Keras's eager update leaves them after dense and
    IndexedSlices gradients of changing sizes, and a None gradient; the
    same compiled update reused, not one traced per step."""
    rng = np.random.default_rng(3)
    initial = [rng.normal(size=(6, 3)).astype(np.float32),
               rng.normal(size=(3,)).astype(np.float32)]
    steps = []
    for size in (2, 4, 3, 5, 1):
        indices = rng.integers(0, 6, size=size).astype(np.int32)
        steps.append((tensorflow.IndexedSlices(
            tensorflow.constant(rng.normal(size=(size, 3)).astype(np.float32)),
            tensorflow.constant(indices), tensorflow.constant([6, 3])),
            tensorflow.constant(rng.normal(size=(3,)).astype(np.float32))))

    def run(make):
        variables = [tensorflow.Variable(value) for value in initial]
        optimizer_object = make(0.1)
        for number, (sparse, dense) in enumerate(steps):
            gradients = [sparse, None if number == 3 else dense]
            optimizer_object.apply_gradients(zip(gradients, variables))
        return optimizer_object, [variable.numpy() for variable in variables]

    keras_class = getattr(tensorflow.keras.optimizers, optimizer)
    _, expected = run(keras_class)
    ours, got = run(getattr(tf.keras.optimizers, optimizer))
    assert isinstance(ours, keras_class) and type(ours) is not keras_class
    for value, want in zip(got, expected, strict=True):
        np.testing.assert_array_equal(value, want)
    assert len(optimizers._UPDATES[ours]) == 1   # one update, of any number of entries


@pytest.mark.parametrize("options", [{}, {"epsilon": 0.0}])
def test_adagrad_steps_on_looked_up_rows_give_keras_bits(options):
    """Adagrad's step for an IndexedSlices gradient touches only its rows
    (optimizers.RowwiseAdagrad) and leaves the variable and accumulator
    bit for bit where Keras's eager step does, duplicate indices included;
    without epsilon Keras's own step runs (a zero accumulator row would
    give 0 / 0 in rows no entry touched)."""
    rng = np.random.default_rng(11)
    initial = rng.normal(size=(50, 4)).astype(np.float32)
    steps = [tensorflow.IndexedSlices(
        tensorflow.constant(rng.normal(size=(size, 4)).astype(np.float32)),
        tensorflow.constant(rng.integers(0, 8, size=size).astype(np.int32)),
        tensorflow.constant([50, 4])) for size in (6, 9, 3, 12)]

    def run(make):
        variable = tensorflow.Variable(initial)
        optimizer_object = make(0.1, **options)
        for gradient in steps:
            optimizer_object.apply_gradients([(gradient, variable)])
        return variable.numpy(), optimizer_object.variables[-1].numpy()

    expected = run(tensorflow.keras.optimizers.Adagrad)
    got = run(tf.keras.optimizers.Adagrad)
    assert isinstance(tf.keras.optimizers.Adagrad(0.1), optimizers.RowwiseAdagrad)
    for value, want in zip(got, expected, strict=True):
        np.testing.assert_array_equal(value, want)
