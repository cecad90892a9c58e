"""Rescaling: snapshots restored into backends with other key-group ranges.

As in Flink, a key belongs to key group ``key_group_for(key, max_parallelism)``
and operator ``i`` of ``p`` owns ``key_group_range_for_operator(max_par, p, i)``.
A restore takes exactly the key groups of the restoring backend's range; a
scale-in restores several old snapshots into one backend. Every state kind is
covered, with and without TTL (timestamps, per element for lists and maps, must
survive the move).
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest

from cowmap.state import (
    VOID_NAMESPACE,
    AggregateFunction,
    AggregatingStateDescriptor,
    KeyedStateBackend,
    KeyGroupRange,
    ListStateDescriptor,
    MapStateDescriptor,
    ReducingStateDescriptor,
    StateTtlConfig,
    ValueStateDescriptor,
    key_group_for,
    key_group_range_for_operator,
    operator_index_for_key_group,
)

MAX_PAR = 10
TTL = 2000  # longer than the whole write phase (clock < 1300): nothing expires while writing
KEYS: list[Any] = list(range(60)) + [f"k{i}" for i in range(40)] + [-7, 2**40, ""]
# Reads happen at READ_AT: a value written at t(k) in [0, 990) has expired iff t(k) + TTL <= READ_AT
# (inclusive: key 10 is written at exactly READ_AT - TTL), an element written at t(k) + 300 iff
# t(k) <= 70.
READ_AT = 370 + TTL


def t_of(i: int) -> int:
    """The write time of the i-th key."""
    return (i * 37) % 990


assert t_of(10) + TTL == READ_AT

class SumCount(AggregateFunction):
    """Mutable accumulator ``[sum, count]``, changed in place."""

    def create_accumulator(self) -> list[int]:
        return [0, 0]

    def add(self, value: int, accumulator: list[int]) -> list[int]:
        accumulator[0] += value
        accumulator[1] += 1
        return accumulator

    def get_result(self, accumulator: list[int]) -> tuple[int, int]:
        return accumulator[0], accumulator[1]

    def merge(self, acc_a: list[int], acc_b: list[int]) -> list[int]:
        acc_a[0] += acc_b[0]
        acc_a[1] += acc_b[1]
        return acc_a


def ttl_config() -> StateTtlConfig:
    return StateTtlConfig.new_builder(timedelta(milliseconds=TTL)).build()


def register(b: KeyedStateBackend) -> dict[str, Any]:
    def ttl(d: Any) -> Any:
        d.enable_time_to_live(ttl_config())
        return d

    return {
        "v": b.get_state(ValueStateDescriptor("v")),
        "l": b.get_list_state(ListStateDescriptor("l")),
        "m": b.get_map_state(MapStateDescriptor("m")),
        "r": b.get_reducing_state(ReducingStateDescriptor("r", lambda a, c: a + c)),
        "a": b.get_aggregating_state(AggregatingStateDescriptor("a", SumCount())),
        "vt": b.get_state(ttl(ValueStateDescriptor("vt"))),
        "lt": b.get_list_state(ttl(ListStateDescriptor("lt"))),
        "mt": b.get_map_state(ttl(MapStateDescriptor("mt"))),
        "rt": b.get_reducing_state(ttl(ReducingStateDescriptor("rt", lambda a, c: a + c))),
        "at": b.get_aggregating_state(ttl(AggregatingStateDescriptor("at", SumCount()))),
    }


def num(k: Any) -> int:
    return k if isinstance(k, int) else len(k) * 1000 + 1


def m_entries(k: Any) -> dict[Any, Any]:
    """The plain MapState's entries, in an order unrelated to their hashes."""
    return {9: 0, "b": str(k), 3: 1, "a": num(k), -5: 2, 7: 3}


def write_key(b: KeyedStateBackend, s: dict[str, Any], clock: list[int], i: int, k: Any) -> None:
    b.set_current_key(k)
    t = t_of(i)
    clock[0] = t
    s["v"].update(f"v{k}")
    s["v"].set_current_namespace("w")
    s["v"].update(f"w{k}")
    s["v"].set_current_namespace(VOID_NAMESPACE)
    s["l"].add_all([num(k), 1, 2])
    s["m"].put_all(m_entries(k))
    s["r"].add(num(k))
    s["r"].add(1)
    s["a"].add(num(k))
    s["a"].add(2)
    s["vt"].update(f"t{k}")
    s["lt"].add("x")
    s["mt"].put("p", 1)
    s["rt"].add(num(k))
    s["at"].add(num(k))
    clock[0] = t + 300
    s["lt"].add("y")
    s["mt"].put("q", 2)


def expected_plain(k: Any) -> dict[str, Any]:
    return {
        "v": f"v{k}",
        "w": f"w{k}",
        "l": [num(k), 1, 2],
        "m": list(m_entries(k).items()),  # in insertion order
        "r": num(k) + 1,
        "a": (num(k) + 2, 2),
    }


def read_plain(s: dict[str, Any]) -> dict[str, Any]:
    s["v"].set_current_namespace("w")
    w = s["v"].value()
    s["v"].set_current_namespace(VOID_NAMESPACE)
    return {
        "v": s["v"].value(),
        "w": w,
        "l": s["l"].get(),
        "m": s["m"].items(),
        "r": s["r"].get(),
        "a": s["a"].get(),
    }


def expected_ttl_at_read(i: int, k: Any) -> dict[str, Any]:
    t = t_of(i)
    alive = t + TTL > READ_AT
    late_alive = t + 300 + TTL > READ_AT
    return {
        "vt": f"t{k}" if alive else None,
        "lt": (["x"] if alive else []) + (["y"] if late_alive else []),
        "mt": ([("p", 1)] if alive else []) + ([("q", 2)] if late_alive else []),
        "rt": num(k) if alive else None,
        "at": (num(k), 1) if alive else None,
    }


def read_ttl(s: dict[str, Any]) -> dict[str, Any]:
    return {
        "vt": s["vt"].value(),
        "lt": s["lt"].get(),
        "mt": s["mt"].items(),
        "rt": s["rt"].get(),
        "at": s["at"].get(),
    }


def build_old(parallelism: int, clock: list[int]) -> list[KeyedStateBackend]:
    backends = [
        KeyedStateBackend(
            MAX_PAR, key_group_range_for_operator(MAX_PAR, parallelism, j), time_provider=lambda: clock[0]
        )
        for j in range(parallelism)
    ]
    states = [register(b) for b in backends]
    for i, k in enumerate(KEYS):
        j = operator_index_for_key_group(MAX_PAR, parallelism, key_group_for(k, MAX_PAR))
        write_key(backends[j], states[j], clock, i, k)
    return backends


def rescale(
    old: list[KeyedStateBackend], parallelism: int, clock: list[int], reverse: bool = False
) -> list[KeyedStateBackend]:
    snaps = [b.snapshot() for b in old]
    new = []
    for j in range(parallelism):
        b = KeyedStateBackend(
            MAX_PAR, key_group_range_for_operator(MAX_PAR, parallelism, j), time_provider=lambda: clock[0]
        )
        for snap in reversed(snaps) if reverse else snaps:
            b.restore(snap)
        new.append(b)
    for snap in snaps:
        snap.release()
    return new


def owner(k: Any, parallelism: int) -> int:
    return operator_index_for_key_group(MAX_PAR, parallelism, key_group_for(k, MAX_PAR))


def check_placement(backends: list[KeyedStateBackend], parallelism: int) -> None:
    """Every key is in exactly the backend owning its key group, with its values and timestamps."""
    for j, b in enumerate(backends):
        mine = {k for k in KEYS if owner(k, parallelism) == j}
        for name in ("v", "l", "m", "r", "a", "vt", "lt", "mt", "rt", "at"):
            assert set(b.keys(name)) == mine, (j, name)
        assert set(b.keys("v", "w")) == mine
        # timestamps, read from a snapshot before any TTL read can touch them
        with b.snapshot() as snap:
            ts = {k: ts for k, ns, v, ts in snap.entries("vt")}
            assert ts == {k: t_of(KEYS.index(k)) for k in mine}
            lists = {k: (vals, stamps) for k, ns, vals, stamps in snap.entries("lt")}
            assert lists == {k: (["x", "y"], [t_of(KEYS.index(k)), t_of(KEYS.index(k)) + 300]) for k in mine}
            maps = {(k, uk): (v, ts) for k, ns, uk, v, ts in snap.entries("mt")}
            expected_maps = {}
            for k in mine:
                t = t_of(KEYS.index(k))
                expected_maps[k, "p"] = (1, t)
                expected_maps[k, "q"] = (2, t + 300)
            assert maps == expected_maps
            assert {k: ts for k, ns, v, ts in snap.entries("rt")} == {k: t_of(KEYS.index(k)) for k in mine}
            assert {k: ts for k, ns, v, ts in snap.entries("at")} == {k: t_of(KEYS.index(k)) for k in mine}


def check_reads(backends: list[KeyedStateBackend], parallelism: int, clock: list[int]) -> None:
    clock[0] = READ_AT
    states = [register(b) for b in backends]
    for i, k in enumerate(KEYS):
        o = owner(k, parallelism)
        for j, b in enumerate(backends):
            if j != o:
                with pytest.raises(ValueError):
                    b.set_current_key(k)
                continue
            b.set_current_key(k)
            assert read_plain(states[j]) == expected_plain(k), k
            assert read_ttl(states[j]) == expected_ttl_at_read(i, k), k


@pytest.mark.parametrize(("old_par", "new_par"), [(2, 5), (4, 3), (4, 1), (1, 4), (3, 3), (5, 2)])
def test_rescale_every_state_kind(old_par: int, new_par: int) -> None:
    clock = [0]
    old = build_old(old_par, clock)
    total = sum(b.num_entries() for b in old)
    new = rescale(old, new_par, clock)
    assert sum(b.num_entries() for b in new) == total
    check_placement(new, new_par)
    check_reads(new, new_par, clock)


def test_rescale_restore_order_does_not_matter() -> None:
    clock = [0]
    old = build_old(4, clock)
    new = rescale(old, 3, clock, reverse=True)
    check_placement(new, 3)
    check_reads(new, 3, clock)


def test_rescale_twice() -> None:
    """2 -> 5 -> 3: a restored backend snapshots and rescales again."""
    clock = [0]
    old = build_old(2, clock)
    mid = rescale(old, 5, clock)
    new = rescale(mid, 3, clock)
    check_placement(new, 3)
    check_reads(new, 3, clock)


def test_scale_in_merges_snapshots_with_different_states() -> None:
    clock = [0]
    a = KeyedStateBackend(MAX_PAR, key_group_range_for_operator(MAX_PAR, 2, 0), time_provider=lambda: clock[0])
    b = KeyedStateBackend(MAX_PAR, key_group_range_for_operator(MAX_PAR, 2, 1), time_provider=lambda: clock[0])
    va = a.get_state(ValueStateDescriptor("only_in_a"))
    lb = b.get_list_state(ListStateDescriptor("only_in_b"))
    shared_a = a.get_map_state(MapStateDescriptor("shared"))
    shared_b = b.get_map_state(MapStateDescriptor("shared"))
    keys_a = [k for k in range(50) if owner(k, 2) == 0]
    keys_b = [k for k in range(50) if owner(k, 2) == 1]
    for k in keys_a:
        a.set_current_key(k)
        va.update(k)
        shared_a.put("from", "a")
    for k in keys_b:
        b.set_current_key(k)
        lb.add(k)
        shared_b.put("from", "b")
    merged = KeyedStateBackend(MAX_PAR, time_provider=lambda: clock[0])
    with a.snapshot() as sa, b.snapshot() as sb:
        merged.restore(sa)
        merged.restore(sb)
    assert sorted(merged.state_names()) == ["only_in_a", "only_in_b", "shared"]
    v = merged.get_state(ValueStateDescriptor("only_in_a"))
    lst = merged.get_list_state(ListStateDescriptor("only_in_b"))
    m = merged.get_map_state(MapStateDescriptor("shared"))
    assert set(merged.keys("only_in_a")) == set(keys_a)
    assert set(merged.keys("only_in_b")) == set(keys_b)
    assert set(merged.keys("shared")) == set(range(50))
    for k in range(50):
        merged.set_current_key(k)
        if k in keys_a:
            assert (v.value(), lst.get(), m.items()) == (k, [], [("from", "a")])
        else:
            assert (v.value(), lst.get(), m.items()) == (None, [k], [("from", "b")])


def test_restore_takes_only_own_key_groups() -> None:
    clock = [0]
    src = KeyedStateBackend(MAX_PAR, time_provider=lambda: clock[0])
    s = src.get_state(ValueStateDescriptor("v"))
    for k in range(200):
        src.set_current_key(k)
        s.update(k)
    snap = src.snapshot()
    groups = {key_group_for(k, MAX_PAR) for k in range(200)}
    assert groups == set(range(MAX_PAR))
    for kg in range(MAX_PAR):
        b = KeyedStateBackend(MAX_PAR, KeyGroupRange(kg, kg), time_provider=lambda: clock[0])
        b.restore(snap)
        assert set(b.keys("v")) == {k for k in range(200) if key_group_for(k, MAX_PAR) == kg}
        assert b.num_entries() == sum(1 for k in range(200) if key_group_for(k, MAX_PAR) == kg)
    snap.release()


def test_key_outside_range_is_rejected() -> None:
    rng = key_group_range_for_operator(MAX_PAR, 3, 1)
    b = KeyedStateBackend(MAX_PAR, rng)
    state = b.get_state(ValueStateDescriptor("v"))
    inside = next(k for k in range(100) if key_group_for(k, MAX_PAR) in rng)
    outside = [k for k in range(100) if key_group_for(k, MAX_PAR) not in rng]
    assert outside
    b.set_current_key(inside)
    state.update("in")
    for k in outside:
        with pytest.raises(ValueError):
            b.set_current_key(k)
        assert b.get_current_key() == inside  # a rejected key leaves the context as it was
    assert state.value() == "in"


def test_mismatched_max_parallelism_is_rejected() -> None:
    src = KeyedStateBackend(MAX_PAR)
    s = src.get_state(ValueStateDescriptor("v"))
    src.set_current_key(1)
    s.update(1)
    with src.snapshot() as snap:
        for other in (MAX_PAR * 2, MAX_PAR - 1, 128):
            with pytest.raises(ValueError):
                KeyedStateBackend(other).restore(snap)


def test_key_group_range_beyond_max_parallelism_is_rejected() -> None:
    with pytest.raises(ValueError):
        KeyedStateBackend(MAX_PAR, KeyGroupRange(5, MAX_PAR))
