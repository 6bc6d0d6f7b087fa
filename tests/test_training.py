"""Several optimizer steps under subgraphjit leave the variables where eager
TensorFlow leaves them.  Adam, Adagrad and RMSprop apply an IndexedSlices
gradient entry by entry, so this fails whenever a gradient's type or its
entries differ from eager's, even when its dense value is the same."""

import numpy as np
import pytest
import tensorflow

import subgraphjit as tf
from experiments.example_models import MODELS

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


@pytest.mark.parametrize("optimizer", OPTIMIZERS)
@pytest.mark.parametrize("model_name", ["bilstm_tagger", "tree_lstm", "mv_rnn",
                                        "lattice_lstm"])
def test_optimizer_steps_equal_eager(model_name, optimizer, granularity):
    rng = np.random.default_rng(7)
    eager_model = MODELS[model_name](rng)
    minibatches = [eager_model.random_examples(rng, 4) for _ in range(4)]
    lazy_model = MODELS[model_name](np.random.default_rng(7))
    make = getattr(tensorflow.keras.optimizers, optimizer)
    expected = train(tensorflow, eager_model, minibatches, make(0.05))
    got = train(tf, lazy_model, minibatches, make(0.05))
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)
    for lazy, eager in zip(lazy_model.variables, eager_model.variables):
        np.testing.assert_allclose(lazy.numpy(), eager.numpy(), rtol=1e-4, atol=1e-5)
