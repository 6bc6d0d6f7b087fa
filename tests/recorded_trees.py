"""Helpers of the tests of user code that records trees through TensorFlow's
own machinery (Keras layers, ``tf.function`` cells): random trees, the
count of forced evaluations, and a tree minibatch's loss and gradients."""

import numpy as np
import tensorflow

import subgraphjit
from subgraphjit import VirtualNode


def forced():
    """Evaluations forced by a read so far, all sites together."""
    return sum(subgraphjit.stats()["forced_evaluations"].values())


def random_tree(rng, depth, vocabulary, leaf_chance):
    """Nested pairs of word ids below ``vocabulary``."""
    if depth == 0 or rng.random() < leaf_chance:
        return int(rng.integers(vocabulary))
    return (random_tree(rng, depth - 1, vocabulary, leaf_chance),
            random_tree(rng, depth - 1, vocabulary, leaf_chance))


def loss_and_gradients(encode, trees, variables, lazy):
    """A weighted sum of the trees' root states (``encode(tree)``, rows of
    one width) and its gradients for ``variables()``, asked after the
    forward (Keras creates a layer's variables at its first call);
    ``lazy``: each root must be a recorded node, none forced, the loss
    built."""
    with tensorflow.GradientTape() as tape:
        roots = [encode(tree) for tree in trees]
        if lazy:
            assert all(type(root) is VirtualNode for root in roots)
            assert forced() == 0, subgraphjit.stats()["forced_evaluations"]
        width = roots[0].shape[-1]
        loss = subgraphjit.reduce_sum(subgraphjit.concat(roots, 0) * np.arange(
            1, 1 + width, dtype=np.float32))
        if lazy:
            loss = subgraphjit.build(loss)
    return loss, tape.gradient(loss, variables())
