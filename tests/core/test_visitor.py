"""``CopyOnWriteStateMap.incremental_visitor`` (Flink's ``StateIncrementalVisitor``).

``next_entries()`` returns one whole bucket chain as a list of ``(key, ns, state)``, an empty list
after scanning ``max_empty_buckets`` empty buckets, and ``None`` when the visit is over. Entries
present for the whole visit are returned at least once even if the map rehashes meanwhile;
changes during the visit never crash.
"""

from __future__ import annotations

import random

import pytest

from cowmap import CopyOnWriteStateMap

from core_helpers import CollidingKey, fill_until_rehashing, finish_rehash, map_contents, snapshot_contents


def visit_all(v, bound: int = 1_000_000) -> list[tuple]:
    """Drain a visitor; returns all entries returned (possibly with duplicates)."""
    out = []
    calls = 0
    while True:
        batch = v.next_entries()
        if batch is None:
            break
        assert isinstance(batch, list)
        for entry in batch:
            assert isinstance(entry, tuple) and len(entry) == 3
        out.extend(batch)
        calls += 1
        assert calls <= bound, "visitor never finished"
    assert not v.has_next()
    assert v.next_entries() is None  # stays done
    return out


def test_empty_map_visit_ends() -> None:
    m = CopyOnWriteStateMap()
    v = m.incremental_visitor(16)
    assert visit_all(v, bound=m.capacity + 2) == []


def test_visit_returns_each_entry_once_when_map_is_unchanged() -> None:
    m = CopyOnWriteStateMap(capacity=4)
    expected = {(k, k % 3): f"s{k}" for k in range(1000)}
    for (k, ns), st in expected.items():
        m.put(k, ns, st)
    finish_rehash(m)
    got = visit_all(m.incremental_visitor(8))
    assert len(got) == len(expected)
    assert {(k, ns): st for k, ns, st in got} == expected


def test_next_entries_returns_whole_chains() -> None:
    m = CopyOnWriteStateMap(capacity=1024)
    colliding = [CollidingKey(i, h=777) for i in range(10)]  # same hash, same ns: one chain
    for i, k in enumerate(colliding):
        m.put(k, "ns", i)
    for k in range(20):
        m.put(k, "ns", k)
    batches = []
    v = m.incremental_visitor(4)
    while (batch := v.next_entries()) is not None:
        if batch:
            batches.append(batch)
    chain_batches = [b for b in batches if any(isinstance(e[0], CollidingKey) for e in b)]
    assert len(chain_batches) == 1, "a bucket chain was split across next_entries() calls"
    assert {e[0] for e in chain_batches[0] if isinstance(e[0], CollidingKey)} == set(colliding)
    assert sum(len(b) for b in batches) == 30


def test_empty_list_after_max_empty_buckets() -> None:
    """One entry in 1024 buckets: with max_empty_buckets=16 each call scans at most 16 empty
    buckets, so the visit takes about 1023/16 calls that return ``[]``."""
    m = CopyOnWriteStateMap(capacity=1024)
    m.put("only", 0, 1)
    v = m.incremental_visitor(16)
    empties = 0
    found = []
    calls = 0
    while (batch := v.next_entries()) is not None:
        calls += 1
        assert calls <= 1024 + 2
        if batch == []:
            empties += 1
        else:
            found.extend(batch)
    assert found == [("only", 0, 1)]
    assert empties >= 1023 // 16 - 2, f"only {empties} empty results: more than 16 empty buckets per call"


def test_has_next_and_done() -> None:
    m = CopyOnWriteStateMap(capacity=8)
    for k in range(5):
        m.put(k, 0, k)
    v = m.incremental_visitor(1)
    assert v.has_next()
    got = []
    while v.has_next():
        batch = v.next_entries()
        if batch is None:
            break
        got.extend(batch)
    assert not v.has_next()
    assert v.next_entries() is None
    assert sorted(got) == [(k, 0, k) for k in range(5)]


def test_visitor_states_are_current() -> None:
    m = CopyOnWriteStateMap(capacity=4)
    for k in range(100):
        m.put(k, 0, ("v", k))
    v = m.incremental_visitor(4)
    for k in range(100):
        m.put(k, 0, ("w", k))  # before the visitor reaches them
    got = visit_all(v)
    assert {(k, ns): st for k, ns, st in got} == {(k, 0): ("w", k) for k in range(100)}


def test_remove_and_update_through_visitor() -> None:
    m = CopyOnWriteStateMap(capacity=16)
    for k in range(200):
        m.put(k, "ns", k)
    v = m.incremental_visitor(8)
    seen = set()
    while (batch := v.next_entries()) is not None:
        for k, ns, st in batch:
            seen.add(k)
            if k % 2:
                v.remove(k, ns)
            else:
                v.update(k, ns, st * 10)
    assert seen == set(range(200))
    assert map_contents(m) == {(k, "ns"): k * 10 for k in range(0, 200, 2)}
    assert len(m) == 100


def test_remove_everything_through_visitor() -> None:
    m = CopyOnWriteStateMap(capacity=4)
    for k in range(500):
        m.put(k, k % 2, k)
    v = m.incremental_visitor(2)
    while (batch := v.next_entries()) is not None:
        for k, ns, _ in batch:
            v.remove(k, ns)
    assert len(m) == 0 and list(m) == []


def test_visitor_update_and_remove_are_copy_on_write() -> None:
    m = CopyOnWriteStateMap(capacity=8, copier=list)
    for k in range(50):
        m.put(k, 0, [k])
    expected = {(k, 0): [k] for k in range(50)}
    with m.snapshot() as s:
        v = m.incremental_visitor(4)
        while (batch := v.next_entries()) is not None:
            for k, ns, _st in batch:
                if k % 3 == 0:
                    v.remove(k, ns)
                else:
                    v.update(k, ns, [k, "updated"])
        assert snapshot_contents(s) == expected
    assert map_contents(m) == {(k, 0): [k, "updated"] for k in range(50) if k % 3}


@pytest.mark.parametrize("seed", range(4))
def test_at_least_once_across_rehash(seed: int) -> None:
    """Entries present for the whole visit are returned at least once while new keys make the
    map rehash (possibly more than once) during the visit."""
    rng = random.Random(seed)
    m = CopyOnWriteStateMap(capacity=4)
    stable = {(f"s{k}", 0) for k in range(60)}
    for k, ns in stable:
        m.put(k, ns, "stable")
    for k in range(40):
        m.put(k, 1, "transient")
    v = m.incremental_visitor(rng.choice([1, 2, 8]))
    seen = []
    next_key = 1000
    rehashes_seen = 0
    calls = 0
    while (batch := v.next_entries()) is not None:
        seen.extend(batch)
        calls += 1
        assert calls <= 100_000, "visit did not end"
        # churn: new keys (two or three rehashes, then the growth stops so that the visit can
        # end), removes of transient keys, lookups (rehash steps)
        for _ in range(rng.randrange(0, 6)):
            if next_key < 1400:
                m.put(next_key, 1, "transient")
                next_key += 1
        m.remove(rng.randrange(0, next_key), 1)
        m.get(rng.randrange(0, next_key), 1)
        rehashes_seen += m.is_rehashing
    assert rehashes_seen > 0, "the scenario should rehash during the visit"
    seen_keys = {(k, ns) for k, ns, _ in seen}
    missing = stable - seen_keys
    assert not missing, f"entries present for the whole visit were not returned: {sorted(missing)[:5]}"
    for _, ns, st in seen:
        if ns == 0:
            assert st == "stable"


def test_visit_started_during_rehash() -> None:
    m = CopyOnWriteStateMap(capacity=32)
    nxt = fill_until_rehashing(m)
    m.get(0, 0)
    assert m.is_rehashing
    v = m.incremental_visitor(4)
    seen = set()
    while (batch := v.next_entries()) is not None:
        seen.update((k, ns) for k, ns, _ in batch)
        m.contains_key(-1, 0)  # advance the rehash under the visitor
    assert seen == {(k, 0) for k in range(nxt)}
    assert not m.is_rehashing


def test_modifications_during_visit_never_crash() -> None:
    """Random churn, snapshots and visitor writes at once; the map must stay consistent."""
    rng = random.Random(11)
    m = CopyOnWriteStateMap(capacity=4, copier=list)
    model: dict = {}
    snaps = []
    for rnd in range(20):
        v = m.incremental_visitor(rng.choice([1, 3, 16]))
        while (batch := v.next_entries()) is not None:
            for k, ns, st in batch:
                # next_entries() reads the current table: the entry is live and current
                assert (k, ns) in model
                assert st == model[(k, ns)]
                r = rng.random()
                if r < 0.2:
                    v.remove(k, ns)
                    del model[(k, ns)]
                elif r < 0.4:
                    v.update(k, ns, [rnd])
                    model[(k, ns)] = [rnd]
            for _ in range(rng.randrange(0, 8)):
                k, ns = rng.randrange(300), rng.randrange(3)
                op = rng.random()
                if op < 0.5:
                    m.put(k, ns, [k])
                    model[(k, ns)] = [k]
                elif op < 0.8:
                    m.remove(k, ns)
                    model.pop((k, ns), None)
                else:
                    st = m.get(k, ns)
                    if st is not None:
                        st.append(-1)
                        model[(k, ns)] = model[(k, ns)] + [-1]
            if rng.random() < 0.05:
                snaps.append((m.snapshot(), {key: list(val) for key, val in model.items()}))
            if snaps and rng.random() < 0.05:
                s, exp = snaps.pop(rng.randrange(len(snaps)))
                assert snapshot_contents(s) == exp
                s.release()
        assert len(m) == len(model)
        assert map_contents(m) == model
    for s, exp in snaps:
        assert snapshot_contents(s) == exp
        s.release()
