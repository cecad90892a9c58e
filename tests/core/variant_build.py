"""Builds of the extension modules with CMake options set, for the tests that rerun parts of
the suite on them (``test_plain_batch_build.py``, ``test_public_api_build.py``); not a test
module itself.

:func:`build_variant` builds from a copy of the sources with ``pip wheel`` and
``--config-settings``, the way a developer would, and lays the result out as a package
directory; :func:`run_child` runs ``variant_child.py`` on it, which imports cowmap from that
directory only and checks which build it got. The tests run both as background jobs
(``tests/background.py``): they wait on the compiler and on child processes.
"""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

from background import run

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent

#: every extension module (CMakeLists.txt builds one per .pyx)
MODULES = re.search(r"foreach\(mod ([^)]*)\)", (REPO / "CMakeLists.txt").read_text()).group(1).split()  # type: ignore[union-attr]

#: what the build needs of the repository
SOURCES = ["pyproject.toml", "CMakeLists.txt", "README.md", "LICENSE", "src", "python"]


def build_variant(tmp: Path, defines: dict[str, str], modules: list[str] | None = None) -> Path:
    """A directory holding a package cowmap: the sources' Python files, ``modules`` (default:
    all) built with the CMake ``defines``, and the normal build's other extension modules."""
    # A copy of the sources, under a name without a hyphen: pip keeps wheels built from a
    # local directory named like "name-version" in its wheel cache, where a later install
    # of that directory could pick this build up.
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
    cmd = [sys.executable, "-m", "pip", "wheel", str(src), "--no-deps", "--wheel-dir", str(wheels),
           f"--config-settings=build-dir={tmp / 'build'}",
           *(f"--config-settings=cmake.define.{k}={v}" for k, v in defines.items())]
    if modules is not None:
        cmd += [f"--config-settings=build.targets={';'.join(modules)}",
                f"--config-settings=install.components={';'.join(modules)}"]
    build = run(cmd, timeout=900)
    assert build.returncode == 0, build.stdout[-6000:]
    (wheel,) = wheels.glob("cowmap-*.whl")
    root = tmp / "pkg"
    with zipfile.ZipFile(wheel) as z:
        z.extractall(root)
    built = sorted(p.name.split(".")[0] for p in (root / "cowmap").glob("_*.so"))
    assert built == sorted(modules or MODULES), built
    for mod in MODULES:
        if mod not in built:
            origin = importlib.util.find_spec(f"cowmap.{mod}").origin
            shutil.copy2(origin, root / "cowmap" / Path(origin).name)
    return root


def run_child(root: str, build: str, *args: str, env: dict[str, str] | None = None,
              log: Path | None = None) -> subprocess.CompletedProcess:
    """variant_child.py on the package in root ("-": as installed), expecting `build`; its
    output in ``log`` if given."""
    cmd = [sys.executable, "-X", "faulthandler", str(HERE / "variant_child.py"), root, build, *args]
    return run(cmd, timeout=900, cwd=REPO, env=env, log=log)


#: hypothesis examples per state machine in a rerun (400 in the normal run): the rules still
#: run thousands of times, and a rerun stays near a minute
RERUN_STATEMACHINE_EXAMPLES = "100"


def rerun_tests(root: Path, build: str, files: list[str]) -> tuple[int, Path]:
    """The test ``files`` run on the package in ``root`` (``build``): the exit status, and
    the file holding the output."""
    env = dict(os.environ, COWMAP_STATEMACHINE_EXAMPLES=RERUN_STATEMACHINE_EXAMPLES)
    log = root.parent / "rerun.log"
    done = run_child(str(root), build, "pytest", "-q", "-p", "no:cacheprovider", "-rs", *files, env=env, log=log)
    return done.returncode, log


def check_rerun(rerun: tuple[int, Path], root: Path, flag: str) -> None:
    """A :func:`rerun_tests` on ``root`` passed on the build it meant (the first line of its
    output shows ``flag``): every test passed, none was skipped."""
    status, log = rerun
    out = log.read_text()
    assert status == 0, out[-8000:]
    first = out.splitlines()[0]
    assert first.startswith(f"cowmap._core from {root}"), first
    assert flag in first.split(", ")[1:], first
    summary = out.strip().splitlines()[-1]
    assert " passed" in summary and "skipped" not in summary and "failed" not in summary, summary
