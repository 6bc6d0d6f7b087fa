"""``python -m subgraphjit``: the same as the ``subgraphjit`` command."""

from .tools.cli import main

main()
