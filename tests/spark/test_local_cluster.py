"""cowmap.spark on a ``local-cluster``: executors are JVMs of their own with
their own Python workers, as on a real cluster, started from the pip install.
Three runs over the same rows at 2, 3 and 2 partitions count every key exactly."""

from __future__ import annotations

import json
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest


def test_counts_across_rescales_on_a_local_cluster(tmp_path: Path) -> None:
    pytest.importorskip("pyspark", reason="pyspark is in the test extra: pip install '.[test]'")
    script = Path(__file__).with_name("cluster_run.py")
    done = subprocess.run(
        [sys.executable, str(script), str(tmp_path / "state")], capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stderr[-3000:]
    got = Counter(tuple(json.loads(line)) for line in done.stdout.splitlines() if line.startswith("["))
    per_run = Counter((i * 7919) % 101 for i in range(3_000))
    want = Counter((k, n * run) for run in (1, 2, 3) for k, n in per_run.items())
    assert got == want
