"""Adagrad's update of an embedding table from looked-up rows: Keras's
eager update, Keras's update compiled (subgraphjit's ``CompiledUpdate``
alone) and subgraphjit's optimizer (compiled, rows only: ``RowwiseAdagrad``),
ms per update, in one run.

    python benchmarks/optimizer_update.py                 # the SST Tree-LSTM's sizes
    python benchmarks/optimizer_update.py --vocabulary 100000 --rows 5000
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
from subgraphjit.dropin import optimizers  # noqa: E402


def per_update_ms(optimizer_class, arguments, gradients):
    rng = np.random.default_rng(0)
    table = tensorflow.Variable(rng.normal(size=(arguments.vocabulary, arguments.width))
                                .astype(np.float32))
    optimizer = optimizer_class(0.05)
    optimizer.apply_gradients([(gradients[0], table)])   # builds it (and compiles ours)
    optimizer.apply_gradients([(gradients[1], table)])
    times = []
    for gradient in gradients[2:]:
        started = time.perf_counter()
        optimizer.apply_gradients([(gradient, table)])
        table.sparse_read([0]).numpy()   # waits for the update (one row read)
        times.append(time.perf_counter() - started)
    return 1e3 * float(np.median(times))


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--vocabulary", type=int, default=7687,
                        help="rows of the table (the words of the first 2,000 SST trees)")
    parser.add_argument("--width", type=int, default=300)
    parser.add_argument("--rows", type=int, default=450,
                        help="entries per gradient (a 25-tree SST minibatch: about 450 leaves)")
    parser.add_argument("--updates", type=int, default=40)
    arguments = parser.parse_args()
    rng = np.random.default_rng(1)
    gradients = [tensorflow.IndexedSlices(
        tensorflow.constant(rng.normal(size=(arguments.rows, arguments.width)).astype(np.float32)),
        tensorflow.constant(rng.integers(arguments.vocabulary, size=arguments.rows)
                            .astype(np.int32)),
        tensorflow.constant([arguments.vocabulary, arguments.width]))
        for _ in range(arguments.updates)]
    keras_class = tensorflow.keras.optimizers.Adagrad
    systems = [("Keras, eager", keras_class),
               ("Keras, compiled", type("Adagrad", (optimizers.CompiledUpdate, keras_class), {})),
               ("subgraphjit (compiled, rows only)", subgraphjit.keras.optimizers.Adagrad)]
    print(f"Adagrad update of a {arguments.vocabulary} x {arguments.width} table from "
          f"{arguments.rows} looked-up rows, median of {arguments.updates - 2}, 1 thread")
    print(f"{'system':36s} {'ms/update':>10s} {'x Keras eager':>14s}")
    base = None
    for name, optimizer_class in systems:
        milliseconds = per_update_ms(optimizer_class, arguments, gradients)
        base = base or milliseconds
        print(f"{name:36s} {milliseconds:10.2f} {base / milliseconds:14.1f}")


if __name__ == "__main__":
    main()
