"""A writer killed with SIGKILL at random points never leaves a directory that
restores wrong: the last committed checkpoint restores exactly, every time."""

from __future__ import annotations

import random
import signal
import subprocess
import sys
import time
from pathlib import Path

from cowmap.checkpoint import CheckpointStorage
from cowmap.state import KeyedStateBackend, ValueStateDescriptor

from ckpt_helpers import contents

HERE = Path(__file__).parent
KILLS = 50


def test_sigkill_at_random_points_restores_last_committed(tmp_path: Path) -> None:
    rng = random.Random(20261125)
    expected_by_step: dict[int, dict] = {}
    from kill_writer import state_after

    root = tmp_path / "ck"
    seen_commits = 0
    mid_write = 0
    for kill in range(KILLS):
        proc = subprocess.Popen(
            [sys.executable, str(HERE / "kill_writer.py"), str(root)],
            stdout=subprocess.PIPE,
            cwd=HERE,
        )
        assert proc.stdout is not None and proc.stdout.readline() == b"ready\n"
        time.sleep(rng.uniform(0.0, 0.25))
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        names = [p.name for p in root.iterdir()]
        committed = {n[:14] for n in names if n.endswith(".manifest")}
        mid_write += any(n.startswith(".tmp-") or (n.endswith(".data") and n[:14] not in committed) for n in names)
        storage = CheckpointStorage(root)
        if not storage.checkpoints():
            continue
        seen_commits += 1
        b = KeyedStateBackend(max_parallelism=16)
        storage.restore(b)
        b.set_current_key("step")
        i = b.get_state(ValueStateDescriptor("v")).value()
        if i not in expected_by_step:
            expected_by_step[i] = contents(state_after(i))
        assert contents(b) == expected_by_step[i], f"kill {kill}: checkpoint of step {i} restores wrong"
        if kill % 10 == 9:
            storage.retain(2)  # what killed writers left goes; what is kept still restores
    assert mid_write >= 5, f"only {mid_write} kills landed during a save: the test is not testing that"
    assert seen_commits >= KILLS // 2, "the writer was killed before committing anything too often"


def test_restore_in_a_process_with_another_hash_seed(tmp_path: Path) -> None:
    """Key groups come from a stable hash: str and tuple keys land in the same key
    group whatever PYTHONHASHSEED the writer and the reader run with."""
    import os

    from kill_writer import step

    code = (
        "import sys; from kill_writer import step; from cowmap.state import KeyedStateBackend;"
        "from cowmap.checkpoint import CheckpointStorage;"
        "b = KeyedStateBackend(max_parallelism=16); step(b, 3);"
        "from cowmap.state import ValueStateDescriptor as D; v = b.get_state(D('v'));"
        "[ (b.set_current_key(k), v.update(len(str(k)))) for k in ['a', 'bb', ('t', 1), b'raw']];"
        "CheckpointStorage(sys.argv[1]).save(b)"
    )
    env = dict(os.environ, PYTHONHASHSEED="12345")
    subprocess.run([sys.executable, "-c", code, str(tmp_path)], check=True, cwd=HERE, env=env)
    b = KeyedStateBackend(max_parallelism=16)
    CheckpointStorage(tmp_path).restore(b)
    want = KeyedStateBackend(max_parallelism=16)
    step(want, 3)
    v = want.get_state(ValueStateDescriptor("v"))
    for k in ["a", "bb", ("t", 1), b"raw"]:
        want.set_current_key(k)
        v.update(len(str(k)))
    assert contents(b) == contents(want)
    rv = b.get_state(ValueStateDescriptor("v"))
    b.set_current_key(("t", 1))
    assert rv.value() == len(str(("t", 1)))
