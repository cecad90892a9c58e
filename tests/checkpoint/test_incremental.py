"""Incremental checkpoints: a chain of increments on a full base restores
exactly what the source held at each save, and holds only what changed."""

from __future__ import annotations

import contextlib
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from unittest import mock

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_roundtrip import KEYS, NAMESPACES, VALUES, apply

from cowmap import VOID_NAMESPACE
from cowmap.checkpoint import CheckpointStorage, CorruptCheckpointError, checkpoint_storage, fileformat, states
from cowmap.state import KeyedStateBackend, KeyGroupRange, MapStateDescriptor, ValueStateDescriptor

from ckpt_helpers import Clock, contents, register

OP = st.tuples(
    st.sampled_from(
        ["value", "list", "map", "map_remove", "reducing", "aggregating", "clear", "tick", "snapshot",
         "mutate", "sweep", "columns", "save", "save_full", "timer", "timer_delete", "fire"]
    ),
    KEYS,
    NAMESPACES,
    st.integers(-3, 3),
    VALUES,
)


def map_order(backend: KeyedStateBackend) -> dict[Any, list[Any]]:
    """Each (key, namespace)'s user keys of the MapState, in iteration order."""
    out: dict[Any, list[Any]] = defaultdict(list)
    with backend.snapshot() as snap:
        if "map" in snap.state_names():
            for key, ns, ukey, _, _ in snap.entries("map"):
                out[repr((key, ns))].append(ukey)
    return dict(out)


def step(b: KeyedStateBackend, states: dict[str, Any], clock: Clock, op: tuple, snaps: list) -> None:
    kind, key, ns, ukey, value = op
    if kind == "mutate":  # a value changed in place after a read, never written back
        b.set_current_key(key)
        v = states["value"]
        v.set_current_namespace(ns)
        held = v.value()
        if isinstance(held, list):
            held.append(ukey)
        else:
            v.update([ukey])
    elif kind == "sweep":  # TTL cleanup removes entries behind the writes' backs
        for t in b._tables.values():
            for kg in t.live if t.ttl else ():
                t.sweep(kg, clock.now, None)
    elif kind == "columns":  # the columnar path writes without a per-key call
        keys = np.arange(ukey, ukey + 40, 3, dtype=np.int64)
        states["value"].update_many(keys, keys * 2)
        states["reducing"].add_many(keys, keys)
    else:
        apply(b, states, clock, op, snaps)


@pytest.mark.parametrize("ttl", [False, True])
@settings(max_examples=40, deadline=None)
@given(ops=st.lists(OP, max_size=80), max_increments=st.integers(0, 3), block_rows=st.sampled_from([1, 3, 16384]))
def test_every_checkpoint_of_a_chain_restores_its_moment(
    tmp_path_factory: Any, ttl: bool, ops: list, max_increments: int, block_rows: int
) -> None:
    """(``block_rows``: key groups per block from one each to all in one, runs across them)"""
    with blocks_of(block_rows):
        chain_restores_its_moments(tmp_path_factory, ttl, ops, max_increments)


def chain_restores_its_moments(tmp_path_factory: Any, ttl: bool, ops: list, max_increments: int) -> None:
    clock = Clock()
    src = KeyedStateBackend(max_parallelism=8, time_provider=clock)
    states = register(src, ttl)
    storage = CheckpointStorage(tmp_path_factory.mktemp("ck"), max_increments=max_increments)
    snaps: list = []
    saved: dict[int, tuple[Any, Any]] = {}
    for op in ops + [("save",) + op[1:] for op in ops[-1:]]:
        if op[0] in ("save", "save_full"):
            cid = storage.save(src, incremental=op[0] == "save")
            saved[cid] = (contents(src), map_order(src))
        else:
            step(src, states, clock, op, snaps)
    for s in snaps:
        s.release()
    for cid, (expected, order) in saved.items():
        m = storage.manifest(cid)
        assert len(m["files"]) <= max_increments + 1
        dst = KeyedStateBackend(max_parallelism=8, time_provider=clock)
        storage.restore(dst, cid)
        assert contents(dst) == expected
        assert map_order(dst) == order


@contextlib.contextmanager
def blocks_of(rows: int) -> Iterator[None]:
    """Checkpoints written meanwhile gather key groups into blocks of about
    ``rows`` rows (full ones), ``rows`` key groups (increments); with 3, a
    state's rows of a full block are also read a key group and 2 rows at a
    time when there are more than 4 of them, not in one call."""
    before = checkpoint_storage.BLOCK_ROWS, checkpoint_storage.CHANGE_CHUNK, states.READ_SLICE
    checkpoint_storage.BLOCK_ROWS = checkpoint_storage.CHANGE_CHUNK = rows
    if rows == 3:
        states.READ_SLICE = 2
    try:
        yield
    finally:
        checkpoint_storage.BLOCK_ROWS, checkpoint_storage.CHANGE_CHUNK, states.READ_SLICE = before


def filled(n: int) -> tuple[KeyedStateBackend, Any]:
    b = KeyedStateBackend(max_parallelism=32)
    v = b.get_state(ValueStateDescriptor("v"))
    keys = np.arange(n, dtype=np.int64)
    v.update_many(keys, keys)
    return b, v


def test_an_increment_holds_what_changed(tmp_path: Path) -> None:
    """1% of the keys changed (and some removed): the increment holds about
    those rows, a few percent of the full checkpoint's bytes."""
    b, v = filled(100_000)
    storage = CheckpointStorage(tmp_path)
    full = storage.save(b)
    rng = np.random.default_rng(7)
    changed = rng.choice(100_000, 1_000, replace=False).astype(np.int64)
    v.update_many(changed, -changed)
    for k in changed[:50].tolist():
        b.set_current_key(k)
        v.clear()
    inc = storage.save(b)
    m_full, m_inc = storage.manifest(full), storage.manifest(inc)
    assert m_inc["type"] == "incremental" and m_inc["parent"] == full
    assert 1_000 <= m_inc["entries"] <= 3_000
    assert m_inc["files"][-1]["size"] < 0.03 * m_full["files"][0]["size"]
    r = KeyedStateBackend(max_parallelism=32)
    storage.restore(r)
    assert contents(r) == contents(b)


def test_a_new_base_when_the_chain_is_long_or_heavy(tmp_path: Path) -> None:
    b, v = filled(1_000)
    storage = CheckpointStorage(tmp_path, max_increments=2)
    kinds = []
    for i in range(4):
        v.update_many(np.array([i], dtype=np.int64), np.array([-i], dtype=np.int64))
        kinds.append(storage.manifest(storage.save(b))["type"])
    assert kinds == ["full", "incremental", "incremental", "full"]
    v.update_many(np.arange(1_000, dtype=np.int64), np.zeros(1_000, dtype=np.int64))  # all of it changed
    assert storage.manifest(storage.save(b))["type"] == "incremental"
    # the chain's increments now outweigh the base: the next one is a base again
    v.update_many(np.arange(5, dtype=np.int64), np.ones(5, dtype=np.int64))
    assert storage.manifest(storage.save(b))["type"] == "full"


def test_after_a_failed_save_the_next_is_full(tmp_path: Path) -> None:
    b, v = filled(100)
    storage = CheckpointStorage(tmp_path)
    storage.save(b)
    v.update_many(np.array([1], dtype=np.int64), np.array([-1], dtype=np.int64))

    class Boom(Exception):
        pass

    def fail(*_: Any) -> None:
        raise Boom

    real = storage._store.write_manifest
    storage._store.write_manifest = fail  # type: ignore[method-assign]
    with pytest.raises(Boom):
        storage.save(b)
    storage._store.write_manifest = real  # type: ignore[method-assign]
    cid = storage.save(b)
    assert storage.manifest(cid)["type"] == "full"  # the failed one's changes are in no checkpoint
    r = KeyedStateBackend(max_parallelism=32)
    storage.restore(r)
    assert contents(r) == contents(b)


def test_a_parent_gone_or_another_storage_gives_a_full_checkpoint(tmp_path: Path) -> None:
    b, v = filled(100)
    one, two = CheckpointStorage(tmp_path / "one"), CheckpointStorage(tmp_path / "two")
    first = one.save(b)
    assert two.manifest(two.save(b))["type"] == "full"  # its chain is not two's
    assert one.manifest(one.save(b))["type"] == "full"  # two's cut took the changes since one's
    (tmp_path / "one" / f"chk-{first + 1:010d}.manifest").unlink()  # the parent vanished
    assert one.manifest(one.save(b))["type"] == "full"


def test_restore_then_increment_chains_to_the_restored_checkpoint(tmp_path: Path) -> None:
    """A fresh backend restored from a storage's latest checkpoint writes the
    next one as an increment of it (a job restarting, a Spark micro-batch)."""
    b, v = filled(2_000)
    storage = CheckpointStorage(tmp_path)
    base = storage.save(b)
    r = KeyedStateBackend(max_parallelism=32)
    storage.restore(r)
    rv = r.get_state(ValueStateDescriptor("v"))
    rv.update_many(np.array([3, 4], dtype=np.int64), np.array([30, 40], dtype=np.int64))
    r.set_current_key(5)
    rv.clear()
    cid = storage.save(r)
    m = storage.manifest(cid)
    assert m["type"] == "incremental" and m["parent"] == base and m["entries"] <= 20
    again = KeyedStateBackend(max_parallelism=32)
    storage.restore(again)
    assert contents(again) == contents(r)
    # a backend that held state before the restore is not the checkpoint: full next
    other, _ = filled(10)
    other.set_current_key(10_000)
    other.get_state(ValueStateDescriptor("v")).update(1)
    storage.restore(other, base)
    assert storage.manifest(storage.save(other))["type"] == "full"


@pytest.mark.parametrize("block_rows", [50, 16384])
def test_a_chain_restores_at_another_parallelism(tmp_path: Path, block_rows: int) -> None:
    """(with 50-row blocks, blocks straddle the new ranges' bounds)"""
    b, v = filled(3_000)
    storage = CheckpointStorage(tmp_path)
    with blocks_of(block_rows):
        storage.save(b)
        v.update_many(np.arange(0, 3_000, 7, dtype=np.int64), np.zeros(429, dtype=np.int64))
        for k in range(0, 3_000, 11):
            b.set_current_key(k)
            v.clear()
        storage.save(b)
    firsts = storage._store.open_data(storage.manifest(2)["files"][0]["name"], storage.manifest(2)["files"][0]["size"])
    assert len(firsts.blocks) > 1 if block_rows == 50 else len(firsts.blocks) == 1
    parts = [KeyedStateBackend(max_parallelism=32, key_group_range=KeyGroupRange(lo, hi)) for lo, hi in
             ((0, 9), (10, 20), (21, 31))]
    merged: dict[str, list[Any]] = {}
    for p in parts:
        storage.restore(p)
        for name, rows in contents(p).items():
            merged.setdefault(name, []).extend(rows)
    assert {n: sorted(r, key=repr) for n, r in merged.items()} == contents(b)


def test_a_damaged_base_fails_the_increments_restore(tmp_path: Path) -> None:
    b, v = filled(500)
    storage = CheckpointStorage(tmp_path)
    storage.save(b)
    v.update_many(np.array([1], dtype=np.int64), np.array([-1], dtype=np.int64))
    storage.save(b)
    base = tmp_path / storage.manifest(1)["files"][0]["name"]
    raw = bytearray(base.read_bytes())
    raw[len(raw) // 2] ^= 0x40
    base.write_bytes(bytes(raw))
    r = KeyedStateBackend(max_parallelism=32)
    with pytest.raises(CorruptCheckpointError) as e:
        storage.restore(r)
    assert e.value.path == str(base)
    assert contents(r) == {}


def test_a_map_that_lost_its_changes_gives_a_full_checkpoint(tmp_path: Path) -> None:
    b, v = filled(100)
    storage = CheckpointStorage(tmp_path)
    storage.save(b)
    b.set_current_key(0)
    for i in range(6_000):  # written and removed over and over: its removal log is given up
        v.update(i)
        v.clear()
    cid = storage.save(b)
    assert storage.manifest(cid)["type"] == "full"
    r = KeyedStateBackend(max_parallelism=32)
    storage.restore(r)
    assert contents(r) == contents(b)
    v.update_many(np.array([1], dtype=np.int64), np.array([9], dtype=np.int64))
    assert storage.manifest(storage.save(b))["type"] == "incremental"


def test_async_saves_in_a_row_each_restore_their_moment(tmp_path: Path) -> None:
    """Saves taken one after another while the first is still being written:
    each is a cut of its own; whichever write goes first, every checkpoint
    restores what the backend held at its call."""
    b, v = filled(20_000)
    storage = CheckpointStorage(tmp_path)
    handles, expected = [], []
    for r in range(4):
        keys = np.arange(r * 100, r * 100 + 300, dtype=np.int64)
        v.update_many(keys, keys * (r + 2))
        b.set_current_key(r)
        v.clear()
        expected.append(contents(b))
        handles.append(storage.save_async(b))
    ids = [h.result(timeout=60) for h in handles]
    assert ids == sorted(ids)
    for cid, exp in zip(ids, expected):
        r = KeyedStateBackend(max_parallelism=32)
        storage.restore(r, cid)
        assert contents(r) == exp


@pytest.mark.parametrize("explicit", [False, True])
def test_a_save_written_after_a_later_one_keeps_it_unless_its_id_was_chosen(tmp_path: Path, explicit: bool) -> None:
    """Two ``save_async`` calls in a row may write in either order. Writing the
    first after the second must not drop the second (it did: a committed
    checkpoint lost). Only a save under an id the caller chose drops what comes
    after it, as a retried micro-batch must."""
    b, v = filled(2_000)
    storage = CheckpointStorage(tmp_path)
    keys = np.arange(10, dtype=np.int64)
    first = storage._begin(b, None, True, 1 if explicit else None)
    v.update_many(keys, keys + 100)
    expected_second = contents(b)
    second = storage._begin(b, None, True, 2 if explicit else None)
    try:
        drop = checkpoint_storage._rewrites(2 if explicit else None, True)
        assert storage._write(b, second[1], second[2], second[0], second[3], None, drop) == 2
        drop = checkpoint_storage._rewrites(1 if explicit else None, True)
        assert storage._write(b, first[1], first[2], first[0], first[3], None, drop) == 1
    finally:
        first[1].release()
        second[1].release()
    assert storage.checkpoints() == ([1] if explicit else [1, 2])
    if not explicit:
        r = KeyedStateBackend(max_parallelism=32)
        storage.restore(r, 2)
        assert contents(r) == expected_second


def test_a_map_value_changed_in_place_after_a_read_is_saved(tmp_path: Path) -> None:
    from cowmap.state import MapStateDescriptor

    b = KeyedStateBackend(max_parallelism=8)
    m = b.get_map_state(MapStateDescriptor("m"))
    for k in range(50):
        b.set_current_key(k)
        m.put("xs", [k])
    storage = CheckpointStorage(tmp_path)
    storage.save(b)
    b.set_current_key(7)
    m.get("xs").append(70)  # never put back: the read counts as a change
    cid = storage.save(b)
    assert storage.manifest(cid)["type"] == "incremental"
    r = KeyedStateBackend(max_parallelism=8)
    storage.restore(r)
    r.set_current_key(7)
    assert r.get_map_state(MapStateDescriptor("m")).get("xs") == [7, 70]


def test_an_increment_holds_the_timers_that_changed_only(tmp_path: Path) -> None:
    b = KeyedStateBackend(max_parallelism=16)
    timers = b.get_timer_service("t", lambda *a: None)
    for k in range(1000):
        b.set_current_key(k)
        timers.register_event_time_timer(k * 10)
        timers.register_processing_time_timer(5, namespace="w")
    storage = CheckpointStorage(tmp_path)
    full = storage.save(b)
    b.set_current_key(3)
    timers.delete_event_time_timer(30)
    one = storage.save(b)
    timers.advance_processing_time(5)  # every processing-time timer goes: their key groups empty
    two = storage.save(b)
    timers.advance_watermark(10**9)
    three = storage.save(b)
    sizes = {cid: storage.manifest(cid)["files"][-1]["size"] for cid in (full, one, two, three)}
    assert storage.manifest(three)["type"] == "incremental"
    assert sizes[one] * 10 < sizes[full]  # one key group's event-time timers, not all of them
    for cid, (event, processing) in {full: (1000, 1000), one: (999, 1000), two: (999, 0), three: (0, 0)}.items():
        dst = KeyedStateBackend(max_parallelism=16)
        storage.restore(dst, cid)
        t = dst.get_timer_service("t")
        assert (t.num_event_time_timers(), t.num_processing_time_timers()) == (event, processing), cid


def test_checkpoints_at_explicit_versions(tmp_path: Path) -> None:
    """Saves under given ids (a micro-batch's version): a chain of increments, and a
    version written again (a retried batch) replacing it and dropping the later ones."""
    b = KeyedStateBackend(max_parallelism=16)
    v = b.get_state(ValueStateDescriptor("v"))
    storage = CheckpointStorage(tmp_path)
    moments = {}
    for version in (1, 2, 3):
        for k in range(1000) if version == 1 else range(version * 10):  # a base, then small changes
            b.set_current_key(k)
            v.update(version)
        assert storage.save(b, checkpoint_id=version) == version
        moments[version] = contents(b)
    assert storage.checkpoints() == [1, 2, 3]
    assert [storage.manifest(i)["type"] for i in (1, 2, 3)] == ["full", "incremental", "incremental"]
    # a retried batch 2: load version 1, redo the batch differently, commit version 2 again
    retry = KeyedStateBackend(max_parallelism=16)
    storage.restore(retry, 1)
    rv = retry.get_state(ValueStateDescriptor("v"))
    retry.set_current_key(99)
    rv.update(-1)
    assert storage.save(retry, checkpoint_id=2) == 2
    assert storage.checkpoints() == [1, 2]  # version 3 was built on the replaced 2: gone
    assert storage.manifest(2)["type"] == "incremental"  # chained to the version it loaded
    for version, expected in ((1, moments[1]), (2, contents(retry))):
        dst = KeyedStateBackend(max_parallelism=16)
        storage.restore(dst, version)
        assert contents(dst) == expected
    assert storage.save(retry) == 3  # without an id: the next one
    with pytest.raises(ValueError, match="at least 1"):
        storage.save(b, checkpoint_id=0)
    with pytest.raises(TypeError, match="int"):
        storage.save(b, checkpoint_id="4")  # type: ignore[arg-type]
    assert storage.save_async(b, checkpoint_id=7).result() == 7
    assert storage.checkpoints() == [1, 2, 3, 7]


@pytest.mark.parametrize("kind", ["value", "map"])
def test_an_increment_mixing_new_and_tracked_maps_in_one_block(tmp_path: Path, kind: str) -> None:
    """A block of an increment gathers key groups whose maps were cut before
    (their changes, read with timestamps) and maps made since (read whole,
    without them, the state having no TTL): both kinds of rows in one section."""
    b = KeyedStateBackend(max_parallelism=8)
    s: Any = b.get_state(ValueStateDescriptor("s")) if kind == "value" else b.get_map_state(MapStateDescriptor("s"))
    groups: dict[int, list[int]] = defaultdict(list)
    for k in range(200):
        groups[b.key_group_of(k)].append(k)
    old, new = sorted(groups)[:4], sorted(groups)[4:]

    def write(keys: list[int], v: int) -> None:
        for k in keys:
            b.set_current_key(k)
            s.update(v) if kind == "value" else s.put("u", v)

    write([k for g in old for k in groups[g]], 1)
    storage = CheckpointStorage(tmp_path)
    storage.save(b)
    write([k for g in old for k in groups[g][:3]] + [k for g in new for k in groups[g]], 2)
    cid = storage.save(b)
    assert storage.manifest(cid)["type"] == "incremental"
    again = KeyedStateBackend(max_parallelism=8)
    storage.restore(again)
    assert contents(again) == contents(b)



@pytest.mark.parametrize("kind", ["value", "map", "list"])
@pytest.mark.parametrize("namespaces", [1, 2])
def test_an_increments_tombstones_for_key_groups_the_base_never_had(
    tmp_path: Path, kind: str, namespaces: int
) -> None:
    """Keys written and removed between two checkpoints, in key groups whose
    maps were empty at the first: the increment holds their tombstones, and a
    restore (which has no map for those key groups) skips them, with one
    namespace or several."""
    from cowmap.state import ListStateDescriptor

    b = KeyedStateBackend(max_parallelism=64)
    if kind == "value":
        s: Any = b.get_state(ValueStateDescriptor("s"))
    elif kind == "map":
        s = b.get_map_state(MapStateDescriptor("s"))
    else:
        s = b.get_list_state(ListStateDescriptor("s"))
    groups: dict[int, list[int]] = defaultdict(list)
    for k in range(400):
        groups[b.key_group_of(k)].append(k)
    base_groups = sorted(groups)[:8]
    nss = ["a", "b"][:namespaces]

    def write(k: int, v: int) -> None:
        b.set_current_key(k)
        for ns in nss:
            s.set_current_namespace(ns)
            s.update(v) if kind == "value" else s.put("u", v) if kind == "map" else s.add(v)

    def remove(k: int) -> None:
        b.set_current_key(k)
        for ns in nss:
            s.set_current_namespace(ns)
            s.remove("u") if kind == "map" else s.clear()

    later = [groups[g][0] for g in sorted(groups)[8:20]]
    for k in later:  # their maps made, and emptied again: the base has no rows of them
        write(k, 1)
        remove(k)
    for g in base_groups:
        write(groups[g][0], 1)
    storage = CheckpointStorage(tmp_path)
    storage.save(b)
    for k in later:
        write(k, 2)
    for k in later[:6]:
        remove(k)
    cid = storage.save(b)
    assert storage.manifest(cid)["type"] == "incremental"
    again = KeyedStateBackend(max_parallelism=64)
    storage.restore(again)
    assert contents(again) == contents(b)

def test_a_version_written_again_stays_readable_until_replaced(tmp_path: Path) -> None:
    """A second write of a committed version (a retried or speculative task)
    that dies half-way leaves the first one committed and whole; one that
    ends replaces it, and retain() removes the replaced data file."""
    b, v = filled(300)
    storage = CheckpointStorage(tmp_path)
    storage.save(b, checkpoint_id=1)
    first = contents(b)
    v.update_many(np.arange(10, dtype=np.int64), np.full(10, -1, dtype=np.int64))
    failing = mock.patch.object(fileformat.DataFileWriter, "finish", side_effect=OSError("disk gone"))
    with failing, pytest.raises(OSError, match="disk gone"):
        storage.save(b, checkpoint_id=1)
    assert storage.checkpoints() == [1]
    dst = KeyedStateBackend(max_parallelism=32)
    storage.restore(dst, 1)
    assert contents(dst) == first
    storage.save(b, checkpoint_id=1)
    dst = KeyedStateBackend(max_parallelism=32)
    storage.restore(dst, 1)
    assert contents(dst) == contents(b) != first
    assert len(list(tmp_path.glob("chk-*.data"))) == 2  # the replaced one is left to retain()
    storage.retain(1)
    assert len(list(tmp_path.glob("chk-*.data"))) == 2  # (the newest id's: a rewrite may be landing)
    storage.save(b, checkpoint_id=2, incremental=False)
    storage.save(b, checkpoint_id=1, incremental=False, drop_later=False)  # a straggler: version 2 stays
    assert storage.checkpoints() == [1, 2]
    storage.retain(1)
    assert [p.name for p in tmp_path.glob("chk-*.data")] == [storage.manifest(2)["files"][0]["name"]]


@pytest.mark.parametrize("ttl", [False, True])
@settings(max_examples=40, deadline=None)
@given(ops=st.lists(OP, max_size=80))
def test_a_backend_caught_up_by_increments_equals_a_restore(tmp_path_factory: Any, ttl: bool, ops: list) -> None:
    """A backend holding checkpoint a, brought to a later b by the increments
    between them only (cowmap.spark's warm backends), holds what a restore of
    b gives, timers included; where b does not extend a's chain it refuses
    and changes nothing."""
    clock = Clock()
    src = KeyedStateBackend(max_parallelism=8, time_provider=clock)
    states = register(src, ttl)
    storage = CheckpointStorage(tmp_path_factory.mktemp("ck"), max_increments=3)
    ids: list[int] = []
    snaps: list = []
    for op in ops + [("save",) + op[1:] for op in ops[-2:]]:
        if op[0] in ("save", "save_full"):
            ids.append(storage.save(src, incremental=op[0] == "save"))
        else:
            step(src, states, clock, op, snaps)
    for s in snaps:
        s.release()
    for i, a in enumerate(ids):
        for b in ids[i + 1 :]:
            warm = KeyedStateBackend(max_parallelism=8, time_provider=clock)
            register(warm, ttl)
            storage.restore(warm, a)
            held = contents(warm)
            before, after = storage.manifest(a)["files"], storage.manifest(b)["files"]
            extends = after[: len(before)] == before and len(after) > len(before)
            assert storage._catch_up(warm, b) == extends
            if extends:
                want = KeyedStateBackend(max_parallelism=8, time_provider=clock)
                storage.restore(want, b)
                assert contents(warm) == contents(want)
                assert warm._chain == (storage._key, b)
            else:
                assert contents(warm) == held


def test_catching_up_is_refused_with_another_history(tmp_path: Path) -> None:
    b, v = filled(100)
    storage = CheckpointStorage(tmp_path)
    storage.save(b)
    v.update_many(np.arange(5, dtype=np.int64), np.zeros(5, dtype=np.int64))
    storage.save(b)
    stranger, _ = filled(100)  # the same entries, but not restored from here
    assert not storage._catch_up(stranger, 2)
    warm = KeyedStateBackend(max_parallelism=32)
    storage.restore(warm, 1)
    assert not storage._catch_up(warm, 7)  # no such checkpoint


def test_a_caught_up_key_groups_timers_are_replaced_and_the_others_kept(tmp_path: Path) -> None:
    src = KeyedStateBackend(max_parallelism=4)
    t = src.get_timer_service("t", lambda *a: None)
    for k in range(40):
        src.set_current_key(k)
        t.register_event_time_timer(100 + k)
        t.register_processing_time_timer(5, namespace="w")
    storage = CheckpointStorage(tmp_path)
    storage.save(src)
    src.set_current_key(3)
    t.delete_event_time_timer(103)
    t.register_event_time_timer(7)
    t.advance_processing_time(5)  # every processing-time timer goes: their key groups' runs hold 0 rows
    storage.save(src)
    warm = KeyedStateBackend(max_parallelism=4)
    wt = warm.get_timer_service("t", lambda *a: None)
    storage.restore(warm, 1)
    assert storage._catch_up(warm, 2)
    assert sorted(wt.timers(0)) == sorted(t.timers(0)) and wt.timers(1) == []
    assert wt.num_event_time_timers() == 40 and wt.num_processing_time_timers() == 0
    fired: list[int] = []
    wt.on_timer = lambda ts, *a: fired.append(ts)
    assert wt.advance_watermark(10**6) == 40  # the queue is whole after the replace
    assert fired == sorted([7] + [100 + k for k in range(40) if k != 3])


def test_replace_columns_checks_before_it_changes_anything() -> None:
    b = KeyedStateBackend(max_parallelism=1)
    t = b.get_timer_service("t", lambda *a: None)
    b.set_current_key("k")
    t.register_event_time_timer(1)
    with pytest.raises(ValueError, match="differ in length"):
        t.replace_columns(0, 0, [1, 2], ["a"], [VOID_NAMESPACE])
    with pytest.raises(TypeError, match="must not be None"):
        t.replace_columns(0, 0, [1], [None], [VOID_NAMESPACE])
    with pytest.raises(TypeError):
        t.replace_columns(0, 0, ["x"], ["a"], [VOID_NAMESPACE])
    with pytest.raises(ValueError, match="outside"):
        t.replace_columns(3, 0, [], [], [])
    assert t.timers(0) == [(1, "k", VOID_NAMESPACE)]
    t.replace_columns(0, 0, [], [], [])
    assert t.timers(0) == [] and t.num_event_time_timers() == 0


def test_a_caught_up_list_is_replaced_not_appended_to(tmp_path: Path) -> None:
    src = KeyedStateBackend(max_parallelism=8)
    lst = register(src, False, timers=False)["list"]
    storage = CheckpointStorage(tmp_path)
    src.set_current_key("k")
    lst.add(1)
    storage.save(src)
    lst.add(2)
    storage.save(src)
    warm = KeyedStateBackend(max_parallelism=8)
    storage.restore(warm, 1)
    assert storage._catch_up(warm, 2)
    warm.set_current_key("k")
    assert list(register(warm, False, timers=False)["list"].get()) == [1, 2]
