"""The batch tests again, on a build whose batches all take the plain path.

The batch ops of the core map (``get_many``, ``put_many``, ``contains_many``, ``remove_many``)
run int64 keys through software pipelines, and the multi-map calls (``multi_get``,
``multi_put``, ``multi_replace``) through prefetch hints; a build made with the CMake option
``COWMAP_PLAIN_BATCH=ON`` runs every batch the plain way instead, the keys one after another
through the steps of the single ops. Both must behave alike. This module builds ``_core``
that way into a temporary directory (``pip wheel`` with ``--config-settings``, the way a
developer would, from a copy of the sources), puts it in a temporary package next to the
normal build's other extension modules and reruns the test files that exercise batches on it
in a child process (``variant_child.py``). It also runs a seeded trace of batch calls
(``batch_trace.py``) on both builds and requires the same outcome, line for line.

About a minute and a half, most of it the child's test run; the build takes about 30 s.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

import cowmap._core

from variant_build import build_variant, rerun_tests, run_child

#: the test files that call the batch ops, the multi-map calls or the column calls, directly
#: or through the async state layer's batches and the columnar state calls
#: (test_block_alloc.py, which fills maps with put_many only to exercise the allocator, is left out)
BATCH_TEST_FILES = [
    "tests/core/test_map_batch.py",
    "tests/core/test_map_basic.py",
    "tests/core/test_core_hardening.py",
    "tests/core/test_map_regressions.py",
    "tests/core/test_map_leaks.py",
    "tests/core/test_map_reclaim.py",
    "tests/core/test_map_ttl.py",
    "tests/core/test_map_threading.py",
    "tests/core/test_map_statemachine.py",
    "tests/asyncstate/test_hardening.py",
    "tests/asyncstate/test_controller.py",
    "tests/core/test_map_columns.py",
    "tests/state/test_columns_value.py",
    "tests/state/test_columns_kinds.py",
]


@pytest.fixture(scope="module")
def plain_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A package cowmap with the plain build of _core and the normal build's other modules."""
    return build_variant(tmp_path_factory.mktemp("plain_batch"), {"COWMAP_PLAIN_BATCH": "ON"}, ["_core"])


def test_normal_build_is_pipelined() -> None:
    """The build the rest of the suite tests is the pipelined one."""
    assert cowmap._core.PLAIN_BATCH is False


def test_batch_tests_pass_on_plain_build(plain_root: Path) -> None:
    """Every test of BATCH_TEST_FILES passes on the plain build, none skipped."""
    rerun_tests(plain_root, "plain", "PLAIN_BATCH=True", BATCH_TEST_FILES)


def test_plain_build_traces_the_same(plain_root: Path, tmp_path: Path) -> None:
    """A seeded run of batch calls gives the same lines on both builds: results, errors,
    timestamps, iteration order, rehash progress, entry and page counts."""
    env = dict(os.environ, PYTHONHASHSEED="0")  # str keys hash alike in both processes
    traces = {}
    for build, root in (("normal", "-"), ("plain", str(plain_root))):
        out = tmp_path / f"{build}.json"
        run = run_child(root, build, "trace", str(out), env=env)
        assert run.returncode == 0, run.stdout[-8000:]
        traces[build] = json.loads(out.read_text())
    normal, plain = traces["normal"], traces["plain"]
    assert len(normal) > 400
    for a, b in zip(normal, plain):
        assert a == b, f"normal build:\n{a[:2000]}\nplain build:\n{b[:2000]}"
    assert len(normal) == len(plain)
