"""``import cowmap.spark`` without PySpark, or with one too old, says what to install."""

from __future__ import annotations

import subprocess
import sys


def _import_with(setup: str) -> subprocess.CompletedProcess:
    code = f"import sys\n{setup}\nimport cowmap.spark"
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)


def test_without_pyspark_the_error_says_how_to_install_it() -> None:
    out = _import_with("sys.modules['pyspark'] = None")
    assert out.returncode != 0
    assert 'ImportError: cowmap.spark needs PySpark (4.1 or newer): pip install "cowmap[spark]"' in out.stderr


def test_an_old_pyspark_is_named() -> None:
    out = _import_with("from pyspark.sql import DataFrame\ndel DataFrame.repartitionById")
    assert out.returncode != 0
    assert "needs PySpark 4.1 or newer (DataFrame.repartitionById), found" in out.stderr


def test_import_cowmap_does_not_load_pyspark() -> None:
    out = _import_with("import cowmap, cowmap.checkpoint\nassert 'pyspark' not in sys.modules\nsys.exit(0)")
    assert out.returncode == 0, out.stderr
