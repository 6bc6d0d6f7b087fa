"""Is one compiled call cheaper than the same ops run eagerly?

The thesis's premise (chapter 5, Table 6.4) is that running a frequent
subgraph as one compiled function beats running its ops one by one.  This
measures that premise on this machine's TensorFlow for the Tree-LSTM's
internal cell (the ops of ``experiments/treelstm.py``; embedding 300, hidden
150), run on one instance at a time (the thesis's setting, ``scheduler
none``) and on a batch of instances at once (subgraphjit's batched
patterns): eager ops, a tf.function, and that tf.function's concrete
function called directly, forward alone and forward plus backward.

    python benchmarks/function_call.py [--batch-sizes 1 20 256] [--calls 300]

Prints microseconds per call (median of ``--repeats`` runs of ``--calls``
calls) and the ratio eager / compiled (above 1: compiling pays).
"""

import argparse
import pathlib
import sys
import time

import numpy as np
import tensorflow as tf

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

from subgraphjit.tools.report import print_table  # noqa: E402

HIDDEN = 150


def make_cell(rng):
    weight = tf.Variable(rng.uniform(-0.08, 0.08, (2 * HIDDEN, 5 * HIDDEN))
                         .astype(np.float32))
    bias = tf.Variable(np.zeros((1, 5 * HIDDEN), np.float32))

    def cell(left_h, left_c, right_h, right_c):
        gates = tf.matmul(tf.concat([left_h, right_h], axis=1), weight) + bias
        i, forget_left, forget_right, o, u = tf.split(gates, 5, axis=1)
        c = (tf.sigmoid(i) * tf.tanh(u) + tf.sigmoid(forget_left) * left_c
             + tf.sigmoid(forget_right) * right_c)
        return tf.sigmoid(o) * tf.tanh(c), c
    return cell, [weight, bias]


def microseconds_per_call(run, calls, repeats):
    for _ in range(20):
        run()
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        for _ in range(calls):
            run()
        times.append((time.perf_counter() - started) / calls * 1e6)
    return float(np.median(times))


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 20, 256])
    parser.add_argument("--calls", type=int, default=300)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1)
    arguments = parser.parse_args()
    tf.config.threading.set_intra_op_parallelism_threads(arguments.threads)
    tf.config.threading.set_inter_op_parallelism_threads(arguments.threads)

    rng = np.random.default_rng(0)
    cell, variables = make_cell(rng)
    rows = []
    for batch_size in arguments.batch_sizes:
        inputs = [tf.constant(rng.normal(size=(batch_size, HIDDEN)).astype(np.float32))
                  for _ in range(4)]
        input_signature = [tf.TensorSpec((None, HIDDEN), tf.float32)] * 4
        compiled = tf.function(cell, autograph=False, input_signature=input_signature)
        ways = {"eager ops": cell, "tf.function": compiled,
                "concrete function": compiled.get_concrete_function()}
        for backward in (False, True):
            def step(function):
                def run():
                    with tf.GradientTape() as tape:
                        tape.watch(inputs)
                        h, c = function(*inputs)
                        total = tf.reduce_sum(h) + tf.reduce_sum(c)
                    if backward:
                        tape.gradient(total, variables + inputs)
                return run
            cost = {name: microseconds_per_call(step(function), arguments.calls,
                                                arguments.repeats)
                    for name, function in ways.items()}
            eager = cost["eager ops"]
            rows.append([batch_size, "forward + backward" if backward else "forward",
                         *(f"{value:.0f}" for value in cost.values()),
                         f"{eager / cost['tf.function']:.2f}x",
                         f"{eager / cost['concrete function']:.2f}x"])
    print(f"Tree-LSTM internal cell (hidden {HIDDEN}), microseconds per call, "
          f"{arguments.threads} thread(s), under a GradientTape:")
    print_table(["instances", "pass", "eager ops", "tf.function", "concrete",
                 "eager/tf.function", "eager/concrete"], rows)


if __name__ == "__main__":
    main()
