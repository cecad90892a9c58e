"""The compiled core's Python surface under hostile use.

Every argument of a compiled class or function that the C code reads through is checked
before it is read: wrong types are ``TypeError``, bad values ``ValueError``, misuse
``RuntimeError``, each naming what was wrong; nothing crashes.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from cowmap import CopyOnWriteStateMap, StateIncrementalVisitor, _core, _future
from cowmap._core import FlatStateMap

from core_helpers import CollidingKey

# --------------------------------------------------------------------------- typed arguments


def _flat_snapshot() -> Any:
    return FlatStateMap().snapshot()


@pytest.mark.parametrize(
    ("make", "argument"),
    [
        (lambda: StateIncrementalVisitor(None, 4), "m"),
        (lambda: _core._MapIterator(None), "m"),
        (lambda: _core._SnapshotIterator(None, False), "snap"),
        (lambda: _core._FlatSnapshotIterator(None, True), "snap"),
        (lambda: _future._post_step(None, None, None), "f"),
        (lambda: _future._post_step(None, _future.StateFuture(), None), "src"),
    ],
    ids=["visitor", "map-iterator", "snapshot-iterator", "flat-snapshot-iterator", "post-step-f", "post-step-src"],
)
def test_typed_arguments_reject_none(make: Callable[[], Any], argument: str) -> None:
    with pytest.raises(TypeError, match=f"'{argument}'"):
        make()


@pytest.mark.parametrize(
    ("make", "argument"),
    [
        (lambda: StateIncrementalVisitor(FlatStateMap(), 4), "m"),
        (lambda: _core._MapIterator(FlatStateMap()), "m"),
        (lambda: _core._SnapshotIterator(_flat_snapshot(), False), "snap"),
        (lambda: _core._FlatSnapshotIterator(CopyOnWriteStateMap().snapshot(), False), "snap"),
    ],
    ids=["visitor", "map-iterator", "snapshot-iterator", "flat-snapshot-iterator"],
)
def test_typed_arguments_reject_other_types(make: Callable[[], Any], argument: str) -> None:
    with pytest.raises(TypeError, match=f"'{argument}'"):
        make()


def test_visitor_bound_is_checked_wherever_the_visitor_is_made() -> None:
    m = CopyOnWriteStateMap()
    m.put(1, 0, "one")
    for make in (lambda n: StateIncrementalVisitor(m, n), m.incremental_visitor):
        for bad in (0, -1, 2**32, 2**70):
            with pytest.raises(ValueError, match="max_empty_buckets"):
                make(bad)
        for bad in (1.5, "3", None):
            with pytest.raises(TypeError, match="max_empty_buckets"):
                make(bad)
        v = make(2**32 - 1)
        assert v.next_entries() == [(1, 0, "one")]
        assert v.next_entries() is None


# --------------------------------------------------------------------------- TTL arguments

MAP_KINDS = [CopyOnWriteStateMap, FlatStateMap]
BAD_TTLS = [0, -1, -(2**63)]


def _ttl_calls(m: Any) -> dict[str, Callable[[int], Any]]:
    """Every TTL-taking entry point of map ``m``, as a function of the ttl."""
    return {
        "get_unexpired": lambda ttl: m.get_unexpired(1, 0, 10, ttl),
        "get_unexpired-refresh": lambda ttl: m.get_unexpired(1, 0, 10, ttl, refresh=True),
        "sweep_expired": lambda ttl: m.sweep_expired(10, ttl),
        "sweep_expired-full": lambda ttl: m.sweep_expired(10, ttl, None),
        "multi_get": lambda ttl: _core.multi_get([m], [0], [1], [0], 10, ttl),
        "multi_get-missing-map": lambda ttl: _core.multi_get([None], [0], [1], [0], 10, ttl),
    }


@pytest.mark.parametrize("kind", MAP_KINDS, ids=lambda k: k.__name__)
@pytest.mark.parametrize("ttl", BAD_TTLS)
def test_ttl_must_be_positive_at_every_entry_point(kind: type, ttl: int) -> None:
    m = kind()
    m.put(1, 0, "v", 5)
    calls = _ttl_calls(m)
    if ttl == 0:
        del calls["multi_get"], calls["multi_get-missing-map"]  # there 0 means: no TTL
    for call in calls.values():
        with pytest.raises(ValueError, match=rf"ttl must be > 0 \(milliseconds\), got {ttl}$"):
            call(ttl)
    assert m.get_with_timestamp(1, 0) == ("v", 5) if kind is CopyOnWriteStateMap else m.timestamp(1, 0) == 5
    assert len(m) == 1


@pytest.mark.parametrize("kind", MAP_KINDS, ids=lambda k: k.__name__)
def test_ttl_of_wrong_type_is_a_type_error(kind: type) -> None:
    m = kind()
    for call in _ttl_calls(m).values():
        for bad in (1.5, "5", None):
            with pytest.raises(TypeError, match="ttl"):
                call(bad)


@pytest.mark.parametrize("kind", MAP_KINDS, ids=lambda k: k.__name__)
def test_good_ttls_behave_alike_in_both_maps(kind: type) -> None:
    m = kind()
    m.put(1, 0, "v", 5)
    assert m.get_unexpired(1, 0, 10, 2**63 - 1) == "v"  # the sum saturates: never expires
    assert m.get_unexpired(1, 0, 10, 6) == "v"
    assert m.get_unexpired(1, 0, 10, 5) is _core.EXPIRED  # inclusive: ts + ttl <= now
    assert _core.multi_get([m], [0], [1], [0], 10, 0) == ["v"]  # ttl 0: a plain read
    assert _core.multi_get([m], [0], [1], [0], 10, 5) == [_core.EXPIRED]
    assert m.sweep_expired(10, 5, None) == 1 and len(m) == 0


# --------------------------------------------------------------------------- re-entrant use


class _Hook(CollidingKey):
    """A key that, once armed, runs an action on the map from its ``__eq__`` or its
    ``__hash__`` (whichever ``armed[0]`` names) and records what the action did."""

    __slots__ = ()
    armed: list[Any] | None = None  # [where, action, outcomes]

    @staticmethod
    def _fire(where: str) -> None:
        a = _Hook.armed
        if a is not None and a[0] == where:
            _Hook.armed = None  # once, and not from the action itself
            try:
                a[2].append(("returned", a[1]()))
            except BaseException as e:  # noqa: BLE001 - the test looks at it
                a[2].append(("raised", e))

    def __hash__(self) -> int:
        _Hook._fire("hash")
        return self.h

    def __eq__(self, other: object) -> bool:
        _Hook._fire("eq")
        return CollidingKey.__eq__(self, other)


def _guarded_calls(kind: type) -> dict[str, Callable[[Any], Any]]:
    """Every call into map ``m`` that reads or changes its entries."""
    calls: dict[str, Callable[[Any], Any]] = {
        "put": lambda m: m.put("x", 0, 1),
        "get": lambda m: m.get("other", 0),
        "get_unexpired": lambda m: m.get_unexpired("other", 0, 10, 5),
        "contains_key": lambda m: m.contains_key("other", 0),
        "timestamp": lambda m: m.timestamp("other", 0),
        "remove": lambda m: m.remove("other", 0),
        "remove_and_get_old": lambda m: m.remove_and_get_old("other", 0),
        "sweep_expired": lambda m: m.sweep_expired(10**6, 5, None),
        "snapshot": lambda m: m.snapshot(),
        "iter": lambda m: next(iter(m)),
        "multi_get": lambda m: _core.multi_get([m], [0], ["other"], [0]),
        "multi_get-ttl": lambda m: _core.multi_get([m], [0], ["other"], [0], 10, 5),
        "multi_put": lambda m: _core.multi_put([m], [0], ["x"], [0], [1]),
        "multi_replace": lambda m: _core.multi_replace([m], [0], ["other"], [0], [2]),
    }
    if kind is CopyOnWriteStateMap:
        calls.update({
            "get_with_timestamp": lambda m: m.get_with_timestamp("other", 0),
            "replace": lambda m: m.replace("other", 0, 2),
            "get_touch": lambda m: m.get_touch("other", 0, 7),
            "set_timestamp": lambda m: m.set_timestamp("other", 0, 7),
            "__contains__": lambda m: ("other", 0) in m,
            "put_and_get_old": lambda m: m.put_and_get_old("x", 0, 1),
            "transform": lambda m: m.transform("x", 0, 1, lambda old, v: v),
            "get_many": lambda m: m.get_many(["other"], 0),
            "put_many": lambda m: m.put_many(["x"], 0, [1]),
            "contains_many": lambda m: m.contains_many(["other"], 0),
            "remove_many": lambda m: m.remove_many(["other"], 0),
            "reclaim": lambda m: m.reclaim(),
            "visitor.next_entries": lambda m: m.incremental_visitor().next_entries(),
        })
    return calls


def _allowed_calls(kind: type) -> dict[str, Callable[[Any, Any], Any]]:
    """The calls the maps' docstrings allow while the map is in use: reading counters, a
    prefetch hint, and reading or releasing a snapshot (``s``, taken before)."""
    calls: dict[str, Callable[[Any, Any], Any]] = {
        "len": lambda m, s: len(m),
        "prefetch": lambda m, s: m.prefetch("other", 0),
        "version": lambda m, s: m.version,
        "is_rehashing": lambda m, s: m.is_rehashing,
        "repr": lambda m, s: repr(m),
        "snapshot-read": lambda m, s: (len(s), len(list(s)), len(list(s.iter_with_timestamps()))),
        "snapshot-release": lambda m, s: s.release(),
    }
    if kind is CopyOnWriteStateMap:
        calls.update({
            "capacity": lambda m, s: m.capacity,
            "snapshot_versions": lambda m, s: m.snapshot_versions,
            "highest_required_snapshot_version": lambda m, s: m.highest_required_snapshot_version,
            "copier": lambda m, s: m.copier,
            "memory_stats": lambda m, s: m.memory_stats()["live_entries"],
            "incremental_visitor": lambda m, s: type(m.incremental_visitor()).__name__,
        })
    else:
        calls["segments_depth"] = lambda m, s: m.segments_depth
    return calls


def _outer_call(m: Any, outer: str) -> Any:
    """The call during which the armed key's __eq__ or __hash__ runs."""
    if outer == "put":
        return m.put(_Hook(2, h=3), 0, "two")
    return m.contains_key(_Hook(2, h=3), 0)


def _fresh_map(kind: type) -> Any:
    m = kind()
    m.put(_Hook(1, h=3), 0, "one", 1)
    m.put("other", 0, "other", 1)
    return m


def _run_armed(m: Any, where: str, outer: str, action: Callable[[], Any]) -> tuple[str, Any]:
    outcomes: list[tuple[str, Any]] = []
    _Hook.armed = [where, action, outcomes]
    try:
        _outer_call(m, outer)
    finally:
        _Hook.armed = None
    assert len(outcomes) == 1, "the key's hook did not run"
    return outcomes[0]


def _guarded_cases() -> list[Any]:
    return [pytest.param(kind, name, id=f"{kind.__name__}-{name}")
            for kind in MAP_KINDS for name in _guarded_calls(kind)]


def _allowed_cases() -> list[Any]:
    return [pytest.param(kind, name, id=f"{kind.__name__}-{name}")
            for kind in MAP_KINDS for name in _allowed_calls(kind)]


@pytest.mark.parametrize("outer", ["put", "contains_key"])
@pytest.mark.parametrize("where", ["eq", "hash"])
@pytest.mark.parametrize(("kind", "name"), _guarded_cases())
def test_calls_back_into_the_map_from_a_key_raise(kind: type, name: str, where: str, outer: str) -> None:
    m = _fresh_map(kind)
    with m.snapshot() as s:  # (copy-on-write on: the outer put copies what it changes)
        what, got = _run_armed(m, where, outer, lambda: _guarded_calls(kind)[name](m))
        assert what == "raised" and type(got) is RuntimeError, (what, got)
        assert f"{kind.__name__} used re-entrantly" in str(got)
        assert len(s) == 2
    # the inner call changed nothing; the outer one did its work
    assert not m.contains_key("x", 0)
    assert m.get("other", 0) == "other" and m.timestamp("other", 0) == 1
    assert m.contains_key(_Hook(2, h=3), 0) == (outer == "put")
    assert len(m) == len(list(m)) == (3 if outer == "put" else 2)


@pytest.mark.parametrize("where", ["eq", "hash"])
@pytest.mark.parametrize(("kind", "name"), _allowed_cases())
def test_reads_of_counters_and_snapshots_are_allowed_from_a_key(kind: type, name: str, where: str) -> None:
    m = _fresh_map(kind)
    s = m.snapshot()
    expected = _allowed_calls(kind)[name](m, s) if name != "snapshot-release" else None
    what, got = _run_armed(m, where, "put", lambda: _allowed_calls(kind)[name](m, s))
    assert what == "returned", got
    if name not in ("version", "repr", "memory_stats", "snapshot_versions", "highest_required_snapshot_version"):
        assert got == expected  # as outside, before the put
    if name == "snapshot-release":
        assert s.released
        with pytest.raises(RuntimeError, match="released"):
            len(s)
        if kind is CopyOnWriteStateMap:
            assert m.snapshot_versions == []  # a release while in use takes effect when the call ends
    else:
        assert sorted(map(repr, s)) == sorted(map(repr, [(_Hook(1, h=3), 0, "one"), ("other", 0, "other")]))
        s.release()
    assert m.get(_Hook(2, h=3), 0) == "two" and len(m) == len(list(m)) == 3


# --------------------------------------------------------------------------- two threads


class _Gate(CollidingKey):
    """A key whose ``__eq__``, once armed, holds the map in use (the comparison runs
    inside a map call) until another thread has made its own call."""

    __slots__ = ()
    armed: tuple[threading.Event, threading.Event] | None = None  # (held, done)

    def __eq__(self, other: object) -> bool:
        gate = _Gate.armed
        if gate is not None:
            _Gate.armed = None
            gate[0].set()
            gate[1].wait()
        return CollidingKey.__eq__(self, other)

    __hash__ = CollidingKey.__hash__


_OTHER_THREAD_CALLS: dict[str, Callable[[Any], Any]] = {
    "put": lambda m: m.put("x", 0, 1),
    "get": lambda m: m.get("other", 0),
    "get_unexpired": lambda m: m.get_unexpired("other", 0, 10, 5),
    "remove": lambda m: m.remove("other", 0),
    "sweep_expired": lambda m: m.sweep_expired(10**6, 5, None),
    "snapshot": lambda m: m.snapshot(),
    "multi_get": lambda m: _core.multi_get([m], [0], ["other"], [0]),
}


@pytest.mark.parametrize("name", list(_OTHER_THREAD_CALLS))
@pytest.mark.parametrize("kind", MAP_KINDS, ids=lambda k: k.__name__)
def test_a_call_from_a_second_thread_while_the_map_is_in_use_says_two_threads(kind: type, name: str) -> None:
    m = kind()
    m.put(_Gate(1, h=3), 0, "one")
    m.put("other", 0, "other", 1)
    held, done = threading.Event(), threading.Event()
    seen: list[BaseException | None] = []

    def second() -> None:
        held.wait()
        try:
            _OTHER_THREAD_CALLS[name](m)
            seen.append(None)
        except BaseException as e:  # noqa: BLE001 - the main thread looks at it
            seen.append(e)
        finally:
            done.set()

    t = threading.Thread(target=second)
    t.start()
    _Gate.armed = (held, done)
    try:
        assert m.put(_Gate(2, h=3), 0, "two")  # its __eq__ waits for the second thread's call
    finally:
        _Gate.armed = None
        held.set()  # (if the gate never ran, the thread still ends)
        t.join()
    assert len(seen) == 1 and type(seen[0]) is RuntimeError, seen
    assert f"{kind.__name__} used from two threads at once" in str(seen[0])
    assert not m.contains_key("x", 0) and m.get("other", 0) == "other"
    assert len(m) == len(list(m)) == 3


# --------------------------------------------------------------------------- multi-map calls

MULTI = {
    "multi_get": lambda maps, kgs, keys, nss, states: _core.multi_get(maps, kgs, keys, nss),
    "multi_get-ttl": lambda maps, kgs, keys, nss, states: _core.multi_get(maps, kgs, keys, nss, 10, 5),
    "multi_put": lambda maps, kgs, keys, nss, states: _core.multi_put(maps, kgs, keys, nss, states),
    "multi_replace": lambda maps, kgs, keys, nss, states: _core.multi_replace(maps, kgs, keys, nss, states),
}


def _filled_maps(kind: type, n: int = 3) -> list[Any]:
    maps = [kind() for _ in range(n)]
    for kg, m in enumerate(maps):
        m.put(kg, 0, f"in {kg}")
    return maps


@pytest.mark.parametrize("kind", MAP_KINDS, ids=lambda k: k.__name__)
@pytest.mark.parametrize("call", list(MULTI))
@pytest.mark.parametrize("bad", [-1, -3, 3, 2**40, 2**63, -(2**70)])
@pytest.mark.parametrize("at", [0, 39])
def test_multi_map_calls_refuse_key_groups_out_of_range(kind: type, call: str, bad: int, at: int) -> None:
    maps = _filled_maps(kind)
    n = 40
    kgs = [i % 3 for i in range(n)]
    kgs[at] = bad
    keys, nss, states = [i % 3 for i in range(n)], [0] * n, ["new"] * n
    with pytest.raises(ValueError, match=rf"kgs\[{at}\] = {bad} is not a key group of the 3 maps"):
        MULTI[call](maps, kgs, keys, nss, states)
    # nothing was read or written in a map the key group does not name (maps[-1] above all)
    assert [m.get(kg, 0) for kg, m in enumerate(maps)] == (
        ["new"] * 3 if call in ("multi_put", "multi_replace") and at == 39 else [f"in {kg}" for kg in range(3)])


@pytest.mark.parametrize("call", list(MULTI))
def test_multi_map_calls_take_any_integer_key_group(call: str) -> None:
    maps = _filled_maps(CopyOnWriteStateMap)
    got = MULTI[call](maps, [np.int64(1), True, np.uint8(2)], [1, 1, 2], [0, 0, 0], ["a", "b", "c"])
    if call.startswith("multi_get"):
        assert got == ["in 1", "in 1", "in 2"]
    else:
        assert [m.get(kg, 0) for kg, m in enumerate(maps)] == ["in 0", "b", "c"]


@pytest.mark.parametrize("call", list(MULTI))
@pytest.mark.parametrize("bad", [1.0, "1", None, [1], object()])
def test_multi_map_calls_refuse_key_groups_that_are_not_ints(call: str, bad: Any) -> None:
    maps = _filled_maps(CopyOnWriteStateMap)
    with pytest.raises(TypeError, match=rf"kgs\[1\] must be an int \(a key group\), not {type(bad).__name__}"):
        MULTI[call](maps, [0, bad], [0, 1], [0, 0], ["a", "b"])


@pytest.mark.parametrize("call", list(MULTI))
@pytest.mark.parametrize("bad", [1, "map", object(), (), StateIncrementalVisitor])
def test_multi_map_calls_refuse_maps_entries_that_are_not_maps(call: str, bad: Any) -> None:
    maps = _filled_maps(FlatStateMap) + [bad]
    with pytest.raises(TypeError, match=r"maps\[3\] must be a CopyOnWriteStateMap, a FlatStateMap or None, not "):
        MULTI[call](maps, [0, 3], [0, 1], [0, 0], ["a", "b"])


def test_multi_map_calls_refuse_snapshots_as_maps() -> None:
    cow, flat = CopyOnWriteStateMap(), FlatStateMap()
    for snap in (cow.snapshot(), flat.snapshot()):
        for call in MULTI.values():
            with pytest.raises(TypeError, match=r"maps\[0\] must be"):
                call([snap], [0], [1], [0], ["a"])


@pytest.mark.parametrize("kind", MAP_KINDS, ids=lambda k: k.__name__)
def test_a_missing_map_reads_as_absent_and_a_put_into_it_is_refused(kind: type) -> None:
    maps = _filled_maps(kind) + [None]
    assert _core.multi_get(maps, [3, 1], [3, 1], [0, 0]) == [None, "in 1"]
    assert _core.multi_get(maps, [3, 1], [3, 1], [0, 0], 10, 5) == [None, "in 1"]
    assert _core.multi_replace(maps, [3, 1], [3, 1], [0, 0], ["a", "b"]) == [False, True]
    with pytest.raises(ValueError, match=r"multi_put: maps\[3\] is None"):
        _core.multi_put(maps, [1, 3], [1, 3], [0, 0], ["c", "d"])
    assert maps[1].get(1, 0) == "c"  # (not atomic: the items before are written)


@pytest.mark.parametrize(
    "args",
    [
        ((), [0], [0], [0], [0]),
        (None, [0], [0], [0], [0]),
        ("maps", [0], [0], [0], [0]),
        ([], (0,), [0], [0], [0]),
        ([], [0], range(1), [0], [0]),
        ([], [0], [0], None, [0]),
        ([], [0], [0], [0], (0,)),
    ],
    ids=["maps-tuple", "maps-none", "maps-str", "kgs-tuple", "keys-range", "namespaces-none", "states-tuple"],
)
def test_multi_map_calls_take_lists_only(args: tuple[Any, ...]) -> None:
    names = ["maps", "kgs", "keys", "namespaces", "states"]
    bad = next(name for name, a in zip(names, args) if type(a) is not list)
    for name, call in MULTI.items():
        if bad == "states" and not name.startswith(("multi_put", "multi_replace")):
            continue
        with pytest.raises(TypeError, match=f"'{bad}'"):
            call(*args)


@pytest.mark.parametrize("call", list(MULTI))
@pytest.mark.parametrize("short", ["kgs", "keys", "namespaces", "states"])
def test_multi_map_calls_refuse_columns_of_different_lengths(call: str, short: str) -> None:
    if short == "states" and call.startswith("multi_get"):
        return
    maps = _filled_maps(CopyOnWriteStateMap)
    cols = {"kgs": [0, 1], "keys": [0, 1], "namespaces": [0, 0], "states": ["a", "b"]}
    cols[short] = cols[short][:1]
    with pytest.raises(ValueError, match="same length"):
        MULTI[call](maps, cols["kgs"], cols["keys"], cols["namespaces"], cols["states"])
    assert [m.get(kg, 0) for kg, m in enumerate(maps)] == [f"in {kg}" for kg in range(3)]


class _Shrinking:
    """A key whose ``__hash__`` empties the given lists (Python code run mid-batch)."""

    def __init__(self, lists: list[list[Any]]) -> None:
        self.lists = lists

    def __hash__(self) -> int:
        for lst in self.lists:
            lst.clear()
        return 5


@pytest.mark.parametrize("kind", MAP_KINDS, ids=lambda k: k.__name__)
@pytest.mark.parametrize("call", list(MULTI))
@pytest.mark.parametrize("column", ["kgs", "keys", "namespaces", "states", "maps"])
def test_multi_map_calls_survive_their_lists_shrinking_under_them(kind: type, call: str, column: str) -> None:
    if column == "states" and call.startswith("multi_get"):
        return
    n = 200
    maps = _filled_maps(kind)
    kept = list(maps)
    cols = {"maps": maps, "kgs": [i % 3 for i in range(n)], "keys": list(range(n)), "namespaces": [0] * n,
            "states": ["s"] * n}
    cols["keys"][7] = _Shrinking([cols[column]])
    expected = (ValueError, r"kgs\[8\] = \d is not a key group of the 0 maps") if column == "maps" else (
        RuntimeError, rf"{call.split('-')[0]}: kgs, keys, namespaces or states changed length during the call")
    with pytest.raises(expected[0], match=expected[1]):
        MULTI[call](cols["maps"], cols["kgs"], cols["keys"], cols["namespaces"], cols["states"])
    # the items before the key were done; the maps are intact
    assert [m.get(kg, 0) for kg, m in enumerate(kept)] == (
        ["s"] * 3 if call in ("multi_put", "multi_replace") else [f"in {kg}" for kg in range(3)])
    assert [len(m) for m in kept] == ([3, 3, 2] if call == "multi_put" else [1, 1, 1])


class _IndexShrinking:
    """A key group whose ``__index__`` empties the given lists."""

    def __init__(self, value: int, lists: list[list[Any]]) -> None:
        self.value, self.lists = value, lists

    def __index__(self) -> int:
        for lst in self.lists:
            lst.clear()
        return self.value


@pytest.mark.parametrize("call", list(MULTI))
def test_multi_map_calls_survive_a_key_group_emptying_the_lists(call: str) -> None:
    maps = _filled_maps(CopyOnWriteStateMap)
    n = 50
    keys, nss, states = list(range(n)), [0] * n, ["s"] * n
    kgs: list[Any] = [0] * n
    kgs[10] = _IndexShrinking(1, [keys, nss, states])
    with pytest.raises(RuntimeError, match="changed length during the call"):
        MULTI[call](maps, kgs, keys, nss, states)


def test_remove_many_holds_each_key_while_its_hash_and_eq_run() -> None:
    """A key whose __hash__ empties the (live) list of keys is the batch's only reference
    to it: remove_many must hold it while probing, as the other batch ops do."""

    class K:
        def __init__(self, lst: list[Any], v: Any) -> None:
            self.lst, self.v = lst, v

        def __hash__(self) -> int:
            self.lst.clear()
            return hash(self.v)

        def __eq__(self, other: object) -> bool:
            return isinstance(other, K) and other.v == self.v

    m = _core.CopyOnWriteStateMap()
    kept = []
    for i in range(50):
        lst: list[Any] = []
        key = K(lst, i)
        kept.append(K([], i))
        m.put(kept[-1], "ns", i)
        lst.append(key)
        del key
        assert m.remove_many(lst, "ns") == 1
    assert len(m) == 0


# --------------------------------------------------------------------------- objects made without __init__

_NEW_ONLY = r"""
import importlib, sys
for m in sys.argv[1:]:
    mod = importlib.import_module(m)
    for name, cls in sorted(vars(mod).items()):
        if not isinstance(cls, type) or cls.__module__ != m:
            continue
        try:
            cls.__new__(cls)
        except Exception:
            continue
        for attr in sorted(dir(cls)):
            if attr.startswith("__") and attr not in {"__len__", "__repr__", "__next__", "__getitem__", "__call__"}:
                continue
            for args in ((), (1,), ("v",), (1, 2), (None,), (1, 2, 3)):
                print(m, name, attr, args, flush=True)
                try:
                    got = getattr(cls.__new__(cls), attr)
                    if callable(got):
                        got(*args)
                except Exception:
                    pass
print("ok")
"""


def test_compiled_objects_made_without_init_never_crash() -> None:
    """``Cls.__new__(Cls)`` skips ``__init__``, leaving the object's fields None:
    every method and property of every compiled class then raises or works,
    never reads through a None field (found: ``Rows`` made that way crashed
    on every method)."""
    import subprocess
    import sys
    from pathlib import Path

    sources = sorted((Path(__file__).resolve().parents[2] / "src" / "cowmap").glob("*.pyx"))
    modules = [f"cowmap.{p.stem}" for p in sources]  # every compiled module: one per Cython source
    assert len(modules) >= 8
    proc = subprocess.run([sys.executable, "-c", _NEW_ONLY, *modules], capture_output=True, text=True, timeout=300)
    last = proc.stdout.strip().splitlines()[-1:] or ["(nothing)"]
    assert proc.returncode == 0 and last == ["ok"], f"exit {proc.returncode} at: {last[0]}\n{proc.stderr[-2000:]}"
