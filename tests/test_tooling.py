"""The checks the package keeps passing, run as part of the suite (the README's test command):

- ruff, with ``[tool.ruff]`` of pyproject.toml, over python/, tests/, benches/ and examples/;
- mypy, with ``[tool.mypy]``, over python/cowmap (the stubs of the compiled modules included);
- stubtest: each ``.pyi`` stub in python/cowmap says what its compiled module has, names and
  signatures, except what tests/stubtest_allowlist.txt lists with its reason.

Each tool runs in a subprocess of this interpreter and must exit 0; its report is the assertion
message. Their caches go to pytest's temporary directory: stubtest, which takes no cache option,
runs there.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
#: every compiled module: one per Cython source
COMPILED = tuple(f"cowmap.{p.stem}" for p in sorted((ROOT / "src" / "cowmap").glob("*.pyx")))


def run_tool(*args: str, cache: Path, cwd: Path = ROOT) -> None:
    """Run ``python -m <args>`` in ``cwd``; fail with its report unless it exits 0."""
    env = {**os.environ, "MYPY_CACHE_DIR": str(cache / "mypy"), "RUFF_CACHE_DIR": str(cache / "ruff")}
    proc = subprocess.run([sys.executable, "-m", *args], cwd=cwd, env=env, capture_output=True, text=True)
    status, report = proc.returncode, proc.stdout + proc.stderr
    assert status == 0, f"{' '.join(args[:2])} exited {status}:\n{report}"


def test_ruff_finds_nothing(tmp_path: Path) -> None:
    run_tool("ruff", "check", "python", "tests", "benches", "examples", cache=tmp_path)


def test_mypy_finds_nothing(tmp_path: Path) -> None:
    run_tool("mypy", cache=tmp_path)


def test_stubs_match_the_compiled_modules(tmp_path: Path) -> None:
    run_tool(
        "mypy.stubtest",
        *COMPILED,
        "--mypy-config-file",
        str(ROOT / "pyproject.toml"),
        "--allowlist",
        str(ROOT / "tests" / "stubtest_allowlist.txt"),
        cache=tmp_path,
        cwd=tmp_path,
    )
