"""Minibatches of one instance: eager TensorFlow against subgraphjit's
defaults, taking turns in blocks of minibatches.

Issue 16's promise: where batching finds nothing to share, subgraphjit
costs at most 5% over eager TensorFlow.  A minibatch of one takes about a
millisecond here, and this VM's speed drifts by tens of percent within
minutes, so the two systems take turns on the same minibatches rather
than one after the other as in models.py: each block of BLOCK
minibatches is run by both, the one that goes first alternating from
block to block (whichever runs second finds the caches warm; and
subgraphjit times each of its scopes until the next, which the other
system's steps must not fall into).  The ratio is of their total times.
Training is the step models.py times (loss, gradient, SGD update);
inference is the losses in one batching scope, then each read.  Printed
per model and mode: instances per second, the ratio to eager, and the
share of subgraphjit's timed scopes that ran eagerly (eager_scopes.py)
or were recorded.
"""

import argparse
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
from benchmarks.models import ALL_MODELS, MODES, make_model, step  # noqa: E402


BLOCK = 10


def measure(name, training, arguments):
    """(eager inst/s, subgraphjit inst/s, subgraphjit scopes run eagerly)."""
    subgraphjit.reset_patterns()
    model = make_model(name, arguments.width, seed=0)
    optimizers = {module: module.keras.optimizers.SGD(0.01)
                  for module in (tensorflow, subgraphjit)}
    data = np.random.default_rng(1 if training else 2)
    seconds = {tensorflow: 0.0, subgraphjit: 0.0}
    for number in range(0, arguments.warm_up + arguments.minibatches, BLOCK):
        if number == arguments.warm_up:
            subgraphjit.reset_stats()
        block = [model.random_examples(data, 1) for _ in range(BLOCK)]
        turns = (tensorflow, subgraphjit) if number // BLOCK % 2 else (subgraphjit, tensorflow)
        for module in turns:
            for minibatch in block:
                started = time.perf_counter()
                step(module, model, optimizers[module], minibatch, False, training)
                if number >= arguments.warm_up:
                    seconds[module] += time.perf_counter() - started
    eagerly = subgraphjit.stats()["scopes_run_eagerly"]
    return (arguments.minibatches / seconds[tensorflow],
            arguments.minibatches / seconds[subgraphjit], eagerly / arguments.minibatches)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", nargs="*", default=sorted(ALL_MODELS),
                        choices=sorted(ALL_MODELS))
    parser.add_argument("--modes", nargs="+", default=list(MODES), choices=list(MODES))
    parser.add_argument("--width", type=int, default=64)
    parser.add_argument("--minibatches", type=int, default=300)
    parser.add_argument("--warm-up", type=int, default=60)
    arguments = parser.parse_args()
    if arguments.minibatches % BLOCK or arguments.warm_up % BLOCK:
        parser.error(f"--minibatches and --warm-up must be multiples of {BLOCK}")
    print(f"minibatches of one, width {arguments.width}, {arguments.minibatches} "
          f"timed after {arguments.warm_up}, eager and subgraphjit's defaults "
          f"taking turns in blocks of {BLOCK} minibatches, 1 thread")
    print(f"{'model':22s} {'mode':5s} {'eager inst/s':>12s} {'subgraphjit':>11s} "
          f"{'x eager':>7s} {'scopes run eagerly':>18s}")
    for name in arguments.models:
        for mode in arguments.modes:
            eager, ours, eagerly = measure(name, mode == "train", arguments)
            print(f"{name:22s} {mode:5s} {eager:12.1f} {ours:11.1f} "
                  f"{ours / eager:7.2f} {eagerly:18.0%}", flush=True)


if __name__ == "__main__":
    main()
