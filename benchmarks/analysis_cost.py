"""The front end's cost per minibatch and per node, beside DyNet's training step.

Issue 17 asks that the analysis and the per-minibatch pattern matching cost
at most 0.15 microseconds per recorded node, and that the front end as a
whole (the user's model code and its recording, the matching, the
analysis) cost at most a third of DyNet's whole training step.  This
records the Tree-LSTM's training loss (SST, embedding 300, hidden 150) on
random minibatches inside a GradientTape, as training does, under each
scheduler and granularity, and prints per minibatch: the time to run the
model code (recording), the pattern search and the analysis (grouping,
duplicates, the schedule, the program's plan; `tf.stats()`, without
compile time, without waiting for the previous minibatch's queued work
or making the call's tensors, both execution), the first two per
recorded node, the share of evaluations run as
a compiled program (the rest ran step by step, whose analysis costs
more), and their sum against
DyNet's training step (forward, backward and update) on the same trees,
timed in the same run by benchmarks/dynet_treelstm.py (if ``dynet38`` is
installed).  The forward runs, untimed; no backward.  The first ``collect
+ 10`` minibatches of each setting warm up (pattern collection, the
FSM's training, the first compiles) and are not counted.

    python benchmarks/analysis_cost.py [--batch-sizes 25 256] [--minibatches 8]
"""

import argparse
import importlib.util
import json
import pathlib
import subprocess
import sys
import time

import numpy as np
from tqdm import tqdm

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

import subgraphjit as tf  # noqa: E402
from experiments import sst  # noqa: E402
from experiments.treelstm import TreeLSTM  # noqa: E402
from subgraphjit.tools.report import print_table  # noqa: E402

# The default scheduler (critical) first.
SETTINGS = [(scheduler, granularity) for granularity in ("subgraph", "op")
            for scheduler in ("critical", "depth", "agenda", "fsm")]
TREES = 2000


def dynet_step_ms(batch_size):
    """DyNet's milliseconds per training minibatch (one pass over the
    trees, autobatching), or None without DyNet."""
    if importlib.util.find_spec("dynet") is None:
        return None
    command = [sys.executable, str(pathlib.Path(__file__).with_name("dynet_treelstm.py")),
               "--batch-size", str(batch_size), "--trees", str(TREES), "--passes", "1",
               "--dynet-autobatch", "1"]
    output = subprocess.run(command, capture_output=True, text=True, check=True)
    rate = json.loads(output.stdout.strip().splitlines()[-1])["train"]
    return batch_size / rate * 1e3


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[25, 256])
    parser.add_argument("--minibatches", type=int, default=8,
                        help="counted minibatches per setting")
    arguments = parser.parse_args()

    trees = sst.load_split("train", limit=TREES)
    vocabulary = sst.Vocabulary(trees)
    model = TreeLSTM(tf, len(vocabulary), 5)
    rng = np.random.default_rng(0)
    warm_up = tf.get_parameter("collect") + 10
    rows = []
    for batch_size in arguments.batch_sizes:
        dynet = dynet_step_ms(batch_size)
        for scheduler, granularity in tqdm(SETTINGS, desc=f"batch {batch_size}",
                                           unit="setting", leave=False):
            tf.set_parameter("scheduler", scheduler)
            tf.set_parameter("granularity", granularity)
            tf.reset_patterns()
            recording = 0.0
            for number in range(warm_up + arguments.minibatches):
                if number == warm_up:
                    tf.reset_stats()
                    recording = 0.0
                minibatch = [trees[i] for i in rng.choice(len(trees), batch_size,
                                                      replace=False)]
                with tf.GradientTape():
                    started = time.perf_counter()
                    loss = tf.add_n([model.loss(tree, vocabulary) for tree in minibatch])
                    recording += time.perf_counter() - started
                    tf.build(loss)
            stats = tf.stats()
            count = arguments.minibatches
            nodes = stats["nodes_recorded"] / count
            record_ms = recording / count * 1e3
            search_ms = stats["search_seconds"] / count * 1e3
            analysis_ms = (stats["analysis_seconds"] - stats["compile_seconds"]) / count * 1e3
            front_end = record_ms + search_ms + analysis_ms
            rows.append([
                batch_size, scheduler, granularity, f"{nodes:.0f}", f"{record_ms:.1f}",
                f"{search_ms:.1f}", f"{analysis_ms:.1f}",
                f"{(search_ms + analysis_ms) / nodes * 1e3:.3f}",
                f"{stats['program_runs'] / stats['evaluations']:.2f}", f"{front_end:.1f}",
                "n/a" if dynet is None else f"{dynet:.1f}",
                "n/a" if dynet is None else f"{front_end / dynet:.2f}"])
    print(f"Tree-LSTM on SST, training loss recorded and evaluated (no backward), "
          f"means per minibatch over {arguments.minibatches} minibatches after "
          f"{warm_up} warm-up; DyNet: its whole training step, autobatching, "
          f"one pass over {TREES} trees:")
    print_table(["batch", "scheduler", "granularity", "nodes recorded", "record ms",
                 "search ms", "analysis ms", "search+analysis us/node",
                 "compiled runs", "front end ms", "DyNet step ms", "front end / DyNet step"], rows)
    print("Issue 17's targets: search+analysis at most 0.15 us per node; the "
          "front end at most 0.33 of DyNet's step.")


if __name__ == "__main__":
    main()
