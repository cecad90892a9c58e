"""Slow jobs of the suite that run in the background; not a test module itself.

A few tests wait mostly on a compiler and on child processes: building the extension modules
with other CMake options and rerunning test files on that build, building the sdist and the
wheel. The rest of the suite runs in one process, on one core. A test module hands such work
to :func:`register` when it is imported; once collection shows one of its tests is selected,
``tests/conftest.py`` starts the job on a worker thread (one job at a time, so the jobs take
the spare core and no more) and moves the module's tests to the end of the run. The tests
then take the job's outcome from :func:`result`, which waits for it, and assert on it as they
would on work done in place: an exception in the job is raised in each test that asks.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

_jobs: dict[str, tuple[str, Callable[[Path], Any]]] = {}
_futures: dict[str, Future] = {}
_executor: ThreadPoolExecutor | None = None
_tmp: Path | None = None
_live: set[subprocess.Popen] = set()
_lock = threading.Lock()
_stopping = False


def register(name: str, module_file: str, job: Callable[[Path], Any]) -> None:
    """Make ``job`` (called with an empty directory of its own) the background job ``name``
    of the test module at ``module_file``."""
    _jobs[name] = (str(Path(module_file).resolve()), job)


def modules() -> set[str]:
    """The files of the test modules that registered a job."""
    return {module for module, _ in _jobs.values()}


def start(selected_modules: set[str]) -> None:
    """Start the jobs of the selected modules, in the order they were registered."""
    global _executor, _tmp
    wanted = [name for name, (module, _) in _jobs.items() if module in selected_modules and name not in _futures]
    if not wanted:
        return
    if _executor is None:
        _executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="cowmap-test-job")
        _tmp = Path(tempfile.mkdtemp(prefix="cowmap-test-jobs-"))
    for name in wanted:
        (home := _tmp / name).mkdir()
        _futures[name] = _executor.submit(_jobs[name][1], home)


def result(name: str) -> Any:
    """The outcome of job ``name``: what it returned, or its exception raised again. A job
    nobody started (its module imported some other way than by collection) runs here."""
    if name not in _futures:
        start({_jobs[name][0]})
    return _futures[name].result()


def run(cmd: list[str], timeout: float, log: Path | None = None, **kw: Any) -> subprocess.CompletedProcess[str]:
    """:func:`subprocess.run` with stderr into stdout and the output as text, the child killed
    by :func:`stop` if the session ends first. The output goes to a file while the child runs,
    and with ``log`` stays there (``stdout`` is then None): what a job keeps in memory is
    allocated in the suite's process, whose memory tests would count it. A build in the child
    compiles one file at a time, unless ``env`` says otherwise: the job takes one core."""
    kw["env"] = {"CMAKE_BUILD_PARALLEL_LEVEL": "1", **(kw.get("env") or os.environ)}
    with open(log, "w+", encoding="utf-8") if log else tempfile.TemporaryFile("w+", encoding="utf-8") as out:
        with _lock:
            if _stopping:
                raise RuntimeError("the test session is over")
            proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, **kw)
            _live.add(proc)
        try:
            proc.wait(timeout=timeout)
        finally:
            proc.kill()  # a no-op once it has exited; after a timeout, the child's end
            proc.wait()
            with _lock:
                _live.discard(proc)
        if log:
            return subprocess.CompletedProcess(cmd, proc.returncode, None)
        out.seek(0)
        return subprocess.CompletedProcess(cmd, proc.returncode, out.read())


def stop() -> None:
    """End the session's jobs: the ones not begun are dropped, running children killed, and
    the jobs' directories removed."""
    global _stopping
    with _lock:
        _stopping = True
        for proc in _live:
            proc.kill()
    if _executor is not None:
        _executor.shutdown(wait=True, cancel_futures=True)
    if _tmp is not None:
        shutil.rmtree(_tmp, ignore_errors=True)
