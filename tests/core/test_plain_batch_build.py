"""The batch tests again, on a build whose batches all take the plain path.

The batch ops of the core map (``get_many``, ``put_many``, ``contains_many``, ``remove_many``)
run int64 keys through software pipelines, and the multi-map calls (``multi_get``,
``multi_put``, ``multi_replace``) through prefetch hints; a build made with the CMake option
``COWMAP_PLAIN_BATCH=ON`` runs every batch the plain way instead, the keys one after another
through the steps of the single ops. Both must behave alike. This module builds ``_core``
that way into a temporary directory (``pip wheel`` with ``--config-settings``, the way a
developer would, from a copy of the sources), puts it in a temporary package next to the
normal build's other extension modules and reruns the test files that exercise batches on it
in a child process (``plain_batch_child.py``). It also runs a seeded trace of batch calls
(``batch_trace.py``) on both builds and requires the same outcome, line for line.

About a minute and a half, most of it the child's test run; the build takes about 30 s.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

import cowmap._core

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent

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

#: the extension modules other than _core: COWMAP_PLAIN_BATCH does not touch them, so the
#: temporary package takes the normal build's
OTHER_MODULES = [
    m
    for m in re.search(r"foreach\(mod ([^)]*)\)", (REPO / "CMakeLists.txt").read_text()).group(1).split()  # type: ignore[union-attr]
    if m != "_core"
]

#: what the build needs of the repository
SOURCES = ["pyproject.toml", "CMakeLists.txt", "README.md", "src", "python"]


def _run(cmd: list[str], timeout: float, **kw) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          timeout=timeout, **kw)


@pytest.fixture(scope="module")
def plain_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A directory holding a package cowmap: the sources' Python files, the plain build of
    _core and the normal build's other extension modules."""
    tmp = tmp_path_factory.mktemp("plain_batch")
    # A copy of the sources, under a name without a hyphen: pip keeps wheels built from a
    # local directory named like "name-version" in its wheel cache, where a later install
    # of that directory could pick this plain build up.
    src = tmp / "cowmap_src"
    src.mkdir()
    ignore = shutil.ignore_patterns("__pycache__", "*.so", "*.pyc")
    for name in SOURCES:
        path = REPO / name
        if path.is_dir():
            shutil.copytree(path, src / name, ignore=ignore)
        else:
            shutil.copy2(path, src / name)
    wheels = tmp / "wheel"
    build = _run([sys.executable, "-m", "pip", "wheel", str(src), "--no-deps",
                  "--wheel-dir", str(wheels),
                  "--config-settings=cmake.define.COWMAP_PLAIN_BATCH=ON",
                  f"--config-settings=build-dir={tmp / 'build'}",
                  "--config-settings=build.targets=_core",
                  "--config-settings=install.components=_core"], timeout=900)
    assert build.returncode == 0, build.stdout[-6000:]
    (wheel,) = wheels.glob("cowmap-*.whl")
    root = tmp / "pkg"
    with zipfile.ZipFile(wheel) as z:
        z.extractall(root)
    built = [p.name for p in (root / "cowmap").glob("_*.so")]
    assert len(built) == 1 and built[0].startswith("_core."), built
    for mod in OTHER_MODULES:
        origin = importlib.util.find_spec(f"cowmap.{mod}").origin
        shutil.copy2(origin, root / "cowmap" / Path(origin).name)
    return root


def _child(root: str, build: str, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """plain_batch_child.py on the package in root ("-": as installed), expecting `build`."""
    cmd = [sys.executable, "-X", "faulthandler", str(HERE / "plain_batch_child.py"), root, build, *args]
    return _run(cmd, timeout=900, cwd=REPO, env=env)


#: hypothesis examples per state machine in the rerun (400 in the normal run): the batch
#: rules still run thousands of times, and the rerun stays near a minute
RERUN_STATEMACHINE_EXAMPLES = "100"


def test_normal_build_is_pipelined() -> None:
    """The build the rest of the suite tests is the pipelined one."""
    assert cowmap._core.PLAIN_BATCH is False


def test_batch_tests_pass_on_plain_build(plain_root: Path) -> None:
    """Every test of BATCH_TEST_FILES passes on the plain build, none skipped."""
    env = dict(os.environ, COWMAP_STATEMACHINE_EXAMPLES=RERUN_STATEMACHINE_EXAMPLES)
    run = _child(str(plain_root), "plain", "pytest", "-q", "-p", "no:cacheprovider", "-rs",
                 *BATCH_TEST_FILES, env=env)
    out = run.stdout
    assert run.returncode == 0, out[-8000:]
    first = out.splitlines()[0]
    assert first.startswith(f"cowmap._core from {plain_root}"), first
    assert first.endswith("PLAIN_BATCH=True"), first
    summary = out.strip().splitlines()[-1]
    assert " passed" in summary and "skipped" not in summary and "failed" not in summary, summary


def test_plain_build_traces_the_same(plain_root: Path, tmp_path: Path) -> None:
    """A seeded run of batch calls gives the same lines on both builds: results, errors,
    timestamps, iteration order, rehash progress, entry and page counts."""
    env = dict(os.environ, PYTHONHASHSEED="0")  # str keys hash alike in both processes
    traces = {}
    for build, root in (("normal", "-"), ("plain", str(plain_root))):
        out = tmp_path / f"{build}.json"
        run = _child(root, build, "trace", str(out), env=env)
        assert run.returncode == 0, run.stdout[-8000:]
        traces[build] = json.loads(out.read_text())
    normal, plain = traces["normal"], traces["plain"]
    assert len(normal) > 400
    for a, b in zip(normal, plain):
        assert a == b, f"normal build:\n{a[:2000]}\nplain build:\n{b[:2000]}"
    assert len(normal) == len(plain)
