"""``python -m subgraphjit``: the same as the ``subgraphjit`` command."""

from .cli import main

main()
