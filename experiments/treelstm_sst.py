"""Train the Tree-LSTM on SST with plain eager TensorFlow and with subgraphjit,
without and with frequent-subgraph patterns.

Every backend starts from the same weights and sees the same minibatches, so
their losses must agree; the script prints a per-minibatch time breakdown in
the style of the thesis's Table 6.4 (DAG construction, optimization (pattern
search), execution, backward, update), the speedups, the largest loss
difference from eager TensorFlow, and dev accuracy.

The first ``collect + compile + 1`` minibatches are not timed, for any
backend: with patterns they collect statistics and compile the patterns,
and a compiled program compiles at its key's ``compile``-th sighting.

    python experiments/treelstm_sst.py                 # all three backends
    python experiments/treelstm_sst.py --backend patterns --steps 100
"""

import argparse
import contextlib
import importlib
import pathlib
import sys
import time

import numpy as np
from tqdm import tqdm

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

from experiments import sst  # noqa: E402
from experiments.treelstm import TreeLSTM  # noqa: E402
from subgraphjit.context import PARAMETERS  # noqa: E402
from subgraphjit.tools.report import forced_lines, print_table  # noqa: E402

COLUMNS = ("construction", "optimization", "execution", "backward", "update")
BACKENDS = ("tensorflow", "subgraphjit", "patterns")


def parse_arguments(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--backend", choices=("all",) + BACKENDS, default="all",
                        help="'subgraphjit' batches single ops; 'patterns' "
                             "batches compiled frequent subgraphs")
    parser.add_argument("--batch-size", type=int, default=20)
    parser.add_argument("--train-limit", type=int, default=2000,
                        help="use the first N training trees")
    parser.add_argument("--steps", type=int, default=24,
                        help="minibatches to train (the first collect + "
                             "compile + 1 are warm-up, not timed)")
    parser.add_argument("--embedding", type=int, default=300)
    parser.add_argument("--hidden", type=int, default=150)
    parser.add_argument("--fine-grained", action="store_true",
                        help="five classes instead of binary sentiment")
    parser.add_argument("--dev-limit", type=int, default=300,
                        help="dev trees (a fixed random sample) for the "
                             "accuracy; 0 skips it")
    parser.add_argument("--scheduler", default=None,
                        help="subgraphjit's scheduler (critical, agenda, depth, fsm, "
                             "none; default: subgraphjit's default)")
    parser.add_argument("--depth", type=int, default=8, help="P_Depth")
    parser.add_argument("--collect", type=int, default=3, help="P_Collect")
    parser.add_argument("--threads", type=int, default=1,
                        help="TensorFlow intra- and inter-op threads")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--no-overlap", action="store_true",
                        help="run subgraphjit's backward and update in place, so "
                             "that each column times its own phase")
    return parser.parse_args(argv)


def minibatches(trees, batch_size, steps, seed):
    rng = np.random.default_rng(seed)
    order = []
    while len(order) < steps * batch_size:
        order.extend(rng.permutation(len(trees)))
    return [[trees[i] for i in order[k * batch_size:(k + 1) * batch_size]]
            for k in range(steps)]


def train(tf, arguments, training_minibatches, vocabulary, classes, name):
    """Train one backend; returns the model, per-step losses and the timings
    of the timed steps."""
    model = TreeLSTM(tf, len(vocabulary), classes, arguments.embedding,
                     arguments.hidden, seed=arguments.seed)
    optimizer = tf.keras.optimizers.Adagrad(learning_rate=0.05)
    losses, timings = [], []
    lazy = hasattr(tf, "build")
    for minibatch in tqdm(training_minibatches, desc=f"training ({name})", unit="batch",
                          leave=False):
        started = time.perf_counter()
        with tf.GradientTape() as tape:
            loss = tf.add_n([model.loss(tree, vocabulary) for tree in minibatch]) \
                / len(minibatch)
            constructed = time.perf_counter()
            if lazy:
                searched_before = tf.stats()["search_seconds"]
                loss = tf.build(loss)
                searching = tf.stats()["search_seconds"] - searched_before
            executed = time.perf_counter()
        gradients = tape.gradient(loss, model.variables)
        differentiated = time.perf_counter()
        optimizer.apply_gradients(zip(gradients, model.variables))
        updated = time.perf_counter()
        losses.append(float(loss))
        if lazy:
            timing = (constructed - started, searching,
                      executed - constructed - searching)
        else:  # eager: building the graph is running it
            timing = (0.0, 0.0, executed - started)
        timings.append(timing + (differentiated - executed, updated - differentiated))
    return model, np.array(losses), np.array(timings[untimed(arguments):])


def untimed(arguments):
    """Warm-up minibatches: pattern collection, then the compiles of the
    programs (at a key's ``compile``-th sighting, the default)."""
    return arguments.collect + PARAMETERS["compile"].default + 1


def accuracy(tf, model, trees, vocabulary, batch_size):
    """Root accuracy, inference only, one minibatch at a time."""
    correct = 0
    for start in tqdm(range(0, len(trees), batch_size), desc="dev accuracy",
                      unit="batch", leave=False):
        minibatch = trees[start:start + batch_size]
        # subgraphjit's batching scope evaluates the minibatch on exit.
        with getattr(tf, "batching", contextlib.nullcontext)():
            logits = [model.logits(tree, vocabulary) for tree in minibatch]
        correct += sum(int(np.argmax(np.asarray(value)) == tree.label)
                       for value, tree in zip(logits, minibatch))
    return correct / max(len(trees), 1)


def main(argv=None):
    arguments = parse_arguments(argv)
    import tensorflow
    try:
        tensorflow.config.threading.set_intra_op_parallelism_threads(arguments.threads)
        tensorflow.config.threading.set_inter_op_parallelism_threads(arguments.threads)
    except RuntimeError:  # run again in one process (subgraphjit tune)
        pass

    binary = not arguments.fine_grained
    train_trees = sst.load_split("train", limit=arguments.train_limit, binary=binary)
    # The dev file is ordered by sentiment: take a fixed random sample.
    dev_trees = sst.load_split("dev", binary=binary)
    sample = np.random.default_rng(arguments.seed).permutation(len(dev_trees))
    dev_trees = [dev_trees[i] for i in sorted(sample[:arguments.dev_limit])]
    vocabulary = sst.Vocabulary(train_trees)
    classes = 2 if binary else 5
    training_minibatches = minibatches(train_trees, arguments.batch_size, arguments.steps,
                                       arguments.seed)
    print(f"SST {'binary' if binary else 'fine-grained'}: {len(train_trees)} "
          f"training trees, vocabulary {len(vocabulary)}, batch "
          f"{arguments.batch_size}, {arguments.steps} steps (first "
          f"{untimed(arguments)} untimed), depth {arguments.depth}, "
          f"embedding {arguments.embedding}, hidden {arguments.hidden}, "
          f"{arguments.threads} thread(s)")

    if arguments.steps <= untimed(arguments):
        raise SystemExit(f"--steps must exceed collect + compile + 1 = "
                         f"{untimed(arguments)} (those minibatches are not timed)")
    names = list(BACKENDS) if arguments.backend == "all" else [arguments.backend]
    results, statistics = {}, {}
    for name in names:
        tf = importlib.import_module("tensorflow" if name == "tensorflow"
                                     else "subgraphjit")
        if name != "tensorflow":
            if arguments.scheduler is not None:
                tf.set_parameter("scheduler", arguments.scheduler)
            tf.set_parameter("granularity", "subgraph" if name == "patterns" else "op")
            tf.set_parameter("depth", arguments.depth)
            tf.set_parameter("collect", arguments.collect)
            tf.set_parameter("overlap", not arguments.no_overlap)
            tf.reset_patterns()
            tf.reset_stats()
        model, losses, timings = train(tf, arguments, training_minibatches, vocabulary,
                                       classes, name)
        if name != "tensorflow":
            statistics[name] = tf.stats()
        dev = (accuracy(tf, model, dev_trees, vocabulary, arguments.batch_size)
               if dev_trees else None)
        results[name] = (losses, timings, dev)

    print("\nTime per minibatch in ms (mean over timed steps), as thesis Table 6.4:")
    rows = []
    for name, (losses, timings, dev) in results.items():
        mean = timings.mean(axis=0) * 1e3
        total = mean.sum()
        rows.append([name] + [f"{value:.1f}" for value in mean]
                    + [f"{total:.1f}", f"{arguments.batch_size / total * 1e3:.1f}",
                       f"{losses[-1]:.4f}", "-" if dev is None else f"{dev:.3f}"])
    print_table(["backend", *COLUMNS, "total", "sentences/s", "last loss",
                 "dev acc"], rows)
    if not arguments.no_overlap and set(results) - {"tensorflow"}:
        print("(subgraphjit overlaps: its backward and update columns are the time "
              "to queue them; they run during the next minibatch's construction, "
              "optimization and execution, whose columns include any wait for "
              "them.  Totals are exact; --no-overlap times each phase in place.)")

    comparisons = [(slow, fast) for slow, fast in (
        ("tensorflow", "subgraphjit"), ("tensorflow", "patterns"),
        ("subgraphjit", "patterns")) if slow in results and fast in results]
    if comparisons:
        print("\nSpeedups (time of the first / time of the second):")
        rows = []
        for slow, fast in comparisons:
            before, after = (results[name][1].mean(axis=0) for name in (slow, fast))
            rows.append([f"{fast} over {slow}",
                         f"{before[2] / after[2]:.2f}x",
                         f"{before[:3].sum() / after[:3].sum():.2f}x",
                         f"{before[3] / after[3]:.2f}x",
                         f"{before.sum() / after.sum():.2f}x"])
        print_table(["", "execution", "forward", "backward", "end to end"], rows)
    if "tensorflow" in results:
        for name in results:
            if name != "tensorflow":
                difference = np.max(np.abs(results["tensorflow"][0] - results[name][0]))
                print(f"Largest per-step loss difference, {name} vs eager "
                      f"TensorFlow: {difference:.2e}")
    for name, numbers in statistics.items():
        print(f"\n{name} statistics over the run:")
        sizes = numbers.pop("batch_sizes")
        if sizes:
            launches = sum(sizes.values())
            numbers["batch_sizes"] = (
                f"mean {sum(k * v for k, v in sizes.items()) / launches:.1f}, "
                f"largest {max(sizes)}, {sizes.get(1, 0)} of {launches} of size 1")
        forced = numbers.pop("forced_evaluations")
        for key, value in numbers.items():
            if isinstance(value, float):
                value = f"{value:.3f}"
            print(f"  {key}: {value}")
        for line in forced_lines(forced):
            print(f"  {line}")


if __name__ == "__main__":
    main()
