"""Damaged checkpoints: every flipped byte and every truncation of every file is
refused with CorruptCheckpointError naming the file and block, and the backend
restoring is left unchanged (no fallback to an older checkpoint)."""

from __future__ import annotations

import gc
import os
from pathlib import Path
from typing import Any

import pytest

from cowmap.checkpoint import CheckpointStorage, CorruptCheckpointError
from cowmap.state import KeyedStateBackend

from ckpt_helpers import Clock, contents, register


def small_checkpoint(root: Path) -> CheckpointStorage:
    """Two committed checkpoints of every state kind, TTL on, and timers, over a few key groups."""
    clock = Clock()
    b = KeyedStateBackend(max_parallelism=4, time_provider=clock)
    s = register(b, ttl=True)
    storage = CheckpointStorage(root)
    for round_ in range(2):
        for k in [1, 2, "x", (3, "y")]:
            b.set_current_key(k)
            s["value"].update(round_)
            s["list"].add(k)
            s["map"].put("u", 1.5)
            s["reducing"].add(2)
            s["aggregating"].add(3)
            b.get_timer_service("timers").register_event_time_timer(10 + round_)
        storage.save(b)
    return storage


def restore_fails(storage: CheckpointStorage, path: Path) -> CorruptCheckpointError:
    b = KeyedStateBackend(max_parallelism=4, time_provider=Clock())
    register(b, ttl=True)
    with pytest.raises(CorruptCheckpointError) as info:
        storage.restore(b)
    assert contents(b) == {}, "a failed restore changed the backend"
    err = info.value
    assert err.path == str(path) and str(path) in str(err)
    assert err.block
    return err


def latest_files(root: Path) -> list[Path]:
    return sorted(p for p in root.iterdir() if p.name.startswith("chk-0000000002"))


def test_every_byte_flip_is_caught(tmp_path: Path) -> None:
    storage = small_checkpoint(tmp_path)
    files = latest_files(tmp_path)
    assert [p.suffix for p in files] == [".data", ".manifest"]
    blocks: set[str] = set()
    for path in files:
        good = path.read_bytes()
        for i in range(len(good)):
            for mask in (0x01, 0xFF):
                bad = bytearray(good)
                bad[i] ^= mask
                path.write_bytes(bytes(bad))
                blocks.add(restore_fails(storage, path).block)
        path.write_bytes(good)
    assert {"header", "index", "footer", "manifest"} <= blocks
    assert any(b.startswith("key group ") for b in blocks)
    ok = KeyedStateBackend(max_parallelism=4, time_provider=Clock())
    storage.restore(ok)  # intact again
    assert ok.num_entries() > 0


def test_every_truncation_is_caught(tmp_path: Path) -> None:
    storage = small_checkpoint(tmp_path)
    for path in latest_files(tmp_path):
        good = path.read_bytes()
        for n in range(len(good)):
            path.write_bytes(good[:n])
            restore_fails(storage, path)
        path.write_bytes(good + b"\0")  # and a byte too many
        restore_fails(storage, path)
        path.write_bytes(good)


# a file that failed to open must leave nothing for its finaliser to trip on
@pytest.mark.filterwarnings("error::pytest.PytestUnraisableExceptionWarning")
def test_missing_data_file_is_corruption_not_fallback(tmp_path: Path) -> None:
    storage = small_checkpoint(tmp_path)
    data = latest_files(tmp_path)[0]
    os.remove(data)
    restore_fails(storage, data)
    assert storage.checkpoints() == [1, 2]
    gc.collect()


def test_cli_verify_names_the_damage(tmp_path: Path, capsys: Any) -> None:
    from cowmap.checkpoint.__main__ import main

    (tmp_path / "empty").mkdir()
    assert main(["verify", str(tmp_path / "empty")]) == 1  # nothing to vouch for
    assert "no committed checkpoint in" in capsys.readouterr().out
    storage = small_checkpoint(tmp_path)
    assert main(["verify", str(tmp_path)]) == 0
    assert main(["inspect", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "value" in out and "key group" in out
    data = latest_files(tmp_path)[0]
    raw = bytearray(data.read_bytes())
    raw[len(raw) // 2] ^= 0x40
    data.write_bytes(bytes(raw))
    assert main(["verify", str(tmp_path)]) == 1
    out = capsys.readouterr().out
    assert str(data) in out and "CORRUPT" in out
    assert storage.checkpoints() == [1, 2]


def test_a_data_file_of_another_checkpoint_is_refused(tmp_path: Path) -> None:
    """A manifest naming a data file that holds another checkpoint (a file copied
    over it, same size) is corruption, not a silent restore of other state."""
    b = KeyedStateBackend(max_parallelism=4, time_provider=Clock())
    s = register(b, ttl=True)
    for k in range(10):
        b.set_current_key(k)
        s["value"].update(k)
    storage = CheckpointStorage(tmp_path)
    storage.save(b)
    storage.save(b, incremental=False)  # the same state again: a data file of the same size
    one, two = (tmp_path / storage.manifest(i)["files"][-1]["name"] for i in (1, 2))
    assert one.stat().st_size == two.stat().st_size
    two.write_bytes(one.read_bytes())
    err = restore_fails(storage, two)
    assert err.block == "header" and "holds checkpoint 1" in str(err)


def test_cli_on_a_missing_directory(tmp_path: Path, capsys: Any) -> None:
    from cowmap.checkpoint.__main__ import main

    missing = tmp_path / "nope"
    assert main(["inspect", str(missing)]) == 2
    assert not missing.exists()
    assert "no checkpoint directory" in capsys.readouterr().err


@pytest.mark.parametrize("files", [[], "abc", [{"name": "../../etc/passwd", "size": 1}], [{"name": 3, "size": 1}]])
def test_a_manifest_whose_list_of_files_is_malformed_is_corrupt(tmp_path: Path, files: Any) -> None:
    """A manifest rewritten with a matching checksum but no data files (or names outside the
    directory) passed verify and failed restore with an IndexError: it is corrupt."""
    import json

    from cowmap.checkpoint.__main__ import main
    from cowmap.checkpoint.fileformat import checksum

    storage = small_checkpoint(tmp_path)
    path = tmp_path / "chk-0000000002.manifest"
    doc = json.loads(path.read_text())
    body = json.loads(doc["manifest"])
    body["files"] = files
    text = json.dumps(body)
    path.write_text(json.dumps({"manifest": text, "checksum": checksum(text.encode())}))
    with pytest.raises(CorruptCheckpointError, match="its list of data files is missing or malformed"):
        storage.restore(KeyedStateBackend(max_parallelism=4))
    assert main(["verify", str(tmp_path)]) == 1
