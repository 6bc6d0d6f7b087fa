"""Every example model, trained under each subgraphjit setting beside eager
TensorFlow in the same run: instances per second, the ratio to eager, and
per minibatch the launches (batched ops) per instance and the evaluations.

The models of ``experiments/example_models.py`` (trees, sequences, a
lattice, attention), at a chosen width, on random inputs of varying
structure, and the value-dependent ones (``CONTROL_FLOW_MODELS``), whose
minibatch runs with ``tf.batching.map`` (``minibatch_losses``), and also
as the plain loop, where every read is an evaluation of its own.  Each setting gets a fresh copy of the model; the first
``--warm-up`` minibatches (pattern collection, traces, compiled programs)
are timed apart.  This is the table that says which settings are the
fastest, and so the defaults.

    python benchmarks/models.py                       # width 64, batch 25
    python benchmarks/models.py --width 16 --models tree_lstm mv_rnn
    python benchmarks/models.py --models gated_tree adaptive_computation
"""

import argparse
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
from subgraphjit.context import PARAMETERS  # noqa: E402
from subgraphjit.patterns.search import Trial  # noqa: E402
from experiments.example_models import (  # noqa: E402
    CONTROL_FLOW_MODELS, MODELS, minibatch_losses)

ALL_MODELS = {**MODELS, **CONTROL_FLOW_MODELS}

# (name, granularity, compile); None: plain eager TensorFlow.
SETTINGS = [
    ("eager TensorFlow", None, None),
    ("subgraphjit op, step by step", "op", 0),
    ("subgraphjit op, compiled", "op", 4),
    ("subgraphjit subgraph, step by step", "subgraph", 0),
    ("subgraphjit subgraph, compiled", "subgraph", 4),
    ("subgraphjit defaults", "defaults", None),
]
# ... and for the value-dependent models, the defaults without the map.
PLAIN_LOOP = ("subgraphjit defaults, plain loop", "defaults", None)


def make_model(name, width, seed):
    """The model with every size parameter it has (embed, hidden, size) at
    ``width``."""
    model_class = ALL_MODELS[name]
    sizes = {parameter: width for parameter in ("embed", "hidden", "size")
             if parameter in inspect.signature(model_class).parameters}
    return model_class(np.random.default_rng(seed), **sizes)


def train_step(module, model, optimizer, minibatch, plain_loop=False):
    with module.GradientTape() as tape:
        loss = module.add_n([model.loss(module, example) for example in minibatch]
                            if plain_loop else minibatch_losses(module, model, minibatch))
        if module is subgraphjit:
            loss = subgraphjit.build(loss)
    gradients = tape.gradient(loss, model.variables)
    optimizer.apply_gradients(zip(gradients, model.variables))
    return float(loss)


def rate(name, setting, arguments):
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
    if granularity == "auto" or arguments.same_minibatches:
        # Time the choice's trial apart too; with --same-minibatches every
        # setting warms up as long (a model whose work depends on values,
        # such as the number of ponder steps, changes as it trains).
        warm_up_steps += (subgraphjit.get_parameter("collect") + len(Trial.TIMED)
                          + len(Trial.UNITS) * (2 * PARAMETERS["compile"].default + 1))
    model = make_model(name, arguments.width, seed=0)
    data = np.random.default_rng(1)
    minibatches = [model.random_examples(data, arguments.batch_size)
               for _ in range(warm_up_steps + arguments.minibatches)]
    optimizer = module.keras.optimizers.SGD(0.01)   # (subgraphjit's: a compiled update)
    plain_loop = setting is PLAIN_LOOP
    started = time.perf_counter()
    for minibatch in minibatches[:warm_up_steps]:
        train_step(module, model, optimizer, minibatch, plain_loop)
    warm_up = time.perf_counter() - started
    subgraphjit.reset_stats()
    started, cpu_started = time.perf_counter(), time.process_time()
    for minibatch in minibatches[warm_up_steps:]:
        train_step(module, model, optimizer, minibatch, plain_loop)
    seconds = time.perf_counter() - started
    cpu_seconds = time.process_time() - cpu_started
    stats = subgraphjit.stats()
    chosen = (stats["granularity_chosen"].get("training")
              if granularity == "auto" else None)
    counts = None if module is tensorflow else (
        stats["batches"] / (arguments.minibatches * arguments.batch_size),
        stats["evaluations"] / arguments.minibatches)
    instances = arguments.minibatches * arguments.batch_size
    return instances / seconds, warm_up, chosen, counts, instances / cpu_seconds


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", nargs="*", default=[*sorted(MODELS), *CONTROL_FLOW_MODELS],
                        choices=sorted(ALL_MODELS))
    parser.add_argument("--width", type=int, default=64,
                        help="embedding and hidden size (or matrix size)")
    parser.add_argument("--batch-size", type=int, default=25)
    parser.add_argument("--minibatches", type=int, default=8)
    parser.add_argument("--warm-up", type=int, default=10,
                        help="untimed minibatches first (patterns collect in 3, "
                             "a program compiles at its key's 4th sighting; "
                             "the defaults' granularity trial adds its own)")
    parser.add_argument("--same-minibatches", action="store_true",
                        help="every setting warms up as long as the defaults' "
                             "trial, so all time the same minibatches")
    arguments = parser.parse_args()
    defaults = {key: subgraphjit.get_parameter(key) for key in ("granularity", "compile")}
    print(f"training, width {arguments.width}, batch {arguments.batch_size}, "
          f"{arguments.minibatches} timed minibatches after {arguments.warm_up}, "
          f"1 thread; defaults: {defaults}")
    # CPU time too: on a shared machine it is the steadier of the two.
    print(f"{'model':<20} {'setting':<40} {'inst/s':>9} {'x eager':>8} {'cpu x':>6} "
          f"{'warm-up s':>9} {'launch/inst':>11} {'evals/mb':>8}")
    for name in arguments.models:
        eager = cpu_eager = None
        settings = SETTINGS + ([PLAIN_LOOP] if name in CONTROL_FLOW_MODELS else [])
        for setting in settings:
            speed, warm_up, chosen, counts, cpu_speed = rate(name, setting, arguments)
            eager, cpu_eager = eager or speed, cpu_eager or cpu_speed
            label = setting[0] + (f" ({chosen})" if chosen else "")
            launches, evaluations = (f"{counts[0]:.1f}", f"{counts[1]:.1f}") if counts \
                else ("-", "-")
            print(f"{name:<20} {label:<40} {speed:>9.1f} {speed / eager:>8.2f} "
                  f"{cpu_speed / cpu_eager:>6.2f} {warm_up:>9.1f} {launches:>11} "
                  f"{evaluations:>8}", flush=True)
    for key, value in defaults.items():
        subgraphjit.set_parameter(key, value)


if __name__ == "__main__":
    main()
