"""The library never imports experiments/ or its own tools/ (the tools,
the tests and the benchmarks import the library, never the other way)."""

import ast
import subprocess
import sys
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


def test_the_pq_tree_and_the_row_layout_import_without_tensorflow():
    """They are pure algorithms (ED-Batch's row layout): a user or a tool can
    use them where TensorFlow is not installed, and the package says what
    is missing when its drop-in is asked for."""
    script = """
import sys
sys.modules["tensorflow"] = None   # import tensorflow now raises ImportError
from subgraphjit.batcher import layout
from subgraphjit.batcher.pqtree import PQTree
tree = PQTree(range(4))
assert tree.reduce({1, 2}), "a consecutive set reduces"
import subgraphjit
try:
    subgraphjit.constant
except AttributeError as error:
    assert "TensorFlow did not import" in str(error), error
else:
    raise AssertionError("the drop-in answered without TensorFlow")
assert sys.modules["tensorflow"] is None
print("ok", sorted(name for name in sys.modules if name.startswith("subgraphjit")))
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True,
                          text=True, cwd=LIBRARY.parent)
    assert done.returncode == 0, done.stderr
    imported = done.stdout.split("ok", 1)[1]
    assert "subgraphjit.batcher.execute" not in imported and "_native" not in imported
