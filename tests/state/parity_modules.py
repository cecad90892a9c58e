"""The Flink parity modules of tests/flink_parity, loaded by path.

They are not a package, and one of them, trace.py, would clash with the standard
library's ``trace`` if imported by name: each is loaded once under its own name."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

PARITY_DIR = Path(__file__).resolve().parents[1] / "flink_parity"


def load(filename: str) -> ModuleType:
    """tests/flink_parity/``filename``, as module ``cowmap_flink_parity_<stem>``."""
    name = f"cowmap_flink_parity_{Path(filename).stem}"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, PARITY_DIR / filename)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod
