"""Save then restore gives the source backend's states back, for every kind."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cowmap.checkpoint import CheckpointStorage
from cowmap.state import VOID_NAMESPACE, KeyedStateBackend

from ckpt_helpers import Clock, contents, register

KEYS = st.one_of(st.integers(-(2**70), 2**70), st.text(max_size=4), st.tuples(st.integers(0, 3), st.text(max_size=2)))
VALUES = st.one_of(
    st.integers(-(2**70), 2**70),
    st.floats(allow_nan=False),
    st.text(max_size=5),
    st.lists(st.integers(), max_size=3),
    st.none(),
)
NAMESPACES = st.sampled_from([VOID_NAMESPACE, "w1", 7])
OP = st.tuples(
    st.sampled_from(
        ["value", "list", "map", "map_remove", "reducing", "aggregating", "clear", "tick", "snapshot",
         "timer", "timer_delete", "fire"]
    ),
    KEYS,
    NAMESPACES,
    st.integers(-3, 3),
    VALUES,
)


def apply(backend: KeyedStateBackend, states: dict[str, Any], clock: Clock, op: tuple, snaps: list) -> None:
    kind, key, ns, ukey, value = op
    if kind == "tick":
        clock.now += 300
        return
    if kind == "snapshot":  # snapshots held across later writes: the checkpoint must not see those
        snaps.append(backend.snapshot())
        return
    if kind == "fire":  # timers of both domains fire (and go) up to a time
        timers = backend.get_timer_service("timers")
        timers.advance_watermark(ukey * 100)
        timers.advance_processing_time(ukey * 100)
        return
    backend.set_current_key(key)
    for s in states.values():
        s.set_current_namespace(ns)
    if kind in ("timer", "timer_delete"):
        timers = backend.get_timer_service("timers")
        event = ukey % 2 == 0
        if kind == "timer":
            (timers.register_event_time_timer if event else timers.register_processing_time_timer)(ukey * 37, ns)
        else:
            (timers.delete_event_time_timer if event else timers.delete_processing_time_timer)(ukey * 37, ns)
        return
    if kind == "value":
        states["value"].update(value)
    elif kind == "list":
        states["list"].add(value if value is not None else 0)  # a list holds no None
    elif kind == "map":
        states["map"].put(ukey, value)
    elif kind == "map_remove":
        states["map"].remove(ukey)
    elif kind == "reducing":
        states["reducing"].add(ukey)
    elif kind == "aggregating":
        states["aggregating"].add(ukey)
    else:
        states["value"].clear()


@pytest.mark.parametrize("ttl", [False, True])
@settings(max_examples=40, deadline=None)
@given(ops=st.lists(OP, max_size=60), register_first=st.booleans())
def test_round_trip_equals_source(tmp_path_factory: Any, ttl: bool, ops: list, register_first: bool) -> None:
    clock = Clock()
    src = KeyedStateBackend(max_parallelism=8, time_provider=clock)
    states = register(src, ttl)
    snaps: list = []
    for op in ops:
        apply(src, states, clock, op, snaps)
    storage = CheckpointStorage(tmp_path_factory.mktemp("ck"))
    cid = storage.save(src)
    expected = contents(src)
    for op in ops[:10]:  # writes after the save change nothing saved
        apply(src, states, clock, op, snaps)
    for s in snaps:
        s.release()
    dst = KeyedStateBackend(max_parallelism=8, time_provider=clock)
    if register_first:
        register(dst, ttl)
    assert storage.restore(dst, cid) == []
    assert contents(dst) == expected


def test_numbers_fast_path_round_trip(tmp_path: Any) -> None:
    """Int keys and int/float values take the columnar path both ways."""
    from cowmap.state import ValueStateDescriptor

    src = KeyedStateBackend()
    ints = src.get_state(ValueStateDescriptor("ints"))
    floats = src.get_state(ValueStateDescriptor("floats"))
    keys = np.arange(-500, 1500, dtype=np.int64) * 7919
    ints.update_many(keys, keys * 3)
    floats.update_many(keys, keys / 7)
    ints.update_many(np.array([2**62], dtype=np.int64), np.array([-(2**63)], dtype=np.int64))
    storage = CheckpointStorage(tmp_path)
    storage.save(src)
    dst = KeyedStateBackend()
    storage.restore(dst)
    assert contents(dst) == contents(src)
    assert dst.get_state(ValueStateDescriptor("ints")).get_many(keys[:3]) == (keys[:3] * 3).tolist()


@pytest.mark.parametrize("shape", ["one_object_everywhere", "one_object_for_some", "all_distinct"])
def test_restored_keys_share_no_value_object(tmp_path: Any, shape: str) -> None:
    """Values restored a whole column at a time: a column repeating one object
    (written as a constant, or pickled with its repeats shared) still gives
    each key its own copy, so changing one key's list leaves the others."""
    from cowmap.state import ValueStateDescriptor

    src = KeyedStateBackend()
    lists = src.get_state(ValueStateDescriptor("lists"))
    shared = [1, 2]
    for k in range(40):
        src.set_current_key(k)
        if shape == "one_object_everywhere" or (shape == "one_object_for_some" and k % 3 == 0):
            lists.update(shared)
        else:
            lists.update([k, k])
    storage = CheckpointStorage(tmp_path)
    storage.save(src)
    dst = KeyedStateBackend()
    storage.restore(dst)
    assert contents(dst) == contents(src)
    restored = dst.get_state(ValueStateDescriptor("lists"))
    objects = []
    for k in range(40):
        dst.set_current_key(k)
        objects.append(restored.value())
    assert len({id(o) for o in objects}) == 40
    dst.set_current_key(0)
    restored.value().append(3)
    dst.set_current_key(3)
    assert restored.value() == ([1, 2] if shape != "all_distinct" else [3, 3])


def test_checkpoint_ids_increase_and_latest_is_default(tmp_path: Any) -> None:
    from cowmap.state import ValueStateDescriptor

    b = KeyedStateBackend()
    v = b.get_state(ValueStateDescriptor("v"))
    storage = CheckpointStorage(tmp_path)
    with pytest.raises(FileNotFoundError):
        storage.restore(KeyedStateBackend())
    ids = []
    for i in range(3):
        b.set_current_key("k")
        v.update(i)
        ids.append(storage.save(b))
    assert ids == sorted(ids) and len(set(ids)) == 3
    assert storage.checkpoints() == ids
    for cid, want in zip(ids, range(3)):
        r = KeyedStateBackend()
        storage.restore(r, cid)
        r.set_current_key("k")
        assert r.get_state(ValueStateDescriptor("v")).value() == want
    latest = KeyedStateBackend()
    storage.restore(latest)
    latest.set_current_key("k")
    assert latest.get_state(ValueStateDescriptor("v")).value() == 2
    with pytest.raises(FileNotFoundError):
        storage.restore(KeyedStateBackend(), 99)


def test_restored_reducing_state_needs_its_descriptor(tmp_path: Any) -> None:
    from cowmap.state import ReducingStateDescriptor

    from ckpt_helpers import add

    b = KeyedStateBackend()
    r = b.get_reducing_state(ReducingStateDescriptor("r", add))
    b.set_current_key(1)
    r.add(5)
    storage = CheckpointStorage(tmp_path)
    storage.save(b)
    fresh = KeyedStateBackend()
    storage.restore(fresh)
    fresh.set_current_key(1)
    assert fresh.keys("r") == [1]
    fresh.set_current_key(1)
    rr = fresh.get_reducing_state(ReducingStateDescriptor("r", add))
    rr.add(2)
    assert rr.get() == 7


def test_rescale_2_to_5_and_4_to_3(tmp_path: Any) -> None:
    """Each new backend reads only its key groups (states and timers), from every old checkpoint."""
    from cowmap.state import TimeDomain, key_group_for, key_group_range_for_operator

    max_par = 32
    whole = KeyedStateBackend(max_parallelism=max_par)
    ref = register(whole, False)
    keys = list(range(300)) + [f"s{i}" for i in range(100)]
    timers = whole.get_timer_service("timers")
    for i, k in enumerate(keys):
        whole.set_current_key(k)
        ref["value"].update(k)
        ref["map"].put(1, k)
        ref["list"].add(k)
        timers.register_event_time_timer(i % 17)
        timers.register_processing_time_timer(i, namespace="w")
    expected = contents(whole)
    assert expected["timers:timers"]
    for old_par, new_par in [(2, 5), (4, 3)]:
        dirs = []
        for i in range(old_par):
            rng = key_group_range_for_operator(max_par, old_par, i)
            part = KeyedStateBackend(max_parallelism=max_par, key_group_range=rng)
            with whole.snapshot() as s:
                part.restore(s)
            d = tmp_path / f"{old_par}-{i}"
            CheckpointStorage(d).save(part)
            dirs.append(d)
        merged: dict[str, list] = {}
        for j in range(new_par):
            rng = key_group_range_for_operator(max_par, new_par, j)
            nb = KeyedStateBackend(max_parallelism=max_par, key_group_range=rng)
            for d in dirs:
                CheckpointStorage(d).restore(nb)
            for name, rows in contents(nb).items():
                merged.setdefault(name, []).extend(rows)
            assert all(kg in rng for name in nb.state_names() for kg in nb._tables[name].live)
            t = nb.get_timer_service("timers")
            assert all(key_group_for(key, max_par) in rng for d in TimeDomain for _, key, _ in t.timers(d))
        assert {n: sorted(r, key=repr) for n, r in merged.items()} == expected


def test_kind_and_ttl_mismatch_refused_before_any_change(tmp_path: Any) -> None:
    from cowmap.state import ListStateDescriptor, ValueStateDescriptor

    src = KeyedStateBackend(time_provider=Clock())
    register(src, True)["value"]
    src.set_current_key(1)
    src.get_state(__import__("ckpt_helpers").descriptors(True)["value"]).update(3)
    storage = CheckpointStorage(tmp_path)
    storage.save(src)
    other_kind = KeyedStateBackend()
    other_kind.get_list_state(ListStateDescriptor("value"))
    with pytest.raises(ValueError, match="list state here but value"):
        storage.restore(other_kind)
    no_ttl = KeyedStateBackend()
    no_ttl.get_state(ValueStateDescriptor("value"))
    with pytest.raises(ValueError, match="without TTL"):
        storage.restore(no_ttl)
    assert no_ttl.num_entries() == 0
    with pytest.raises(ValueError, match="max_parallelism"):
        storage.restore(KeyedStateBackend(max_parallelism=64))


@pytest.mark.parametrize("ttl", [False, True])
def test_key_groups_whose_entries_were_all_removed(tmp_path: Any, ttl: bool) -> None:
    """A key group map that exists but is empty (every entry removed) saves as no rows."""
    b = KeyedStateBackend(max_parallelism=4, time_provider=Clock())
    s = register(b, ttl)
    for k in range(20):
        b.set_current_key(k)
        s["value"].update(k)
        s["map"].put(k, k)
        s["list"].add(k)
        s["reducing"].add(k)
    for k in range(20):
        b.set_current_key(k)
        s["value"].clear()
        s["map"].remove(k)
        s["list"].clear()
        s["reducing"].clear()
    storage = CheckpointStorage(tmp_path)
    storage.save(b)
    r = KeyedStateBackend(max_parallelism=4, time_provider=Clock())
    storage.restore(r)
    assert r.num_entries() == 0 and contents(r) == {}


def test_descriptor_serializer_is_used_and_required_back(tmp_path: Any) -> None:
    import pickle

    from cowmap.state import ValueStateDescriptor

    from ckpt_helpers import JsonSerializer

    def desc(ser: Any = None) -> ValueStateDescriptor:
        return ValueStateDescriptor("v", serializer=ser if ser is not None else JsonSerializer())

    b = KeyedStateBackend()
    v = b.get_state(desc())
    for k in range(10):
        b.set_current_key(k)
        v.update([k, {"n": k}])  # not a number column: goes through the serializer
    storage = CheckpointStorage(tmp_path)
    storage.save(b)
    raw = next(p for p in tmp_path.iterdir() if p.suffix == ".data").read_bytes()
    assert b'{"n": 3}' in raw and b"json-utf8" in raw
    ok = KeyedStateBackend()
    ok.get_state(desc())
    storage.restore(ok)
    assert contents(ok) == contents(b)
    for registered in (None, desc(pickle)):
        other = KeyedStateBackend()
        if registered is not None:
            other.get_state(registered)
        with pytest.raises(ValueError, match="serializer 'json-utf8'"):
            storage.restore(other)
        assert other.num_entries() == 0
    with pytest.raises(TypeError, match="dumps"):
        ValueStateDescriptor("bad", serializer=object())


def test_serializer_returning_text_is_refused(tmp_path: Any) -> None:
    from cowmap.state import ValueStateDescriptor

    class Text:
        name = "text"

        @staticmethod
        def dumps(obj: Any) -> str:
            return repr(obj)

        @staticmethod
        def loads(data: bytes) -> Any:
            return data

    b = KeyedStateBackend()
    b.set_current_key(1)
    b.get_state(ValueStateDescriptor("v", serializer=Text())).update([1])
    storage = CheckpointStorage(tmp_path)
    with pytest.raises(TypeError, match="returned str, not bytes"):
        storage.save(b)
    assert storage.checkpoints() == []


def test_full_snapshot_cleanup_leaves_expired_rows_out(tmp_path: Any) -> None:
    """With ``cleanup_full_snapshot`` a checkpoint holds what the snapshot's
    entries hold: rows expired at the snapshot's time are left out (numbers and
    objects, value-like and map states)."""
    from datetime import timedelta

    from cowmap.state import MapStateDescriptor, StateTtlConfig, ValueStateDescriptor

    cfg = StateTtlConfig.new_builder(timedelta(milliseconds=100)).cleanup_full_snapshot().build()
    descs = [ValueStateDescriptor("ints"), ValueStateDescriptor("objs"), MapStateDescriptor("map")]
    for d in descs:
        d.enable_time_to_live(cfg)
    clock = Clock()
    b = KeyedStateBackend(max_parallelism=4, time_provider=clock)
    ints, objs, m = b.get_state(descs[0]), b.get_state(descs[1]), b.get_map_state(descs[2])
    for k in range(40):
        clock.now = 0 if k % 2 else 60  # odd keys expire at 100, even ones at 160
        b.set_current_key(k)
        ints.update(k)
        objs.update([k])
        m.put(k, "v")
    clock.now = 120
    expected = contents(b)
    assert expected and all(len(rows) == 20 for rows in expected.values())
    storage = CheckpointStorage(tmp_path)
    storage.save(b)
    r = KeyedStateBackend(max_parallelism=4, time_provider=clock)
    for d in descs[:2]:
        r.get_state(d)
    r.get_map_state(descs[2])
    storage.restore(r)
    assert contents(r) == expected


def test_long_int_columns_are_narrowed_short_ones_not(tmp_path: Any) -> None:
    """Ints that fit in 32 bits take 4 bytes in a column of 4,096 rows or more;
    a shorter column stays int64. Both read back the same."""
    from cowmap.checkpoint.columns import _COL, PICKLE, T_INT32, T_INT64, decode_column, encode_column
    from cowmap.state import ValueStateDescriptor

    for n, tag in ((5_000, T_INT32), (100, T_INT64)):
        col = np.arange(n, dtype=np.int64) - n // 2
        parts = encode_column(col, PICKLE)
        assert _COL.unpack(bytes(parts[0]))[0] == tag
        buf = b"".join(bytes(p) for p in parts)
        back, end = decode_column(memoryview(buf), 0, n, PICKLE)
        assert end == len(buf) and back.tolist() == col.tolist()
    src = KeyedStateBackend(max_parallelism=1)  # one key group: long columns
    v = src.get_state(ValueStateDescriptor("v"))
    keys = np.arange(6_000, dtype=np.int64)
    v.update_many(keys, keys - 3_000)
    storage = CheckpointStorage(tmp_path)
    storage.save(src)
    dst = KeyedStateBackend(max_parallelism=1)
    storage.restore(dst)
    assert contents(dst) == contents(src)


def test_metadata_is_kept_in_the_manifest(tmp_path: Any) -> None:
    storage = CheckpointStorage(tmp_path)
    backend = KeyedStateBackend(max_parallelism=8)
    meta = {"watermark": -(2**63), "timestamp": 1_700_000_000_123, "names": ["a", "ü"]}
    want = {k: list(v) if isinstance(v, list) else v for k, v in meta.items()}
    cid = storage.save(backend, metadata=meta)
    meta["timestamp"] = 0  # the checkpoint holds a copy taken at the call
    assert storage.manifest(cid)["metadata"] == want
    assert storage.manifest(storage.save(backend))["metadata"] is None
    for bad in ({"x": object()}, [1, 2]):
        with pytest.raises(TypeError, match="metadata"):
            storage.save(backend, metadata=bad)  # type: ignore[arg-type]
    assert storage.checkpoints() == [cid, cid + 1]  # nothing written for the refused ones
