"""MapState at sizes where its key-group maps (``FlatStateMap``) split segments many times:
snapshots taken along the way stay exact, restore brings them back, TTL cleanup removes the
expired user entries, and the live state keeps its insertion order throughout (each key
group's lists over its user entries pass ``MapTable._check()`` along the way)."""

from __future__ import annotations

from datetime import timedelta

from cowmap.state import KeyedStateBackend, MapStateDescriptor, StateTtlConfig

N = 30_000  # user entries per key: five times a default segment's 6,144-entry limit


class Clock:
    def __init__(self) -> None:
        self.now = 1_000

    def __call__(self) -> int:
        return self.now


def test_snapshots_taken_while_segments_split_stay_exact_and_restore() -> None:
    backend = KeyedStateBackend(max_parallelism=4)
    ms = backend.get_map_state(MapStateDescriptor("m"))
    snaps = []
    for key in ("a", "b"):
        backend.set_current_key(key)
        for u in range(N):
            ms.put(u, [key, u])
            if u % 10_000 == 9_999:
                snaps.append((backend.snapshot(), key, u + 1))
    table = backend._tables["m"]
    table._check()
    backend.set_current_key("a")
    for u in range(0, N, 2):
        ms.remove(u)
    for u in range(1, N, 2):
        ms.get(u).append("changed")  # in place, after the snapshots: they must not see it
    ms.put(N, "new")
    table._check()
    for snap, key, n in snaps:
        restored = KeyedStateBackend(max_parallelism=4)
        rs = restored.get_map_state(MapStateDescriptor("m"))
        restored.restore(snap)
        restored._tables["m"]._check()
        restored.set_current_key(key)
        assert rs.items() == [(u, [key, u]) for u in range(n)]  # insertion order too
        snap.release()
    assert ms.keys() == list(range(1, N, 2)) + [N]
    assert ms.get(1) == ["a", 1, "changed"]
    with backend.snapshot() as snap:
        restored = KeyedStateBackend(max_parallelism=4)
        rs = restored.get_map_state(MapStateDescriptor("m"))
        restored.restore(snap)
        restored._tables["m"]._check()
        restored.set_current_key("a")
        assert rs.keys() == list(range(1, N, 2)) + [N]


def test_ttl_cleanup_empties_a_large_map_state() -> None:
    clock = Clock()
    backend = KeyedStateBackend(max_parallelism=2, time_provider=clock)
    desc = MapStateDescriptor("m")
    desc.enable_time_to_live(StateTtlConfig.new_builder(timedelta(milliseconds=10)).build())
    ms = backend.get_map_state(desc)
    backend.set_current_key("k")
    ms.put_all({u: u for u in range(N)})
    clock.now += 5
    ms.put_all({u: -u for u in range(0, N, 3)})  # refreshed: these outlive the rest
    clock.now += 6
    table = backend._tables["m"]
    table._check()
    for i in range(N):  # accesses drive the incremental cleanup
        ms.get(-1)
        if i % 250 == 0:  # the lists hold while sweeps take runs of neighbours out
            table._check()
        if backend.num_entries() and len(table.maps[backend.get_current_key_group()]) == N // 3:
            break
    table._check()
    assert len(table.maps[backend.get_current_key_group()]) == N // 3
    assert ms.items() == [(u, -u) for u in range(0, N, 3)]
