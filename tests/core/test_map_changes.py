"""What changed since a cut (``snapshot(cut=True)`` + ``snapshot_changes``),
against a plain dict: the previous cut's contents with the tombstones removed
and the changed entries put equal the new cut's, for either map, whatever ran
in between (rehash, batches, sweeps, held snapshots, reads of mutable states
changed in place)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cowmap import CopyOnWriteStateMap
from cowmap._core import FlatStateMap, snapshot_changes

NS = "ns"
KEYS = st.one_of(st.integers(-50, 50), st.text(max_size=2))
OPS = st.lists(
    st.tuples(
        st.sampled_from(["put", "put", "remove", "mutate", "many", "sweep", "hold", "cut"]),
        KEYS,
        st.sampled_from([NS, NS, "other"]),
        st.integers(0, 9),
    ),
    max_size=150,
)


def listed(col: Any, n: int, default: Any = None) -> list[Any]:
    if col is None:
        return [default] * n
    return col.tolist() if isinstance(col, np.ndarray) else list(col)


def copy_lists(state: Any) -> Any:
    return list(state) if isinstance(state, list) else state


def contents(m: Any) -> dict[tuple[Any, Any], Any]:
    with m.snapshot() as s:
        return {(k, ns): (list(v) if isinstance(v, list) else v) for k, ns, v in s}


@pytest.mark.parametrize("kind", ["chained", "flat"])
@pytest.mark.parametrize("copier", [copy_lists, None])
@settings(max_examples=150, deadline=None)
@given(ops=OPS, capacity=st.sampled_from([4, 64]))
def test_changes_rebuild_each_cut_from_the_previous(kind: str, copier: Any, ops: list, capacity: int) -> None:
    """A cut's changes are read at once or after later writes (as an
    asynchronous checkpoint reads them), with a copier or without (a state
    changed in place after a read is then shared with the snapshots)."""
    m: Any = CopyOnWriteStateMap(capacity=capacity, copier=copier) if kind == "chained" else FlatStateMap(copier=copier)
    held = []
    m.snapshot(cut=True).release()  # tracking from here; the model starts empty
    model: dict[tuple[Any, Any], Any] = {}
    pending: list[tuple[Any, dict[tuple[Any, Any], Any]]] = []  # (cut, its contents) not read yet

    def read_changes() -> None:
        for s, expected in pending:
            assert s.changes == "known"
            keys, nss, states, _, gone_keys, gone_nss = snapshot_changes(s, NS)
            n, g = len(states), len(gone_keys)
            for k, n_ in zip(listed(gone_keys, g), listed(gone_nss, g, NS)):
                model.pop((k, n_), None)
            for k, n_, st_ in zip(listed(keys, n), listed(nss, n, NS), listed(states, n)):
                model[(k, n_)] = list(st_) if isinstance(st_, list) else st_
            s.release()
            assert model == expected
        pending.clear()

    for op, key, ns, v in ops + [("cut", 0, NS, 0)]:
        if op == "put":
            m.put(key, ns, v if v % 3 else [v])
        elif op == "remove":
            m.remove(key, ns)
        elif op == "mutate":  # read, then changed in place: never written back
            if copier is None:
                read_changes()  # without a copier the snapshots would see the change too
            st_ = m.get(key, ns)
            if isinstance(st_, list):
                st_.append(v)
        elif op == "many" and kind == "chained":
            keys = np.arange(v, v + 20, dtype=np.int64)
            m.put_many(keys, ns, list(range(20)))
        elif op == "sweep":
            m.sweep_expired(10**6, 1, v + 1)  # every entry is expired: up to v + 1 removed
        elif op == "hold":
            held.append(m.snapshot())
        elif op == "cut":
            read_changes()  # a cut's changes are relative to the previous cut's
            pending.append((m.snapshot(cut=True), contents(m)))
            if v % 2:
                read_changes()
    read_changes()
    for h in held:
        h.release()


def test_changes_cost_what_changed() -> None:
    """One key changed in a big map: a handful of entries come out, not the map."""
    m = CopyOnWriteStateMap()
    keys = np.arange(200_000, dtype=np.int64)
    m.put_many(keys, NS, keys.tolist())
    m.snapshot(cut=True).release()
    m.put(7, NS, -7)
    m.remove(8, NS)
    with m.snapshot(cut=True) as s:
        keys_, _, states, _, gone, _ = snapshot_changes(s, NS)
        assert 7 in listed(keys_, len(states)) and len(states) <= 8
        assert listed(gone, len(gone)) == [8]


def test_a_map_not_tracking_says_so() -> None:
    m = CopyOnWriteStateMap()
    m.put(1, NS, 1)
    with m.snapshot() as plain:
        assert plain.changes is None
        with pytest.raises(ValueError, match="not known"):
            snapshot_changes(plain, NS)
    with m.snapshot(cut=True) as first:
        assert first.changes == "untracked"
        with pytest.raises(ValueError, match="untracked"):
            snapshot_changes(first, NS)
    with pytest.raises(TypeError):
        snapshot_changes(object(), NS)


@pytest.mark.parametrize("kind", ["chained", "flat"])
def test_a_removal_log_that_outgrows_its_map_is_given_up(kind: str) -> None:
    """Keys written and removed over and over between two cuts: the log stops
    at twice the map's size (plus a margin) instead of growing without bound,
    and says its changes are lost; the next cut starts afresh."""
    m: Any = CopyOnWriteStateMap() if kind == "chained" else FlatStateMap()
    m.snapshot(cut=True).release()
    for i in range(6_000):
        m.put(f"k{i % 3}", NS, i)
        m.remove(f"k{i % 3}", NS)
    with m.snapshot(cut=True) as s:
        assert s.changes == "lost"
        with pytest.raises(ValueError, match="lost"):
            snapshot_changes(s, NS)
    m.put("x", NS, 1)
    with m.snapshot(cut=True) as s:
        assert s.changes == "known"
        assert listed(snapshot_changes(s, NS)[0], 1) == ["x"]


class Key:
    """A hashable key whose references can be counted."""

    def __hash__(self) -> int:
        return 17


@pytest.mark.parametrize("kind", ["chained", "flat"])
def test_the_removal_log_lets_go_of_its_keys(kind: str) -> None:
    import sys

    m: Any = CopyOnWriteStateMap() if kind == "chained" else FlatStateMap()
    key, ns = Key(), ("a", "namespace")
    m.snapshot(cut=True).release()
    before = sys.getrefcount(key), sys.getrefcount(ns)
    m.put(key, ns, 1)
    m.remove(key, ns)  # the map lets go, the log holds on
    s = m.snapshot(cut=True)
    gone = snapshot_changes(s, NS)[4]
    assert gone == [key]
    del gone
    s.release()
    assert (sys.getrefcount(key), sys.getrefcount(ns)) == before
    m.put(key, ns, 1)
    m.remove(key, ns)
    del m, s  # a map freed with a log still held (the snapshot object referred to it)
    assert (sys.getrefcount(key), sys.getrefcount(ns)) == before


def test_tracking_memory_is_returned() -> None:
    import gc
    import tracemalloc

    tracemalloc.start()
    try:
        gc.collect()
        base = tracemalloc.get_traced_memory()[0]
        for kind in ("chained", "flat"):
            m: Any = CopyOnWriteStateMap() if kind == "chained" else FlatStateMap()
            for i in range(200_000):  # the bits of the chained map's cut: 128 KiB
                m.put(i, NS, i)
            m.snapshot(cut=True).release()
            for r in range(3):
                for i in range(r, 200_000, 7):
                    m.remove(i, NS)
                with m.snapshot(cut=True) as s:
                    snapshot_changes(s, NS)
            del m, s
        gc.collect()
        assert tracemalloc.get_traced_memory()[0] - base < 64 * 1024
    finally:
        tracemalloc.stop()


#: a few maps of both kinds, each with puts (True) and removes of keys in two namespaces
MAPS = st.lists(
    st.tuples(
        st.sampled_from(["chained", "flat"]),
        st.lists(st.tuples(st.booleans(), KEYS, st.sampled_from([NS, "other"])), max_size=30),
    ),
    min_size=1,
    max_size=6,
)


def _same(a: Any, b: Any, n: int) -> bool:
    return listed(a, n) == listed(b, n)


@settings(max_examples=100, deadline=None)
@given(maps=MAPS)
def test_changes_of_many_maps_in_one_call_are_each_maps_in_turn(maps: list) -> None:
    """``snapshot_changes_many`` equals ``snapshot_changes`` of each map one after
    the other (counts per map, columns joined); one map not tracking: ValueError, nothing read."""
    from cowmap._core import snapshot_changes_many

    made, snaps = [], []
    for kind, ops in maps:
        m: Any = CopyOnWriteStateMap(capacity=4) if kind == "chained" else FlatStateMap()
        for k in range(5):
            m.put(k, NS, k)
        m.snapshot(cut=True).release()
        for put, key, ns in ops:
            m.put(key, ns, 1) if put else m.remove(key, ns)
        made.append(m)
        snaps.append(m.snapshot(cut=True))
    one = [snapshot_changes(s, NS) for s in snaps]
    keys, nss, states, ts, gk, gn, counts, gcounts = snapshot_changes_many(snaps, NS)
    assert counts.tolist() == [len(o[3]) for o in one]
    assert gcounts.tolist() == [len(o[4]) for o in one]
    n, g = int(counts.sum()), int(gcounts.sum())
    assert listed(keys, n) == [x for o in one for x in listed(o[0], len(o[3]))]
    assert listed(nss, n, NS) == [x for o in one for x in listed(o[1], len(o[3]), NS)]
    assert listed(states, n) == [x for o in one for x in listed(o[2], len(o[3]))]
    assert listed(ts, n) == [x for o in one for x in listed(o[3], len(o[3]))]
    assert listed(gk, g) == [x for o in one for x in listed(o[4], len(o[4]))]
    assert listed(gn, g, NS) == [x for o in one for x in listed(o[5], len(o[4]), NS)]
    plain = CopyOnWriteStateMap()
    with plain.snapshot() as untracked, pytest.raises(ValueError, match="not known"):
        snapshot_changes_many([*snaps, untracked], NS)
    with pytest.raises(TypeError, match="expected a StateMapSnapshot"):
        snapshot_changes_many([object()], NS)
    for s in snaps:
        s.release()
    with pytest.raises(RuntimeError, match="released"):
        snapshot_changes_many(snaps, NS)


@settings(max_examples=100, deadline=None)
@given(maps=MAPS)
def test_columns_of_many_maps_in_one_call_are_each_maps_in_turn(maps: list) -> None:
    """``snapshot_columns_many`` equals ``snapshot_columns`` of each map one after
    the other (counts per map, columns joined), empty maps included."""
    from cowmap._core import snapshot_columns, snapshot_columns_many

    made, snaps = [], []
    for kind, ops in maps:
        m: Any = CopyOnWriteStateMap(capacity=4) if kind == "chained" else FlatStateMap()
        for put, key, ns in ops:
            m.put(key, ns, key) if put else m.remove(key, ns)
        made.append(m)
        snaps.append(m.snapshot())
    for m in made:  # written after the snapshots: not seen
        m.put(10**6, NS, "later")
    one = [snapshot_columns(s, NS) for s in snaps]
    keys, nss, states, ts, counts = snapshot_columns_many(snaps, NS)
    assert counts.tolist() == [len(o[3]) for o in one]
    n = int(counts.sum())
    assert listed(keys, n) == [x for o in one for x in listed(o[0], len(o[3]))]
    assert listed(nss, n, NS) == [x for o in one for x in listed(o[1], len(o[3]), NS)]
    assert listed(states, n) == [x for o in one for x in listed(o[2], len(o[3]))]
    assert listed(ts, n) == [x for o in one for x in listed(o[3], len(o[3]))]
    with pytest.raises(TypeError, match="expected a StateMapSnapshot"):
        snapshot_columns_many([*snaps, object()], NS)
    snaps[-1].release()
    with pytest.raises(RuntimeError, match="released"):
        snapshot_columns_many(snaps, NS)
    for s in snaps:
        s.release()
