"""``FlatStateMap``: the open-addressed map with inline entries, against a dict model.

The state machines mirror every operation on ``{(key, ns): (state, ts)}`` with tiny segments
(``max_shift=3``: 8 slots), so that puts split segments and double the directory all the time,
interleaved with snapshots (each checked against the model frozen when it was taken), TTL sweeps
(whose removals shift probe runs back) and, in the copier machine, list states mutated in place.
"""

from __future__ import annotations

import gc
import sys
import tracemalloc
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from hypothesis.stateful import Bundle, RuleBasedStateMachine, consumes, invariant, rule

from cowmap import NO_TIMESTAMP
from cowmap._core import EXPIRED, FlatStateMap, flat_column_lookup

from core_helpers import CountingCopier, ListStates, PlainStates, as_dict
from test_map_statemachine import INT64_MAX, INT64_MIN, KEYS, NAMESPACES, NOWS, OPT_TS, TTLS, SnapRecord, is_expired


class FlatMachine(PlainStates, RuleBasedStateMachine):
    """Immutable states; no copier."""

    snapshots = Bundle("snapshots")

    def __init__(self) -> None:
        super().__init__()
        self.m = FlatStateMap(copier=self.make_copier(), max_shift=3)
        self.model: dict[tuple[Any, Any], tuple[Any, int]] = {}
        self.live: list[SnapRecord] = []

    def contents(self) -> dict:
        with self.m.snapshot() as s:
            return {k: (self.norm(v), ts) for k, (v, ts) in as_dict(s.iter_with_timestamps()).items()}

    def in_order(self, snapshot: Any) -> list:
        """The snapshot's entries in insertion order, as ``((key, ns), (state, ts))``."""
        return [((k, ns), (self.norm(v), ts)) for k, ns, v, ts in snapshot.iter_with_timestamps(True)]

    # -- single entries ---------------------------------------------------------------------

    @rule(key=KEYS, ns=NAMESPACES, state=st.data(), ts=OPT_TS)
    def put(self, key, ns, state, ts) -> None:
        obj = self.new_state(state.draw(self.STATES))
        added = self.m.put(key, ns, obj) if ts is None else self.m.put(key, ns, obj, ts)
        assert added == ((key, ns) not in self.model)
        self.model[(key, ns)] = (self.norm(obj), NO_TIMESTAMP if ts is None else ts)

    @rule(key=KEYS, ns=NAMESPACES)
    def get(self, key, ns) -> None:
        assert self.norm(self.m.get(key, ns)) == self.expected_state(key, ns)

    @rule(key=KEYS, ns=NAMESPACES)
    def contains_key(self, key, ns) -> None:
        assert self.m.contains_key(key, ns) == ((key, ns) in self.model)
        entry = self.model.get((key, ns))
        assert self.m.timestamp(key, ns) == (None if entry is None else entry[1])

    @rule(key=KEYS, ns=NAMESPACES)
    def remove(self, key, ns) -> None:
        assert self.m.remove(key, ns) == ((key, ns) in self.model)
        self.model.pop((key, ns), None)

    @rule(key=KEYS, ns=NAMESPACES)
    def remove_and_get_old(self, key, ns) -> None:
        old = self.m.remove_and_get_old(key, ns)
        assert self.norm(old) == self.expected_state(key, ns)
        self.model.pop((key, ns), None)
        self.scribble(old)

    def scribble(self, old_state: Any) -> None:
        pass

    @rule(key=KEYS, ns=NAMESPACES, now=NOWS, ttl=TTLS, refresh=st.booleans())
    def get_unexpired(self, key, ns, now, ttl, refresh) -> None:
        got = self.m.get_unexpired(key, ns, now, ttl, refresh)
        entry = self.model.get((key, ns))
        if entry is None:
            assert got is None
        elif is_expired(entry[1], ttl, now):
            assert got is EXPIRED
        else:
            assert self.norm(got) == entry[0]
            if refresh:
                self.model[(key, ns)] = (entry[0], now)

    # -- TTL sweeps -------------------------------------------------------------------------

    @rule(now=NOWS, ttl=TTLS, max_entries=st.integers(1, 8))
    def sweep_partial(self, now, ttl, max_entries) -> None:
        """A bounded sweep removes some expired entries (reported in ``removed``), nothing else."""
        removed: list = []
        n = self.m.sweep_expired(now, ttl, max_entries, removed)
        assert n == len(removed)
        for key, ns, state in removed:
            st_, ts = self.model.pop((key, ns))
            assert is_expired(ts, ttl, now), f"unexpired {(key, ns)} swept"
            assert self.norm(state) == st_

    @rule(now=NOWS, ttl=TTLS)
    def sweep_full(self, now, ttl) -> None:
        expired = [k for k, (_, ts) in self.model.items() if is_expired(ts, ttl, now)]
        assert self.m.sweep_expired(now, ttl, None) == len(expired)
        for k in expired:
            del self.model[k]

    @rule(data=st.data(), ttl=TTLS, delta=st.sampled_from([-1, 0, 1]))
    def sweep_at_boundary(self, data, ttl, delta) -> None:
        if not self.model:
            return
        key = data.draw(st.sampled_from(sorted(self.model, key=repr)))
        self.sweep_full(min(max(self.model[key][1] + ttl + delta, INT64_MIN), INT64_MAX), ttl)

    # -- snapshots --------------------------------------------------------------------------

    @rule(target=snapshots)
    def take_snapshot(self) -> SnapRecord:
        rec = SnapRecord(self.m.snapshot(), dict(self.model))
        self.live.append(rec)
        return rec

    @rule(rec=snapshots)
    def check_snapshot(self, rec: SnapRecord) -> None:
        s = rec.snapshot
        assert len(s) == len(rec.expected)
        got = {k: (self.norm(v), ts) for k, (v, ts) in as_dict(s.iter_with_timestamps()).items()}
        assert got == rec.expected
        assert {k: self.norm(v) for k, v in as_dict(iter(s)).items()} == {k: v for k, (v, _) in rec.expected.items()}
        # the model is a dict: an overwrite keeps a key's place, a removal and a new put move it last
        assert self.in_order(s) == list(rec.expected.items())

    @rule(rec=consumes(snapshots))
    def release_snapshot(self, rec: SnapRecord) -> None:
        self.check_snapshot(rec)
        rec.snapshot.release()
        rec.snapshot.release()
        assert rec.snapshot.released
        self.live.remove(rec)

    # -- invariants -------------------------------------------------------------------------

    @invariant()
    def same_contents(self) -> None:
        assert len(self.m) == len(self.model)
        assert self.contents() == self.model
        with self.m.snapshot() as s:
            assert self.in_order(s) == list(self.model.items())

    def teardown(self) -> None:
        for rec in self.live:
            self.check_snapshot(rec)
            rec.snapshot.release()


class FlatCopierMachine(ListStates, FlatMachine):
    """List states with a copier, mutated in place where user code may: snapshots never see it."""

    @rule(key=KEYS, ns=NAMESPACES, value=st.integers(0, 9))
    def get_and_mutate(self, key, ns, value) -> None:
        calls = self.copier.calls
        state = self.m.get(key, ns)
        assert self.norm(state) == self.expected_state(key, ns)
        assert self.m.get(key, ns) is state  # the second get returns the same object
        if not self.live:
            assert self.copier.calls == calls
        if state is not None:
            state.append(value)
            old, ts = self.model[(key, ns)]
            self.model[(key, ns)] = (old + (value,), ts)


_SETTINGS = settings(
    max_examples=300,
    stateful_step_count=80,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
TestFlatMachine = FlatMachine.TestCase
TestFlatMachine.settings = _SETTINGS
TestFlatCopierMachine = FlatCopierMachine.TestCase
TestFlatCopierMachine.settings = _SETTINGS


# ------------------------------------------------------------------------------ unit tests


def test_growth_splits_segments_and_keeps_every_snapshot():
    m = FlatStateMap(max_shift=4)
    snaps = []
    for i in range(3000):
        m.put(i, i % 3, i)
        if i % 500 == 0:
            snaps.append((m.snapshot(), {(k, k % 3): k for k in range(i + 1)}))
    assert m.segments_depth >= 8  # 16-slot segments: the directory doubled many times
    for i in range(0, 3000, 2):
        assert m.remove(i, i % 3)
    for s, expected in snaps:
        assert as_dict(s) == expected
        s.release()
    assert as_dict(m) == {(k, k % 3): k for k in range(1, 3000, 2)}


def test_insertion_order_holds_while_the_map_changes_under_the_iteration():
    """Ordered iteration sorts positions up front; writes, removals and splits after that
    must not show through (each position is read as the snapshot sees it)."""
    m = FlatStateMap(max_shift=4)
    keys = [(i * 7919) % 1000 for i in range(1000)]  # added in an order unrelated to the hashes
    for k in keys:
        m.put(k, "n", [k])
    for k in keys[::3]:
        m.remove(k, "n")
        m.put(k, "n", [k, "again"])  # moves to the end
    expected = [k for k in keys if keys.index(k) % 3] + keys[::3]
    with m.snapshot() as s:
        it = s.iter_with_timestamps(True)
        got = [next(it) for _ in range(10)]
        model = {k: None for k in expected}  # a dict keeps insertion order the same way
        for k in keys:
            m.put(k, "n", ["changed"])
            model[k] = None
            m.remove(k + 1, "n")
            model.pop(k + 1, None)
        for k in range(1000, 5000):
            m.put(k, "n", [k])  # many more splits
            model[k] = None
        got += list(it)
        assert [k for k, _, _, _ in got] == expected
        assert all(v[0] == k and (len(v) == 2) == (k in keys[::3]) for k, _, v, _ in got)
    with m.snapshot() as s:
        assert [k for k, _, _, _ in s.iter_with_timestamps(True)] == list(model)


def test_a_full_sweep_removes_runs_whose_entries_shift_back():
    m = FlatStateMap(max_shift=3)
    for i in range(200):
        m.put(i, 0, i, ts=i % 2)  # odd keys expire later: runs of mixed entries
    with m.snapshot() as s:
        removed: list = []
        assert m.sweep_expired(10, 10, None, removed) == 100
        assert sorted(k for k, _, _ in removed) == list(range(0, 200, 2))
        assert len(s) == 200 and len(list(s)) == 200
    assert sorted(k for k, _, _ in m) == list(range(1, 200, 2))
    assert all(m.get(i, 0) == i for i in range(1, 200, 2))


def test_bounded_sweeps_cover_the_map_in_rounds():
    m = FlatStateMap(max_shift=5)
    for i in range(500):
        m.put(i, "n", i, ts=0)
    total = 0
    for _ in range(1000):
        total += m.sweep_expired(1, 1, 5)
        if not len(m):
            break
    assert total == 500 and len(m) == 0


def test_bad_input_raises():
    m = FlatStateMap()
    with pytest.raises(TypeError):
        m.put(None, 0, 1)
    with pytest.raises(TypeError):
        m.put(1, None, 1)
    with pytest.raises(TypeError):
        m.put([1], 0, 1)
    with pytest.raises(TypeError):
        m.get(1, {})
    with pytest.raises(TypeError):
        m.put(1, 0, 1, ts=1.5)
    with pytest.raises(ValueError):
        m.sweep_expired(0, 0)
    with pytest.raises(TypeError):
        FlatStateMap(copier=3)
    with pytest.raises(ValueError):
        FlatStateMap(max_shift=40)
    s = m.snapshot()
    s.release()
    with pytest.raises(RuntimeError):
        len(s)
    with pytest.raises(RuntimeError):
        list(s)


def test_reentrant_use_raises():
    m = FlatStateMap()

    class Evil:
        def __hash__(self):
            return 1

        def __eq__(self, other):
            m.put(99, 0, 0)
            return True

    m.put(Evil(), 0, 1)
    with pytest.raises(RuntimeError, match="re-entrantly"):
        m.get(Evil(), 0)
    assert len(m) == 1


class _Counted:
    pass


def test_no_leaks_over_cycles_of_fill_snapshot_mutate_release():
    states = [_Counted() for _ in range(300)]
    keys = [f"k{i}" for i in range(300)]
    before = [sys.getrefcount(o) for o in states + keys]
    gc.collect()
    tracemalloc.start()
    base = None
    for cycle in range(30):
        m = FlatStateMap(copier=lambda s: s, max_shift=4)
        for k, s in zip(keys, states):
            m.put(k, 0, s)
        snap = m.snapshot()
        partial = snap.iter_with_timestamps(True)
        next(partial)  # an ordered iteration left unfinished frees its order too
        for k, s in zip(keys[::3], states[::3]):
            m.put(k, 1, s)
            m.remove(k, 0)
        m.sweep_expired(2**62, 1, None, [])
        assert len(list(snap.iter_with_timestamps(True))) == len(keys)
        del partial
        snap.release()
        del m, snap, k, s
        gc.collect()
        cur = tracemalloc.get_traced_memory()[0]
        if cycle == 5:
            base = cur
    assert tracemalloc.get_traced_memory()[0] - base < 64 * 1024
    tracemalloc.stop()
    assert [sys.getrefcount(o) for o in states + keys] == before


def test_copier_identity_contract():
    """Flink's: no snapshot, the original; after one, a copy on the first get and the same
    copy after; once released, no more copies."""
    copier = CountingCopier(list)
    m = FlatStateMap(copier=copier)
    original = [1]
    m.put("k", 0, original)
    assert m.get("k", 0) is original and copier.calls == 0
    s = m.snapshot()
    first = m.get("k", 0)
    assert first is not original and first == [1] and copier.calls == 1
    assert m.get("k", 0) is first and copier.calls == 1
    first.append(2)
    assert list(s) == [("k", 0, [1])]
    s.release()
    assert m.get("k", 0) is first and copier.calls == 1
    m.put("j", 0, [3])
    with m.snapshot() as s2:
        assert m.remove_and_get_old("j", 0) == [3] and copier.calls == 2  # handed out: a copy
        assert sorted(s2, key=repr) == sorted([("k", 0, [1, 2]), ("j", 0, [3])], key=repr)


class _SameHash:
    """Keys that all hash alike: splits cannot separate them."""

    def __init__(self, i: int) -> None:
        self.i = i

    def __hash__(self) -> int:
        return 7

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _SameHash) and other.i == self.i


def test_keys_with_one_hash_grow_the_segment_not_the_directory():
    m = FlatStateMap(max_shift=3)
    keys = [_SameHash(i) for i in range(300)]
    for k in keys:
        m.put(k, 0, k.i)
    assert m.segments_depth == 0  # no split could help: the one segment doubled
    assert [m.get(k, 0) for k in keys] == list(range(300))


def test_a_copier_cycle_with_a_live_snapshot_is_collected():
    """Map -> copier (a bound method) -> owner -> map and snapshot: the collector frees it
    all, the snapshot releasing into its map first."""
    import weakref

    class Owner:
        def __init__(self) -> None:
            self.m = FlatStateMap(copier=self.copy, max_shift=3)
            self.snap = None

        def copy(self, v):
            return list(v)

    states = [[i] for i in range(100)]
    before = [sys.getrefcount(s) for s in states]
    for _ in range(20):
        o = Owner()
        for i, state in enumerate(states):
            o.m.put(i, 0, state)
        del state
        o.snap = o.m.snapshot()
        o.m.put(3, 0, [9])  # a page saved for the snapshot
        assert o.m.get(5, 0) == [5]
        ref = weakref.ref(o)
        del o
        gc.collect()
        assert ref() is None
    assert [sys.getrefcount(s) for s in states] == before


@pytest.mark.parametrize("kept_every", [1, 3, 50])
def test_insertion_order_whether_the_sequence_is_dense_or_sparse(kept_every: int) -> None:
    """Ordered reads place each entry by its sequence number when the numbers
    are dense, and sort them when removals left them sparse: the same order."""
    m = FlatStateMap()
    order = [(i * 7919) % 20_000 for i in range(20_000)]
    for k in order:
        m.put(k, "n", k)
    for x, k in enumerate(order):
        if x % kept_every:
            m.remove(k, "n")
    for k in order[:100:7]:  # overwritten: keeps its place (or added again, if removed: last)
        m.put(k, "n", -k)
    for k in order[1:100:11]:  # removed and added again: last
        m.remove(k, "n")
        m.put(k, "n", k)
    model = {k: None for x, k in enumerate(order) if x % kept_every == 0}
    for k in order[:100:7]:
        model.setdefault(k, None)
    for k in order[1:100:11]:
        model.pop(k, None)
        model[k] = None
    with m.snapshot() as s:
        assert [k for k, _, _, _ in s.iter_with_timestamps(insertion_order=True)] == list(model)


# ---------------------------------------------------------------- column lookups of int pairs

_PAIR_KEYS = st.one_of(st.integers(-3, 3), st.sampled_from([1.0, 2.0, True, False, 2**70, "a"]))
_PAIR_NS = st.one_of(st.integers(-3, 3), st.sampled_from([1.0, True, 2**64, "n"]))


@settings(max_examples=200, deadline=None)
@example(  # (1.0, 1) and (-1, -1) have one hash: the int pair after it in the run is still found
    puts=[(1.0, 1, 0), (-1, -1, 0)], removes=[], probes=[(-1, -1, 0), (1, 1, 0)], now=0, ttl=0, snap=False
)
@given(
    puts=st.lists(st.tuples(_PAIR_KEYS, _PAIR_NS, st.integers(0, 50)), max_size=40),
    removes=st.lists(st.tuples(_PAIR_KEYS, _PAIR_NS), max_size=10),
    probes=st.lists(st.tuples(st.integers(-3, 3), st.integers(-3, 3), st.integers(0, 1)), max_size=30),
    now=st.integers(0, 80),
    ttl=st.sampled_from([0, 10, 40]),
    snap=st.booleans(),
)
def test_a_column_lookup_of_int_pairs_is_each_rows_lookup(puts, removes, probes, now, ttl, snap) -> None:
    """flat_column_lookup against a dict: each row is live, absent or expired as
    a single lookup finds it, or undecided (3) only where the map has no int
    pair equal to the row's but an entry of another type (a float, a bool, a
    big int, a str) of its hash, which could be."""
    maps = [FlatStateMap(max_shift=4), None]
    model: dict[tuple[Any, Any], int] = {}
    for k, ns, ts in puts:
        maps[0].put(k, ns, "v", ts)
        model[(k, ns)] = ts  # Python equality: 1.0 and True replace 1, as the map does
    s = maps[0].snapshot() if snap else None
    for k, ns in removes:
        maps[0].remove(k, ns)
        model.pop((k, ns), None)
    kgs = np.array([kg for _, _, kg in probes], dtype=np.int32)
    keys = np.array([k for k, _, _ in probes], dtype=np.int64)
    nss = np.array([ns for _, ns, _ in probes], dtype=np.int64)
    got = flat_column_lookup(maps, kgs, keys, nss, now, ttl).tolist()
    for (k, ns, kg), st_ in zip(probes, got):
        live = kg == 0 and (k, ns) in model
        want = (2 if ttl and is_expired(model[k, ns], ttl, now) else 1) if live else 0
        stored = next((p for p in model if p == (k, ns)), None) if kg == 0 else None
        exact = stored is not None and type(stored[0]) is int and type(stored[1]) is int
        assert st_ == want or (st_ == 3 and not exact), (k, ns, kg, st_, want, stored)
    if s is not None:
        s.release()
    with pytest.raises(ValueError, match="not within"):
        flat_column_lookup(maps, np.array([2], dtype=np.int32), np.array([1]), np.array([1]))
    with pytest.raises(TypeError, match="FlatStateMap or None"):
        flat_column_lookup(["x"], np.array([0], dtype=np.int32), np.array([1]), np.array([1]))
