"""The release artefacts work for a stranger: ``python -m build`` makes an sdist that builds
from scratch and a wheel, ``twine check`` accepts both, and the wheel installs into a fresh
virtual environment with no compiler on its PATH and runs the benchmark harness (its tiny
configuration) and the README's examples from there.

Takes about two minutes, in the background while the rest of the suite runs
(``tests/background.py``): the wheel is compiled from the sdist, in an isolated build
environment, as pip would on a machine with no wheel for it.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import venv
from pathlib import Path

import background
import pytest

from test_package import python_blocks

ROOT = Path(__file__).resolve().parents[1]
COMPILERS = ("cc", "gcc", "clang", "c++", "g++", "clang++")

#: a README example that needs more than a Python install (Spark and a JDK): run by tests/spark
NEEDS_SPARK = "apply_with_state("


def _run(cmd: list[str], timeout: float = 900, **kw) -> subprocess.CompletedProcess[str]:
    return background.run(cmd, timeout=timeout, **kw)


def _readme_examples() -> list[str]:
    return [b for b in python_blocks(ROOT / "README.md") if NEEDS_SPARK not in b]


def _build_and_install(tmp: Path) -> tuple[Path, Path, dict[str, str]]:
    """``python -m build`` of the repository (the sdist, and the wheel built from it), and a
    new virtual environment with the wheel installed, with the environment variables of a
    shell in it whose PATH holds the environment's scripts only: no compiler."""
    dist = tmp / "dist"
    r = _run([sys.executable, "-m", "build", "--outdir", str(dist), str(ROOT)])
    assert r.returncode == 0, r.stdout[-6000:]
    home = tmp / "venv"
    venv.create(home, with_pip=True)
    bindir = home / "bin"
    env = {k: v for k, v in os.environ.items() if k not in ("CC", "CXX", "PYTHONPATH", "VIRTUAL_ENV")}
    env.update(PATH=str(bindir), VIRTUAL_ENV=str(home), OPENBLAS_NUM_THREADS="1")
    assert not [c for c in COMPILERS if shutil.which(c, path=env["PATH"])]
    (wheel,) = dist.glob("cowmap-*.whl")
    extras = ["pandas"] if any("pandas" in b for b in _readme_examples()) else []
    r = _run([str(bindir / "python"), "-m", "pip", "install", "--no-cache-dir", "-q", str(wheel), *extras],
             env=env, cwd=home)
    assert r.returncode == 0, r.stdout[-6000:]
    return dist, home, env


background.register("install", __file__, _build_and_install)


@pytest.fixture(scope="module")
def dist() -> Path:
    """The sdist and the wheel."""
    return background.result("install")[0]


@pytest.fixture(scope="module")
def fresh_env() -> tuple[Path, dict[str, str]]:
    """The fresh environment with the wheel installed, and its shell's variables."""
    return background.result("install")[1:]


def test_the_sdist_and_the_wheel_pass_twine_check(dist: Path) -> None:
    names = sorted(p.name for p in dist.iterdir())
    assert len(names) == 2 and names[0].endswith(".whl") and names[1].endswith(".tar.gz"), names
    r = _run([sys.executable, "-m", "twine", "check", "--strict", *(str(p) for p in sorted(dist.iterdir()))])
    assert r.returncode == 0 and r.stdout.count("PASSED") == 2, r.stdout


def test_the_sdist_holds_what_a_rebuild_and_the_tests_need(dist: Path) -> None:
    import tarfile

    (sdist,) = dist.glob("cowmap-*.tar.gz")
    with tarfile.open(sdist) as t:
        names = {n.split("/", 1)[1] for n in t.getnames() if "/" in n}
    for need in ("pyproject.toml", "CMakeLists.txt", "LICENSE", "README.md", "src/cowmap/_core.pyx",
                 "python/cowmap/__init__.py", "tests/test_package.py"):
        assert need in names, need
    assert not [n for n in names if n.startswith("build/") or n.endswith(".so")]


def test_the_wheel_runs_in_a_fresh_environment(fresh_env: tuple[Path, dict[str, str]], tmp_path: Path) -> None:
    home, env = fresh_env
    python = str(home / "bin" / "python")
    r = _run([python, "-c", "import cowmap, cowmap._core as c; print(cowmap.__version__, c.__file__)"],
             env=env, cwd=tmp_path)
    assert r.returncode == 0, r.stdout
    version, where = r.stdout.split()
    assert Path(where).is_relative_to(home), where
    assert version == _run([sys.executable, "-c", "import cowmap; print(cowmap.__version__)"]).stdout.strip()
    # the README's main job, at its tiny size
    out = tmp_path / "ttl.json"
    r = _run([python, "-m", "cowmap.bench", "--groups", "4", "--users-per-group", "50", "--sweep", "1,10",
              "--records", "400", "--repeats", "2", "--no-progress", "--out", str(out)], env=env, cwd=tmp_path)
    assert r.returncode == 0, r.stdout[-4000:]
    assert "ns/record (median)" in r.stdout
    doc = json.loads(out.read_text())
    assert doc["state_lost"] is False and doc["errors"] == [] and len(doc["rows"]) == 18
    r = _run([python, "-m", "cowmap.bench", "core", "--n", "2000", "--repeats", "1"], env=env, cwd=tmp_path)
    assert r.returncode == 0 and "get hit (ns/op)" in r.stdout, r.stdout[-4000:]


@pytest.mark.parametrize("i", range(len(_readme_examples())))
def test_the_readme_examples_run_from_the_wheel(fresh_env: tuple[Path, dict[str, str]], tmp_path: Path, i: int) -> None:
    home, env = fresh_env
    script = tmp_path / f"example_{i}.py"
    script.write_text(_readme_examples()[i])
    env = dict(env, TMPDIR=str(tmp_path))  # what an example makes with tempfile, pytest clears
    r = _run([str(home / "bin" / "python"), str(script)], env=env, cwd=tmp_path, timeout=300)
    assert r.returncode == 0, r.stdout[-4000:]
