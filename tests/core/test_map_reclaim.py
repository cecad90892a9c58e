"""Releasing a snapshot frees what only it kept alive: a bounded amount at once, the rest
bit by bit on later operations or at once with ``reclaim()`` — never leaked, never freed twice."""

import sys

import numpy as np

from cowmap import CopyOnWriteStateMap


class State:
    __slots__ = ("v", "__weakref__")

    def __init__(self, v: int) -> None:
        self.v = v


def _rewrite_all(m: CopyOnWriteStateMap, n: int) -> None:
    for k in range(n):
        m.put(k, 0, State(-k))


def test_large_release_is_queued_and_reclaim_frees_everything() -> None:
    n = 20_000
    old = [State(k) for k in range(n)]
    m = CopyOnWriteStateMap()
    for k, s in enumerate(old):
        m.put(k, 0, s)
    base = [sys.getrefcount(s) for s in old[:50]]
    snap = m.snapshot()
    _rewrite_all(m, n)  # every entry copied: the originals are retired onto the snapshot
    assert m.memory_stats()["retained_entries"] == n
    snap.release()
    pending = m.memory_stats()["reclaim_pending"]
    assert 0 < pending < n, "release must free a bounded part at once and queue the rest"
    assert m.reclaim(max_items=100) == pending - 100
    assert m.reclaim() == 0
    stats = m.memory_stats()
    assert stats["retained_entries"] == 0 and stats["reclaim_pending"] == 0
    # the old states were referenced only by the retired entries: back to baseline
    assert [sys.getrefcount(s) for s in old[:50]] == [b - 1 for b in base]
    assert all(m.get(k, 0).v == -k for k in range(0, n, 997))


def test_operations_drain_the_queue() -> None:
    n = 20_000
    m = CopyOnWriteStateMap()
    m.put_many(np.arange(n, dtype=np.int64), 0, [State(k) for k in range(n)])
    snap = m.snapshot()
    _rewrite_all(m, n)
    snap.release()
    pending = m.memory_stats()["reclaim_pending"]
    assert pending > 0
    for _ in range(10):
        m.get(1, 0)
    assert m.memory_stats()["reclaim_pending"] < pending  # single ops reclaim a few each
    m.get_many(np.arange(n, dtype=np.int64), 0)  # a batch reclaims in proportion to its size
    assert m.memory_stats()["reclaim_pending"] == 0
    assert m.memory_stats()["retained_entries"] == 0


def test_queued_items_still_needed_by_an_older_snapshot_survive() -> None:
    n = 10_000
    m = CopyOnWriteStateMap()
    for k in range(n):
        m.put(k, 0, State(k))
    older = m.snapshot()
    for k in range(n // 2):
        m.put(k, 0, State(-k))  # retired onto `older`
    newer = m.snapshot()
    _rewrite_all(m, n)  # retired onto `newer`; half of those entries `older` also sees
    newer.release()
    m.reclaim()
    # `older` must still see every original entry after the reclaim
    got = {k: s.v for k, _, s in older}
    assert got == {k: k for k in range(n)}
    older.release()
    assert m.reclaim() == 0
    assert m.memory_stats()["retained_entries"] == 0
    assert len(m) == n


def test_a_column_call_reclaims_in_proportion_to_its_rows_in_each_map() -> None:
    from cowmap._core import column_get

    n = 20_000
    maps = [CopyOnWriteStateMap(), CopyOnWriteStateMap(), None]
    for m in maps[:2]:
        m.put_many(np.arange(n, dtype=np.int64), 0, [State(k) for k in range(n)])
        snap = m.snapshot()
        _rewrite_all(m, n)
        snap.release()
    pending = [m.memory_stats()["reclaim_pending"] for m in maps[:2]]
    assert min(pending) > 200
    keys = np.arange(100, dtype=np.int64)
    kgs = np.array([0] * 90 + [1] * 10, dtype=np.int32)  # 90 rows in map 0, 10 in map 1
    column_get(maps, kgs, keys, 0)
    freed = [p - m.memory_stats()["reclaim_pending"] for p, m in zip(pending, maps[:2])]
    # two items a row, as a batch of each map's rows reclaims (on top of a step's, as any call)
    assert freed[0] - freed[1] == 2 * (90 - 10) and freed[1] >= 2 * 10
    maps[0].reclaim()
    maps[1].reclaim()
    assert all(m.memory_stats()["retained_entries"] == 0 for m in maps[:2])
