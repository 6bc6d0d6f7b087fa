"""Row layout on and off, per model: what ED-Batch's table 2 reports.

For each model, the same minibatches are run (forward and backward) with
``layout`` "none" and "pq", alternating, and the script prints per minibatch
(medians): gather ops, megabytes gathered, slices, the planner's time, and
the whole step's time; then the ratios none / pq.  The models: the Tree-LSTM
on SST (embedding 300, hidden 150: leaf and internal cells), and the example
models' LSTM (BiLSTM tagger), Tree-GRU, MV-RNN and lattice LSTM cells, sized
up to hidden 150.

    python benchmarks/layout.py                  # agenda, batch 20, 8 minibatches
    python benchmarks/layout.py --scheduler fsm --minibatches 4
    python benchmarks/layout.py --granularity subgraph   # patterns as units
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
from experiments import example_models, sst  # noqa: E402
from experiments.treelstm import TreeLSTM  # noqa: E402
from subgraphjit.tools.report import print_table  # noqa: E402

LAYOUTS = ("none", "pq")
COLUMNS = ("gathers", "MB gathered", "slices", "planning ms", "step ms")


class SstTreeLSTM:
    """The main job's model and data behind the example models' interface."""

    def __init__(self, rng):
        self.trees = sst.load_split("train", limit=2000)
        self.vocabulary = sst.Vocabulary(self.trees)
        self.model = TreeLSTM(subgraphjit, len(self.vocabulary), 2)
        self.variables = self.model.variables

    def random_examples(self, rng, count):
        return [self.trees[i] for i in rng.choice(len(self.trees), count)]

    def loss(self, tf, tree):
        return self.model.loss(tree, self.vocabulary)


def sized(name, **sizes):
    return lambda rng: example_models.MODELS[name](rng, **sizes)


MODELS = {
    "Tree-LSTM on SST": SstTreeLSTM,
    "LSTM (BiLSTM tagger)": sized("bilstm_tagger", embed=100, hidden=150),
    "Tree-GRU": sized("tree_gru", embed=100, hidden=150),
    "MV-RNN": sized("mv_rnn", size=32),
    "lattice LSTM": sized("lattice_lstm", embed=100, hidden=150),
}


def step(model, examples):
    """One forward and backward pass; returns its statistics and seconds."""
    before = subgraphjit.stats()
    started = time.perf_counter()
    with subgraphjit.GradientTape() as tape:
        loss = subgraphjit.build(subgraphjit.add_n(
            [model.loss(subgraphjit, example) for example in examples]))
    tape.gradient(loss, model.variables)
    seconds = time.perf_counter() - started
    after = subgraphjit.stats()
    return {"gathers": after["gathers"] - before["gathers"],
            "MB gathered": (after["bytes_gathered"] - before["bytes_gathered"]) / 1e6,
            "slices": after["slices"] - before["slices"],
            "planning ms": (after["layout_seconds"] - before["layout_seconds"]) * 1e3,
            "step ms": seconds * 1e3}


def measure(make_model, arguments):
    rng = np.random.default_rng(arguments.seed)
    model = make_model(rng)
    subgraphjit.reset_patterns()   # a new model: collect its own patterns
    # Warm-up: with patterns, the collection minibatches and one more.
    warm_up = (subgraphjit.get_parameter("collect") + 1
               if arguments.granularity == "subgraph" else 1)
    minibatches = [model.random_examples(rng, arguments.batch_size)
                   for _ in range(arguments.minibatches + warm_up)]
    samples = {layout: [] for layout in LAYOUTS}
    for number, examples in enumerate(minibatches):
        for layout in LAYOUTS if number % 2 else LAYOUTS[::-1]:
            subgraphjit.set_parameter("layout", layout)
            result = step(model, examples)
            if number >= warm_up:
                samples[layout].append(result)
    return {layout: {column: float(np.median([s[column] for s in rows]))
                     for column in COLUMNS}
            for layout, rows in samples.items()}


def ratio(before, after):
    return "-" if after == 0 else f"{before / after:.2f}x"


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--scheduler", default="agenda")
    parser.add_argument("--granularity", default="op", choices=("op", "subgraph"))
    parser.add_argument("--batch-size", type=int, default=20)
    parser.add_argument("--minibatches", type=int, default=8,
                        help="measured minibatches (one more warms up)")
    parser.add_argument("--models", default=",".join(MODELS),
                        help="comma-separated, from: " + ", ".join(MODELS))
    parser.add_argument("--seed", type=int, default=0)
    arguments = parser.parse_args(argv)
    subgraphjit.set_parameter("scheduler", arguments.scheduler)
    subgraphjit.set_parameter("granularity", arguments.granularity)
    headers = ("model", "layout") + COLUMNS
    rows = []
    for name in arguments.models.split(","):
        print(f"measuring {name} ...", file=sys.stderr, flush=True)
        results = measure(MODELS[name.strip()], arguments)
        for layout in LAYOUTS:
            rows.append((name, layout) + tuple(
                f"{results[layout][column]:.2f}" if column == "MB gathered"
                else f"{results[layout][column]:.1f}" for column in COLUMNS))
        none, pq = results["none"], results["pq"]
        rows.append((name, "none / pq", ratio(none["gathers"], pq["gathers"]),
                     ratio(none["MB gathered"], pq["MB gathered"]), "", "",
                     ratio(none["step ms"], pq["step ms"])))
    subgraphjit.set_parameter("layout", "none")
    print(f"scheduler {arguments.scheduler}, granularity {arguments.granularity}, "
          f"batch {arguments.batch_size}, "
          f"median of {arguments.minibatches} minibatches, forward + backward")
    print_table(headers, rows)


if __name__ == "__main__":
    main()
