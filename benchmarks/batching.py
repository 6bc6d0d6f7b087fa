"""Tree-LSTM on SST: sentences per second of every system, in one run.

Training (forward, backward and an Adagrad update) and inference, at each
batch size, for: plain eager TensorFlow per instance; eager with the cells
in tf.function; a hand-batched TensorFlow version (level by level), eager
and with its whole step in tf.function (traced once per tree height); DyNet
with autobatching, agenda and depth (if ``dynet38`` is installed); and
subgraphjit with each scheduler and granularity (ops, or frequent
subgraphs as units), every batch its own launch (``compile`` 0),
and with agenda, each evaluation run as one compiled program once its key
recurs (``compiled``: ``compile`` 4); and with every parameter at its
default (``subgraphjit defaults``, its warm-up running passes until
``auto`` has chosen its granularity for training and for inference,
shown beside it).  Each system runs in a process of its own, and the
processes take turns pass by pass (turns.py), so that every system's
passes sample the same minutes of this machine.  Ratios are
to plain eager TensorFlow, measured in this run.  Also prints the compute
floor: the model's FLOPs per sentence over the measured single-thread
matmul rate.

    python benchmarks/batching.py                      # 2,000 trees, batch 25 and 256
    python benchmarks/batching.py --trees 500 --passes 1   # quicker
    python benchmarks/batching.py --systems "subgraphjit agenda, op" hand-batched
"""

import argparse
import contextlib
import importlib.util
import pathlib
import sys
import time
import typing

import numpy as np

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import tensorflow  # noqa: E402

tensorflow.config.threading.set_intra_op_parallelism_threads(1)
tensorflow.config.threading.set_inter_op_parallelism_threads(1)

import subgraphjit  # noqa: E402
from subgraphjit.context import PARAMETERS  # noqa: E402
from benchmarks.treelstm_baselines import (  # noqa: E402
    FunctionCellTreeLSTM, HandBatchedTreeLSTM, compiled_hand_batched)
from experiments import sst  # noqa: E402
from experiments.treelstm import TreeLSTM, train_step  # noqa: E402
from benchmarks import turns  # noqa: E402


DEFAULTS = "subgraphjit defaults"
# Systems that encode one tree at a time, timed on ``--eager-trees`` trees.
PER_INSTANCE = {"eager TensorFlow", "eager, cells in tf.function"}


class Passes(typing.NamedTuple):
    """A system's training and inference passes over the minibatches."""
    train: typing.Callable[[], None]
    infer: typing.Callable[[], None]
    model: object = None


def per_instance_system(module, make_model):
    """Training and inference passes of a model that encodes one tree at a time."""
    def passes(minibatches, vocabulary):
        model = make_model()
        optimizer = module.keras.optimizers.Adagrad(0.05)   # (subgraphjit's: a compiled update)

        def train():
            for minibatch in minibatches:
                train_step(module, model, optimizer, minibatch, vocabulary)
            # subgraphjit queues a minibatch's backward and update to run
            # while the next one records (overlap.py): the last ones are
            # this pass's work, so it ends when a read of a weight, which
            # waits for them, returns.  (At 256 they were 7% of a pass,
            # which it was not charged for before: BENCHMARKS.md.)
            np.asarray(model.variables[-1])

        def infer():
            for minibatch in minibatches:
                # subgraphjit's batching scope (no GradientTape here to be one).
                with getattr(module, "batching", contextlib.nullcontext)():
                    outputs = [model.logits(t, vocabulary) for t in minibatch]
                [np.asarray(o) for o in outputs]
        return Passes(train, infer, model)
    return passes


def front_end_rate(model, minibatches, vocabulary):
    """Training sentences/s if only subgraphjit's front end cost time: the
    model code and its recording, pattern search and the batching analysis
    (grouping, duplicates, the schedule), everything before the first
    batched launch.  The forward still runs, untimed; no backward, no update."""
    seconds, sentences = 0.0, 0
    for minibatch in minibatches:
        subgraphjit.reset_stats()
        with subgraphjit.GradientTape():
            started = time.perf_counter()
            loss = subgraphjit.add_n([model.loss(t, vocabulary) for t in minibatch]) \
                / len(minibatch)
            seconds += time.perf_counter() - started
            subgraphjit.build(loss)
        statistics = subgraphjit.stats()
        seconds += statistics["search_seconds"] + statistics["analysis_seconds"]
        sentences += len(minibatch)
    return sentences / seconds


def hand_batched_system(make_model):
    def passes(minibatches, vocabulary):
        model = make_model()
        optimizer = tensorflow.keras.optimizers.Adagrad(0.05)

        def train():
            for minibatch in minibatches:
                plan = model.plan(minibatch, vocabulary)
                with tensorflow.GradientTape() as tape:
                    loss = model.batch_loss(plan)
                gradients = tape.gradient(loss, model.variables)
                optimizer.apply_gradients(zip(gradients, model.variables))

        def infer():
            for minibatch in minibatches:
                model.batch_logits(model.plan(minibatch, vocabulary)).numpy()
        return Passes(train, infer)
    return passes


def compiled_hand_batched_system(make_model):
    def passes(minibatches, vocabulary):
        model = make_model()
        train_step, logits = compiled_hand_batched(
            model, tensorflow.keras.optimizers.Adagrad(0.05))
        def plans():
            for minibatch in minibatches:
                yield model.plan_tensors(model.plan(minibatch, vocabulary))

        def train():
            for plan in plans():
                train_step(plan)

        def infer():
            for plan in plans():
                logits(plan).numpy()
        return Passes(train, infer)
    return passes


def serve(name, system, trees, vocabulary, arguments):
    """One system at ``arguments.batch_sizes[0]``, in its own process: its
    warm-up, then its passes when its turn comes (turns.py); at the end, its
    warm-up and, for subgraphjit, what its granularity trials chose and
    measured, and its front end's rate."""
    batch_size = arguments.batch_sizes[0]
    subset = trees[:arguments.eager_trees] if name in PER_INSTANCE else trees
    minibatches = [subset[k:k + batch_size] for k in range(0, len(subset), batch_size)]
    train, infer, model = system(minibatches, vocabulary)
    subgraphjit.reset_stats()
    started = time.perf_counter()
    train(), infer()  # warm up: traces, caches, compiled programs
    trials = refused = None
    if name == DEFAULTS:   # and the granularity trials, however long
        while len(subgraphjit.stats()["granularity_chosen"]) < 2:
            train(), infer()
        chosen = subgraphjit.stats()["granularity_chosen"]
        name = f"{name} ({chosen['training']}, {chosen['inference']})"
        trials = subgraphjit.stats()["granularity_trial"]
        refused = dict(subgraphjit.stats()["programs_not_compiled"])
    warm_up = time.perf_counter() - started
    programs = subgraphjit.stats()["programs_compiled"]
    turns.serve({"train": train, "infer": infer}, lambda: {
        "name": name, "sentences": len(subset),
        "front_end": (front_end_rate(model, minibatches, vocabulary)
                      if name.startswith("subgraphjit") else None),
        "warm_up": warm_up, "programs": programs, "trials": trials,
        "refused": refused})


def system_process(name, batch_size, arguments):
    """``serve`` in a process of its own, warmed up."""
    return turns.Child(name, [
        sys.executable, str(ROOT / "benchmarks" / "batching.py"),
        "--system", name, "--batch-sizes", str(batch_size),
        "--trees", str(arguments.trees), "--eager-trees", str(arguments.eager_trees)])


def dynet_process(strategy, label, batch_size, arguments):
    return turns.Child(f"DyNet autobatch {label}", [
        sys.executable, str(ROOT / "benchmarks" / "dynet_treelstm.py"),
        "--dynet-autobatch", str(strategy), "--batch-size", str(batch_size),
        "--trees", str(arguments.trees), "--serve"])


def compute_floor(trees):
    """Sentences/s if every FLOP ran at the single-thread matmul rate."""
    a = tensorflow.random.normal((512, 300))
    b = tensorflow.random.normal((300, 750))
    tensorflow.matmul(a, b).numpy()
    started, repeats = time.perf_counter(), 50
    for _ in range(repeats):
        result = tensorflow.matmul(a, b)
    result.numpy()
    rate = 2 * 512 * 300 * 750 * repeats / (time.perf_counter() - started)
    leaves = np.mean([len(t.words()) for t in trees])
    forward = leaves * 2 * 300 * 450 + (leaves - 1) * 2 * 300 * 750 + 2 * 150 * 2
    # Backward costs about twice the forward (two products per product).
    return rate, rate / (3 * forward), rate / forward


def print_paired(seconds, sentences):
    """subgraphjit's defaults against each other system, round by round:
    the two rates of one round, measured a pass apart, divided, and the
    median of those ratios with the lowest and highest.  The table divides
    medians, which may come from different rounds, minutes apart; a
    round's ratio compares one minute's speeds, and the range shows how
    far this machine moved them."""
    if DEFAULTS not in seconds:
        return
    print(f"{DEFAULTS} against each system, round by round (median of the "
          f"rounds' ratios, lowest-highest):")
    ours = seconds[DEFAULTS]
    for name, theirs in seconds.items():
        if name == DEFAULTS:
            continue
        cells = []
        for mode in ("train", "infer"):
            ratios = [(sentences[DEFAULTS] / own) / (sentences[name] / other)
                      for own, other in zip(ours[mode], theirs[mode])]
            cells.append(f"{mode} {np.median(ratios):.2f}x "
                         f"({min(ratios):.2f}-{max(ratios):.2f})")
        print(f"  vs {name:<36} " + ", ".join(cells))


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trees", type=int, default=2000)
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[25, 256])
    parser.add_argument("--passes", type=int, default=3)
    parser.add_argument("--eager-trees", type=int, default=100,
                        help="trees for the slow per-instance baselines")
    parser.add_argument("--systems", nargs="*", default=None,
                        help="run only the systems whose names contain one of "
                             "these (eager TensorFlow, the ratios' base, always runs)")
    parser.add_argument("--system", default=None, help=argparse.SUPPRESS)
    arguments = parser.parse_args()

    trees = sst.load_split("train", limit=arguments.trees)
    vocabulary = sst.Vocabulary(trees)
    size = len(vocabulary)
    systems = {
        "eager TensorFlow": per_instance_system(
            tensorflow, lambda: TreeLSTM(tensorflow, size, 2)),
        "eager, cells in tf.function": per_instance_system(
            tensorflow, lambda: FunctionCellTreeLSTM(size, 2)),
        "hand-batched TensorFlow": hand_batched_system(
            lambda: HandBatchedTreeLSTM(size, 2)),
        "hand-batched, tf.function": compiled_hand_batched_system(
            lambda: HandBatchedTreeLSTM(size, 2)),
    }
    settings = [(scheduler, granularity, 0) for granularity in ("op", "subgraph")
                for scheduler in ("agenda", "depth", "fsm")]
    # Each evaluation as one compiled program once its key is 4 of the last
    # 16.
    settings += [("agenda", "op", 4), ("agenda", "subgraph", 4)]
    for scheduler, granularity, compile_after in settings:
        def make(scheduler=scheduler, granularity=granularity,
                 compile_after=compile_after):
            subgraphjit.set_parameter("scheduler", scheduler)
            subgraphjit.set_parameter("granularity", granularity)
            subgraphjit.set_parameter("compile", compile_after)
            subgraphjit.reset_patterns()  # a new model: collect its patterns
            return TreeLSTM(subgraphjit, size, 2)
        name = f"subgraphjit {scheduler}, {granularity}"
        systems[name + (", compiled" if compile_after else "")] = \
            per_instance_system(subgraphjit, make)

    def with_defaults():
        """As a user who changes only the import line."""
        for key in ("scheduler", "granularity", "compile"):
            subgraphjit.set_parameter(key, PARAMETERS[key].default)
        subgraphjit.reset_patterns()
        return TreeLSTM(subgraphjit, size, 2)
    systems[DEFAULTS] = per_instance_system(subgraphjit, with_defaults)
    if arguments.systems:
        systems = {name: system for name, system in systems.items()
                   if name == "eager TensorFlow" or any(
                       wanted in name for wanted in arguments.systems)}
    has_dynet = importlib.util.find_spec("dynet") is not None
    dynet_strategies = [(strategy, label) for strategy, label in ((1, "agenda"), (2, "depth"))
                        if not arguments.systems or any(
                            wanted in f"DyNet autobatch {label}"
                            for wanted in arguments.systems)]

    if arguments.system is not None:   # (a child process: one system, one size)
        serve(arguments.system, systems[arguments.system], trees, vocabulary, arguments)
        return
    rate, floor_train, floor_infer = compute_floor(trees)
    print(f"SST Tree-LSTM, embedding 300, hidden 150, first {len(trees)} training "
          f"trees, 1 thread, median of {arguments.passes} passes, the systems' "
          f"processes taking turns pass by pass")
    print(f"single-thread matmul: {rate / 1e9:.1f} GFLOP/s; compute floor "
          f"{floor_train:.0f} sentences/s training, {floor_infer:.0f} inference")

    for batch_size in arguments.batch_sizes:
        children = [system_process(name, batch_size, arguments) for name in systems]
        if has_dynet:
            children += [dynet_process(strategy, label, batch_size, arguments)
                         for strategy, label in dynet_strategies]
        seconds = turns.take_turns(children, ("train", "infer"), arguments.passes)
        rows, eager, trials, refused = [], None, None, None
        sentences = {}
        for child in children:
            final = child.finish()
            sentences[child.name] = final["sentences"]
            train_rate, infer_rate = (final["sentences"]
                                      / float(np.median(seconds[child.name][mode]))
                                      for mode in ("train", "infer"))
            eager = eager or (train_rate, infer_rate)
            trials = final.get("trials") or trials
            refused = final.get("refused") or refused
            rows.append((final.get("name", child.name), train_rate, infer_rate,
                         final.get("front_end"), final.get("warm_up"), final.get("programs")))
        print(f"\nbatch size {batch_size}")
        print(f"{'system':<40} {'train sent/s':>12} {'x eager':>8} "
              f"{'infer sent/s':>12} {'x eager':>8} {'front end sent/s':>16} "
              f"{'warm-up s':>9} {'programs':>8}")
        for name, train_rate, infer_rate, front_end, warm_up, programs in rows:
            print(f"{name:<40} {train_rate:>12.1f} {train_rate / eager[0]:>8.1f} "
                  f"{infer_rate:>12.1f} {infer_rate / eager[1]:>8.1f} "
                  + (f"{front_end:>16.1f}" if front_end is not None else " " * 16)
                  + (f" {warm_up:>9.1f} {programs:>8}" if warm_up is not None else ""))
        print(f"{'compute floor':<40} {floor_train:>12.0f} {floor_train / eager[0]:>8.1f} "
              f"{floor_infer:>12.0f} {floor_infer / eager[1]:>8.1f}")
        print_paired(seconds, sentences)
        if trials:   # what the defaults' granularity trials measured
            print("granularity trials, median us per node: " + "; ".join(
                f"{mode} " + ", ".join(f"{unit} {seconds * 1e6:.2f}"
                                       for unit, seconds in trial.items())
                for mode, trial in trials.items())
                + (f"; programs not compiled in the warm-up: {refused}" if refused else ""))
    print("\nfront end: training sentences/s if only subgraphjit's recording, "
          "pattern search and batching analysis cost time (no TensorFlow op "
          "timed): no execution, however fast, can train faster.  warm-up: "
          "the untimed first training and inference pass (traces, pattern "
          "collection, compiled programs); programs: compiled in it.")
    if not has_dynet:
        print("\n(DyNet rows need `pip install dynet38`.)")


if __name__ == "__main__":
    main()
