"""The ``subgraphjit`` command (also ``python -m subgraphjit``).

``subgraphjit tune`` runs a model's collection stage (its first ``collect``
minibatches) once per depth and prints the thesis's Table 6.3: for each
P_Depth, the occurrences of frequent subgraphs, how many distinct ones, their
average occurrences and average op count; then it recommends the depth whose
patterns cover the most ops.  The model is the Tree-LSTM on SST
(``experiments/treelstm_sst.py``) unless ``--script`` names another program;
any program that trains through subgraphjit works, since the run stops by
itself once collection ends.

``subgraphjit tune --schedulers`` compares the batching schedulers instead:
batches per minibatch of depth, agenda and the learned FSM against the lower
bound on every example model (``subgraphjit/tools/scheduler_comparison.py``);
``--fsm-sweep alpha=0.5,1,2`` repeats it for each value of an FSM
hyperparameter.
"""

import argparse
import csv
import dataclasses
import itertools
import pathlib
import runpy
import sys

from tqdm import tqdm

from . import REPOSITORY
from .report import print_table

DEFAULT_SCRIPT = REPOSITORY / "experiments" / "treelstm_sst.py"
COLUMNS = ("depth", "subgraphs", "distinct", "average occurrences",
           "average ops", "ops covered")


class CollectionDone(BaseException):
    """Stops the user's program once the collection stage is over (a
    BaseException, so the program's own ``except Exception`` lets it pass)."""


def parse_arguments(argv):
    parser = argparse.ArgumentParser(prog="subgraphjit", description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    tune = commands.add_parser("tune", help="Table 6.3: frequent subgraphs per depth")
    tune.add_argument("--depths", default="5-10",
                      help="depths to try: a range '5-10' or a list '2,4,8'")
    tune.add_argument("--collect", type=int, default=3, help="P_Collect")
    tune.add_argument("--freq", type=int, default=1, help="P_Freq")
    tune.add_argument("--equivalence", default="signature",
                      choices=("shape", "structure", "signature"))
    tune.add_argument("--script", type=pathlib.Path, default=None,
                      help="a Python program training through subgraphjit "
                           "(default: the Tree-LSTM SST experiment)")
    tune.add_argument("--csv", type=pathlib.Path, help="also write the table here")
    tune.add_argument("--plot", type=pathlib.Path,
                      help="also plot it here (needs matplotlib)")
    tune.add_argument("--schedulers", action="store_true",
                      help="compare the schedulers' batches per minibatch "
                           "on every example model instead")
    tune.add_argument("--batch-size", type=int, default=32,
                      help="--schedulers: instances per minibatch")
    tune.add_argument("--models", default=None,
                      help="--schedulers: comma-separated model names (default all)")
    tune.add_argument("--fsm-sweep", action="append", default=[],
                      metavar="KEY=V1,V2",
                      help="--schedulers: FSM hyperparameter values to try "
                           "(repeat for a grid)")
    tune.add_argument("script_arguments", nargs=argparse.REMAINDER,
                      help="after '--': arguments for the script")
    return parser.parse_args(argv)


def parse_depths(text):
    try:
        if "-" in text:
            low, high = (int(part) for part in text.split("-"))
            depths = list(range(low, high + 1))
        else:
            depths = [int(part) for part in text.split(",")]
    except ValueError:
        raise SystemExit(f"--depths: expected a range like 5-10 or a list "
                         f"like 2,4,8, not {text!r}") from None
    if not depths or min(depths) < 1:
        raise SystemExit(f"--depths: depths are positive integers, not {text!r}")
    return depths


def collect_once(script, script_arguments, depth, arguments):
    """Run the script until its collection stage ends; returns the row."""
    import subgraphjit
    from subgraphjit.patterns.search import SEARCH

    for key, value in (("granularity", "subgraph"), ("depth", depth),
                       ("collect", arguments.collect), ("freq", arguments.freq),
                       ("equivalence", arguments.equivalence)):
        subgraphjit.set_parameter(key, value)
    subgraphjit.reset_patterns()
    found = {}

    def stop(patterns):
        found["patterns"] = list(patterns.values())
        raise CollectionDone

    SEARCH.on_collected = stop
    saved_argv = sys.argv
    sys.argv = [str(script), *script_arguments]
    try:
        runpy.run_path(str(script), run_name="__main__")
    except CollectionDone:
        pass
    finally:
        sys.argv = saved_argv
        SEARCH.on_collected = None
    if "patterns" not in found:
        raise SystemExit(f"{script} finished before {arguments.collect} "
                         f"evaluations through subgraphjit: nothing to tune")
    patterns = found["patterns"]
    occurrences = sum(pattern.occurrences for pattern in patterns)
    covered = sum(pattern.occurrences * pattern.op_count for pattern in patterns)
    distinct = len(patterns)
    return (depth, occurrences, distinct,
            occurrences / distinct if distinct else 0.0,
            sum(p.op_count for p in patterns) / distinct if distinct else 0.0,
            covered)


def parse_sweep(items):
    """``["alpha=0.5,1", "n_step=2,4"]`` -> the FsmConfig overrides to try."""
    from ..batcher.schedulers.fsm import FsmConfig
    fields = {field.name: field for field in dataclasses.fields(FsmConfig)}
    axes = []
    for item in items:
        key, _, values = item.partition("=")
        if key not in fields or not values:
            raise SystemExit(f"--fsm-sweep: expected KEY=V1,V2 with KEY one of "
                             f"{', '.join(fields)}, not {item!r}")
        kind = type(getattr(FsmConfig(), key))
        try:
            axes.append([(key, kind(value)) for value in values.split(",")])
        except ValueError:
            raise SystemExit(f"--fsm-sweep: {key} takes {kind.__name__} "
                             f"values, not {values!r}") from None
    return [dict(choice) for choice in itertools.product(*axes)]


def compare_schedulers(arguments):
    from ..batcher.schedulers.fsm import FsmConfig
    from . import scheduler_comparison

    models = arguments.models.split(",") if arguments.models else None
    sweep = parse_sweep(arguments.fsm_sweep)
    configs = [FsmConfig(**overrides) for overrides in sweep]
    rows = scheduler_comparison.compare(arguments.batch_size, configs=configs,
                                        models=models)
    all_rows = []
    for overrides, config in zip(sweep, configs):
        if overrides:
            print("\nFSM settings: " + ", ".join(
                f"{key}={value}" for key, value in overrides.items()))
        scheduler_comparison.print_rows(rows[config], arguments.batch_size, config)
        all_rows += [(*overrides.values(), *row) for row in rows[config]]
    if arguments.csv:
        sweep_keys = list(sweep[0])
        with open(arguments.csv, "w", newline="") as handle:
            writer = csv.writer(handle)
            writer.writerow([*sweep_keys, *scheduler_comparison.COLUMNS])
            writer.writerows(all_rows)
        print(f"wrote {arguments.csv}")
    return all_rows


def tune(arguments):
    if arguments.schedulers:
        return compare_schedulers(arguments)
    script = arguments.script or DEFAULT_SCRIPT
    script_arguments = [a for a in arguments.script_arguments if a != "--"]
    if arguments.script is None:
        if not script.exists():
            raise SystemExit(f"the default model {script} is not here (an "
                             "installed copy has no experiments/); name one "
                             "with --script")
        # Only the collection stage matters: the patterns backend, no
        # accuracy pass, and enough steps to finish collecting.
        script_arguments = ["--backend", "patterns", "--dev-limit", "0",
                            "--steps", str(arguments.collect + 2),
                            "--collect", str(arguments.collect), *script_arguments]
    elif not script.exists():
        raise SystemExit(f"--script: no such file {script}")
    rows = []
    depths = parse_depths(arguments.depths)
    for depth in tqdm(depths, desc="tuning depths", unit="depth"):
        if arguments.script is None:
            depth_arguments = script_arguments + ["--depth", str(depth)]
        else:
            depth_arguments = script_arguments
        rows.append(collect_once(script, depth_arguments, depth, arguments))
    print_collection_table(rows, arguments)
    best = max(rows, key=lambda row: (row[5], -row[0]))
    print(f"\nRecommended: depth {best[0]} (its patterns cover the most ops, "
          f"{best[5]} over {arguments.collect} minibatches); set it with "
          f"subgraphjit.set_parameter('depth', {best[0]}) or "
          f"SUBGRAPHJIT_DEPTH={best[0]}.")
    if arguments.csv:
        with open(arguments.csv, "w", newline="") as handle:
            writer = csv.writer(handle)
            writer.writerow(COLUMNS)
            writer.writerows(rows)
        print(f"wrote {arguments.csv}")
    if arguments.plot:
        plot(rows, arguments.plot)
        print(f"wrote {arguments.plot}")
    return rows


def print_collection_table(rows, arguments):
    print(f"\nFrequent subgraphs over the first {arguments.collect} minibatches "
          f"(freq {arguments.freq}, {arguments.equivalence} equivalence), "
          "as thesis Table 6.3:")
    print_table(COLUMNS, [(*row[:3], f"{row[3]:.2f}", f"{row[4]:.2f}", row[5])
                          for row in rows])


def plot(rows, path):
    try:
        import matplotlib
    except ImportError:
        raise SystemExit("--plot needs matplotlib: pip install matplotlib") from None
    matplotlib.use("Agg")
    from matplotlib import pyplot
    depths = [row[0] for row in rows]
    figure, (left, right) = pyplot.subplots(1, 2, figsize=(9, 3.5))
    left.plot(depths, [row[1] for row in rows], marker="o", label="occurrences")
    left.plot(depths, [row[5] for row in rows], marker="s", label="ops covered")
    left.set_xlabel("depth")
    left.legend()
    right.plot(depths, [row[4] for row in rows], marker="o", label="average ops")
    right.plot(depths, [row[2] for row in rows], marker="s", label="distinct")
    right.set_xlabel("depth")
    right.legend()
    figure.tight_layout()
    figure.savefig(path)


def main(argv=None):
    arguments = parse_arguments(sys.argv[1:] if argv is None else argv)
    if arguments.command == "tune":
        tune(arguments)


if __name__ == "__main__":
    main()
