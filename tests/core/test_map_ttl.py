"""Per-entry timestamps and ``sweep_expired`` of ``cowmap.CopyOnWriteStateMap``.

An entry is expired when ``ts + ttl <= now`` (inclusive), the sum saturating at 2**63 - 1 as in
Flink, so ``NO_TIMESTAMP`` (2**63 - 1) never expires before the clock reads 2**63 - 1. Sweeps do
bounded work per call, resume where the
previous call stopped and wrap around.
"""

from __future__ import annotations

import pickle
import random

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cowmap import NO_TIMESTAMP, CopyOnWriteStateMap
from cowmap._core import EXPIRED, FlatStateMap, column_get, column_put, maps_may_expire, wall_clock_ms

from core_helpers import map_contents, snapshot_contents_ts

INT64_MIN = -(2**63)
INT64_MAX = 2**63 - 1


def expired(ts: int, ttl: int, now: int) -> bool:
    """The reference rule: ``ts + ttl <= now`` with the sum saturating at 2**63 - 1,
    as Flink's ``TtlUtils.getExpirationTimestamp`` does."""
    return min(ts + ttl, INT64_MAX) <= now


def sweep_until_done(m: CopyOnWriteStateMap, now: int, ttl: int, expected_removed: int, max_entries: int = 5) -> int:
    """Call partial sweeps until ``expected_removed`` entries are gone; return the call count."""
    removed = calls = 0
    bound = 4 * (m.capacity + len(m)) + 100  # generous: every call examines >= 1 bucket/entry
    while removed < expected_removed:
        before = len(m)
        r = m.sweep_expired(now, ttl, max_entries)
        assert r == before - len(m), "return value must be the number of removed entries"
        removed += r
        calls += 1
        assert calls <= bound, f"sweep made no progress: {removed}/{expected_removed} after {calls} calls"
    assert removed == expected_removed
    return calls


# --------------------------------------------------------------------------- timestamps


def test_timestamp_accessors() -> None:
    m = CopyOnWriteStateMap()
    assert m.timestamp("k", 0) is None
    assert m.get_with_timestamp("k", 0) is None
    assert m.set_timestamp("k", 0, 5) is False
    assert not m.contains_key("k", 0) and len(m) == 0  # set_timestamp does not create

    m.put("k", 0, "v")
    assert m.timestamp("k", 0) == NO_TIMESTAMP
    assert m.get_with_timestamp("k", 0) == ("v", NO_TIMESTAMP)
    assert m.set_timestamp("k", 0, 42) is True
    assert m.timestamp("k", 0) == 42
    assert m.get("k", 0) == "v"
    m.put("k", 0, "w", 7)
    assert m.get_with_timestamp("k", 0) == ("w", 7)
    m.put("k", 0, "x")  # a write without ts resets to NO_TIMESTAMP
    assert m.timestamp("k", 0) == NO_TIMESTAMP
    for ts in (INT64_MIN, -1, 0, INT64_MAX):
        m.put("k", 0, "y", ts=ts)
        assert m.timestamp("k", 0) == ts
    m.remove("k", 0)
    assert m.timestamp("k", 0) is None and m.get_with_timestamp("k", 0) is None


def test_every_write_sets_the_timestamp() -> None:
    m = CopyOnWriteStateMap()
    m.put("a", 0, 1, 10)
    assert m.put_and_get_old("a", 0, 2, 20) == 1
    assert m.timestamp("a", 0) == 20
    m.put_and_get_old("a", 0, 3)
    assert m.timestamp("a", 0) == NO_TIMESTAMP
    m.transform("a", 0, 1, lambda o, v: o + v, ts=30)
    assert m.get_with_timestamp("a", 0) == (4, 30)
    m.transform("a", 0, 1, lambda o, v: o + v)
    assert m.get_with_timestamp("a", 0) == (5, NO_TIMESTAMP)
    m.transform("new", 0, 1, lambda o, v: v, 31)
    assert m.timestamp("new", 0) == 31
    m.put_many(["a", "b"], 0, ["A", "B"], ts=40)
    assert m.get_with_timestamp("a", 0) == ("A", 40) and m.get_with_timestamp("b", 0) == ("B", 40)
    m.put_many(["a"], 0, ["A2"])
    assert m.timestamp("a", 0) == NO_TIMESTAMP and m.timestamp("b", 0) == 40


def test_set_timestamp_on_shared_entry_does_not_change_snapshot() -> None:
    m = CopyOnWriteStateMap(copier=list)
    m.put("k", 0, [1], 5)
    with m.snapshot() as s:
        assert m.set_timestamp("k", 0, 99)
        assert m.get_with_timestamp("k", 0) == ([1], 99)
        assert snapshot_contents_ts(s) == {("k", 0): ([1], 5)}


# --------------------------------------------------------------------------- expiry rule


@pytest.mark.parametrize(
    ("ts", "ttl", "now"),
    [
        (100, 10, 110),  # inclusive: ts + ttl == now expires
        (100, 10, 109),
        (100, 10, 111),
        (-50, 10, -40),  # negative timestamps and clocks
        (-50, 10, -41),
        (INT64_MIN, 1, INT64_MIN + 1),
        (INT64_MIN, 1, INT64_MIN),
        (INT64_MIN, INT64_MAX, -1),  # ts + ttl == -1
        (INT64_MIN, INT64_MAX, -2),
        (NO_TIMESTAMP, 1, INT64_MAX - 1),  # no timestamp: never expires before the last instant
        (NO_TIMESTAMP, INT64_MAX, 0),
        (NO_TIMESTAMP, 1, INT64_MAX),  # saturated at INT64_MAX == now: expired, as in Flink
        (INT64_MAX - 10, 20, INT64_MAX - 1),  # ts + ttl overflows int64: saturates, not expired yet
        (INT64_MAX - 10, 20, INT64_MAX),  # ... but expired at the last instant
        (INT64_MAX - 10, 10, INT64_MAX),  # ts + ttl == INT64_MAX == now: expired
        (INT64_MAX - 10, 5, INT64_MAX),
        (5, INT64_MAX, INT64_MAX - 1),  # overflow
        (0, INT64_MAX, INT64_MAX),  # exactly INT64_MAX: expired
        (2**62, 2**62, 2**62 + 5),  # 2**63 overflows: not expired
    ],
)
def test_expiry_rule_is_inclusive_and_overflow_safe(ts: int, ttl: int, now: int) -> None:
    m = CopyOnWriteStateMap()
    m.put("k", "ns", "v", ts)
    m.put("keep", "ns", "v")  # NO_TIMESTAMP
    removed = m.sweep_expired(now, ttl, max_entries=None)
    should = expired(ts, ttl, now)
    assert removed == int(should) + int(expired(NO_TIMESTAMP, ttl, now))
    assert m.contains_key("k", "ns") is (not should)
    assert m.contains_key("keep", "ns") is (not expired(NO_TIMESTAMP, ttl, now))


@pytest.mark.parametrize("ttl", [1, 50, 2**32, 2**62, INT64_MAX])
@pytest.mark.parametrize("now", [0, INT64_MAX - 100, INT64_MAX])
def test_timestamps_near_int64_max(ttl: int, now: int) -> None:
    m = CopyOnWriteStateMap()
    for i in range(100):
        m.put(i, 0, i)  # NO_TIMESTAMP: expires only at the last instant, INT64_MAX
        m.put(i, 1, i, INT64_MAX - i)
    n_expired = sum(expired(INT64_MAX - i, ttl, now) for i in range(100))
    n_expired += 100 * expired(NO_TIMESTAMP, ttl, now)
    assert m.sweep_expired(now, ttl, None) == n_expired
    for i in range(100):
        assert m.contains_key(i, 0) is (now != INT64_MAX)
        assert m.contains_key(i, 1) is not expired(INT64_MAX - i, ttl, now)


@pytest.mark.parametrize("ttl", [0, -1, INT64_MIN])
def test_non_positive_ttl_is_value_error(ttl: int) -> None:
    m = CopyOnWriteStateMap()
    m.put("k", 0, "v", 0)
    with pytest.raises(ValueError):
        m.sweep_expired(100, ttl)
    with pytest.raises(ValueError):
        m.sweep_expired(100, ttl, None)
    assert m.contains_key("k", 0)


def test_bad_sweep_argument_types() -> None:
    m = CopyOnWriteStateMap()
    m.put("k", 0, "v", 0)
    with pytest.raises(TypeError):
        m.sweep_expired("100", 10)  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        m.sweep_expired(100, 1.5)  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        m.sweep_expired(100, 10, "5")  # type: ignore[arg-type]
    assert m.contains_key("k", 0)


def test_sweep_of_empty_map() -> None:
    m = CopyOnWriteStateMap()
    assert m.sweep_expired(10, 1) == 0
    assert m.sweep_expired(10, 1, None) == 0
    m.put(1, 1, 1, 0)
    m.remove(1, 1)
    assert m.sweep_expired(10, 1) == 0


# --------------------------------------------------------------------------- full and partial sweeps


def test_full_sweep_removes_exactly_the_expired() -> None:
    rng = random.Random(7)
    m = CopyOnWriteStateMap(capacity=4)
    ts_of = {}
    for k in range(5000):
        ts = rng.choice([rng.randrange(-1000, 1000), NO_TIMESTAMP])
        m.put(k, k % 5, k, ts)
        ts_of[(k, k % 5)] = ts
    now, ttl = 300, 100
    exp = {key for key, ts in ts_of.items() if expired(ts, ttl, now)}
    assert 0 < len(exp) < len(ts_of)
    assert m.sweep_expired(now, ttl, max_entries=None) == len(exp)
    assert set(map_contents(m)) == set(ts_of) - exp
    assert m.sweep_expired(now, ttl, max_entries=None) == 0


def test_one_partial_sweep_is_bounded() -> None:
    m = CopyOnWriteStateMap()
    for k in range(10_000):
        m.put(k, 0, k, 0)
    r = m.sweep_expired(1000, 1)  # max_entries defaults to 5
    assert 1 <= r <= 50, f"one sweep with max_entries=5 removed {r} of 10000 expired entries"
    assert len(m) == 10_000 - r
    r2 = m.sweep_expired(1000, 1, max_entries=5)
    assert 1 <= r2 <= 50
    assert len(m) == 10_000 - r - r2


@pytest.mark.parametrize("max_entries", [1, 5, 64])
def test_partial_sweeps_eventually_remove_all_expired(max_entries: int) -> None:
    rng = random.Random(max_entries)
    m = CopyOnWriteStateMap()
    expired_keys, live_keys = set(), set()
    for k in range(3000):
        if rng.random() < 0.5:
            m.put(k, "ns", k, rng.randrange(0, 100))  # expired at now=200, ttl=100
            expired_keys.add(k)
        else:
            m.put(k, "ns", k, rng.choice([100 + rng.randrange(1, 1000), NO_TIMESTAMP]))
            live_keys.add(k)
    per_call = []
    removed = 0
    calls = 0
    while removed < len(expired_keys):
        r = m.sweep_expired(200, 100, max_entries)
        per_call.append(r)
        removed += r
        calls += 1
        assert calls <= 4 * (m.capacity + 3000)
        assert r <= max_entries + 45  # about max_entries (whole chains may add a few)
    assert removed == len(expired_keys)
    assert {k for (k, _ns) in map_contents(m)} == live_keys
    # more sweeps (wrapping around several times) never remove an unexpired entry
    for _ in range(2000):
        assert m.sweep_expired(200, 100, max_entries) == 0
    assert len(m) == len(live_keys)


def test_sweeps_resume_and_wrap_around() -> None:
    m = CopyOnWriteStateMap(capacity=1024)
    for k in range(600):
        m.put(k, 0, k, 0)
    sweep_until_done(m, 10, 1, 600)
    assert len(m) == 0
    # new expired entries anywhere in the table are found by the continuing sweep
    for k in range(600, 1200):
        m.put(k, 0, k, 3)
    for k in range(1200, 1300):
        m.put(k, 0, k)
    sweep_until_done(m, 10, 1, 600)
    assert {k for k, _ in map_contents(m)} == set(range(1200, 1300))


def test_sweep_progress_is_not_restarted_by_other_operations() -> None:
    """Sweeping continues where the last call stopped, so interleaved lookups do not make it
    re-examine the same entries forever: a few thousand calls clear everything."""
    m = CopyOnWriteStateMap(capacity=8192)
    for k in range(5000):
        m.put(k, 0, k, 0)
    removed = 0
    calls = 0
    while len(m):
        removed += m.sweep_expired(5, 1, 5)
        m.get(calls, 0)
        m.contains_key(calls + 1, 0)
        calls += 1
        assert calls <= 8192 + 5000
    assert removed == 5000


def test_partial_sweeps_while_rehashing() -> None:
    rng = random.Random(3)
    m = CopyOnWriteStateMap(capacity=16)
    live, dead = set(), set()
    saw_rehash = False
    for k in range(4000):
        ts = rng.choice([0, NO_TIMESTAMP, 500])
        m.put(k, 1, k, ts)
        (dead if ts == 0 else live).add(k)
        saw_rehash |= m.is_rehashing
        before = len(m)
        r = m.sweep_expired(100, 50, 3)
        assert r == before - len(m)
        if k % 50 == 0:
            present = {key for key, _ in map_contents(m)}
            assert live <= present, "an unexpired entry was swept"
            assert present <= live | dead
    assert saw_rehash
    # with puts stopped, the sweep finishes the job
    remaining_dead = {key for key, _ in map_contents(m)} - live
    sweep_until_done(m, 100, 50, len(remaining_dead), max_entries=3)
    assert {key for key, _ in map_contents(m)} == live


@pytest.mark.parametrize("steps", [0, 1, 5])
def test_full_sweep_while_rehashing(steps: int) -> None:
    m = CopyOnWriteStateMap()
    nxt = 0
    while not m.is_rehashing:
        m.put(nxt, 0, nxt, ts=nxt)
        nxt += 1
    for i in range(steps):
        m.get(i, 0)  # a few rehash steps: entries in both tables
    assert m.is_rehashing
    n_expired = sum(expired(k, 10, 60) for k in range(nxt))
    assert m.sweep_expired(60, 10, None) == n_expired
    assert {k for k, _ in map_contents(m)} == {k for k in range(nxt) if not expired(k, 10, 60)}


def test_snapshot_taken_before_sweep_keeps_swept_entries() -> None:
    m = CopyOnWriteStateMap(capacity=4, copier=list)
    for k in range(200):
        m.put(k, "ns", [k], ts=k)
    expected = {(k, "ns"): ([k], k) for k in range(200)}
    with m.snapshot() as s:
        assert m.sweep_expired(150, 50, None) == 101  # ts in 0..100
        sweep_until_done(m, 199 + 50, 50, 99)
        assert len(m) == 0
        assert len(s) == 200
        assert snapshot_contents_ts(s) == expected
    # sweeping again after release still works on a fresh fill
    for k in range(10):
        m.put(k, "ns", [k], ts=0)
    assert m.sweep_expired(1, 1, None) == 10


def test_sweep_with_interleaved_snapshots() -> None:
    m = CopyOnWriteStateMap(capacity=64, copier=list)
    for k in range(1000):
        m.put(k, 0, [k], ts=k % 10)
    snaps = []
    removed = 0
    for i in range(300):
        if i % 60 == 0:
            snaps.append((m.snapshot(), map_contents_ts(m)))
        removed += m.sweep_expired(5, 1, 5)  # ts <= 4 expires: 500 entries
        if i % 90 == 45 and snaps:
            s, _ = snaps.pop(0)
            s.release()
    for s, exp in snaps:
        assert snapshot_contents_ts(s) == exp
        s.release()
    sweep_until_done(m, 5, 1, 500 - removed)
    assert {k for k, _ in map_contents(m)} == {k for k in range(1000) if k % 10 >= 5}


def map_contents_ts(m: CopyOnWriteStateMap) -> dict:
    """``{(key, ns): (state, ts)}`` of the map, as a deep enough copy to compare later."""
    return {(k, ns): (list(st), m.timestamp(k, ns)) for k, ns, st in list(m)}


def test_a_time_provider_stands_for_the_time_and_is_called_once_per_call() -> None:
    calls: list[int] = []

    def clock() -> int:
        calls.append(1)
        return 1000 + len(calls)

    m = CopyOnWriteStateMap()
    m.put("k", "ns", "v", clock)
    assert m.timestamp("k", "ns") == 1001 and len(calls) == 1
    assert m.replace("k", "ns", "w", clock) and m.timestamp("k", "ns") == 1002
    assert m.get_unexpired("k", "ns", clock, ttl=10) == "w" and len(calls) == 3
    assert m.get_unexpired("k", "ns", lambda: 1012, ttl=10) is EXPIRED  # ts + ttl <= now
    before = wall_clock_ms()
    m.put("k", "ns", "x", wall_clock_ms)  # read in C
    assert before <= m.timestamp("k", "ns") <= wall_clock_ms()
    for bad in (lambda: 1.5, lambda: None, lambda: "1"):
        with pytest.raises(TypeError, match="time_provider must return int milliseconds"):
            m.put("k", "ns", "y", bad)
    assert m.get("k", "ns") == "x"  # a failing provider changes nothing
    with pytest.raises(TypeError, match="must be an int"):
        m.put("k", "ns", "y", 1.5)


# --------------------------------------------------------------------------- expiry floor

# few keys and times, so that writes below the floor, refreshes and expiries meet often
_KEY = st.integers(0, 9)
_TIME = st.sampled_from([0, 40, 80, 120, 160, 200, 240, 280, 320])
_FLOOR_OPS = st.lists(
    st.one_of(
        st.tuples(st.just("put"), _KEY, _TIME),
        st.tuples(st.just("put_no_ts"), _KEY),
        st.tuples(st.just("put_many"), st.lists(_KEY, max_size=12), _TIME),
        st.tuples(st.just("column_put"), st.lists(_KEY, max_size=12), _TIME),
        st.tuples(st.just("column_put_float"), st.lists(_KEY, max_size=12), _TIME),
        st.tuples(st.just("column_refresh"), st.lists(_KEY, max_size=12), _TIME),
        st.tuples(st.just("set_ts"), _KEY, _TIME),
        st.tuples(st.just("touch"), _KEY, _TIME),
        st.tuples(st.just("refresh"), _KEY, _TIME),
        st.tuples(st.just("remove"), _KEY),
        st.tuples(st.just("snapshot")),
        st.tuples(st.just("release")),
        st.tuples(st.just("sweep"), _TIME, st.integers(1, 12)),
        st.tuples(st.just("full_sweep"), _TIME),
    ),
    max_size=60,
)


@settings(max_examples=300, deadline=None)
@given(ops=_FLOOR_OPS, capacity=st.sampled_from([4, 8, 64]))
def test_the_expiry_floor_bounds_every_live_timestamp_and_sweeps_find_what_expired(
    ops: list[tuple], capacity: int
) -> None:
    """Every way a timestamp is written (single, batch, column, refresh, touch)
    lowers the floor as far as it must, through snapshots (copy-on-write) and
    rehash; a sweep skips a map only when nothing in it has expired; a full
    round raises the floor to the least live timestamp."""
    ttl = 100
    m = CopyOnWriteStateMap(capacity=capacity)
    snaps = []

    def live_ts() -> dict:
        return {k: m.timestamp(k, 0) for k, _ns, _st in list(m)}

    for op in ops:
        kind = op[0]
        if kind == "put":
            m.put(op[1], 0, "v", op[2])
        elif kind == "put_no_ts":
            m.put(op[1], 0, "v")
        elif kind == "put_many":
            m.put_many(np.array(op[1], dtype=np.int64), 0, ["v"] * len(op[1]), op[2])
        elif kind in ("column_put", "column_put_float", "column_refresh"):
            keys = np.array(op[1], dtype=np.int64)
            kgs = np.zeros(len(keys), dtype=np.int32)
            if kind == "column_put":
                column_put([m], kgs, keys, 0, np.arange(len(keys), dtype=np.int64), op[2])
            elif kind == "column_put_float":  # floats a map owns alone are rewritten in place
                column_put([m], kgs, keys, 0, np.arange(len(keys), dtype=np.float64) + 0.5, op[2])
            else:  # a TTL read that refreshes (and removes what expired)
                column_get([m], kgs, keys, 0, op[2], ttl, True)
        elif kind == "set_ts":
            m.set_timestamp(op[1], 0, op[2])
        elif kind == "touch":
            m.get_touch(op[1], 0, op[2])
        elif kind == "refresh":
            m.get_unexpired(op[1], 0, op[2], ttl, refresh=True)
        elif kind == "remove":
            m.remove(op[1], 0)
        elif kind == "snapshot":
            snaps.append(m.snapshot())
        elif kind == "release" and snaps:
            snaps.pop(0).release()
        elif kind in ("sweep", "full_sweep"):
            now = op[1]
            before = live_ts()
            due = {k for k, ts in before.items() if expired(ts, ttl, now)}
            assert maps_may_expire([m], now, ttl) or not due, "a map with expired entries would be skipped"
            ran = expired(m.expiry_floor, ttl, now)
            removed = m.sweep_expired(now, ttl, op[2] if kind == "sweep" else None)
            after = live_ts()
            gone = set(before) - set(after)
            assert gone <= due and removed == len(gone)
            assert {k: before[k] for k in after} == after
            if kind == "full_sweep":
                assert gone == due
                if ran:  # a whole round: the floor is the least timestamp left
                    assert m.expiry_floor == min(after.values(), default=NO_TIMESTAMP)
        ts = live_ts()
        assert m.expiry_floor <= min(ts.values(), default=NO_TIMESTAMP)
    for s in snaps:
        s.release()


def test_sweeps_skip_a_map_where_nothing_has_expired_and_resume_when_something_does() -> None:
    m = CopyOnWriteStateMap()
    assert m.expiry_floor == NO_TIMESTAMP and not maps_may_expire([m, None], 10**12, 1)
    for k in range(1000):
        m.put(k, 0, k, 1000 + k)
    assert m.expiry_floor == 1000
    assert not maps_may_expire([m], 1099, 100) and m.sweep_expired(1099, 100, None) == 0
    assert maps_may_expire([None, m], 1100, 100)
    assert m.sweep_expired(1100, 100, None) == 1  # key 0 expired
    assert m.expiry_floor == 1001  # the full round raised the floor
    m.set_timestamp(500, 0, 7)  # a write below the floor lowers it
    assert m.expiry_floor == 7 and maps_may_expire([m], 107, 100)
    with pytest.raises(TypeError, match="CopyOnWriteStateMap, FlatStateMap or None"):
        maps_may_expire([m, "x"], 0, 1)
    with pytest.raises(ValueError, match="ttl must be > 0"):
        maps_may_expire([m], 0, 0)


def _write_paths() -> dict:
    """Each way a write gives key 5 of a map the timestamp 200."""
    kgs, key = np.zeros(1, dtype=np.int32), np.array([5], dtype=np.int64)
    return {
        "put": lambda m: m.put(5, 0, "w", 200),
        "replace": lambda m: m.replace(5, 0, "w", 200),
        "set_timestamp": lambda m: m.set_timestamp(5, 0, 200),
        "get_touch": lambda m: m.get_touch(5, 0, 200),
        "refresh": lambda m: m.get_unexpired(5, 0, 200, 1000, refresh=True),
        "put_many": lambda m: m.put_many(key, 0, ["w"], 200),
        "column_put": lambda m: column_put([m], kgs, key, 0, np.array([7], dtype=np.int64), 200),
        "column_put_float": lambda m: column_put([m], kgs, key, 0, np.array([2.5]), 200),
        "column_refresh": lambda m: column_get([m], kgs, key, 0, 200, 1000, True),
        "transform": lambda m: m.transform(5, 0, 1, lambda a, b: b, 200),
    }


@pytest.mark.parametrize("path", sorted(_write_paths()))
@pytest.mark.parametrize("shared", [False, True], ids=["alone", "with_snapshot"])
def test_every_write_below_the_floor_lowers_it(path: str, shared: bool) -> None:
    m = CopyOnWriteStateMap()
    kgs, key = np.zeros(1, dtype=np.int32), np.array([5], dtype=np.int64)
    column_put([m], kgs, key, 0, np.array([1.5]), 300)  # a float the map owns alone
    m.put(6, 0, "x", 300)
    snap = m.snapshot() if shared else None
    _write_paths()[path](m)
    assert m.timestamp(5, 0) == 200
    assert m.expiry_floor <= 200 and maps_may_expire([m], 200 + 50, 50)
    assert m.sweep_expired(250, 50, None) == 1 and m.timestamp(5, 0) is None
    if snap is not None:
        snap.release()


def test_a_flat_maps_floor_skips_sweeps_until_something_can_have_expired() -> None:
    """FlatStateMap keeps the same floor: every timestamp written lowers it (a
    put, a replace, a refreshing read), and a full sweep raises it."""
    f = FlatStateMap()
    assert f.expiry_floor == NO_TIMESTAMP
    for k in range(200):
        f.put(k, "ns", k, 1000 + k)
    assert f.expiry_floor == 1000 and not maps_may_expire([f], 1099, 100)
    assert f.sweep_expired(1099, 100, 5) == 0 and len(f) == 200
    assert maps_may_expire([f, None], 1100, 100)
    assert f.sweep_expired(1100, 100, None) == 1 and f.expiry_floor == 1001
    f.put(150, "ns", "w", 10)  # an overwrite
    assert f.expiry_floor == 10
    f.put(150, "ns", "w", 2000)
    assert f.sweep_expired(1101, 100, None) == 1 and f.expiry_floor == 1002  # key 1
    assert f.get_unexpired(7, "ns", 5, 10_000, refresh=True) == 7  # a refresh back in time
    assert f.expiry_floor == 5 and f.sweep_expired(4_000, 10_000, None) == 0
    assert f.timestamp(7, "ns") == 5


@settings(max_examples=150, deadline=None)
@given(
    ops=st.lists(
        st.tuples(st.sampled_from(["put", "get", "get_refresh", "tick", "sweep", "column"]),
                  st.integers(0, 30), st.integers(0, 400)),
        max_size=60,
    )
)
def test_a_manual_clock_read_in_c_is_the_same_time_as_a_python_provider(ops: list) -> None:
    """Every map call given a ``ManualClock`` (read in C) acts as with a Python
    callable returning the same time, on both map kinds and the column calls."""
    from cowmap._core import ManualClock

    clock = ManualClock(1_000)
    now = [1_000]
    a, b = CopyOnWriteStateMap(), CopyOnWriteStateMap()
    fa, fb = FlatStateMap(), FlatStateMap()
    ttl = 250
    for op, key, arg in ops:
        if op == "tick":
            clock.ms += arg
            now[0] += arg
        elif op == "put":
            a.put(key, "n", arg, clock)
            b.put(key, "n", arg, lambda: now[0])
            fa.put(key, "n", arg, clock)
            fb.put(key, "n", arg, lambda: now[0])
        elif op in ("get", "get_refresh"):
            refresh = op == "get_refresh"
            for m, twin in ((a, b), (fa, fb)):
                assert m.get_unexpired(key, "n", clock, ttl, refresh) == twin.get_unexpired(
                    key, "n", lambda: now[0], ttl, refresh
                )
        elif op == "sweep":
            assert a.sweep_expired(clock(), ttl, None) == b.sweep_expired(now[0], ttl, None)
        else:
            keys = np.arange(key, key + 5, dtype=np.int64)
            kgs = np.zeros(5, dtype=np.int32)
            column_put([a], kgs, keys, "n", (arg,) * 5, clock)
            column_put([b], kgs, keys, "n", (arg,) * 5, lambda: now[0])
    with a.snapshot() as sa, b.snapshot() as sb:
        assert snapshot_contents_ts(sa) == snapshot_contents_ts(sb)
    assert repr(clock) == f"ManualClock({now[0]})" and clock() == now[0]
    assert pickle.loads(pickle.dumps(clock)).ms == now[0]
    with pytest.raises(TypeError):
        clock.ms = "1"  # type: ignore[assignment]
