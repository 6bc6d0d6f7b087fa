"""Pipelined inference's part sizes, compared in one process.

The Tree-LSTM's inference on SST minibatches (as ``batching.py`` runs it,
one thread for TensorFlow), with the ``pipeline`` parameter set to each
value in turn, pass by pass, in alternating order.  Timing every setting
in the same process, interleaved, keeps the machine's drift (this VM's
speed moves by 10-20% between processes minutes apart) out of the ratios.

    python benchmarks/pipeline_parts.py [--batch-sizes 25 256]
        [--settings 0 20000 40000] [--passes 6]

Prints, per batch size and setting, the median ms per minibatch over the
passes, its ratio to the first setting, and the compiled program runs and
pipelined parts per minibatch.  0 evaluates a scope only when it closes;
a scope under twice the setting (by the last inference scope) has one
part before its close (``context.FIRST_SHARE``).
"""

import argparse
import pathlib
import sys
import time

import numpy as np
import tensorflow

tensorflow.config.threading.set_intra_op_parallelism_threads(1)
tensorflow.config.threading.set_inter_op_parallelism_threads(1)

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

import subgraphjit  # noqa: E402
from experiments import sst  # noqa: E402
from experiments.treelstm import TreeLSTM, train_step  # noqa: E402


def rows(batch_size, settings, passes, trees, vocabulary):
    model = TreeLSTM(subgraphjit, len(vocabulary), 2)
    optimizer = subgraphjit.keras.optimizers.Adagrad(0.05)
    minibatches = [trees[k:k + batch_size] for k in range(0, len(trees), batch_size)]

    def infer():
        for minibatch in minibatches:
            with subgraphjit.batching():
                outputs = [model.logits(tree, vocabulary) for tree in minibatch]
            [np.asarray(output) for output in outputs]

    # Warm up as batching.py does (the granularity trials, every program
    # compiled), then once per setting: its parts' programs.
    while len(subgraphjit.stats()["granularity_chosen"]) < 2:
        for minibatch in minibatches:
            train_step(subgraphjit, model, optimizer, minibatch, vocabulary)
        infer()
    for setting in settings:
        subgraphjit.set_parameter("pipeline", setting)
        infer()
    times = {setting: [] for setting in settings}
    counts = {setting: (0, 0) for setting in settings}
    for turn in range(passes):
        order = settings if turn % 2 == 0 else settings[::-1]
        for setting in order:
            subgraphjit.set_parameter("pipeline", setting)
            subgraphjit.reset_stats()
            started = time.perf_counter()
            infer()
            times[setting].append((time.perf_counter() - started) / len(minibatches))
            statistics = subgraphjit.stats()
            counts[setting] = (statistics["program_runs"] / len(minibatches),
                               statistics["pipelined_evaluations"] / len(minibatches))
    first = np.median(times[settings[0]])
    return [(batch_size, setting, np.median(times[setting]) * 1e3,
             np.median(times[setting]) / first, *counts[setting]) for setting in settings]


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[25, 256])
    parser.add_argument("--settings", type=int, nargs="+", default=[0, 20_000, 40_000])
    parser.add_argument("--passes", type=int, default=6)
    parser.add_argument("--trees", type=int, default=2000)
    arguments = parser.parse_args()
    trees = sst.load_split("train", limit=arguments.trees)
    vocabulary = sst.Vocabulary(trees)
    default = subgraphjit.get_parameter("pipeline")
    print(f"SST Tree-LSTM inference, first {arguments.trees} training trees, 1 thread; "
          f"median of {arguments.passes} passes per setting, alternating in one process")
    print(f"{'batch':>5} {'pipeline':>8} {'ms/minibatch':>12} {'x first':>8} "
          f"{'programs/mb':>11} {'parts/mb':>8}")
    for batch_size in arguments.batch_sizes:
        subgraphjit.reset_patterns()
        for row in rows(batch_size, arguments.settings, arguments.passes, trees, vocabulary):
            print(f"{row[0]:>5} {row[1]:>8} {row[2]:>12.2f} {row[3]:>8.3f} "
                  f"{row[4]:>11.2f} {row[5]:>8.2f}")
        subgraphjit.set_parameter("pipeline", default)


if __name__ == "__main__":
    main()
