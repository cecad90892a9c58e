"""What a release is made of, checked without building it: the CI workflow that builds and
publishes the wheels passes the linters for its format, the wheel matrix configured for
cibuildwheel is the one the docs promise, the version is written in one place, and the
license the metadata claims is the one shipped.

(``tests/test_install.py`` builds the sdist and a wheel and installs it.)
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import cowmap

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - the suite runs on 3.11 in CI
    tomllib = pytest.importorskip("tomli", reason="reading pyproject.toml on Python 3.10 needs tomli")

ROOT = Path(__file__).resolve().parents[1]
WORKFLOWS = sorted((ROOT / ".github" / "workflows").glob("*.yml"))
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())


def _tool(name: str) -> str:
    """The path of a console script installed with the test extra."""
    path = shutil.which(name, path=os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")]))
    assert path is not None, f"{name} is not installed (it comes with the test extra: pip install -e '.[test]')"
    return path


def _run(cmd: list[str], **kw) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=ROOT, **kw)


def test_there_is_a_wheels_workflow() -> None:
    assert [p.name for p in WORKFLOWS] == ["wheels.yml"]


def test_the_workflows_match_the_github_actions_schema() -> None:
    r = _run([_tool("check-jsonschema"), "--builtin-schema", "vendor.github-workflows", *map(str, WORKFLOWS)])
    assert r.returncode == 0, r.stdout + r.stderr


def test_the_workflows_pass_zizmor() -> None:
    """zizmor's audits (offline): actions pinned to commits, no credentials persisted, no
    template injection, least permissions."""
    r = _run([_tool("zizmor"), "--offline", "--no-progress", *map(str, WORKFLOWS)])
    assert r.returncode == 0, r.stdout + r.stderr


def test_the_workflow_builds_on_a_runner_per_architecture() -> None:
    text = (ROOT / ".github" / "workflows" / "wheels.yml").read_text()
    runners = re.search(r"os: \[([^\]]*)\]", text).group(1).split(", ")  # type: ignore[union-attr]
    assert runners == ["ubuntu-24.04", "ubuntu-24.04-arm", "macos-13", "macos-14"]
    assert "pypa/cibuildwheel@" in text and "twine check --strict" in text and "id-token: write" in text


@pytest.mark.parametrize(("platform", "archs", "expected"), [
    ("linux", "x86_64,aarch64", [f"cp3{v}-{libc}_{arch}" for v in (10, 11, 12, 13)
                                 for libc in ("manylinux", "musllinux") for arch in ("x86_64", "aarch64")]),
    ("macos", "x86_64,arm64", [f"cp3{v}-macosx_{arch}" for v in (10, 11, 12, 13) for arch in ("x86_64", "arm64")]),
])
def test_cibuildwheel_builds_the_promised_wheels(platform: str, archs: str, expected: list[str]) -> None:
    """CPython 3.10-3.13, no free-threaded build, on each architecture a runner of the workflow has."""
    env = dict(os.environ, CIBW_ARCHS=archs)
    r = _run([_tool("cibuildwheel"), "--print-build-identifiers", "--platform", platform], env=env)
    assert r.returncode == 0, r.stdout + r.stderr
    assert sorted(r.stdout.split()) == sorted(expected)


def test_the_version_is_written_once() -> None:
    assert "version" in PYPROJECT["project"]["dynamic"] and "version" not in PYPROJECT["project"]
    text = (ROOT / "python" / "cowmap" / "_version.py").read_text()
    (version,) = re.findall(r'^__version__ = "([^"]+)"$', text, re.M)
    assert cowmap.__version__ == version
    assert re.fullmatch(r"\d+\.\d+\.\d+((a|b|rc)\d+)?", version), version
    assert f"## [{version}]" in (ROOT / "CHANGELOG.md").read_text()


def test_the_license_is_the_one_claimed() -> None:
    assert PYPROJECT["project"]["license"] == "Apache-2.0"
    text = (ROOT / "LICENSE").read_text()
    assert "Apache License" in text and "Version 2.0, January 2004" in text
    assert "END OF TERMS AND CONDITIONS" in text


def test_the_metadata_names_every_supported_python() -> None:
    classifiers = PYPROJECT["project"]["classifiers"]
    versions = sorted(c.rsplit(":: ", 1)[1] for c in classifiers if re.search(r"Python :: 3\.\d+$", c))
    assert versions == ["3.10", "3.11", "3.12", "3.13"]
    assert PYPROJECT["project"]["requires-python"] == ">=3.10"
    assert {"Homepage", "Documentation", "Source", "Issues", "Changelog"} <= set(PYPROJECT["project"]["urls"])
