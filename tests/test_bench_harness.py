"""The README's main job, ``python -m cowmap.bench``, runs end to end (tiny size)."""

import subprocess
import sys

import pytest

from cowmap.bench.__main__ import main


def test_core_scenario_prints_a_table(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["core", "--n", "2000", "--repeats", "1"]) == 0
    out = capsys.readouterr().out
    assert "2,000 random int64 keys" in out
    for row in ("get hit (ns/op)", "put hit (ns/op)", "snapshot() start (us)"):
        assert row in out
    ratios = [line.split()[-3] for line in out.splitlines() if line.startswith(("get hit", "put hit"))]
    assert ratios and all(float(r) > 0 for r in ratios)


def test_bad_arguments_are_rejected() -> None:
    proc = subprocess.run([sys.executable, "-m", "cowmap.bench", "--n", "0"], capture_output=True, text=True)
    assert proc.returncode == 2 and "--n and --repeats must be >= 1" in proc.stderr
