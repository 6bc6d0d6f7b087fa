"""The SST Tree-LSTM trains identically under tensorflow and subgraphjit."""

import numpy as np
import pytest
import tensorflow

import subgraphjit
from experiments import sst
from experiments.treelstm import TreeLSTM, train_step


@pytest.fixture(scope="module")
def trees():
    return sst.load_split("train", limit=24)


def test_sst_parses_every_training_tree():
    trees = sst.load_split("train", binary=False)
    assert len(trees) == 8544
    for tree in trees:
        nodes = tree.nodes()
        leaves = sum(node.is_leaf for node in nodes)
        assert len(nodes) == 2 * leaves - 1
        assert all(0 <= node.label <= 4 for node in nodes)


def test_binary_split_drops_neutral_sentences_and_maps_labels(trees):
    assert all(tree.label in (0, 1) for tree in trees)
    vocabulary = sst.Vocabulary(trees)
    assert vocabulary["a-word-that-is-not-there"] == 0
    assert vocabulary[trees[0].words()[0]] > 0


@pytest.mark.parametrize("scheduler", ["none", "depth", "agenda", "critical"])
def test_training_matches_eager_tensorflow(trees, scheduler, parameters):
    vocabulary = sst.Vocabulary(trees)
    minibatches = [trees[0:4], trees[4:8], trees[8:12]]
    runs = {}
    parameters(scheduler=scheduler)
    for module in (tensorflow, subgraphjit):
        model = TreeLSTM(module, len(vocabulary), 2, embedding=16, hidden=8, seed=1)
        optimizer = tensorflow.keras.optimizers.Adagrad(learning_rate=0.1)
        losses = [train_step(module, model, optimizer, minibatch, vocabulary)
                  for minibatch in minibatches]
        runs[module.__name__] = (losses, [v.numpy() for v in model.variables])
    (eager_losses, eager_weights), (lazy_losses, lazy_weights) = runs.values()
    np.testing.assert_allclose(lazy_losses, eager_losses, rtol=1e-5)
    assert eager_losses[0] != eager_losses[-1]  # it did train
    for lazy, eager in zip(lazy_weights, eager_weights):
        np.testing.assert_allclose(lazy, eager, rtol=1e-4, atol=1e-6)
