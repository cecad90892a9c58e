"""Reference counting and memory: nothing leaks, nothing is freed twice.

The core allocates through ``PyMem_Raw*``, which ``tracemalloc`` traces, so repeated
fill / snapshot / mutate / release cycles must leave the traced memory flat after a warm-up.
Python references held by entries (keys, namespaces, states, copies) must be dropped exactly once:
``sys.getrefcount`` returns to its baseline and weak references die when the map goes away.
"""

from __future__ import annotations

import gc
import sys
import tracemalloc
import weakref

import numpy as np
import pytest

from cowmap import CopyOnWriteStateMap


class Obj:
    """A weak-referenceable, identity-hashed object (usable as key, namespace or state)."""

    __slots__ = ("__weakref__", "v")

    def __init__(self, v) -> None:
        self.v = v

    def __repr__(self) -> str:
        return f"Obj({self.v!r})"


def copy_obj(o):
    """A copier that makes a fresh ``Obj`` (or copies a list)."""
    if isinstance(o, Obj):
        return Obj(o.v)
    return None if o is None else list(o)


def add_one(old, value):
    return Obj((old.v if old is not None else 0) + value.v)


# --------------------------------------------------------------------------- refcounts


def exercise(keys, nss, states, values, copier, fn) -> None:
    """One full cycle of everything the map can do with these objects; leaves no locals behind."""
    m = CopyOnWriteStateMap(capacity=4, copier=copier)
    n = len(keys)
    for i in range(n):
        m.put(keys[i], nss[i % len(nss)], states[i], i)
    s1 = m.snapshot()
    for i in range(0, n, 2):
        m.get(keys[i], nss[i % len(nss)])  # copy-on-write copies
    for i in range(0, n, 3):
        m.put(keys[i], nss[i % len(nss)], states[(i + 1) % n])
    for i in range(0, n, 5):
        m.transform(keys[i], nss[i % len(nss)], values[i], fn)
    old = m.put_and_get_old(keys[1], nss[1 % len(nss)], states[0])
    old = m.remove_and_get_old(keys[7], nss[7 % len(nss)])
    del old
    s2 = m.snapshot()
    m.remove(keys[4], nss[4 % len(nss)])
    m.set_timestamp(keys[5], nss[5 % len(nss)], 0)
    m.get_with_timestamp(keys[5], nss[5 % len(nss)])
    list(m)
    list(s1)
    list(s2.iter_with_timestamps())
    len(s1)
    # batch operations
    batch = keys[: n // 2]
    m.put_many(batch, nss[0], states[: n // 2], ts=3)
    m.get_many(batch, nss[0])
    m.contains_many(batch, nss[0])
    m.remove_many(batch[::4], nss[0])
    # visitor
    v = m.incremental_visitor(2)
    while (entries := v.next_entries()) is not None:
        for k, ns, _st in entries[:1]:
            v.update(k, ns, states[2])
        for k, ns, _st in entries[1:2]:
            v.remove(k, ns)
    del v, entries
    # sweeps
    m.sweep_expired(10, 1, 5)
    m.sweep_expired(10, 1, None)
    # error paths must not leak either
    for bad in (
        lambda: m.put(keys[0], None, states[0]),
        lambda: m.put([1], nss[0], states[0]),
        lambda: m.put_many(keys[:3], nss[0], states[:2]),
        lambda: m.get_many([keys[0], None], nss[0]),
        lambda: m.transform(keys[0], nss[0], values[0], None),
        lambda: m.transform(keys[0], nss[0], values[0], lambda o, v: 1 / 0),
        lambda: m.sweep_expired(1, 0),
    ):
        try:
            bad()
        except (TypeError, ValueError, ZeroDivisionError):
            pass
        else:
            raise AssertionError("expected an error")
    s1.release()
    with m.snapshot() as s3:
        list(s3)
    del s3
    m.get(keys[3], nss[0])
    # drop the map while s2 is alive, then s2
    del m
    list(s2)
    s2.release()
    del s2, s1


def test_refcounts_return_to_baseline() -> None:
    n = 60
    keys = [Obj(f"k{i}") for i in range(n)]
    nss = [Obj("ns-a"), Obj("ns-b"), ("ns", Obj("c"))]
    states = [Obj(i) for i in range(n)]
    values = [Obj(i) for i in range(n)]
    tracked = keys + nss + states + values + [copy_obj, add_one]
    gc.collect()
    baseline = [sys.getrefcount(o) for o in tracked]
    for _ in range(3):
        exercise(keys, nss, states, values, copy_obj, add_one)
        gc.collect()
        now = [sys.getrefcount(o) for o in tracked]
        diffs = [(o, b, c) for o, b, c in zip(tracked, baseline, now) if b != c]
        assert not diffs, f"refcount changed (object, before, after): {diffs[:5]}"


def test_refcounts_while_map_alive() -> None:
    """Removing entries and releasing snapshots drops the map's references."""
    key, ns, state = Obj("k"), Obj("ns"), Obj("s")

    def counts() -> list[int]:
        return [sys.getrefcount(key), sys.getrefcount(ns), sys.getrefcount(state)]

    base = counts()
    m = CopyOnWriteStateMap(copier=copy_obj)
    m.put(key, ns, state)
    assert all(c > b for c, b in zip(counts(), base))
    m.remove(key, ns)  # no snapshot: the entry is freed at once
    assert counts() == base
    m.put(key, ns, state)
    s = m.snapshot()
    m.remove(key, ns)  # still held by the snapshot
    assert counts()[2] > base[2]
    s.release()
    del s
    # freeing may be spread over later operations; a few dozen are plenty
    for i in range(50):
        m.put(("other", i), 0, 1)
    gc.collect()
    assert counts() == base


def test_get_returns_new_references() -> None:
    state = Obj("s")
    m = CopyOnWriteStateMap()
    m.put("k", 0, state)
    base = sys.getrefcount(state)
    for _ in range(1000):
        got = m.get("k", 0)
        got = m.get_many(["k"], 0)
        got = m.get_with_timestamp("k", 0)
        got = list(m)
    del got
    assert sys.getrefcount(state) == base
    with m.snapshot() as s:
        for _ in range(100):
            list(s)
            list(s.iter_with_timestamps())
    assert sys.getrefcount(state) == base


# --------------------------------------------------------------------------- weakrefs


def test_dropping_the_map_frees_everything() -> None:
    refs = []
    copies = []

    def copier(o):
        c = Obj(o.v)
        copies.append(weakref.ref(c))
        return c

    def fill():
        m = CopyOnWriteStateMap(capacity=4, copier=copier)
        for i in range(500):
            k, ns, st = Obj(i), Obj(i % 7), Obj(i)
            refs.extend(weakref.ref(o) for o in (k, ns, st))
            m.put(k, ns, st)
        snap = m.snapshot()
        for k, ns, _ in list(m)[:200]:
            m.get(k, ns)  # copies
        for k, ns, _ in list(m)[200:300]:
            m.remove(k, ns)
        snap.release()
        snap2 = m.snapshot()  # left unreleased: dropped together with the map
        return m, snap2

    m, snap2 = fill()
    assert copies, "the scenario should make copy-on-write copies"
    del m, snap2
    gc.collect()
    alive = [r() for r in refs + copies if r() is not None]
    assert not alive, f"{len(alive)} objects outlived the map, e.g. {alive[:3]}"


def test_snapshot_keeps_its_states_alive_until_dropped() -> None:
    refs = []
    m = CopyOnWriteStateMap(copier=copy_obj)
    for i in range(100):
        st = Obj(i)
        refs.append(weakref.ref(st))
        m.put(i, 0, st)
    del st
    s = m.snapshot()
    for i in range(100):
        m.put(i, 0, Obj(-i))  # replaces every state
    gc.collect()
    assert all(r() is not None for r in refs), "states still in a live snapshot were freed"
    assert sorted(st.v for _, _, st in s) == list(range(100))
    del m
    gc.collect()
    assert all(r() is not None for r in refs)
    s.release()
    del s
    gc.collect()
    assert all(r() is None for r in refs)


def test_dropped_unreleased_snapshot_is_released() -> None:
    """A snapshot that is garbage-collected without ``release()`` must not pin the map's
    copy-on-write forever (nor leak the entries it shared)."""
    m = CopyOnWriteStateMap(copier=copy_obj)
    st = Obj(1)
    ref = weakref.ref(st)
    m.put("k", 0, st)
    del st
    s = m.snapshot()
    assert m.snapshot_versions == [s.version]
    m.put("k", 0, Obj(2))
    del s
    gc.collect()
    assert m.snapshot_versions == []
    assert m.highest_required_snapshot_version == 0
    assert ref() is None


# --------------------------------------------------------------------------- tracemalloc / gc


def churn_cycle(m: CopyOnWriteStateMap, n: int = 4000) -> None:
    for k in range(n):
        m.put(k, k % 3, [k], k)
    s1 = m.snapshot()
    for k in range(0, n, 2):
        m.get(k, k % 3).append(-1)  # copy-on-write copies
    for k in range(0, n, 3):
        m.remove(k, k % 3)
    for k in range(0, n, 5):
        m.transform(k, k % 3, 1, lambda old, v: (old or []) + [v])
    s2 = m.snapshot()
    list(s2.iter_with_timestamps())
    keys = np.arange(n, dtype=np.int64)
    m.put_many(keys[::7], 0, [[i] for i in range(len(keys[::7]))])
    m.get_many(keys, 1)
    v = m.incremental_visitor(16)
    while (entries := v.next_entries()) is not None:
        for k, ns, _ in entries[:1]:
            v.update(k, ns, [0])
    m.sweep_expired(n // 2, 1, 50)
    s1.release()
    m.sweep_expired(n // 2, 1, None)
    s2.release()
    for ns in range(3):
        m.remove_many(keys, ns)
    assert len(m) == 0


def traced_growth(cycle, warmup: int = 2, cycles: int = 8) -> int:
    gc.collect()
    tracemalloc.start()
    try:
        for _ in range(warmup):
            cycle()
        gc.collect()
        before = tracemalloc.get_traced_memory()[0]
        for _ in range(cycles):
            cycle()
        gc.collect()
        after = tracemalloc.get_traced_memory()[0]
    finally:
        tracemalloc.stop()
    return after - before


def test_traced_memory_flat_over_snapshot_cycles() -> None:
    m = CopyOnWriteStateMap(capacity=4, copier=list)
    growth = traced_growth(lambda: churn_cycle(m))
    # each cycle allocates megabytes; a per-entry leak would show as >= 100 KB here
    assert growth < 64 * 1024, f"traced memory grew by {growth} bytes over 8 cycles"


def test_traced_memory_flat_over_map_lifetimes() -> None:
    def cycle():
        m = CopyOnWriteStateMap(capacity=4, copier=list)
        churn_cycle(m, 2000)
        for k in range(500):
            m.put(k, 0, [k])
        s = m.snapshot()  # map dropped with a live snapshot and entries
        m.put(0, 0, [1])
        del m
        list(s)
        s.release()

    growth = traced_growth(cycle)
    assert growth < 64 * 1024, f"traced memory grew by {growth} bytes over 8 map lifetimes"


def test_traced_memory_flat_with_dropped_snapshots() -> None:
    m = CopyOnWriteStateMap(capacity=4, copier=list)

    def cycle():
        for k in range(2000):
            m.put(k, 0, [k])
        for _ in range(5):
            m.snapshot()  # never released: dropped immediately
            for k in range(0, 2000, 3):
                m.get(k, 0).append(0)
        gc.collect()
        m.remove_many(list(range(2000)), 0)

    growth = traced_growth(cycle)
    assert growth < 64 * 1024, f"traced memory grew by {growth} bytes"


def test_gc_object_count_flat() -> None:
    m = CopyOnWriteStateMap(capacity=4, copier=list)
    for _ in range(2):
        churn_cycle(m, 2000)
    gc.collect()
    before = len(gc.get_objects())
    for _ in range(6):
        churn_cycle(m, 2000)
    gc.collect()
    after = len(gc.get_objects())
    assert after - before < 100, f"{after - before} more gc-tracked objects after 6 cycles"


@pytest.mark.parametrize("n", [10, 1000])
def test_large_state_objects_freed(n: int) -> None:
    """Big states (numpy arrays) are released with their entries."""
    m = CopyOnWriteStateMap(copier=lambda a: a.copy())
    gc.collect()
    tracemalloc.start()
    try:
        for k in range(n):
            m.put(k, 0, np.zeros(1000))
        with m.snapshot():
            for k in range(n):
                m.get(k, 0)[0] = 1  # copies
        peak_with = tracemalloc.get_traced_memory()[0]
        m.remove_many(list(range(n)), 0)
        for k in range(50):
            m.get(k, 0)
        gc.collect()
        after = tracemalloc.get_traced_memory()[0]
    finally:
        tracemalloc.stop()
    assert peak_with - after >= n * 8000 * 0.9  # the arrays were freed


def test_ttl_read_write_helpers_keep_refcounts() -> None:
    """``get_unexpired``, ``get_touch``, ``replace`` and a collecting sweep take and drop
    references exactly once, with and without a live snapshot, on hits, misses and expiry."""
    keys = [Obj(f"k{i}") for i in range(40)]
    ns = Obj("ns")
    states = [Obj(i) for i in range(40)]
    fresh = [Obj(-i) for i in range(40)]
    tracked = keys + [ns] + states + fresh
    gc.collect()
    baseline = [sys.getrefcount(o) for o in tracked]
    for _ in range(3):
        m = CopyOnWriteStateMap(copier=copy_obj)
        for i, (k, s) in enumerate(zip(keys, states)):
            m.put(k, ns, s, i)
        snap = m.snapshot()
        for i, k in enumerate(keys):
            m.get_unexpired(k, ns, 20, 10, refresh=i % 2 == 0)  # expired for i <= 10
            m.get_touch(k, ns, 30 + i)
            assert m.replace(k, ns, fresh[i], 30 + i)
        assert not m.replace(Obj("absent"), ns, fresh[0])
        assert m.get_touch(Obj("absent"), ns, 1) is None
        removed: list = []
        assert m.sweep_expired(45, 10, None, removed) == len(removed) == 6
        del removed, k, s  # the loops' last bindings
        snap.release()
        del snap, m
        gc.collect()
        now = [sys.getrefcount(o) for o in tracked]
        diffs = [(o, b, c) for o, b, c in zip(tracked, baseline, now) if b != c]
        assert not diffs, f"refcount changed (object, before, after): {diffs[:5]}"
