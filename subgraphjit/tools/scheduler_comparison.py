"""``subgraphjit tune --schedulers``: batches per minibatch for every
scheduler on every example model (ED-Batch figure 7), with the FSM's
training time and iterations (ED-Batch table 4).

Scheduling depends only on the graph's structure, so nothing is executed:
each model records the loss of two minibatches lazily, the FSM trains on the
first and every scheduler is counted on the second (a learned policy must
generalise to new inputs).  The models are the example models of
``experiments/example_models.py`` on random inputs, the Tree-LSTM on SST
trees and the lattice LSTM on Weibo NER messages.
"""

import dataclasses
import sys

import numpy as np
from tqdm import tqdm

from ..batcher.graph import BatchGraph
from ..batcher.schedulers import SCHEDULERS, lower_bound
from ..batcher.schedulers.fsm import ENCODINGS, FsmConfig, FsmPolicy, FsmScheduler
from . import REPOSITORY
from .report import print_table

COLUMNS = ("model", "nodes", "lower bound", "depth", "agenda", "critical",
           *(f"fsm-{encoding}" for encoding in ENCODINGS),
           "fsm/agenda", "train s", "iterations", "states", "coarse", "fallbacks")


def count_batches(graph, scheduler):
    """How many batches the scheduler needs for the graph (nothing runs)."""
    return len(scheduler.schedule(graph))


def recorded_graph(loss_of_minibatch):
    """The BatchGraph of one minibatch's loss, recorded but not evaluated."""
    import subgraphjit as tf
    from ..evaluate import unevaluated_ancestors

    saved = tf.get_parameter("granularity")
    tf.set_parameter("granularity", "op")
    try:
        loss = loss_of_minibatch(tf)
        return BatchGraph(unevaluated_ancestors([loss]))
    finally:
        tf.set_parameter("granularity", saved)


def _make_experiments_importable():
    if not (REPOSITORY / "experiments").is_dir():
        raise SystemExit("subgraphjit tune --schedulers runs the example models "
                         "of a source checkout's experiments/; this installed "
                         "copy has none")
    if str(REPOSITORY) not in sys.path:
        sys.path.insert(0, str(REPOSITORY))


def example_minibatches(batch_size, seed, models=None):
    """(name, loss_of_minibatch for training, for testing) per model, for
    the models named in ``models`` (all if None)."""
    _make_experiments_importable()
    from experiments.example_models import MODELS, LatticeLSTM

    def wanted(name):
        return models is None or name in models

    # A generator per model, so a model's minibatches do not depend on
    # which other models were asked for.
    for number, (name, model_class) in enumerate(MODELS.items()):
        if wanted(name):
            rng = np.random.default_rng([seed, number])
            model = model_class(rng)
            yield name, *(_loss_over(model, model.random_examples(rng, batch_size))
                          for _ in range(2))
    if wanted("tree_lstm_sst"):
        yield ("tree_lstm_sst", *_sst_minibatches(batch_size, seed))
    if not wanted("lattice_lstm_weibo"):
        return
    from experiments.weibo_ner import Lattices
    lattices = Lattices()
    examples = lattices.examples("train", 2 * batch_size)
    model = LatticeLSTM(np.random.default_rng([seed, len(MODELS)]),
                        vocabulary=len(lattices.characters),
                        classes=len(lattices.tags))
    yield ("lattice_lstm_weibo", _loss_over(model, examples[:batch_size]),
           _loss_over(model, examples[batch_size:]))


def _loss_over(model, examples):
    return lambda tf: tf.add_n([model.loss(tf, example) for example in examples])


def _sst_minibatches(batch_size, seed):
    from experiments.sst import Vocabulary, load_split
    from experiments.treelstm import TreeLSTM

    import subgraphjit

    trees = load_split("train", limit=2 * batch_size)
    vocabulary = Vocabulary(trees)
    # One model for both minibatches: type names include its variables.
    model = TreeLSTM(subgraphjit, len(vocabulary), 2, embedding=8, hidden=6,
                     seed=seed)

    def loss_over(chosen):
        return lambda tf: tf.add_n([model.loss(tree, vocabulary) for tree in chosen])
    return loss_over(trees[:batch_size]), loss_over(trees[batch_size:])


def compare(batch_size=32, seed=0, configs=(FsmConfig(),), models=None):
    """Rows (see COLUMNS) per FSM config, one per model; each model's
    minibatches are recorded once for every config."""
    rows = {config: [] for config in configs}
    sources = list(example_minibatches(batch_size, seed, models))
    if not sources:
        raise SystemExit(f"--models: none of {sorted(models)} is a model here")
    for name, train_loss, test_loss in tqdm(sources, desc="comparing schedulers",
                                            unit="model"):
        train_graph, test_graph = recorded_graph(train_loss), recorded_graph(test_loss)
        heuristics = {scheduler: count_batches(test_graph, SCHEDULERS[scheduler]())
                      for scheduler in ("depth", "agenda", "critical")}
        for config in configs:
            counts = dict(heuristics)
            for encoding in ENCODINGS:
                policy = FsmPolicy(dataclasses.replace(config, encoding=encoding))
                report = policy.train(train_graph, progress=False)
                scheduler = FsmScheduler(policy)
                counts[f"fsm-{encoding}"] = count_batches(test_graph, scheduler)
                if encoding == config.encoding:
                    chosen = (report, scheduler.coarse_decisions, scheduler.fallbacks)
            report, coarse, fallbacks = chosen
            fsm = counts[f"fsm-{config.encoding}"]
            rows[config].append((
                name, sum(t >= 0 for t in test_graph.type_of),
                lower_bound(test_graph), counts["depth"], counts["agenda"],
                counts["critical"],
                *(counts[f"fsm-{encoding}"] for encoding in ENCODINGS),
                counts["agenda"] / fsm, report.seconds, report.iterations,
                report.states, coarse, fallbacks))
    return rows


def print_rows(rows, batch_size, config):
    print(f"\nBatches per minibatch of {batch_size} (ED-Batch figure 7 and "
          f"table 4); the FSM ({config.encoding} encoding for fsm/agenda and "
          "the last five columns) trained on another minibatch:")
    print_table(COLUMNS, [[f"{value:.2f}" if isinstance(value, float) else value
                           for value in row] for row in rows])

