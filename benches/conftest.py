"""pytest-benchmark suite for ``cowmap.CopyOnWriteStateMap`` against the alternatives a user has.

Run::

    pytest benches/ --benchmark-only                     # ~2-3 min, "10M" rows at 2M
    COWMAP_BENCH_FULL=1 pytest benches/ --benchmark-only # 10M-entry rows (several minutes, GBs of RAM)

Figures (one module each; each module's docstring says how it is measured):

1. ``test_bench_single.py``   single-key ``get`` / ``put`` from Python vs ``dict``.
1h. ``test_bench_hints.py``   a ``prefetch()`` hint hides a cold lookup's miss (a build guard).
2. ``test_bench_batch.py``    ``get_many`` / ``put_many`` on int64 arrays vs pandas' khash.
3. ``test_bench_snapshot.py`` ``snapshot()`` start time (and 6.: first write after a snapshot).
4. ``test_bench_growth.py``   worst single ``put`` while growing, vs a dict's resize pause.
5. ``test_bench_memory.py``   map overhead per entry vs a ``{(key, ns): v}`` dict.
7.-11. ``test_bench_state.py`` keyed state: MapState with TTL by entries per key, MapState vs
   ValueState, ValueState with/without TTL and vs a dict, backend ``snapshot()`` start.
12.-15. ``test_bench_async.py`` the async state layer: core calls per record, cost per record
   vs the sync path, the time hidden when every state call has a latency, and a hot key.
16.-19. ``test_bench_columnar.py`` columnar state: a pandas UDF's batches through the batch
   twins vs the per-record loop vs a pandas Series.

pytest-benchmark's own table shows seconds per *round*; a round of the per-op figures is a loop
of 1M calls, so there "ms per round" reads as "ns per op". The summary printed after it (by
``pytest_terminal_summary`` below) converts every figure to its unit, puts cowmap's figure next
to the comparison measured in the same run, and marks each target met / NOT met. Figures are
medians of rounds (the machine is shared and noisy); nothing here asserts on timings.
"""

from __future__ import annotations

import os

# numpy's OpenBLAS threads spin on idle cores; on 2 cores that steals from the
# code under measurement. Must be set before numpy is first imported.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
import platform
import time

import pytest

import benchlib
from benchlib import BIG_LABEL, BIG_TAG, FULL, N_BIG, N_SMALL, SMALL_TAG

_session_info: dict[str, object] = {}


def _core_file() -> tuple[str, float]:
    """Path and mtime of the compiled core this process imported."""
    import cowmap._core as core

    return core.__file__, os.path.getmtime(core.__file__)


def pytest_sessionstart(session: pytest.Session) -> None:
    _session_info["t0"] = time.time()
    _session_info["load0"] = os.getloadavg()
    try:
        _session_info["core"] = _core_file()
    except Exception as exc:  # noqa: BLE001  # pragma: no cover - the tests will fail to import anyway
        _session_info["core"] = (f"unknown ({exc!r})", float("nan"))


@pytest.fixture(scope="session")
def figures() -> benchlib.Figures:
    """The session's figure registry; the summary table is printed from it."""
    return benchlib.FIGURES


@pytest.fixture(scope="session")
def small() -> benchlib.Dataset:
    """1,000,000 unique random int64 keys and a random probe order."""
    return benchlib.make_dataset(N_SMALL, SMALL_TAG, "1M")


@pytest.fixture(scope="session")
def big() -> benchlib.Dataset:
    """10,000,000 keys with COWMAP_BENCH_FULL=1, else 2,000,000 (rows say so)."""
    return benchlib.make_dataset(N_BIG, BIG_TAG, BIG_LABEL)


def _cowmap_build_info() -> list[str]:
    """Which core was measured, and a warning if it was rebuilt on disk during the session."""
    path, mtime0 = _session_info.get("core", ("unknown", float("nan")))
    stamp = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(mtime0)) if mtime0 == mtime0 else "?"
    lines = [f"cowmap core: {path} (built {stamp})"]
    try:
        mtime1 = os.path.getmtime(path)
    except OSError:
        mtime1 = float("nan")
    if mtime1 == mtime1 and mtime0 == mtime0 and mtime1 != mtime0:
        lines.append("WARNING: the core was rebuilt on disk during this session; this process kept "
                     "the one it imported at start, but figures may not match the current build.")
    return lines


@pytest.hookimpl(trylast=True)
def pytest_terminal_summary(terminalreporter, exitstatus, config) -> None:
    """Print the cowmap summary table after pytest-benchmark's own tables."""
    figs = benchlib.FIGURES
    if not figs.values:
        return
    tr = terminalreporter
    tr.write_sep("=", "cowmap benchmark summary")
    load1 = os.getloadavg()
    elapsed = time.time() - float(_session_info.get("t0", time.time()))
    tr.write_line(
        f"mode: {'FULL (COWMAP_BENCH_FULL=1)' if FULL else 'default'}; small = {N_SMALL:,} entries, "
        f"'10M' rows = {N_BIG:,} entries; python {platform.python_version()}, {os.cpu_count()} CPUs"
    )
    for line in _cowmap_build_info():
        tr.write_line(line)
    load0 = _session_info.get("load0", (float("nan"),) * 3)
    tr.write_line(
        f"load average at start {load0[0]:.2f}/{load0[1]:.2f}/{load0[2]:.2f}, "
        f"at end {load1[0]:.2f}/{load1[1]:.2f}/{load1[2]:.2f}; session {elapsed:.0f} s "
        "(figures are medians; a loaded machine inflates both columns)"
    )
    tr.write_line("")
    for line in benchlib.render_summary(figs):
        tr.write_line(line)
