"""Recording cost per op: the Tree-LSTM on SST minibatches, recorded by
subgraphjit and never evaluated, against the same Python model code running
eagerly.  Prints microseconds per recorded op.

    python benchmarks/record_cost.py [--batch-sizes 25 256] [--repeats 5]

DyNet builds its graph at about 0.5 microseconds per node on this machine
(../shared/DESIGN.md); the target for subgraphjit is under 2.
"""

import argparse
import gc
import pathlib
import sys
import time

import numpy as np

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

import subgraphjit  # noqa: E402
from experiments import sst  # noqa: E402
from experiments.treelstm import TreeLSTM  # noqa: E402


def time_recording(model, batch, vocabulary):
    """Seconds to record one minibatch's loss inside a GradientTape, as the
    training loop does, and the ops recorded; the tape's exit then evaluates
    it (not timed)."""
    subgraphjit.reset_stats()
    with subgraphjit.GradientTape():
        started = time.perf_counter()
        subgraphjit.add_n([model.loss(tree, vocabulary) for tree in batch])
        elapsed = time.perf_counter() - started
        recorded = subgraphjit.stats()["nodes_recorded"]
    return elapsed, recorded


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[25, 256])
    parser.add_argument("--repeats", type=int, default=5)
    arguments = parser.parse_args()

    trees = sst.load_split("train", limit=2000)
    vocabulary = sst.Vocabulary(trees)
    model = TreeLSTM(subgraphjit, len(vocabulary), 2)
    rows = []
    for batch_size in arguments.batch_sizes:
        batch = trees[:batch_size]
        time_recording(model, batch, vocabulary)  # warm the spec caches
        per_op = []
        for _ in range(arguments.repeats):
            gc.collect()
            elapsed, recorded = time_recording(model, batch, vocabulary)
            per_op.append(elapsed / recorded * 1e6)
        rows.append((batch_size, recorded, np.median(per_op), min(per_op),
                     np.median(per_op) * recorded / 1e3))
    print(f"{'batch':>5}  {'ops recorded':>12}  {'us/op (median)':>14}  "
          f"{'us/op (best)':>12}  {'ms/minibatch':>12}  {'vs DyNet 0.5 us':>15}")
    for batch_size, recorded, median, best, total in rows:
        print(f"{batch_size:>5}  {recorded:>12}  {median:>14.2f}  {best:>12.2f}  "
              f"{total:>12.1f}  {median / 0.5:>14.1f}x")
    print("(time of the user's Python model code plus recording, divided by "
          "the ops recorded; nothing is evaluated)")


if __name__ == "__main__":
    main()
