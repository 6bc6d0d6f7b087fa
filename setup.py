"""Builds the compiled core, ``subgraphjit._native`` (C against the CPython
API, no build dependency beyond setuptools).  Everything else about the
package is in pyproject.toml."""

import os

from setuptools import Extension, setup

setup(ext_modules=[Extension(
    "subgraphjit._native",
    sources=["native/_native.c", "native/analysis.c", "native/match.c",
             "native/plan.c", "native/fuse.c", "native/slab.c",
             "native/operands.c"],
    depends=["native/native.h", "native/containers.h"],
    extra_compile_args=[] if os.name == "nt" else ["-O2", "-Wall"],
)])
