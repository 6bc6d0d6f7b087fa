"""Analysis and scheduling cost per node, per scheduler and granularity.

Issue 5 asks that grouping nodes into types, finding duplicates and
scheduling (everything between recording and the first batched launch)
cost under 5 microseconds per node.  This runs the Tree-LSTM on SST
(embedding 300, hidden 150) forward over minibatches of each size, under
every scheduler and granularity, and prints ``tf.stats()``'s analysis time
divided by the nodes analysed.  The first ``collect + 2`` minibatches warm
up (pattern collection, the FSM's training on op-level types and again on
pattern types) and are not counted.

    python benchmarks/analysis_cost.py [--batch-sizes 25 256] [--minibatches 4]
"""

import argparse
import pathlib
import sys

import numpy as np
from tqdm import tqdm

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

import subgraphjit as tf  # noqa: E402
from experiments import sst  # noqa: E402
from experiments.treelstm import TreeLSTM  # noqa: E402
from subgraphjit.report import print_table  # noqa: E402

SETTINGS = [(scheduler, granularity) for granularity in ("op", "subgraph")
            for scheduler in ("depth", "agenda", "fsm")]


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[25, 256])
    parser.add_argument("--minibatches", type=int, default=4,
                        help="counted minibatches per setting")
    arguments = parser.parse_args()

    trees = sst.load_split("train", limit=2000)
    vocabulary = sst.Vocabulary(trees)
    model = TreeLSTM(tf, len(vocabulary), 2)
    rng = np.random.default_rng(0)
    # Collection, then the first minibatch with patterns: the FSM, trained on
    # op-level types, learns again there.
    warm_up = tf.get_parameter("collect") + 2
    rows = []
    for batch_size in arguments.batch_sizes:
        for scheduler, granularity in tqdm(SETTINGS, desc=f"batch {batch_size}",
                                           unit="setting", leave=False):
            tf.set_parameter("scheduler", scheduler)
            tf.set_parameter("granularity", granularity)
            tf.reset_patterns()
            for number in range(warm_up + arguments.minibatches):
                if number == warm_up:
                    tf.reset_stats()
                batch = [trees[i] for i in rng.choice(len(trees), batch_size,
                                                      replace=False)]
                with tf.batching():   # (results kept: a scope drops the rest)
                    outputs = [model.logits(tree, vocabulary) for tree in batch]
                del outputs
            stats = tf.stats()
            nodes = stats["nodes_evaluated"]
            rows.append([batch_size, scheduler, granularity,
                         nodes // arguments.minibatches,
                         f"{stats['analysis_seconds'] / arguments.minibatches * 1e3:.1f}",
                         f"{stats['analysis_seconds'] / nodes * 1e6:.2f}",
                         f"{stats['analysis_seconds'] / stats['nodes_recorded'] * 1e6:.2f}",
                         f"{stats['fsm_training_seconds'] / arguments.minibatches * 1e3:.1f}",
                         stats["scheduler_fallbacks"] // arguments.minibatches])
    print(f"Tree-LSTM on SST, forward, means per minibatch over "
          f"{arguments.minibatches} minibatches after {warm_up} warm-up "
          "(analysis includes FSM training when it learns again):")
    print_table(["batch", "scheduler", "granularity", "nodes analysed",
                 "analysis ms", "us per node analysed", "us per node recorded",
                 "FSM training ms", "FSM fallbacks"], rows)


if __name__ == "__main__":
    main()
