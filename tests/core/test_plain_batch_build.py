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

About two and a half minutes, most of it the child's test run, in the background while the
rest of the suite runs (``tests/background.py``).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import background

import cowmap._core

from variant_build import build_variant, check_rerun, rerun_tests, run_child

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


def _traces(root: Path, tmp: Path) -> dict[str, tuple[int, Path, Path]]:
    """The seeded trace of batch calls on the normal build and on the one in ``root``: per
    build, the exit status, the file of the trace's lines and the file of the output."""
    env = dict(os.environ, PYTHONHASHSEED="0")  # str keys hash alike in both processes
    traces = {}
    for build, where in (("normal", "-"), ("plain", str(root))):
        out, log = tmp / f"{build}.json", tmp / f"{build}.log"
        traces[build] = (run_child(where, build, "trace", str(out), env=env, log=log).returncode, out, log)
    return traces


def _build_and_rerun(tmp: Path) -> tuple[Path, tuple[int, Path], dict[str, tuple[int, Path, Path]]]:
    """A package cowmap with the plain build of _core and the normal build's other modules,
    the run of BATCH_TEST_FILES on it, and the traces of both builds."""
    root = build_variant(tmp, {"COWMAP_PLAIN_BATCH": "ON"}, ["_core"])
    return root, rerun_tests(root, "plain", BATCH_TEST_FILES), _traces(root, tmp)


background.register("plain_batch_build", __file__, _build_and_rerun)


def test_normal_build_is_pipelined() -> None:
    """The build the rest of the suite tests is the pipelined one."""
    assert cowmap._core.PLAIN_BATCH is False


def test_batch_tests_pass_on_plain_build() -> None:
    """Every test of BATCH_TEST_FILES passes on the plain build, none skipped."""
    root, rerun, _ = background.result("plain_batch_build")
    check_rerun(rerun, root, "PLAIN_BATCH=True")


def test_plain_build_traces_the_same() -> None:
    """A seeded run of batch calls gives the same lines on both builds: results, errors,
    timestamps, iteration order, rehash progress, entry and page counts."""
    _, _, runs = background.result("plain_batch_build")
    traces = {}
    for build, (status, out, log) in runs.items():
        assert status == 0, log.read_text()[-8000:]
        traces[build] = json.loads(out.read_text())
    normal, plain = traces["normal"], traces["plain"]
    assert len(normal) > 400
    for a, b in zip(normal, plain):
        assert a == b, f"normal build:\n{a[:2000]}\nplain build:\n{b[:2000]}"
    assert len(normal) == len(plain)
