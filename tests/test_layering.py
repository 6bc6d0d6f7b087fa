"""The library never imports experiments/ or its own tools/ (the tools,
the tests and the benchmarks import the library, never the other way)."""

import ast
import pathlib

LIBRARY = pathlib.Path(__file__).parents[1] / "subgraphjit"


def imported_modules(path):
    """Every module ``path`` imports, anywhere in it, as an absolute name."""
    package = ".".join(path.relative_to(LIBRARY.parent).with_suffix("").parts[:-1])
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            parts = package.split(".")
            base = parts[:len(parts) - node.level + 1] if node.level else []
            module = ".".join(base + ([node.module] if node.module else []))
            yield module
            # ``from . import tools`` names the module in its alias.
            yield from (f"{module}.{alias.name}" for alias in node.names)


def test_library_imports_neither_experiments_nor_tools():
    offending = []
    for path in sorted(LIBRARY.rglob("*.py")):
        # (__main__.py is ``python -m subgraphjit``: the command, a tool.)
        if "tools" in path.relative_to(LIBRARY).parts or path.name == "__main__.py":
            continue
        for module in imported_modules(path):
            if module.split(".")[0] == "experiments" or \
                    module.startswith("subgraphjit.tools"):
                offending.append(f"{path.relative_to(LIBRARY.parent)}: {module}")
    assert not offending, offending


def test_relative_imports_are_resolved():
    """(So that ``from ..tools import cli`` would be seen.)"""
    modules = set(imported_modules(LIBRARY / "batcher" / "graph.py"))
    assert "subgraphjit._native" in modules     # from .. import _native
    assert "subgraphjit.ir.table" in modules    # from ..ir.table import ...
