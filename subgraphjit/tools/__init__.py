"""Tools apart from the library: the ``subgraphjit`` command (cli.py), the
scheduler comparison it runs (scheduler_comparison.py), the plain-text
tables that it, the experiments and the benchmarks print (report.py), and
the README's op table (op_table.py).
Nothing in the library imports this package; the tools may import the
library and a source checkout's ``experiments/``."""

import pathlib

# The source checkout this package sits in (its experiments/ hold the
# models the tools run); an installed copy has none.
REPOSITORY = pathlib.Path(__file__).resolve().parents[2]
