"""save_async: the snapshot is taken at the call, the write runs on another
thread while the backend keeps changing, and the snapshot is released when the
write ends, committed or failed; a failure surfaces from result()."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from cowmap.checkpoint import CheckpointStorage
from cowmap.state import KeyedStateBackend, ValueStateDescriptor

from ckpt_helpers import contents


def live_snapshots(b: KeyedStateBackend) -> int:
    return sum(len(m.snapshot_versions) for t in b._tables.values() for m in t.maps if m is not None)


def test_writes_after_the_call_are_not_in_the_checkpoint(tmp_path: Path) -> None:
    b = KeyedStateBackend()
    v = b.get_state(ValueStateDescriptor("v"))
    keys = np.arange(50_000, dtype=np.int64)
    v.update_many(keys, keys)
    expected = contents(b)
    handle = CheckpointStorage(tmp_path).save_async(b)
    v.update_many(keys, keys + 1)  # while it writes
    v.clear_many(keys[:100])
    cid = handle.result(timeout=60)
    assert handle.done() and cid == 1
    assert live_snapshots(b) == 0
    r = KeyedStateBackend()
    CheckpointStorage(tmp_path).restore(r)
    assert contents(r) == expected


class Exploding:
    name = "exploding"

    def __init__(self) -> None:
        self.thread: threading.Thread | None = None

    def dumps(self, obj: Any) -> bytes:
        self.thread = threading.current_thread()
        raise RuntimeError("disk on fire")

    def loads(self, data: bytes) -> Any:
        raise AssertionError("never written")


def test_a_failed_write_raises_from_result_and_releases_the_snapshot(tmp_path: Path) -> None:
    ser = Exploding()
    b = KeyedStateBackend()
    v = b.get_state(ValueStateDescriptor("v", serializer=ser))
    b.set_current_key("k")
    v.update([1, 2])  # not a number: goes through the serializer
    storage = CheckpointStorage(tmp_path)
    handle = storage.save_async(b)
    with pytest.raises(RuntimeError, match="disk on fire"):
        handle.result(timeout=60)
    assert ser.thread is not threading.current_thread()  # it ran on the writer thread
    assert live_snapshots(b) == 0
    assert storage.checkpoints() == []
    assert [p.name for p in tmp_path.iterdir()] == []  # the temporary file is gone too


def test_overlapping_saves_commit_one_after_another(tmp_path: Path) -> None:
    """Two save_async calls before either ends (and a save during them): each
    keeps the state of its own call, ids increase in call order, so the latest
    id is the newest state."""
    b = KeyedStateBackend()
    v = b.get_state(ValueStateDescriptor("v"))
    keys = np.arange(20_000, dtype=np.int64)
    storage = CheckpointStorage(tmp_path)
    expected = []
    handles = []
    for i in range(3):
        v.update_many(keys, keys * i)
        expected.append(contents(b))
        handles.append(storage.save_async(b) if i < 2 else None)
    sync_id = storage.save(b)
    ids = [h.result(timeout=60) for h in handles[:2]] + [sync_id]
    assert ids == sorted(ids) and len(set(ids)) == 3  # in the order of the calls, whichever write ended first
    assert storage.checkpoints() == ids
    for cid, want in zip(ids, expected):
        r = KeyedStateBackend()
        storage.restore(r, cid)
        assert contents(r) == want
    latest = KeyedStateBackend()
    storage.restore(latest)
    assert contents(latest) == expected[-1]
    assert live_snapshots(b) == 0


def test_a_save_from_inside_a_write_is_refused_not_deadlocked(tmp_path: Path) -> None:
    storage = CheckpointStorage(tmp_path)
    b = KeyedStateBackend()

    class SavesAgain:
        name = "saves-again"

        def dumps(self, obj: Any) -> bytes:
            storage.save(b)  # re-entrant: the outer write holds the storage
            return b""

        def loads(self, data: bytes) -> Any:
            return []

    b.set_current_key(1)
    b.get_state(ValueStateDescriptor("v", serializer=SavesAgain())).update([1])
    with pytest.raises(RuntimeError, match="inside a checkpoint write"):
        storage.save(b)
    assert storage.checkpoints() == []
    assert live_snapshots(b) == 0


def test_two_saves_read_out_at_once_while_the_backend_is_written_throughout(tmp_path: Path) -> None:
    """Two storages' writes run at once (their read-outs go without the GIL),
    while the task thread writes, inserts and clears until both are done: each
    checkpoint holds the backend as it was at its own call."""
    b = KeyedStateBackend()
    v = b.get_state(ValueStateDescriptor("v"))
    keys = np.arange(60_000, dtype=np.int64)
    v.update_many(keys, keys)
    first = contents(b)
    h1 = CheckpointStorage(tmp_path / "a").save_async(b, incremental=False)
    v.update_many(keys[::2], -keys[::2])
    second = contents(b)
    h2 = CheckpointStorage(tmp_path / "b").save_async(b, incremental=False)
    r = 0
    while not (h1.done() and h2.done()):
        r += 1
        v.update_many(keys[r % 5 :: 5], keys[r % 5 :: 5] * r)
        v.update_many(keys[:2_000] + 1_000_000 * r, keys[:2_000])
        v.clear_many(keys[r % 7 :: 7])
    h1.result(timeout=60)
    h2.result(timeout=60)
    assert r > 0 and live_snapshots(b) == 0
    for where, want in (("a", first), ("b", second)):
        back = KeyedStateBackend()
        CheckpointStorage(tmp_path / where).restore(back)
        assert contents(back) == want
