"""Every example in a docstring of the installed package runs and shows what it says: the pure
Python modules under ``cowmap`` and the compiled ones (``cowmap._core`` and the async layer's),
whose class and function docstrings are found through the imported modules.

The examples of the README and of the docs' pages are python blocks, not doctests;
``tests/test_package.py`` runs them.
"""

from __future__ import annotations

import doctest
import importlib
import pkgutil
from types import ModuleType

import pytest

import cowmap

COMPILED = ("cowmap._core", "cowmap._keygroups", "cowmap._future", "cowmap._controller", "cowmap._requests")

#: Docstrings known to carry examples: if the finder stops seeing one (a compiled class's
#: docstring hidden by a build option, say), the parametrized test would pass without running it.
DOCUMENTED = {
    "cowmap._core.CopyOnWriteStateMap",
    "cowmap._core.FlatStateMap",
    "cowmap.state",
    "cowmap.asyncstate",
}


def _module_names() -> list[str]:
    """``cowmap``, every module and package below it, and the compiled modules (listed by name
    too, so a build that left one out fails on its import instead of being skipped)."""
    found = {info.name for info in pkgutil.walk_packages(cowmap.__path__, "cowmap.")}
    return sorted({"cowmap", *COMPILED, *found})


MODULES = _module_names()


def _doctests(module: ModuleType) -> list[doctest.DocTest]:
    return [t for t in doctest.DocTestFinder().find(module, module.__name__) if t.examples]


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples_run(name: str) -> None:
    module = importlib.import_module(name)
    report: list[str] = []
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS)
    for test in _doctests(module):
        runner.run(test, out=report.append)
    assert runner.failures == 0, "".join(report)


def test_the_documented_examples_are_found() -> None:
    found = {t.name for name in MODULES for t in _doctests(importlib.import_module(name))}
    assert found >= DOCUMENTED
