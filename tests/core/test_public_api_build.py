"""Tests again, on a build that uses only CPython's public C API.

Some fast paths read or change CPython's own structures: the digits of an int (hashing int
keys, reading int states), a float's value (columns written in place), the allocation slots
of the async layer's futures and record contexts (born untracked by the GC). Each has a
public-API fallback, taken on CPython versions the fast path does not know and in a build
made with the CMake option ``COWMAP_PUBLIC_API_ONLY=ON``. This module makes that build of
every extension module and reruns, in a child process (``variant_child.py``), the test files
whose code goes through those paths: the core map, the columnar state, key groups and the
async layer. (The whole suite was run on it too; that takes as long as the suite.)
"""

from __future__ import annotations

from pathlib import Path

import background

import cowmap._core

from variant_build import build_variant, check_rerun, rerun_tests

#: the test files that go through a fast path with a fallback (the two build tests, which
#: would build again, and the GC switch test, which runs the installed build, are left out)
FALLBACK_TEST_FILES = [
    "tests/core/test_map_basic.py",
    "tests/core/test_map_batch.py",
    "tests/core/test_map_columns.py",
    "tests/core/test_map_export.py",
    "tests/core/test_map_changes.py",
    "tests/core/test_core_hardening.py",
    "tests/core/test_map_leaks.py",
    "tests/core/test_map_statemachine.py",
    "tests/state/test_keygroups.py",
    "tests/state/test_columns_value.py",
    "tests/state/test_columns_kinds.py",
    "tests/asyncstate/test_future.py",
    "tests/asyncstate/test_controller.py",
    "tests/asyncstate/test_controller_misuse.py",
    "tests/asyncstate/test_hardening.py",
]


def _build_and_rerun(tmp: Path) -> tuple[Path, tuple[int, Path]]:
    """A package cowmap whose extension modules all use CPython's public C API only, and the
    run of FALLBACK_TEST_FILES on it."""
    root = build_variant(tmp, {"COWMAP_PUBLIC_API_ONLY": "ON"})
    return root, rerun_tests(root, "public", FALLBACK_TEST_FILES)


background.register("public_api_build", __file__, _build_and_rerun)


def test_normal_build_takes_the_fast_paths() -> None:
    """The build the rest of the suite tests uses them."""
    assert cowmap._core.CPYTHON_INTERNALS is True


def test_tests_pass_on_the_public_api_build() -> None:
    """Every test of FALLBACK_TEST_FILES passes on the public-API build, none skipped."""
    root, rerun = background.result("public_api_build")
    check_rerun(rerun, root, "CPYTHON_INTERNALS=False")
