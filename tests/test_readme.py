"""The README's op table is the one the code generates."""

import pathlib
import re

from subgraphjit.tools.op_table import markdown_table


def test_readme_op_table_is_current():
    readme = (pathlib.Path(__file__).parents[1] / "README.md").read_text()
    shown = re.search(r"<!-- op-table -->\n(.*?)\n<!-- /op-table -->",
                      readme, re.S).group(1)
    assert shown == markdown_table(), (
        "README op table is stale; regenerate it with "
        "python -c 'from subgraphjit.tools.op_table import markdown_table; "
        "print(markdown_table())'")
