"""The async layer hides its in-flight futures and contexts from the cyclic GC (a cost
saving only). With the hiding switched off (``COWMAP_ASYNC_GC_HIDE=0`` at import)
everything must behave the same: this runs the whole of tests/asyncstate that way."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from cowmap._future import gc_hiding

_CHILD = "COWMAP_GC_SWITCH_CHILD"


def test_asyncstate_passes_with_the_gc_hiding_switched_off() -> None:
    if os.environ.get(_CHILD):  # the run below: it only checks that the switch took
        assert not gc_hiding()
        return
    assert gc_hiding()  # the default
    here = Path(__file__).parent
    env = dict(os.environ, COWMAP_ASYNC_GC_HIDE="0", **{_CHILD: "1"})
    r = subprocess.run(
        [sys.executable, "-m", "pytest", str(here), "-q", "-p", "no:cacheprovider", "-x"],
        env=env, cwd=here.parent.parent, capture_output=True, text=True, timeout=900,
    )
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-2000:]
    assert " passed" in r.stdout and " failed" not in r.stdout
