"""Where the data sets live: ``../shared/data/<name>`` beside the
repository, or ``$SUBGRAPHJIT_DATA/<name>``."""

import os
import pathlib


def data_directory(name):
    root = os.environ.get("SUBGRAPHJIT_DATA")
    if root:
        return pathlib.Path(root) / name
    return pathlib.Path(__file__).resolve().parents[2] / "shared" / "data" / name
