"""The backward and the optimizer update run while the next minibatch
records (subgraphjit/overlap.py): training leaves every variable
where eager TensorFlow leaves it, a variable read in the asynchronous
stretch sees the update, and an error of an op run there is raised at the
next evaluation, saying why."""

import numpy as np
import pytest
import tensorflow

import subgraphjit as tf
from subgraphjit import overlap
from experiments.example_models import MODELS
from test_programs import compiled  # noqa: F401 (fixture)


def step(module, model, optimizer, examples):
    with module.GradientTape() as tape:
        loss = module.add_n([model.loss(module, example) for example in examples])
    gradients = tape.gradient(loss, model.variables)
    optimizer.apply_gradients(zip(gradients, model.variables))
    return loss


@pytest.fixture(params=[True, False], ids=["overlap", "in place"])
def overlapping(request):
    tf.set_parameter("overlap", request.param)
    yield request.param
    overlap.end()
    tf.set_parameter("overlap", True)


@pytest.mark.parametrize("optimizer", ["Adam", "Adagrad"])
def test_training_equals_eager_and_reads_see_the_update(optimizer, overlapping, compiled):
    """The Tree-LSTM's embedding gradient is an IndexedSlices: the update's
    flat call takes its promised shapes.  Each step's variables are read
    right after ``apply_gradients``, while the update may still be queued."""
    rng = np.random.default_rng(11)
    eager_model = MODELS["tree_lstm"](rng)
    lazy_model = MODELS["tree_lstm"](np.random.default_rng(11))
    minibatches = [eager_model.random_examples(rng, 4) for _ in range(5)]
    eager_optimizer = getattr(tensorflow.keras.optimizers, optimizer)(0.05)
    lazy_optimizer = getattr(tf.keras.optimizers, optimizer)(0.05)
    tf.reset_stats()
    queued = 0
    for examples in minibatches:
        # (From the second step on, eager TensorFlow's ops run in our
        # asynchronous stretch too.)
        expected = float(step(tensorflow, eager_model, eager_optimizer, examples))
        loss = step(tf, lazy_model, lazy_optimizer, examples)
        queued += overlap.active()
        for lazy, eager in zip(lazy_model.variables, eager_model.variables):
            np.testing.assert_allclose(lazy.numpy(), eager.numpy(), rtol=1e-4, atol=1e-5)
        np.testing.assert_allclose(float(loss), expected, rtol=1e-5, atol=1e-6)
    assert tf.stats()["program_runs"] >= 3
    assert queued == (len(minibatches) if overlapping else 0)


def test_an_error_in_the_asynchronous_stretch_is_raised_at_the_next_evaluation(compiled):
    rng = np.random.default_rng(5)
    model = MODELS["tree_lstm"](rng)
    optimizer = tf.keras.optimizers.SGD(0.1)
    for _ in range(3):
        step(tf, model, optimizer, model.random_examples(rng, 3))
    assert overlap.active()
    # An index out of range: TensorFlow finds it when the op runs, queued.
    tensorflow.gather(tensorflow.constant([1.0, 2.0]), [7])
    with pytest.raises(tensorflow.errors.InvalidArgumentError) as raised:
        tf.build(step(tf, model, optimizer, model.random_examples(rng, 3)))
    assert any("set_parameter('overlap', False)" in note
               for note in raised.value.__notes__)
    assert not overlap.active()
    # And the next minibatch trains as usual.
    before = [variable.numpy() for variable in model.variables]
    float(step(tf, model, optimizer, model.random_examples(rng, 3)))
    assert any(not np.array_equal(variable.numpy(), old)
               for variable, old in zip(model.variables, before))
