"""The column calls of the core (``column_get``/``column_put``/``column_remove``/
``column_contains``) against the single ops of the map, row by row.

A column spreads over many maps; its fast passes (int64 keys) leave a map to the
general pass at the first row they cannot do (an expired entry, a rehash, a live
snapshot, a None state), so every mix of those is compared with the plain loop:
results, statuses, timestamps and every map's contents.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cowmap._core import (
    COL_FLOAT64,
    COL_INT64,
    COL_LIST,
    EXPIRED,
    FOLD_ADD,
    NO_TIMESTAMP,
    PLAIN_BATCH,
    ColumnLocations,
    CopyOnWriteStateMap,
    column_contains,
    column_fold,
    column_get,
    column_groups,
    column_missing,
    column_put,
    column_remove,
    snapshot_columns,
)

NMAPS = 5
NS = "ns"


def _maps(capacity: int) -> list[Any]:
    maps: list[Any] = [CopyOnWriteStateMap(capacity=capacity, copier=lambda s: s) for _ in range(NMAPS - 1)]
    return [*maps, None]  # the last key group has no map


def _content(maps: list[Any]) -> list[Any]:
    return [None if m is None else sorted(((repr(k), ns, s, ts) for k, ns, s, ts in _entries(m)), key=repr)
            for m in maps]


def _entries(m: CopyOnWriteStateMap) -> list[tuple[Any, ...]]:
    with m.snapshot() as s:
        return list(s.iter_with_timestamps())


def loop_get(maps: list[Any], kgs: list[int], keys: list[Any], now: int, ttl: int, refresh: bool, peek: bool):
    values, status = [], []
    for kg, k in zip(kgs, keys):
        m = maps[kg]
        if m is None:
            values.append(None)
            status.append(0)
            continue
        if not ttl:
            v = m.get(k, NS)
            values.append(v)
            status.append(0 if v is None else 1)
        elif peek:
            r = m.get_with_timestamp(k, NS)
            if r is None:
                values.append(None)
                status.append(0)
            else:
                values.append(r[0])
                status.append(2 if r[1] + ttl <= now else 1)
        else:
            v = m.get_unexpired(k, NS, now, ttl, refresh)
            if v is EXPIRED:
                values.append(m.remove_and_get_old(k, NS))
                status.append(2)
            else:
                values.append(v)
                status.append(0 if v is None else 1)
    return values, status


def loop_put(maps: list[Any], kgs: list[int], keys: list[Any], states: list[Any], ts: int) -> None:
    for kg, k, s in zip(kgs, keys, states):
        if s is None:
            maps[kg].remove(k, NS)
        else:
            maps[kg].put(k, NS, s, ts)


ops = st.sampled_from(["get", "get", "put", "put", "remove", "contains", "snap", "release", "tick"])


@settings(max_examples=200, deadline=None)
@given(
    program=st.lists(
        st.tuples(
            ops,
            st.lists(st.tuples(st.integers(0, NMAPS - 1), st.integers(0, 40),
                               # big ints too: the fast write rewrites an int only the map holds
                               st.one_of(st.none(), st.integers(0, 9), st.integers(2**31, 2**40))),
                     max_size=120),
            st.booleans(),
            st.integers(0, 7),
        ),
        max_size=12,
    ),
    ttl=st.sampled_from([0, 5]),
    refresh=st.booleans(),
    int_keys=st.booleans(),
    capacity=st.sampled_from([4, 128]),
)
def test_columns_equal_the_single_ops(program: Any, ttl: int, refresh: bool, int_keys: bool, capacity: int) -> None:
    col, loop = _maps(capacity), _maps(capacity)
    snaps: list[Any] = []
    now = 0
    for op, rows, flag, dt in program:
        kgs_l = [kg for kg, _, _ in rows]
        keys_l = [k if int_keys else f"k{k}" for _, k, _ in rows]
        kgs = np.array(kgs_l, dtype=np.int32)
        keys: Any = np.array(keys_l, dtype=np.int64) if int_keys else tuple(keys_l)
        if op == "get":
            want_v, want_s = loop_get(loop, kgs_l, keys_l, now, ttl, refresh, flag)
            got_v, got_s = column_get(col, kgs, keys, NS, now, ttl, refresh, None, True, COL_LIST, flag)
            assert (got_v, got_s.tolist()) == (want_v, want_s)
        elif op == "put":
            states = [s for _, _, s in rows]
            mask = kgs < NMAPS - 1  # writes need their maps: the last key group has none
            keep = np.flatnonzero(mask).tolist()
            ts = now if ttl else NO_TIMESTAMP
            st_in: Any = (
                np.array(states, dtype=np.int64)[mask] if flag and None not in states
                else tuple(states[i] for i in keep)
            )
            column_put(col, kgs[mask], _sub(keys, mask), NS, st_in, ts)
            loop_put(loop, [kgs_l[i] for i in keep], [keys_l[i] for i in keep], [states[i] for i in keep], ts)
        elif op == "remove":
            column_remove(col, kgs, keys, NS)
            for kg, k in zip(kgs_l, keys_l):
                if loop[kg] is not None:
                    loop[kg].remove(k, NS)
        elif op == "contains":
            got = column_contains(col, kgs, keys, NS).tolist()
            assert got == [loop[kg] is not None and loop[kg].contains_key(k, NS) for kg, k in zip(kgs_l, keys_l)]
        elif op == "snap":
            snaps.append([[m.snapshot() if m is not None else None for m in maps] for maps in (col, loop)])
        elif op == "release" and snaps:
            pair = snaps.pop(dt % len(snaps))
            views = [[None if s is None else sorted(map(repr, s.iter_with_timestamps())) for s in side]
                     for side in pair]
            assert views[0] == views[1]  # the snapshots kept what they saw
            for side in pair:
                for s in side:
                    if s is not None:
                        s.release()
        else:
            now += dt
        assert _content(col) == _content(loop)
        assert [None if m is None else m.capacity for m in col] == [None if m is None else m.capacity for m in loop]


def _sub(keys: Any, mask: np.ndarray) -> Any:
    return keys[mask] if isinstance(keys, np.ndarray) else tuple(k for k, m in zip(keys, mask.tolist()) if m)


def test_big_column_through_rehash_expiry_and_snapshots() -> None:
    """20,000 rows over 3 maps growing from capacity 4 (rehashes start mid-column),
    half the entries expired, a snapshot live on one map: every path in one column."""
    rng = np.random.default_rng(7)
    col, loop = _maps(4), _maps(4)
    for maps in (col, loop):
        maps[3] = None
    kgs = rng.integers(0, 3, 20_000).astype(np.int32)
    keys = rng.integers(0, 6_000, 20_000)
    vals = rng.integers(0, 100, 20_000)
    column_put(col, kgs, keys, NS, vals, 0)
    loop_put(loop, kgs.tolist(), keys.tolist(), vals.tolist(), 0)
    assert _content(col) == _content(loop)
    snaps = [col[1].snapshot(), loop[1].snapshot()]
    kgs2 = rng.integers(0, 3, 20_000).astype(np.int32)
    keys2 = rng.integers(0, 9_000, 20_000)
    column_put(col, kgs2[:5000], keys2[:5000], NS, vals[:5000], 10)
    loop_put(loop, kgs2[:5000].tolist(), keys2[:5000].tolist(), vals[:5000].tolist(), 10)
    got = column_get(col, kgs2, keys2, NS, 12, 5, True, -1, False, COL_INT64)
    want_v, want_s = loop_get(loop, kgs2.tolist(), keys2.tolist(), 12, 5, True, False)
    assert got[1].tolist() == want_s
    assert got[0].tolist() == [-1 if s != 1 else v for v, s in zip(want_v, want_s)]
    assert _content(col) == _content(loop)
    for s in snaps:
        s.release()


def test_float_states_and_typed_reads() -> None:
    maps = _maps(8)
    kgs = np.array([0, 1, 0, 2], dtype=np.int32)
    keys = np.array([1, 2, 1, 3])
    column_put(maps, kgs, keys, NS, np.array([0.5, 1.5, 2.5, 3.5]))
    vals, status = column_get(maps, kgs, keys, NS, out_type=COL_FLOAT64)
    assert vals.tolist() == [2.5, 1.5, 2.5, 3.5] and status.tolist() == [1, 1, 1, 1]
    with pytest.raises(TypeError, match="key 1 is float 2.5, not an int"):
        column_get(maps, kgs, keys, NS, default=0, out_type=COL_INT64)
    maps[0].put(1, NS, "text")
    with pytest.raises(TypeError, match="not a number"):
        column_get(maps, kgs, keys, NS, out_type=COL_FLOAT64)


def test_bad_arguments() -> None:
    maps = _maps(8)
    with pytest.raises(ValueError, match="not within"):
        column_get(maps, np.array([NMAPS], dtype=np.int32), np.array([1]), NS)
    with pytest.raises(ValueError, match="no map for key group"):
        column_put(maps, np.array([NMAPS - 1], dtype=np.int32), np.array([1]), NS, (1,))
    with pytest.raises(TypeError, match="CopyOnWriteStateMap or None"):
        column_get([object()], np.array([0], dtype=np.int32), np.array([1]), NS)
    with pytest.raises(ValueError, match="2 states for 1 keys"):
        column_put(maps, np.array([0], dtype=np.int32), np.array([1]), NS, (1, 2))
    with pytest.raises(TypeError, match="must not be None"):
        column_get(maps, np.array([0], dtype=np.int32), (None,), NS)
    assert column_missing(maps, np.array([4, 0, 4, 3], dtype=np.int32)) == [4]


def test_a_busy_map_fails_the_column_before_anything_is_written() -> None:
    maps = _maps(8)

    class Evil:
        def __hash__(self) -> int:
            return 1

        def __eq__(self, other: object) -> bool:
            column_put(maps, np.array([0], dtype=np.int32), np.array([5]), NS, (1,))
            return False

    maps[0].put(Evil(), NS, 1)
    with pytest.raises(RuntimeError, match="re-entrantly"):
        column_get(maps, np.array([0], dtype=np.int32), (Evil(),), NS)
    assert not maps[0].contains_key(5, NS)


def test_groups() -> None:
    first, group = column_groups(np.array([5, 3, 5, 7, 3]))
    assert first.tolist() == [0, 1, 3] and group.tolist() == [0, 1, 0, 2, 1]
    first, group = column_groups(("a", "b", "a"))
    assert first.tolist() == [0, 1] and group.tolist() == [0, 1, 0]
    first, group = column_groups(np.array([], dtype=np.int64))
    assert first.tolist() == [] and group.tolist() == []


@pytest.mark.parametrize("dtype", [np.int64, np.float64])
def test_numbers_are_rewritten_in_place_only_when_nothing_else_holds_them(dtype: Any) -> None:
    """A numeric column written over numbers that only the map holds reuses their
    objects; a number anyone else holds (a reader, a second entry, a snapshot)
    keeps its value."""
    maps = _maps(8)
    kgs = np.zeros(3, dtype=np.int32)
    keys = np.array([1, 2, 3])
    column_put(maps, kgs, keys, NS, np.array([10**6, 10**6 + 1, 10**6 + 2], dtype=dtype))
    held, _ = column_get(maps, kgs[:1], keys[:1], NS)  # a reader holds key 1's number
    column_put(maps, kgs, keys, NS, np.array([2 * 10**6, 2 * 10**6 + 1, 2 * 10**6 + 2], dtype=dtype))
    assert held == [10**6]
    snap = maps[0].snapshot()
    column_put(maps, kgs, keys, NS, np.array([3 * 10**6, 3, -(2**62)], dtype=dtype))
    assert sorted(s for _, _, s in snap) == [2 * 10**6, 2 * 10**6 + 1, 2 * 10**6 + 2]
    snap.release()
    column_put(maps, kgs, keys, NS, np.array([-5 * 10**6, 2**40, -(2**52) + 1], dtype=dtype))
    got, _ = column_get(maps, kgs, keys, NS)
    assert got == [-5 * 10**6, 2**40, -(2**52) + 1]
    assert [type(v) for v in got] == [int if dtype is np.int64 else float] * 3


def loop_fold(maps: list[Any], kgs: list[int], keys: list[Any], vals: list[int], fold: int, now: int, ttl: int,
              return_expired: bool, ts: int) -> list[int]:
    """column_fold's model: the single ops, row by row."""
    from cowmap._core import FOLD_ADD, FOLD_MIN

    unfit = []
    for i, (kg, k, v) in enumerate(zip(kgs, keys, vals)):
        m = maps[kg]
        r = m.get_with_timestamp(k, NS)
        if r is not None and (not ttl or return_expired or r[1] + ttl > now):
            old = r[0]
            if type(old) is not int or not -(2**63) <= old < 2**63:
                unfit.append(i)
                continue
            new = old + v if fold == FOLD_ADD else min(old, v) if fold == FOLD_MIN else max(old, v)
            if not -(2**63) <= new < 2**63:
                unfit.append(i)
                continue
            v = new
        m.put(k, NS, v, ts)
    return unfit


@settings(max_examples=200, deadline=None)
@given(
    steps=st.lists(
        st.tuples(
            st.lists(st.tuples(st.integers(0, NMAPS - 2), st.integers(0, 30),
                               st.one_of(st.integers(-5, 5), st.integers(2**62, 2**63 - 1), st.just(-(2**63)))),
                     max_size=80),
            st.sampled_from(["fold", "fold", "fold", "put_float", "snap", "tick"]),
            st.integers(0, 8),
        ),
        max_size=10,
    ),
    fold=st.sampled_from([0, 1, 2]),
    ttl=st.sampled_from([0, 4]),
    return_expired=st.booleans(),
    int_keys=st.booleans(),
)
def test_fold_equals_the_single_ops(steps: Any, fold: int, ttl: int, return_expired: bool, int_keys: bool) -> None:
    from cowmap._core import column_fold

    col, loop = _maps(4), _maps(4)
    snaps: list[Any] = []
    now = 0
    for rows, op, dt in steps:
        kgs_l = [kg for kg, _, _ in rows]
        keys_l = [k if int_keys else f"k{k}" for _, k, _ in rows]
        vals_l = [v for _, _, v in rows]
        kgs = np.array(kgs_l, dtype=np.int32)
        keys: Any = np.array(keys_l, dtype=np.int64) if int_keys else tuple(keys_l)
        ts = now if ttl else NO_TIMESTAMP
        if op == "fold":
            got = column_fold(col, kgs, keys, NS, np.array(vals_l, dtype=np.int64), fold, now, ttl, return_expired, ts)
            assert got == loop_fold(loop, kgs_l, keys_l, vals_l, fold, now, ttl, return_expired, ts)
        elif op == "put_float":  # a stored value the fold cannot take
            for maps in (col, loop):
                for kg, k in list(zip(kgs_l, keys_l))[:2]:
                    maps[kg].put(k, NS, 0.5, ts)
        elif op == "snap":
            snaps.append([m.snapshot() for m in col if m is not None])
        else:
            now += dt
        assert _content(col) == _content(loop)
    for group in snaps:
        for s in group:
            s.release()


# --------------------------------------------------------------------------- column calls


def _column_cycle(keys: tuple[Any, ...], states: tuple[Any, ...], ints: np.ndarray, n_maps: int) -> None:
    """Every column call over fresh maps, with snapshots, expiry, rehash and in-place rewrites."""
    maps: list[Any] = [CopyOnWriteStateMap(capacity=4, copier=lambda s: s) for _ in range(n_maps)]
    kgs = (np.arange(len(keys)) % n_maps).astype(np.int32)
    ikeys = np.arange(len(keys), dtype=np.int64)
    column_put(maps, kgs, keys, NS, states, 0)
    column_put(maps, kgs, ikeys, NS, ints + 2**40, 0)
    snap = [m.snapshot() for m in maps]
    column_get(maps, kgs, keys, NS, 10, 5, True, None, True, COL_LIST)  # expired: removed, returned
    column_put(maps, kgs, keys, NS, states, 11)
    column_get(maps, kgs, ikeys, NS, 11, 100, True, 0, False, COL_INT64)
    column_fold(maps, kgs, ikeys, NS, ints, 0, 11, 100, False, 12)
    for s in snap:
        s.release()
    column_put(maps, kgs, ikeys, NS, ints + 2**41, 13)  # rewritten in place: only the maps hold them
    column_fold(maps, kgs, ikeys, NS, ints, 0, 13, 100, False, 14)
    column_contains(maps, kgs, keys, NS)
    column_remove(maps, kgs, keys, NS)
    column_put(maps, kgs, keys, NS, tuple(None for _ in keys), 15)


def test_column_calls_leak_nothing() -> None:
    """References to keys and states return to their baseline, and the traced
    memory is flat over repeated cycles of every column call."""
    import gc
    import sys
    import tracemalloc

    keys = tuple(f"key-{i}" for i in range(300))
    states = tuple([i] for i in range(300))
    ints = np.arange(300, dtype=np.int64)
    before = [sys.getrefcount(o) for o in keys[:20] + states[:20]]
    _column_cycle(keys, states, ints, 5)
    gc.collect()
    assert [sys.getrefcount(o) for o in keys[:20] + states[:20]] == before
    tracemalloc.start()
    try:
        _column_cycle(keys, states, ints, 5)
        gc.collect()
        base = tracemalloc.get_traced_memory()[0]
        for _ in range(20):
            _column_cycle(keys, states, ints, 5)
        gc.collect()
        grown = tracemalloc.get_traced_memory()[0] - base
    finally:
        tracemalloc.stop()
    assert grown < 64 * 1024, f"traced memory grew by {grown} bytes over 20 cycles"


@pytest.mark.parametrize("out_type", [COL_LIST, COL_INT64, COL_FLOAT64])
@pytest.mark.parametrize("return_expired", [False, True])
def test_peek_of_an_expired_entry_reads_default_unless_returned(out_type: int, return_expired: bool) -> None:
    """peek leaves an expired entry in place (status 2); its row holds the
    default unless expired values are returned, in every output form."""
    maps = _maps(8)
    kgs = np.zeros(2, dtype=np.int32)
    keys = np.array([1, 2])
    column_put(maps, kgs, keys, NS, np.array([10**6, 7]), 0)
    column_put(maps, kgs[1:], keys[1:], NS, np.array([8]), 10)  # key 2 stays live
    vals, status = column_get(maps, kgs, keys, NS, 12, 5, False, -1, return_expired, out_type, True)
    assert status.tolist() == [2, 1]
    assert list(vals) == [10**6 if return_expired else -1, 8]
    assert maps[0].contains_key(1, NS)  # still there: peek changes nothing


def test_fold_and_put_refuse_a_missing_map_before_writing() -> None:
    from cowmap._core import FOLD_ADD

    maps = _maps(8)
    kgs = np.array([0, 0, NMAPS - 1, 0], dtype=np.int32)
    keys = np.array([1, 2, 3, 4])
    with pytest.raises(ValueError, match="no map for key group"):
        column_fold(maps, kgs, keys, NS, np.array([10, 20, 30, 40]), FOLD_ADD)
    with pytest.raises(ValueError, match="no map for key group"):
        column_put(maps, kgs, keys, NS, np.array([10, 20, 30, 40]))
    assert len(maps[0]) == 0
    with pytest.raises(TypeError, match="states must be a tuple"):
        column_put(maps, kgs[:1], keys[:1], NS, [1])


def test_column_put_with_a_timestamp_per_row() -> None:
    """A restore writes each row with its own timestamp: ``ts`` as an int64 array."""
    from cowmap._core import CopyOnWriteStateMap, column_put

    maps = [CopyOnWriteStateMap(), CopyOnWriteStateMap()]
    keys = np.arange(10, dtype=np.int64)
    kgs = (keys % 2).astype(np.int32)
    stamps = keys * 1000 + 7
    column_put(maps, kgs, keys, "ns", keys * 3, stamps)
    column_put(maps, kgs[:2], keys[:2], "ns", (("a",), ("b",)), stamps[:2][::-1].copy())
    for k in range(10):
        m = maps[k % 2]
        assert m.timestamp(k, "ns") == (stamps[1 - k] if k < 2 else stamps[k])
        assert m.get(k, "ns") == ((("a",), ("b",))[k] if k < 2 else k * 3)
    with pytest.raises(ValueError, match="timestamps"):
        column_put(maps, kgs, keys, "ns", keys, stamps[:3])
    with pytest.raises(TypeError, match="int64 array"):
        column_put(maps, kgs, keys, "ns", keys, stamps.astype(np.float64))


# ---------------------------------------------------------------- located writes

between_ops = st.lists(
    st.one_of(
        st.tuples(st.just("put"), st.integers(0, 40), st.integers(-5, 5)),
        st.tuples(st.just("remove"), st.integers(0, 40)),
        st.tuples(st.just("snapshot"), st.booleans()),  # released at once, or kept to the end
        st.tuples(st.just("grow"), st.integers(0, NMAPS - 1)),  # enough inserts to start a rehash
    ),
    max_size=4,
)


@settings(max_examples=200, deadline=None)
@given(
    start=st.dictionaries(st.integers(0, 40), st.integers(-9, 9), max_size=30),
    keys=st.lists(st.integers(0, 40), max_size=25),
    between=between_ops,
    values=st.data(),
    as_floats=st.booleans(),
)
def test_a_write_through_a_reads_locations_equals_a_plain_write(
    start: dict[int, int], keys: list[int], between: list[Any], values: Any, as_floats: bool
) -> None:
    """get with ColumnLocations, anything in between, then put of the same keys
    through them: the maps (and every snapshot taken in between) end as a plain
    put leaves them, and with nothing in between every row whose key the read
    found (in a map not rehashing) is written in place."""
    vals = values.draw(st.lists(st.integers(-1000, 1000), min_size=len(keys), max_size=len(keys)))
    states = np.array(vals, dtype=np.float64 if as_floats else np.int64)
    sides = []
    for located in (True, False):
        maps = [CopyOnWriteStateMap(capacity=64) for _ in range(NMAPS)]  # no rehash unless grown
        for k, v in start.items():
            maps[k % NMAPS].put(k, NS, v * 1000)  # not a small int: rewritten in place when only the map holds it
        ks = np.array(keys, dtype=np.int64)
        kgs = np.array([k % NMAPS for k in keys], dtype=np.int32)
        loc = ColumnLocations() if located else None
        settled = not any(m.is_rehashing for m in maps)
        column_get(maps, kgs, ks, NS, out_type=COL_INT64, default=0, locations=loc)
        kept = []
        for op in between:
            if op[0] == "put":
                maps[op[1] % NMAPS].put(op[1], NS, op[2])
            elif op[0] == "remove":
                maps[op[1] % NMAPS].remove(op[1], NS)
            elif op[0] == "snapshot":
                s = [m.snapshot() for m in maps]
                if op[1]:
                    for x in s:
                        x.release()
                else:
                    kept.append(s)
            else:
                m = maps[op[1]]
                for i in range(1000, 1000 + 2 * m.capacity):
                    m.put(i * NMAPS + op[1], NS, i)
        column_put(maps, kgs, ks, NS, states, locations=loc)
        if located and not between and settled:  # every row whose key the read found
            assert loc.written == (0 if PLAIN_BATCH else sum(k in start for k in keys))
        sides.append(([sorted(_entries(m), key=repr) for m in maps],
                      [[sorted(x.iter_with_timestamps(), key=repr) for x in s] for s in kept]))
        for s in kept:
            for x in s:
                x.release()
    assert sides[0] == sides[1]


def test_locations_of_other_keys_or_another_namespace_are_not_used() -> None:
    maps = [CopyOnWriteStateMap(capacity=4) for _ in range(NMAPS)]
    ks = np.arange(10, dtype=np.int64)
    kgs = (ks % NMAPS).astype(np.int32)
    column_put(maps, kgs, ks, NS, ks * 1000)
    loc = ColumnLocations()
    column_get(maps, kgs, ks, NS, out_type=COL_INT64, default=0, locations=loc)
    assert loc.kgs_for(ks.copy(), NS) is kgs and loc.kgs_for(ks[::-1].copy(), NS) is None
    column_put(maps, kgs[::-1].copy(), ks[::-1].copy(), NS, ks, locations=loc)  # other keys: looked up
    assert loc.written == 0
    column_put(maps, kgs, ks, "other", ks, locations=loc)  # another namespace
    assert loc.written == 0
    column_get(maps, kgs, ks, NS, out_type=COL_INT64, default=0, locations=loc)  # the put above added entries
    column_put(maps, kgs, ks, NS, ks + 7, locations=loc)
    assert loc.written == (0 if PLAIN_BATCH else 10)  # the plain build looks every row up
    assert [maps[k % NMAPS].get(k, NS) for k in range(10)] == [k + 7 for k in range(10)]
    assert [maps[k % NMAPS].get(k, "other") for k in range(10)] == list(range(10))
    # the maps replaced (a restore): the locations hold none of them, and the new ones are told apart
    column_get(maps, kgs, ks, NS, out_type=COL_INT64, default=0, locations=loc)
    del maps[:]
    maps += [CopyOnWriteStateMap(capacity=4) for _ in range(NMAPS)]
    column_put(maps, kgs, ks, NS, ks, locations=loc)
    assert loc.written == 0
    assert [maps[k % NMAPS].get(k, NS) for k in range(10)] == list(range(10))


# an int64 column's ints are kept in the entries: every way out gives them back as ints
EDGE_INTS = [0, 1, -1, 255, 257, -6, 2**30, -(2**30), 2**62 - 1, 2**62, -(2**62), -(2**62) - 1, 2**63 - 1, -(2**63)]


def test_ints_written_by_a_column_read_back_as_ints_everywhere() -> None:
    n = len(EDGE_INTS)
    ks = np.arange(n, dtype=np.int64)
    kgs = np.zeros(n, dtype=np.int32)
    m = CopyOnWriteStateMap(capacity=64, copier=lambda s: s)
    column_put([m], kgs, ks, NS, np.array(EDGE_INTS, dtype=np.int64), 5)
    want = {k: v for k, v in enumerate(EDGE_INTS)}

    def same(got: Any, v: int) -> bool:
        return type(got) is int and got == v

    assert all(same(m.get(k, NS), v) for k, v in want.items())
    assert all(m.get_with_timestamp(k, NS) == (v, 5) for k, v in want.items())
    assert all(same(m.get_unexpired(k, NS, 6, 100), v) for k, v in want.items())
    for got, v in zip(m.get_many(ks, NS), EDGE_INTS):  # the pipelined batch read
        assert same(got, v)
    for got, v in zip(m.get_many(list(range(n)), NS), EDGE_INTS):  # the general one
        assert same(got, v)
    vals, _ = column_get([m], kgs, ks, NS, out_type=COL_LIST)
    assert vals == EDGE_INTS and all(type(v) is int for v in vals)
    ivals, _ = column_get([m], kgs, ks, NS, out_type=COL_INT64, default=0)
    assert ivals.tolist() == EDGE_INTS
    fvals, _ = column_get([m], kgs, ks, NS, out_type=COL_FLOAT64)
    assert fvals.tolist() == [float(v) for v in EDGE_INTS]
    assert sorted((k, s) for k, _, s in m) == sorted(want.items())
    with m.snapshot() as snap:
        assert sorted((k, s, ts) for k, _, s, ts in snap.iter_with_timestamps()) == [
            (k, v, 5) for k, v in sorted(want.items())
        ]
        keys, _, states, _ = snapshot_columns(snap, NS)
        assert dict(zip(list(keys), list(states))) == want
        column_put([m], kgs, ks, NS, ks * 7, 9)  # copy-on-write: the snapshot keeps its ints
        assert sorted((k, s) for k, _, s, _ in snap.iter_with_timestamps()) == sorted(want.items())
    assert all(same(m.get(k, NS), 7 * k) for k in range(n))
    column_put([m], kgs, ks, NS, np.array(EDGE_INTS, dtype=np.int64), 5)
    assert same(m.put_and_get_old(0, NS, "x"), EDGE_INTS[0])
    assert same(m.remove_and_get_old(1, NS), EDGE_INTS[1])
    m.transform(2, NS, 10, lambda old, v: old + v)
    assert same(m.get(2, NS), EDGE_INTS[2] + 10)
    m.set_timestamp(0, NS, 2000)
    m.set_timestamp(2, NS, 2000)
    removed: list[Any] = []
    assert m.sweep_expired(1000, 10, None, removed) == n - 3  # what was written at 5 and is still there
    assert sorted((k, s) for k, _, s in removed) == [(k, v) for k, v in sorted(want.items()) if k >= 3]
    assert all(type(s) is int for k, _, s in removed)
    assert sorted(k for k, _, _ in m) == [0, 2]


def test_ints_folded_or_written_by_columns_leak_nothing_when_overwritten() -> None:
    import gc
    import tracemalloc

    m = CopyOnWriteStateMap(capacity=64)
    ks = np.arange(500, dtype=np.int64)
    kgs = np.zeros(500, dtype=np.int32)
    big = np.full(500, 10**15, dtype=np.int64)

    def cycle() -> None:
        column_put([m], kgs, ks, NS, big)  # ints in the entries
        m.put_many(list(range(250)), NS, [10**15 + i for i in range(250)])  # objects over half
        column_fold([m], kgs, ks, NS, big, FOLD_ADD)
        column_put([m], kgs, ks, NS, tuple(range(500)))  # objects over all
        with m.snapshot():
            column_put([m], kgs, ks, NS, big)  # copies keep the snapshot's objects

    for _ in range(3):
        cycle()
    gc.collect()
    tracemalloc.start()
    base = tracemalloc.get_traced_memory()[0]
    for _ in range(30):
        cycle()
    gc.collect()
    grown = tracemalloc.get_traced_memory()[0] - base
    tracemalloc.stop()
    assert grown < 64 * 1024, grown
