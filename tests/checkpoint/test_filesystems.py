"""Checkpoints on other pyarrow filesystems than the local default: pyarrow's
in-memory mock filesystem (what an object store looks like to the code: no fsync,
moves through the filesystem API) and a ``file://`` URI."""

from __future__ import annotations

from pathlib import Path

import pytest

from cowmap.checkpoint import CheckpointStorage, CorruptCheckpointError
from cowmap.state import KeyedStateBackend

from ckpt_helpers import Clock, contents, register

# pyarrow is the arrow extra (local checkpoints need none): a wheel's own test run, with only
# the core's dependencies installed, has no pyarrow filesystem to test
pa_fs = pytest.importorskip("pyarrow._fs", reason="checkpoints on pyarrow's filesystems need the arrow extra")


def filled(ttl: bool) -> KeyedStateBackend:
    b = KeyedStateBackend(max_parallelism=8, time_provider=Clock())
    s = register(b, ttl)
    for k in list(range(30)) + ["x", ("t", 1)]:
        b.set_current_key(k)
        s["value"].update(k)
        s["list"].add(k)
        s["map"].put(1, k)
        s["reducing"].add(2)
        s["aggregating"].add(3)
    return b


@pytest.mark.parametrize("ttl", [False, True])
def test_round_trip_on_the_mock_filesystem(ttl: bool) -> None:
    fs = pa_fs._MockFileSystem()
    storage = CheckpointStorage("bucket/job/ck", filesystem=fs)
    b = filled(ttl)
    ids = [storage.save(b), storage.save(b)]
    assert storage.checkpoints() == ids
    r = KeyedStateBackend(max_parallelism=8, time_provider=Clock())
    storage.restore(r)
    assert contents(r) == contents(b)
    assert storage.retain(1) == ids[:1]
    names = sorted(i.base_name for i in fs.get_file_info(pa_fs.FileSelector("bucket/job/ck")))
    # the second checkpoint is an increment (nothing changed) on the first one's data
    assert storage.manifest(ids[1])["type"] == "incremental"
    data = [storage.manifest(ids[1])["files"][0]["name"], storage.manifest(ids[1])["files"][1]["name"]]
    assert data[0].startswith("chk-0000000001-") and data[1].startswith("chk-0000000002-")
    assert names == [*data, "chk-0000000002.manifest"]
    r = KeyedStateBackend(max_parallelism=8, time_provider=Clock())
    storage.restore(r)
    assert contents(r) == contents(b)


def test_damage_on_the_mock_filesystem_is_caught() -> None:
    fs = pa_fs._MockFileSystem()
    storage = CheckpointStorage("bucket/ck", filesystem=fs)
    storage.save(filled(False))
    path = "bucket/ck/" + storage.manifest(1)["files"][0]["name"]
    with fs.open_input_stream(path) as f:
        raw = bytearray(f.read())
    raw[len(raw) // 3] ^= 0x10
    with fs.open_output_stream(path) as f:
        f.write(bytes(raw))
    r = KeyedStateBackend(max_parallelism=8)
    with pytest.raises(CorruptCheckpointError) as info:
        storage.restore(r)
    assert info.value.path == path and r.num_entries() == 0


def test_file_uri(tmp_path: Path) -> None:
    storage = CheckpointStorage(f"file://{tmp_path}/ck")
    b = filled(True)
    storage.save(b)
    assert (tmp_path / "ck" / "chk-0000000001.manifest").exists()
    r = KeyedStateBackend(max_parallelism=8, time_provider=Clock())
    CheckpointStorage(tmp_path / "ck").restore(r)  # the same directory as a plain path
    assert contents(r) == contents(b)
