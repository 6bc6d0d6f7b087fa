"""Recording cost per op: the Tree-LSTM on SST minibatches, recorded by
subgraphjit and never evaluated, against the same Python model code running
eagerly.  Prints microseconds per recorded op, and the memory a recorded op
holds: bytes allocated (tracemalloc: sizes as requested from Python's
allocators, plus the chunks that hold nodes) and resident-set growth (/proc/self/statm, Linux only), each
divided by the ops recorded.

    python benchmarks/record_cost.py [--batch-sizes 25 256] [--repeats 5]

Beside it, in the same run, DyNet's cost to build the same model's graph
for the same minibatch, per graph node, its Python model code included
(benchmarks/dynet_treelstm.py in a subprocess, if ``dynet38`` is
installed).  Issue 17's target for subgraphjit: 0.25 us per op.
"""

import argparse
import gc
import importlib.util
import json
import os
import pathlib
import subprocess
import sys
import time
import tracemalloc

import numpy as np

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

import subgraphjit  # noqa: E402
from subgraphjit import _native  # noqa: E402
from experiments import sst  # noqa: E402
from experiments.treelstm import TreeLSTM  # noqa: E402


def time_recording(model, minibatch, vocabulary):
    """Seconds to record one minibatch's loss inside a GradientTape, as the
    training loop does, and the ops recorded; the tape's exit then evaluates
    it (not timed)."""
    subgraphjit.reset_stats()
    with subgraphjit.GradientTape():
        started = time.perf_counter()
        subgraphjit.add_n([model.loss(tree, vocabulary) for tree in minibatch])
        elapsed = time.perf_counter() - started
        recorded = subgraphjit.stats()["nodes_recorded"]
    return elapsed, recorded


def resident_bytes():
    try:
        with open("/proc/self/statm") as statm:
            return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except OSError:
        return float("nan")


def node_storage():
    """Bytes of the chunks that hold nodes (native/slab.c), which
    tracemalloc does not see."""
    slab = _native.slab_statistics()
    return slab["chunks"] * slab["chunk_bytes"]


def memory_per_op(model, minibatch, vocabulary, ops_per_minibatch):
    """Bytes per recorded op that a recorded graph holds: allocated
    (tracemalloc, and the chunks nodes live in) and resident-set growth.  Copies of the minibatch's
    recording are kept alive together (2,000,000 ops or more) and each
    measure is taken over the second half of them: the first ones reuse
    memory the process already holds (freed by earlier evaluations).
    Recorded outside any scope, so nothing is evaluated (inside one, the
    scope's list adds 8 bytes per op)."""
    sizes = {}
    # Resident first: memory the other pass freed would be reused without
    # growing the resident set.  (Apart: tracemalloc's own tables count as RSS.)
    for traced in (False, True):
        gc.collect()
        gc.disable()  # as a scope does while recording
        if traced:
            tracemalloc.start()
        subgraphjit.reset_stats()
        losses, marks = [], []
        for _ in range(2 * -(-1_000_000 // ops_per_minibatch)):
            losses.append(subgraphjit.add_n(
                [model.loss(tree, vocabulary) for tree in minibatch]))
            marks.append((tracemalloc.get_traced_memory()[0] + node_storage()
                          if traced else resident_bytes(),
                          subgraphjit.stats()["nodes_recorded"]))
        tracemalloc.stop()
        del losses
        gc.enable()
        (first, first_ops), (last, last_ops) = marks[len(marks) // 2 - 1], \
            marks[-1]
        sizes[traced] = (last - first) / (last_ops - first_ops)
    return sizes[True], sizes[False]


def dynet_construction(batch_size, repeats):
    """DyNet's microseconds per node (median) building this batch size's
    first minibatch, or None without DyNet."""
    if importlib.util.find_spec("dynet") is None:
        return None
    command = [sys.executable, str(pathlib.Path(__file__).with_name("dynet_treelstm.py")),
               "--construction", "--batch-size", str(batch_size),
               "--passes", str(repeats)]
    output = subprocess.run(command, capture_output=True, text=True, check=True)
    return json.loads(output.stdout.strip().splitlines()[-1])["us_per_node_median"]


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
        minibatch = trees[:batch_size]
        time_recording(model, minibatch, vocabulary)  # warm the spec caches
        per_op = []
        for _ in range(arguments.repeats):
            gc.collect()
            elapsed, recorded = time_recording(model, minibatch, vocabulary)
            per_op.append(elapsed / recorded * 1e6)
        rows.append((batch_size, recorded, np.median(per_op), min(per_op),
                     np.median(per_op) * recorded / 1e3,
                     dynet_construction(batch_size, arguments.repeats),
                     *memory_per_op(model, minibatch, vocabulary, recorded)))
    print(f"{'batch':>5}  {'ops recorded':>12}  {'us/op (median)':>14}  "
          f"{'us/op (best)':>12}  {'ms/minibatch':>12}  {'DyNet us/node':>13}  "
          f"{'x DyNet':>7}  {'bytes/op allocated':>18}  {'bytes/op resident':>17}")
    for (batch_size, recorded, median, best, total, dynet, traced,
         resident) in rows:
        versus = (f"{dynet:>13.2f}  {median / dynet:>6.1f}x" if dynet
                  else f"{'n/a':>13}  {'':>7}")
        print(f"{batch_size:>5}  {recorded:>12}  {median:>14.2f}  {best:>12.2f}  "
              f"{total:>12.1f}  {versus}  {traced:>18.0f}  {resident:>17.0f}")
    print("(time of the user's Python model code plus recording, divided by "
          "the ops recorded; nothing is evaluated.  DyNet: the same model's "
          "graph built for the same minibatch, per node, its Python code "
          "included; n/a without `pip install dynet38`)")


if __name__ == "__main__":
    main()
