"""Every example model, trained and then run for inference under each
subgraphjit setting beside eager TensorFlow in the same run: per mode the
instances per second and the ratio to eager, and per training minibatch
the launches (batched ops) per instance and the evaluations.

The models of ``experiments/example_models.py`` (trees, sequences, a
lattice, attention), at a chosen width, on random inputs of varying
structure, and the value-dependent ones (``CONTROL_FLOW_MODELS``), whose
minibatch runs with ``tf.batching.map`` (``minibatch_losses``), and also
as the plain loop, where every read is an evaluation of its own.

Each setting gets a fresh copy of the model, which trains first and then
infers, as a user's would: patterns and compiled programs are shared
between the modes.  Training is a GradientTape step with an SGD update;
inference is the user's ordinary loop: the minibatch's losses in one
batching scope (``with tf.batching():``), then every loss read to NumPy.
In each mode the first ``--warm-up`` minibatches (pattern collection,
traces, compiled programs, and the defaults' granularity trial, one per
mode) are timed apart; each mode passes over its timed minibatches again
until 1.5 seconds have passed.  This is the table
that says which settings are the fastest, and so the defaults.  The
closing summary gives the defaults' ratios per model (and the plain
loop's), measured again with eager TensorFlow and the defaults taking
turns on the same minibatches, and flags those below 1.0x.

    python benchmarks/models.py                       # width 64, batch 25
    python benchmarks/models.py --width 16 --models tree_lstm mv_rnn
    python benchmarks/models.py --models gated_tree adaptive_computation
    python benchmarks/models.py --modes infer --batch-size 1 --minibatches 16
"""

import argparse
import contextlib
import inspect
import pathlib
import sys
import time

import numpy as np

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import tensorflow  # noqa: E402

tensorflow.config.threading.set_intra_op_parallelism_threads(1)
tensorflow.config.threading.set_inter_op_parallelism_threads(1)

import subgraphjit  # noqa: E402
from subgraphjit import overlap  # noqa: E402
from subgraphjit.context import PARAMETERS  # noqa: E402
from subgraphjit.patterns.search import Trial  # noqa: E402
from experiments.example_models import (  # noqa: E402
    CONTROL_FLOW_MODELS, MODELS, minibatch_losses)

ALL_MODELS = {**MODELS, **CONTROL_FLOW_MODELS}
# --modes, and the names subgraphjit's stats give them.
MODES = {"train": "training", "infer": "inference"}

# (name, granularity, compile); None: plain eager TensorFlow.
SETTINGS = [
    ("eager TensorFlow", None, None),
    ("subgraphjit op, step by step", "op", 0),
    ("subgraphjit op, compiled", "op", 4),
    ("subgraphjit subgraph, step by step", "subgraph", 0),
    ("subgraphjit subgraph, compiled", "subgraph", 4),
    ("subgraphjit defaults", "defaults", None),
]
DEFAULTS = SETTINGS[-1]
MIN_SECONDS = 1.5
# Passes each system takes in turn for the summary's ratios (paired_ratio).
PAIRED_ROUNDS = 3
# ... and for the value-dependent models, the defaults without the map.
PLAIN_LOOP = ("subgraphjit defaults, plain loop", "defaults", None)


def make_model(name, width, seed):
    """The model with every size parameter it has (embed, hidden, size) at
    ``width``."""
    model_class = ALL_MODELS[name]
    sizes = {parameter: width for parameter in ("embed", "hidden", "size")
             if parameter in inspect.signature(model_class).parameters}
    return model_class(np.random.default_rng(seed), **sizes)


def step(module, model, optimizer, minibatch, plain_loop, training):
    """One minibatch: a training step (loss, gradient, update), or inference
    as a user writes it: the losses in one batching scope, then each read."""
    def losses():
        return ([model.loss(module, example) for example in minibatch]
                if plain_loop else minibatch_losses(module, model, minibatch))

    if not training:
        with (subgraphjit.batching() if module is subgraphjit
              else contextlib.nullcontext()):
            computed = losses()
        return [np.asarray(loss) for loss in computed]
    with module.GradientTape() as tape:
        loss = module.add_n(losses())
        if module is subgraphjit:
            loss = subgraphjit.build(loss)
    gradients = tape.gradient(loss, model.variables)
    optimizer.apply_gradients(zip(gradients, model.variables))
    return float(loss)


def finish(module):
    """Wait for what subgraphjit still has queued after a pass: the last
    backward and update (overlap.py), which are the pass's work, not the
    next one's (and until they have run, TensorFlow's ops queue too)."""
    if module is subgraphjit:
        overlap.end()


def measure(module, model, optimizer, setting, arguments, warm_up_steps, training):
    """Instances per second (wall and CPU), the warm-up's seconds and the
    stats of the timed minibatches, in one mode."""
    # A stream of inputs per mode, so that each mode's minibatches do not
    # depend on how long the other warmed up.
    data = np.random.default_rng(1 if training else 2)
    minibatches = [model.random_examples(data, arguments.batch_size)
                   for _ in range(warm_up_steps + arguments.minibatches)]
    plain_loop = setting is PLAIN_LOOP
    started = time.perf_counter()
    for minibatch in minibatches[:warm_up_steps]:
        step(module, model, optimizer, minibatch, plain_loop, training)
    warm_up = time.perf_counter() - started
    subgraphjit.reset_stats()
    started, cpu_started = time.perf_counter(), time.process_time()
    passes = 0
    while True:
        for minibatch in minibatches[warm_up_steps:]:
            step(module, model, optimizer, minibatch, plain_loop, training)
        passes += 1
        # Each mode repeats its minibatches for at least MIN_SECONDS: 8
        # minibatches of a fast model took 80 ms, within this VM's
        # hiccups, and gated_tree's 8 training steps, half a second, read
        # 2.4x eager in one run and 4.7x in the next.  (Training goes on
        # training on them; inference computes the same again.)
        if time.perf_counter() - started >= MIN_SECONDS:
            break
    finish(module)
    seconds = time.perf_counter() - started
    cpu_seconds = time.process_time() - cpu_started
    instances = passes * arguments.minibatches * arguments.batch_size
    return instances / seconds, instances / cpu_seconds, warm_up, subgraphjit.stats(), passes


def rate(name, setting, arguments):
    """``{mode: (inst/s, CPU inst/s, warm-up s, stats)}`` for one model and
    setting, and the granularity ``auto`` chose per mode (or None)."""
    label, granularity, compile_after = setting
    module = tensorflow if granularity is None else subgraphjit
    warm_up_steps = arguments.warm_up
    if module is subgraphjit:
        if granularity == "defaults":   # as a user who changes only the import
            granularity, compile_after = (PARAMETERS[key].default
                                          for key in ("granularity", "compile"))
        subgraphjit.set_parameter("granularity", granularity)
        subgraphjit.set_parameter("compile", compile_after)
        subgraphjit.reset_patterns()   # and compiled programs
    if granularity == "auto" or arguments.same_minibatches or name in CONTROL_FLOW_MODELS:
        # Time the choice's trial apart too (each mode has its own; the
        # collection is counted in both, in case only one mode runs); with
        # --same-minibatches every setting warms up as long, and always for
        # a model whose work depends on values (the number of ponder steps,
        # the gates that expand a tree), which changes as it trains (after
        # its shorter warm-up, gated_tree's "op, compiled" timed 43 rounds
        # of tf.batching.map, and the defaults, later minibatches, 62).
        # The trial's longest: each unit settling, every turn, and every
        # turn retimed (a turn that traced patterns for new shapes, as
        # each one of the variable-length model's subgraph unit does).
        warm_up_steps += (subgraphjit.get_parameter("collect") + len(Trial.TIMED)
                          + Trial.RETIMES
                          + len(Trial.UNITS) * (2 * PARAMETERS["compile"].default + 1))
    # One model for both modes, trained first, as a user's.
    model = make_model(name, arguments.width, seed=0)
    optimizer = module.keras.optimizers.SGD(0.01)   # (subgraphjit's: a compiled update)
    results = {mode: measure(module, model, optimizer, setting, arguments,
                             warm_up_steps, training=mode == "train")
               for mode in MODES if mode in arguments.modes}
    chosen = None
    if granularity == "auto":
        chosen = subgraphjit.stats()["granularity_chosen"]
        chosen = "/".join(chosen.get(MODES[mode], "?") for mode in results)
    return results, chosen, model


def paired_ratio(model, setting, arguments, training):
    """Eager TensorFlow's seconds over subgraphjit's on the same new
    minibatches, the two taking turns (PAIRED_ROUNDS passes each, the one
    that goes first alternating; one untimed pass each before): the
    model, warmed up under ``setting``, runs under both.  The table's
    ratios divide rates measured minutes apart, and this VM's speed
    drifts by tens of percent within minutes."""
    plain_loop = setting is PLAIN_LOOP
    data = np.random.default_rng(3 if training else 4)
    minibatches = [model.random_examples(data, arguments.batch_size)
                   for _ in range(arguments.minibatches)]
    systems = [(module, module.keras.optimizers.SGD(0.01))
               for module in (tensorflow, subgraphjit)]
    seconds = [0.0, 0.0]
    for round_number in range(PAIRED_ROUNDS + 1):
        order = (0, 1) if round_number % 2 else (1, 0)
        for number in order:
            module, optimizer = systems[number]
            started = time.perf_counter()
            for minibatch in minibatches:
                step(module, model, optimizer, minibatch, plain_loop, training)
            finish(module)
            if round_number:   # (the first round warms up)
                seconds[number] += time.perf_counter() - started
    return seconds[0] / seconds[1]


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", nargs="*", default=[*sorted(MODELS), *CONTROL_FLOW_MODELS],
                        choices=sorted(ALL_MODELS))
    parser.add_argument("--modes", nargs="+", default=list(MODES), choices=list(MODES))
    parser.add_argument("--width", type=int, default=64,
                        help="embedding and hidden size (or matrix size)")
    parser.add_argument("--batch-size", type=int, default=25)
    parser.add_argument("--minibatches", type=int, default=8)
    parser.add_argument("--warm-up", type=int, default=10,
                        help="untimed minibatches first, per mode (patterns "
                             "collect in 3, a program compiles at its key's "
                             "4th sighting; the defaults' granularity trial "
                             "adds its own)")
    parser.add_argument("--same-minibatches", action="store_true",
                        help="every setting warms up as long as the defaults' "
                             "trial, so all time the same minibatches (always "
                             "for the value-dependent models)")
    arguments = parser.parse_args()
    defaults = {key: subgraphjit.get_parameter(key) for key in ("granularity", "compile")}
    print(f"{' and '.join(arguments.modes)}, width {arguments.width}, batch "
          f"{arguments.batch_size}, {arguments.minibatches} timed minibatches "
          f"after {arguments.warm_up} per mode, 1 thread; defaults: {defaults}")
    # CPU time too: on a shared machine it is the steadier of the two.
    # Launches and evaluations are training's.
    model_width = max(map(len, ["model", *arguments.models]))
    print(f"{'':<{model_width}} {'':<44} {'--------- train ---------':>25} "
          f"{'--------- infer ---------':>25} {'warm-up s':>13}")
    print(f"{'model':<{model_width}} {'setting (auto chose train/infer)':<44} "
          + f"{'inst/s':>9} {'x eager':>8} {'cpu x':>6} " * 2
          + f"{'train':>6} {'infer':>6} {'launch/inst':>11} {'evals/mb':>8}")
    summary = []
    for name in arguments.models:
        eager = None
        settings = SETTINGS + ([PLAIN_LOOP] if name in CONTROL_FLOW_MODELS else [])
        for setting in settings:
            results, chosen, model = rate(name, setting, arguments)
            eager = eager or results
            label = setting[0] + (f" ({chosen})" if chosen else "")
            columns = []
            for mode in MODES:
                if mode not in results:
                    columns.append(f"{'-':>9} {'-':>8} {'-':>6}")
                    continue
                speed, cpu_speed = results[mode][:2]
                columns.append(f"{speed:>9.1f} {speed / eager[mode][0]:>8.2f} "
                               f"{cpu_speed / eager[mode][1]:>6.2f}")
            warm_ups = [f"{results[mode][2]:.1f}" if mode in results else "-"
                        for mode in MODES]
            stats, passes = results.get("train", (None,) * 5)[3:]
            minibatches = None if stats is None else passes * arguments.minibatches
            launches, evaluations = ("-", "-") if stats is None or setting[1] is None else (
                f"{stats['batches'] / (minibatches * arguments.batch_size):.1f}",
                f"{stats['evaluations'] / minibatches:.1f}")
            print(f"{name:<{model_width}} {label:<44} {columns[0]} {columns[1]} "
                  f"{warm_ups[0]:>6} {warm_ups[1]:>6} {launches:>11} {evaluations:>8}",
                  flush=True)
            if setting is DEFAULTS or setting is PLAIN_LOOP:
                summary.append((name + (", plain loop" if setting is PLAIN_LOOP else ""), {
                    mode: paired_ratio(model, setting, arguments, mode == "train")
                    for mode in results}))
    print("\nsubgraphjit defaults against eager TensorFlow, the two taking turns on "
          f"the same minibatches ({PAIRED_ROUNDS} passes each; <1.0x: slower):")
    for name, ratios in summary:
        print(f"  {name:<{model_width + 12}} " + "  ".join(
            f"{mode} {ratio:5.2f}x{' <1.0x' if ratio < 1.0 else '':<6}"
            for mode, ratio in ratios.items()).rstrip())
    for key, value in defaults.items():
        subgraphjit.set_parameter(key, value)


if __name__ == "__main__":
    main()
