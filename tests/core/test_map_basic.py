"""Basic behaviour of ``cowmap.CopyOnWriteStateMap``.

Covers the single-entry operations, key equality, the copy-on-write identity contract (Flink's
``serializer.copy`` contract), Flink's incremental-rehash trigger points, snapshot lifecycle,
iteration (also while rehashing), and the errors raised for bad input or misuse.
"""

from __future__ import annotations

import contextlib
import copy
import gc
import sys

import numpy as np
import pytest

from cowmap import NO_TIMESTAMP, CopyOnWriteStateMap, StateMapSnapshot

from core_helpers import (
    CollidingKey,
    CountingCopier,
    fill_until_rehashing,
    finish_rehash,
    map_contents,
    snapshot_contents,
    snapshot_contents_ts,
    threshold,
)

# --------------------------------------------------------------------------- construction


def test_defaults() -> None:
    m = CopyOnWriteStateMap()
    assert m.capacity == 128
    assert not m.is_rehashing
    assert len(m) == 0
    assert list(m) == []
    assert m.copier is None
    assert m.snapshot_versions == []
    assert m.highest_required_snapshot_version == 0
    assert isinstance(m.version, int)
    assert NO_TIMESTAMP == 2**63 - 1


def test_copier_property() -> None:
    copier = CountingCopier()
    assert CopyOnWriteStateMap(copier=copier).copier is copier


@pytest.mark.parametrize(
    ("requested", "expected"),
    [(0, 4), (1, 4), (3, 4), (4, 4), (5, 8), (64, 64), (100, 128), (128, 128), (129, 256), (1000, 1024)],
)
def test_capacity_rounded_up_to_power_of_two(requested: int, expected: int) -> None:
    m = CopyOnWriteStateMap(capacity=requested)
    assert m.capacity == expected
    assert not m.is_rehashing


def test_bad_constructor_arguments() -> None:
    with pytest.raises(ValueError):
        CopyOnWriteStateMap(capacity=-1)
    with pytest.raises(TypeError):
        CopyOnWriteStateMap(capacity="128")  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        CopyOnWriteStateMap(copier=42)  # type: ignore[arg-type]


# --------------------------------------------------------------------------- single-entry ops


def test_put_get_remove_roundtrip() -> None:
    m = CopyOnWriteStateMap()
    assert m.get(1, "a") is None
    assert not m.contains_key(1, "a")
    m.put(1, "a", "one-a")
    m.put(1, "b", "one-b")
    m.put(2, "a", "two-a")
    assert len(m) == 3
    assert m.get(1, "a") == "one-a"
    assert m.get(1, "b") == "one-b"
    assert m.get(2, "a") == "two-a"
    assert m.get(2, "b") is None
    assert m.contains_key(1, "b") and not m.contains_key(2, "b")

    m.put(1, "a", "one-a'")  # overwrite keeps the size
    assert len(m) == 3 and m.get(1, "a") == "one-a'"

    m.remove(1, "a")
    assert len(m) == 2 and not m.contains_key(1, "a") and m.get(1, "a") is None
    m.remove(1, "a")  # absent: no-op
    m.remove("nope", "a")
    assert len(m) == 2
    assert map_contents(m) == {(1, "b"): "one-b", (2, "a"): "two-a"}


def test_put_says_whether_the_key_is_new() -> None:
    m = CopyOnWriteStateMap()
    assert m.put("k", 0, None) is True
    assert m.put("k", 0, "v") is False  # a None state is a mapping too
    assert m.put("k", 1, "v") is True
    with m.snapshot():
        assert m.put("k", 0, "w") is False  # shared with the snapshot: copied, still not new
        assert m.put(7, 0, "x") is True
    m.remove("k", 0)
    assert m.put("k", 0, "y") is True
    assert len(m) == 3


def test_put_and_get_old_and_remove_and_get_old() -> None:
    m = CopyOnWriteStateMap()
    assert m.put_and_get_old("k", 0, "v1") is None
    assert m.put_and_get_old("k", 0, "v2") == "v1"
    assert m.get("k", 0) == "v2"
    assert len(m) == 1
    assert m.remove_and_get_old("k", 0) == "v2"
    assert m.remove_and_get_old("k", 0) is None
    assert len(m) == 0 and not m.contains_key("k", 0)


def test_transform_creates_and_updates() -> None:
    m = CopyOnWriteStateMap()
    seen = []

    def fn(old, value):
        seen.append((old, value))
        return (old or 0) + value

    m.transform("k", "ns", 5, fn)
    assert m.get("k", "ns") == 5 and len(m) == 1
    m.transform("k", "ns", 7, fn)
    assert m.get("k", "ns") == 12 and len(m) == 1
    assert seen == [(None, 5), (5, 7)]


def test_transform_exception_propagates_and_keeps_old_state() -> None:
    m = CopyOnWriteStateMap()
    m.put("k", 0, "old")

    def boom(old, value):
        raise ZeroDivisionError("boom")

    with pytest.raises(ZeroDivisionError):
        m.transform("k", 0, 1, boom)
    assert m.get("k", 0) == "old"
    assert len(m) == 1


def test_none_state_is_a_mapping() -> None:
    m = CopyOnWriteStateMap()
    m.put("k", 0, None)
    assert m.contains_key("k", 0)
    assert len(m) == 1
    assert m.get("k", 0) is None
    assert m.get_with_timestamp("k", 0) == (None, NO_TIMESTAMP)
    assert list(m) == [("k", 0, None)]
    # put_and_get_old of a None state returns None but the mapping existed
    assert m.put_and_get_old("k", 0, "x") is None
    assert m.put_and_get_old("k", 0, None) == "x"
    assert m.contains_key("k", 0)
    with m.snapshot() as s:
        assert list(s) == [("k", 0, None)]
    assert m.remove_and_get_old("k", 0) is None
    assert not m.contains_key("k", 0) and len(m) == 0


def test_transform_of_none_state_passes_none() -> None:
    m = CopyOnWriteStateMap()
    m.put("k", 0, None)
    got = []
    m.transform("k", 0, 1, lambda old, v: got.append(old) or "new")
    assert got == [None] and m.get("k", 0) == "new"


# --------------------------------------------------------------------------- key equality


def test_equal_keys_are_the_same_key() -> None:
    m = CopyOnWriteStateMap()
    m.put(1, "ns", "x")
    assert m.get(1.0, "ns") == "x"
    assert m.get(True, "ns") == "x"
    m.put(True, "ns", "y")  # same key: overwrite
    assert len(m) == 1 and m.get(1, "ns") == "y"
    # equal namespaces too
    m.put("k", 0, "z")
    assert m.get("k", 0.0) == "z" and m.get("k", False) == "z"
    assert len(m) == 2
    # numpy scalars hash and compare like the Python int
    assert m.get(np.int64(1), "ns") == "y"
    m.remove(1.0, "ns")
    assert not m.contains_key(1, "ns") and len(m) == 1


@pytest.mark.parametrize(
    ("a", "b"),
    [
        (-1, -2),  # hash(-1) == hash(-2) == -2 in CPython
        (5, 2**61 - 1 + 5),  # int hashes are reduced modulo 2**61 - 1
        (0, 2**61 - 1),
        (2**64 + 3, 3),
        (-(2**70), -(2**70) + 1),
        ((1, 2), (2, 1)),
        ("a", "b"),
    ],
)
def test_distinct_keys_with_colliding_or_big_hashes(a, b) -> None:
    m = CopyOnWriteStateMap(capacity=4)
    m.put(a, 0, "A")
    m.put(b, 0, "B")
    assert len(m) == 2
    assert m.get(a, 0) == "A" and m.get(b, 0) == "B"
    m.remove(a, 0)
    assert m.get(a, 0) is None and m.get(b, 0) == "B"
    assert len(m) == 1


def test_big_and_negative_int_keys_roundtrip() -> None:
    keys = [0, -1, -2, 1, 2**31, -(2**31), 2**63 - 1, -(2**63), 2**63, 2**64, 2**200, -(2**200)]
    m = CopyOnWriteStateMap(capacity=4)
    for i, k in enumerate(keys):
        m.put(k, "ns", i)
    assert len(m) == len(keys)
    for i, k in enumerate(keys):
        assert m.get(k, "ns") == i
    assert map_contents(m) == {(k, "ns"): i for i, k in enumerate(keys)}


def test_key_and_namespace_are_not_interchangeable() -> None:
    # a composite hash that combines key and namespace symmetrically (e.g. by XOR) makes these
    # collide; equality must still tell them apart.
    m = CopyOnWriteStateMap(capacity=4)
    m.put(1, 2, "k1n2")
    m.put(2, 1, "k2n1")
    m.put((1, 2), 3, "tuple-key")
    m.put(1, (2, 3), "tuple-ns")
    assert len(m) == 4
    assert m.get(1, 2) == "k1n2" and m.get(2, 1) == "k2n1"
    assert m.get((1, 2), 3) == "tuple-key" and m.get(1, (2, 3)) == "tuple-ns"


def test_key_equal_to_namespace_many_entries() -> None:
    # XOR-combined hashes of (k, k) are all zero: one long chain. Must still be a correct map.
    m = CopyOnWriteStateMap(capacity=4)
    n = 400
    for k in range(n):
        m.put(k, k, -k)
    assert len(m) == n
    for k in range(n):
        assert m.get(k, k) == -k
        assert not m.contains_key(k, k + 1)
    for k in range(0, n, 2):
        m.remove(k, k)
    assert len(m) == n // 2
    assert map_contents(m) == {(k, k): -k for k in range(1, n, 2)}


def test_all_keys_in_one_chain() -> None:
    m = CopyOnWriteStateMap(capacity=4)
    keys = [CollidingKey(i, h=12345) for i in range(200)]
    for i, k in enumerate(keys):
        m.put(k, "ns", i)
    assert len(m) == 200
    for i in range(200):
        assert m.get(CollidingKey(i, h=12345), "ns") == i
    assert m.get(CollidingKey(999, h=12345), "ns") is None
    for i in range(0, 200, 3):
        assert m.remove_and_get_old(CollidingKey(i, h=12345), "ns") == i
    expected = {(CollidingKey(i, h=12345), "ns"): i for i in range(200) if i % 3}
    assert map_contents(m) == expected
    with m.snapshot() as s:
        assert snapshot_contents(s) == expected


def test_key_hash_error_propagates() -> None:
    class BadHash:
        def __hash__(self):
            raise ZeroDivisionError("no hash")

    m = CopyOnWriteStateMap()
    m.put(1, 0, "x")
    for op in (
        lambda: m.put(BadHash(), 0, 1),
        lambda: m.get(BadHash(), 0),
        lambda: m.contains_key(0, BadHash()),
        lambda: m.remove(BadHash(), 0),
        lambda: m.transform(BadHash(), 0, 1, lambda o, v: v),
    ):
        with pytest.raises(ZeroDivisionError):
            op()
    assert map_contents(m) == {(1, 0): "x"}


def test_key_eq_error_propagates() -> None:
    class BadEq(CollidingKey):
        def __eq__(self, other):
            raise ZeroDivisionError("no eq")

        __hash__ = CollidingKey.__hash__

    m = CopyOnWriteStateMap()
    m.put(BadEq(1, h=7), 0, "x")
    # a second key with the same hash must be compared with the first one
    with pytest.raises(ZeroDivisionError):
        m.put(BadEq(2, h=7), 0, "y")
    with pytest.raises(ZeroDivisionError):
        m.get(BadEq(2, h=7), 0)
    assert len(m) == 1
    assert len(list(m)) == 1


# --------------------------------------------------------------------------- re-entrancy


class _ReentrantEqKey(CollidingKey):
    """A key whose ``__eq__`` calls back into the map (armed only when ``m`` is set)."""

    m: CopyOnWriteStateMap | None = None
    action = staticmethod(lambda m: m.get("other", 0))

    def __eq__(self, other):
        if _ReentrantEqKey.m is not None:
            _ReentrantEqKey.action(_ReentrantEqKey.m)
        return CollidingKey.__eq__(self, other)

    __hash__ = CollidingKey.__hash__


@pytest.mark.parametrize(
    "action",
    [
        lambda m: m.get("other", 0),
        lambda m: m.contains_key("other", 0),
        lambda m: m.put("other", 0, 1),
        lambda m: m.remove("other", 0),
        lambda m: m.snapshot().release(),
        lambda m: len(list(m)),
    ],
    ids=["get", "contains_key", "put", "remove", "snapshot", "iter"],
)
def test_reentrant_use_from_key_eq_raises_runtime_error(action) -> None:
    m = CopyOnWriteStateMap()
    m.put(_ReentrantEqKey(1, h=3), 0, "one")
    m.put("other", 0, "other")
    _ReentrantEqKey.action = staticmethod(action)
    _ReentrantEqKey.m = m
    try:
        with pytest.raises(RuntimeError):
            # same hash, different identity: the map must call __eq__ on the stored key
            m.put(_ReentrantEqKey(2, h=3), 0, "two")
    finally:
        _ReentrantEqKey.m = None
    # the map is intact and usable
    assert m.get(_ReentrantEqKey(1, h=3), 0) == "one"
    assert m.get("other", 0) == "other"
    assert len(m) == len(list(m)) == 2


class _CountingHashKey:
    hashed = 0

    def __hash__(self) -> int:
        _CountingHashKey.hashed += 1
        return 7


def test_prefetch_is_a_hint_that_changes_nothing() -> None:
    """``prefetch`` only starts loading a bucket: it returns None and leaves the map as
    it was, for present and absent keys and keys of any type; it never runs a key's
    own ``__hash__`` (a hint must not run Python code) and, called from a key's
    ``__eq__`` while the map is in use, it is skipped instead of raising."""
    m = CopyOnWriteStateMap()
    for k in range(200):
        m.put(k, "ns", k)
    m.put("s", 1, "str key")
    before = (sorted(map(repr, m)), m.version, len(m))
    for key, ns in ((5, "ns"), (10**6, "ns"), ("s", 1), ("absent", 2), (2**70, 0), ([1], 0), (1, {}), (None, None)):
        assert m.prefetch(key, ns) is None
    counting = _CountingHashKey()
    m.prefetch(counting, 0)
    assert _CountingHashKey.hashed == 0
    assert (sorted(map(repr, m)), m.version, len(m)) == before
    m.put(_ReentrantEqKey(1, h=3), 0, "one")
    default_action = _ReentrantEqKey.action
    _ReentrantEqKey.action = staticmethod(lambda mm: mm.prefetch("other", 0))
    _ReentrantEqKey.m = m
    try:
        m.put(_ReentrantEqKey(2, h=3), 0, "two")  # its __eq__ prefetches on the busy map
    finally:
        _ReentrantEqKey.m = None
        _ReentrantEqKey.action = default_action
    assert m.get(_ReentrantEqKey(2, h=3), 0) == "two" and len(m) == 203


def test_reentrant_use_from_key_hash_raises_runtime_error() -> None:
    m = CopyOnWriteStateMap()

    class ReentrantHash:
        def __hash__(self):
            m.put("inner", 0, 1)
            return 1

    with pytest.raises(RuntimeError):
        m.put(ReentrantHash(), 0, "x")
    assert len(m) == len(list(m))
    assert not m.contains_key("inner", 0)


def test_reentrant_use_from_copier_raises_runtime_error() -> None:
    m: CopyOnWriteStateMap

    armed = [True]

    def copier(state):
        if armed[0]:
            armed[0] = False
            m.put("x", 0, ["from copier"])
        return list(state)

    m = CopyOnWriteStateMap(copier=copier)
    original = [1, 2]
    m.put("k", 0, original)
    with m.snapshot() as s:
        with pytest.raises(RuntimeError):
            m.get("k", 0)
        assert not m.contains_key("x", 0)
        # still usable: the next get copies normally
        got = m.get("k", 0)
        assert got == [1, 2] and got is not original
        assert snapshot_contents(s) == {("k", 0): [1, 2]}
        assert next(iter(s))[2] is original


def test_copier_exception_propagates_and_map_stays_consistent() -> None:
    fail = [True]

    def copier(state):
        if fail[0]:
            fail[0] = False
            raise ZeroDivisionError("copy failed")
        return list(state)

    m = CopyOnWriteStateMap(copier=copier)
    original = [1]
    m.put("k", 0, original)
    with m.snapshot() as s:
        with pytest.raises(ZeroDivisionError):
            m.get("k", 0)
        got = m.get("k", 0)
        assert got == [1] and got is not original
        got.append(2)
        assert m.get("k", 0) == [1, 2]
        assert snapshot_contents(s) == {("k", 0): [1]}


def test_state_del_touching_the_map_never_crashes() -> None:
    """A state's ``__del__`` that uses the map runs when the map drops the state.

    Whether that nested call succeeds or raises (an unraisable exception inside ``__del__``),
    the map must stay consistent.
    """
    m = CopyOnWriteStateMap(capacity=4)
    unraisable = []
    old_hook = sys.unraisablehook
    sys.unraisablehook = lambda u: unraisable.append(u.exc_type)

    class Touchy:
        def __init__(self, i):
            self.i = i

        def __del__(self):
            m.put(("from-del", self.i), 0, self.i)
            m.get(("from-del", self.i), 0)

    try:
        for i in range(50):
            m.put(i, 0, Touchy(i))
        with m.snapshot():
            for i in range(0, 50, 2):
                m.put(i, 0, "replaced")  # old Touchy still held by the snapshot
            for i in range(1, 50, 2):
                m.remove(i, 0)
        # snapshot released: the replaced/removed Touchy objects die now or a bit later
        for i in range(50):
            m.put(i, 1, i)  # more activity (and rehash steps)
        gc.collect()
    finally:
        sys.unraisablehook = old_hook
    assert all(t is RuntimeError for t in unraisable), unraisable
    contents = map_contents(m)
    assert len(contents) == len(m)
    for i in range(50):
        assert m.get(i, 1) == i
        assert m.get(i, 0) == ("replaced" if i % 2 == 0 else None)
    for (k, ns), v in contents.items():
        assert (isinstance(k, int) and ns in (0, 1)) or (k == ("from-del", v) and ns == 0)


# --------------------------------------------------------------------------- bad input


_NONE_AND_UNHASHABLE = [None, [1], {"a": 1}, {1, 2}]


@pytest.mark.parametrize("bad", _NONE_AND_UNHASHABLE, ids=["None", "list", "dict", "set"])
@pytest.mark.parametrize("where", ["key", "ns"])
@pytest.mark.parametrize(
    "op",
    [
        lambda m, k, n: m.put(k, n, 1),
        lambda m, k, n: m.put(k, n, 1, 5),
        lambda m, k, n: m.get(k, n),
        lambda m, k, n: m.get_with_timestamp(k, n),
        lambda m, k, n: m.timestamp(k, n),
        lambda m, k, n: m.set_timestamp(k, n, 5),
        lambda m, k, n: m.contains_key(k, n),
        lambda m, k, n: m.remove(k, n),
        lambda m, k, n: m.put_and_get_old(k, n, 1),
        lambda m, k, n: m.remove_and_get_old(k, n),
        lambda m, k, n: m.transform(k, n, 1, lambda o, v: v),
    ],
    ids=[
        "put",
        "put_ts",
        "get",
        "get_with_timestamp",
        "timestamp",
        "set_timestamp",
        "contains_key",
        "remove",
        "put_and_get_old",
        "remove_and_get_old",
        "transform",
    ],
)
def test_none_or_unhashable_key_or_namespace_is_type_error(op, where, bad) -> None:
    m = CopyOnWriteStateMap()
    m.put("k", "ns", "v")
    key, ns = (bad, "ns") if where == "key" else ("k", bad)
    with pytest.raises(TypeError):
        op(m, key, ns)
    assert map_contents(m) == {("k", "ns"): "v"}


def test_non_callable_transform_fn_is_type_error_and_changes_nothing() -> None:
    m = CopyOnWriteStateMap()
    m.put("k", 0, "v")
    with pytest.raises(TypeError):
        m.transform("k", 0, 1, 42)  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        m.transform("absent", 0, 1, None)  # type: ignore[arg-type]
    assert map_contents(m) == {("k", 0): "v"}


@pytest.mark.parametrize("bad_ts", ["5", 1.5])
def test_non_int_timestamp_is_type_error(bad_ts) -> None:
    m = CopyOnWriteStateMap()
    with pytest.raises(TypeError):
        m.put("k", 0, "v", bad_ts)
    with pytest.raises(TypeError):
        m.put_and_get_old("k", 0, "v", bad_ts)
    m.put("k", 0, "v", 3)
    with pytest.raises(TypeError):
        m.set_timestamp("k", 0, bad_ts)
    assert m.timestamp("k", 0) == 3
    assert len(m) == 1


@pytest.mark.parametrize("bad_ts", [2**63, -(2**63) - 1, 2**100])
def test_out_of_range_timestamp_is_rejected(bad_ts) -> None:
    # ts is an int64; Python reports out-of-range ints for C integers as OverflowError
    # (a ValueError is equally acceptable as a "bad value").
    m = CopyOnWriteStateMap()
    with pytest.raises((ValueError, OverflowError)):
        m.put("k", 0, "v", bad_ts)
    assert len(m) == 0 and not m.contains_key("k", 0)


# --------------------------------------------------------------------------- copy-on-write


def test_no_copy_without_snapshot() -> None:
    copier = CountingCopier()
    m = CopyOnWriteStateMap(copier=copier)
    state = [1, 2, 3]
    m.put("k", 0, state)
    for _ in range(3):
        assert m.get("k", 0) is state
    assert m.get_with_timestamp("k", 0)[0] is state
    got = []
    m.transform("k", 0, 4, lambda old, v: got.append(old) or old + [v])
    assert got[0] is state
    new = m.get("k", 0)
    assert m.put_and_get_old("k", 0, [9]) is new
    assert m.get_many(["k"], 0)[0] == [9]
    assert m.remove_and_get_old("k", 0) == [9]
    assert copier.calls == 0


def test_first_get_after_snapshot_copies_once() -> None:
    copier = CountingCopier()
    m = CopyOnWriteStateMap(copier=copier)
    state = [1, 2, 3]
    m.put("k", 0, state)
    s = m.snapshot()

    first = m.get("k", 0)
    assert first is not state and first == state
    assert copier.calls == 1 and copier.copied[0][0] is state
    for _ in range(3):
        assert m.get("k", 0) is first  # later gets return the same copy
    assert m.get_with_timestamp("k", 0)[0] is first
    assert copier.calls == 1

    # mutate the copy in place: the snapshot still sees the original object, unchanged
    first.append(4)
    assert m.get("k", 0) == [1, 2, 3, 4]
    [(k, ns, snap_state)] = list(s)
    assert snap_state is state and state == [1, 2, 3]

    s.release()
    assert m.get("k", 0) is first
    assert copier.calls == 1


def test_no_copy_after_last_snapshot_released() -> None:
    copier = CountingCopier()
    m = CopyOnWriteStateMap(copier=copier)
    states = {i: [i] for i in range(20)}
    for i, st in states.items():
        m.put(i, 0, st)
    m.snapshot().release()
    with m.snapshot():
        pass
    for i, st in states.items():
        assert m.get(i, 0) is st
    got = []
    m.transform(3, 0, 1, lambda old, v: got.append(old) or old)
    assert got[0] is states[3]
    assert m.put_and_get_old(4, 0, [0]) is states[4]
    assert m.remove_and_get_old(5, 0) is states[5]
    assert m.get_many([6, 7], 0)[0] is states[6]
    assert copier.calls == 0


def test_entry_written_after_snapshot_is_not_copied() -> None:
    copier = CountingCopier()
    m = CopyOnWriteStateMap(copier=copier)
    m.put("old", 0, [0])
    with m.snapshot() as s:
        new_state = [1]
        m.put("new", 0, new_state)
        assert m.get("new", 0) is new_state
        replaced = [2]
        m.put("old", 0, replaced)  # overwrite of a shared entry with a fresh state
        assert m.get("old", 0) is replaced
        assert copier.calls == 0
        assert snapshot_contents(s) == {("old", 0): [0]}


def test_transform_of_shared_state_receives_a_copy() -> None:
    copier = CountingCopier()
    m = CopyOnWriteStateMap(copier=copier)
    state = [1]
    m.put("k", 0, state)
    with m.snapshot() as s:
        received = []

        def append_in_place(old, v):
            received.append(old)
            old.append(v)
            return old

        m.transform("k", 0, 2, append_in_place)
        assert received[0] is not state and copier.calls == 1
        assert m.get("k", 0) == [1, 2]
        assert m.get("k", 0) is received[0]
        m.transform("k", 0, 3, append_in_place)  # now owned by the map: no more copies
        assert received[1] is received[0] and copier.calls == 1
        assert state == [1]
        assert snapshot_contents(s) == {("k", 0): [1]}
    assert m.get("k", 0) == [1, 2, 3]


def test_put_and_get_old_and_remove_and_get_old_of_shared_state_return_copies() -> None:
    copier = CountingCopier()
    m = CopyOnWriteStateMap(copier=copier)
    a, b = [1], [2]
    m.put("a", 0, a)
    m.put("b", 0, b)
    with m.snapshot() as s:
        old_a = m.put_and_get_old("a", 0, [10])
        assert old_a == [1] and old_a is not a
        old_b = m.remove_and_get_old("b", 0)
        assert old_b == [2] and old_b is not b
        assert copier.calls == 2
        old_a.append("mutated")
        old_b.append("mutated")
        assert snapshot_contents(s) == {("a", 0): [1], ("b", 0): [2]}
        snap = {k: st for k, _, st in s}
        assert snap["a"] is a and snap["b"] is b
        # a state put after the snapshot is not shared
        fresh = m.get("a", 0)
        assert m.put_and_get_old("a", 0, [11]) is fresh
        assert copier.calls == 2


def test_copy_per_snapshot_generation() -> None:
    copier = CountingCopier()
    m = CopyOnWriteStateMap(copier=copier)
    original = [0]
    m.put("k", 0, original)
    s1 = m.snapshot()
    c1 = m.get("k", 0)
    c1.append(1)
    s2 = m.snapshot()
    c2 = m.get("k", 0)  # shared with s2 now: copied again
    assert c2 is not c1 and c2 == [0, 1] and copier.calls == 2
    c2.append(2)
    assert [st for _, _, st in s1] == [[0]] and next(iter(s1))[2] is original
    assert [st for _, _, st in s2] == [[0, 1]] and next(iter(s2))[2] is c1
    s2.release()
    # c2 was written after s2 and s1 is older: no more copies needed
    assert m.get("k", 0) is c2 and copier.calls == 2
    assert [st for _, _, st in s1] == [[0]]
    s1.release()
    assert m.get("k", 0) is c2 and copier.calls == 2


def test_get_many_copies_shared_states_like_get() -> None:
    copier = CountingCopier()
    m = CopyOnWriteStateMap(copier=copier)
    originals = {i: [i] for i in range(10)}
    for i, st in originals.items():
        m.put(i, "ns", st)
    with m.snapshot() as s:
        first = m.get_many(list(range(12)), "ns")
        assert first[10] is None and first[11] is None
        for i in range(10):
            assert first[i] == [i] and first[i] is not originals[i]
        assert copier.calls == 10
        second = m.get_many(list(range(10)), "ns")
        assert all(a is b for a, b in zip(first, second))
        assert all(m.get(i, "ns") is first[i] for i in range(10))
        assert copier.calls == 10
        for st in first[:10]:
            st.append("x")
        assert all(st is originals[k] for k, _, st in s)
        assert all(st == [k] for k, _, st in s)


def test_without_copier_states_are_never_copied() -> None:
    m = CopyOnWriteStateMap()
    state = [1]
    m.put("k", 0, state)
    with m.snapshot() as s:
        assert m.get("k", 0) is state
        got = []
        m.transform("k", 0, 1, lambda old, v: got.append(old) or old)
        assert got[0] is state
        assert next(iter(s))[2] is state


def test_non_shared_entries_in_a_rehashing_map_are_not_copied() -> None:
    copier = CountingCopier()
    m = CopyOnWriteStateMap(copier=copier)
    with m.snapshot():
        pass
    nxt = fill_until_rehashing(m)
    assert copier.calls == 0
    assert all(m.get(k, 0) == k for k in range(nxt))
    assert copier.calls == 0


# --------------------------------------------------------------------------- rehash (Flink)


def test_rehash_trigger_points_default_capacity() -> None:
    m = CopyOnWriteStateMap()
    for k in range(97):
        m.put(k, 0, k)
        assert not m.is_rehashing, k
        assert m.capacity == 128
    m.put(97, 0, 97)  # size() == 97 > threshold 96: the 98th put starts the rehash
    assert m.is_rehashing
    assert m.capacity == 128  # the primary table while rehashing
    for k in range(98, 123):
        m.put(k, 0, k)
        assert m.is_rehashing, k
        assert m.capacity == 128
    m.put(123, 0, 123)  # the 26th operation after the start finishes it
    assert not m.is_rehashing
    assert m.capacity == 256
    assert len(m) == 124
    assert map_contents(m) == {(k, 0): k for k in range(124)}


@pytest.mark.parametrize("capacity", [4, 8, 16, 64, 1024])
def test_rehash_starts_above_three_quarters(capacity: int) -> None:
    m = CopyOnWriteStateMap(capacity=capacity)
    t = threshold(capacity)
    for k in range(t + 1):
        m.put(k, "ns", k)
    assert not m.is_rehashing and m.capacity == capacity
    m.put(t + 1, "ns", t + 1)
    assert m.is_rehashing and m.capacity == capacity
    finish_rehash(m)
    assert m.capacity == 2 * capacity
    assert map_contents(m) == {(k, "ns"): k for k in range(t + 2)}


def test_overwrites_do_not_start_a_rehash() -> None:
    m = CopyOnWriteStateMap()
    for k in range(97):
        m.put(k, 0, k)
    for _rnd in range(3):
        for k in range(97):
            m.put(k, 0, -k)
            m.transform(k, 0, 1, lambda o, v: o)
    assert not m.is_rehashing and m.capacity == 128


@pytest.mark.parametrize(
    "op",
    [
        lambda m, i: m.get(i, 0),
        lambda m, i: m.get(-1 - i, 0),  # absent keys
        lambda m, i: m.contains_key(i, 0),
        lambda m, i: m.contains_key(i, "absent-ns"),
        lambda m, i: m.timestamp(i, 0),
        lambda m, i: m.get_with_timestamp(i, 0),
        lambda m, i: m.put(i, 0, i),  # overwrite
        lambda m, i: m.remove(-1 - i, 0),  # absent: no-op
        lambda m, i: m.transform(i, 0, 0, lambda o, v: o),
        lambda m, i: m.set_timestamp(i, 0, 7),
    ],
    ids=[
        "get",
        "get-absent",
        "contains_key",
        "contains_key-absent",
        "timestamp",
        "get_with_timestamp",
        "put-overwrite",
        "remove-absent",
        "transform",
        "set_timestamp",
    ],
)
def test_every_operation_advances_the_rehash(op) -> None:
    """Each operation migrates at least 4 entries while rehashing (Flink), so 98 entries are
    moved by at most ceil(98 / 4) = 25 operations that add no entries."""
    m = CopyOnWriteStateMap()
    for k in range(98):
        m.put(k, 0, k)
    assert m.is_rehashing
    n = 0
    while m.is_rehashing:
        op(m, n % 98)
        n += 1
        assert n <= 25, "rehash did not advance by >= 4 entries per operation"
    assert m.capacity == 256
    assert len(m) == 98
    assert {k for (k, ns) in map_contents(m)} == set(range(98))


def test_removes_advance_the_rehash() -> None:
    m = CopyOnWriteStateMap()
    for k in range(98):
        m.put(k, 0, k)
    n = 0
    while m.is_rehashing:
        m.remove(n, 0)
        n += 1
        assert n <= 25
    assert map_contents(m) == {(k, 0): k for k in range(n, 98)}


def test_all_entries_reachable_during_rehash() -> None:
    m = CopyOnWriteStateMap(capacity=64)
    nxt = fill_until_rehashing(m)
    k = nxt
    while m.is_rehashing:
        # lookups from both tables, puts into both tables, removes from both tables
        probe = (k * 7) % k
        if m.contains_key(probe, 0):
            assert m.get(probe, 0) == probe
        m.put(k, 0, k)
        m.remove(k - 3, 0)
        k += 1
    expected = {(i, 0): i for i in range(k) if not (nxt - 3 <= i < k - 3)}
    assert map_contents(m) == expected


def test_many_rehashes_from_tiny_capacity() -> None:
    m = CopyOnWriteStateMap(capacity=4)
    n = 20_000
    for k in range(n):
        m.put(k, k % 3, str(k))
    assert len(m) == n
    finish_rehash(m)
    assert m.capacity >= n * 4 // 3
    assert m.capacity & (m.capacity - 1) == 0
    for k in range(0, n, 97):
        assert m.get(k, k % 3) == str(k)
    assert map_contents(m) == {(k, k % 3): str(k) for k in range(n)}


# --------------------------------------------------------------------------- snapshots


def test_snapshot_is_isolated_from_later_changes() -> None:
    m = CopyOnWriteStateMap(capacity=4)
    for k in range(10):
        m.put(k, "ns", k, ts=k)
    s = m.snapshot()
    expected = {(k, "ns"): (k, k) for k in range(10)}
    # puts, overwrites, removes, transforms, timestamp changes, rehashes, other snapshots
    for k in range(10, 200):
        m.put(k, "ns", k)
    for k in range(0, 10, 2):
        m.put(k, "ns", "changed", ts=99)
    for k in range(1, 10, 4):
        m.remove(k, "ns")
    m.transform(3, "ns", 1, lambda o, v: "transformed")
    m.set_timestamp(7, "ns", 1234)
    other = m.snapshot()
    m.sweep_expired(now=10**6, ttl=1, max_entries=None)
    other.release()
    assert isinstance(s, StateMapSnapshot)
    assert len(s) == 10
    assert snapshot_contents_ts(s) == expected
    assert snapshot_contents(s) == {k: v[0] for k, v in expected.items()}
    s.release()


def test_snapshots_of_a_large_map() -> None:
    """Many buckets (many pages of a paged table), scattered writes, a rehash while two
    snapshots are live: each snapshot keeps exactly its own contents."""
    m = CopyOnWriteStateMap(copier=list)
    n = 30_000
    m.put_many(list(range(n)), "ns", [[k] for k in range(n)])
    finish_rehash(m)
    s1 = m.snapshot()
    exp1 = {(k, "ns"): [k] for k in range(n)}
    for k in range(0, n, 97):
        m.get(k, "ns").append("a")
    for k in range(5, n, 101):
        m.remove(k, "ns")
    s2 = m.snapshot()
    exp2 = {key: list(st) for key, st in map_contents(m).items()}
    k = n
    while not m.is_rehashing:  # grow until a rehash starts, then go on while it runs
        m.put(k, "ns", [k])
        k += 1
    while m.is_rehashing:
        m.put(k, "ns", [k])
        if m.contains_key(k - n, "ns"):
            m.get(k - n, "ns").append("b")
        k += 1
    assert len(s1) == len(exp1) and snapshot_contents(s1) == exp1
    assert len(s2) == len(exp2) and snapshot_contents(s2) == exp2
    s1.release()
    assert snapshot_contents(s2) == exp2
    s2.release()


def test_snapshot_of_empty_map() -> None:
    m = CopyOnWriteStateMap()
    with m.snapshot() as s:
        m.put(1, 1, 1)
        assert len(s) == 0 and list(s) == [] and list(s.iter_with_timestamps()) == []


def test_snapshot_during_rehash() -> None:
    m = CopyOnWriteStateMap(capacity=16)
    nxt = fill_until_rehashing(m)
    m.get(0, 0)  # one rehash step in
    assert m.is_rehashing
    s = m.snapshot()
    expected = {(k, 0): k for k in range(nxt)}
    for k in range(nxt, nxt + 100):
        m.put(k, 0, k)
    for k in range(0, nxt, 3):
        m.remove(k, 0)
    assert len(s) == nxt
    assert snapshot_contents(s) == expected
    s.release()


def test_snapshot_iterable_many_times_and_len_consistent() -> None:
    m = CopyOnWriteStateMap()
    for k in range(50):
        m.put(k, 0, k)
    with m.snapshot() as s:
        a = list(s)
        m.put(1000, 0, 0)
        b = list(s)
        assert sorted(a) == sorted(b) and len(a) == len(s) == 50
        ts = list(s.iter_with_timestamps())
        assert sorted(ts) == sorted((k, ns, st, NO_TIMESTAMP) for k, ns, st in a)


def test_snapshot_release_idempotent_and_context_manager() -> None:
    m = CopyOnWriteStateMap()
    m.put(1, 0, "a")
    s = m.snapshot()
    assert not s.released
    assert m.snapshot_versions == [s.version]
    assert m.highest_required_snapshot_version == s.version
    s.release()
    assert s.released
    s.release()  # idempotent
    assert s.released
    assert m.snapshot_versions == []
    assert m.highest_required_snapshot_version == 0

    with m.snapshot() as s2:
        assert not s2.released
        assert m.snapshot_versions == [s2.version]
    assert s2.released
    assert m.snapshot_versions == []

    # released on exit even when the block raises
    with pytest.raises(KeyError), m.snapshot() as s3:
        raise KeyError("x")
    assert s3.released and m.snapshot_versions == []


def test_using_a_released_snapshot_is_runtime_error() -> None:
    m = CopyOnWriteStateMap()
    m.put(1, 0, "a")
    s = m.snapshot()
    s.release()
    with pytest.raises(RuntimeError):
        len(s)
    with pytest.raises(RuntimeError):
        list(s)
    with pytest.raises(RuntimeError):
        list(s.iter_with_timestamps())
    assert isinstance(s.version, int)


def test_release_during_snapshot_iteration_never_crashes() -> None:
    m = CopyOnWriteStateMap(capacity=4)
    for k in range(200):
        m.put(k, 0, [k])
    s = m.snapshot()
    it = iter(s)
    seen = [next(it) for _ in range(10)]
    s.release()
    for k in range(200):
        m.put(k, 0, "new")  # would overwrite anything the snapshot still pointed at
    gc.collect()
    with contextlib.suppress(RuntimeError):  # refusing to go on is fine; handing out garbage is not
        seen.extend(it)
    for k, ns, st in seen:
        assert st == [k] and ns == 0


def test_snapshot_outlives_the_map() -> None:
    m = CopyOnWriteStateMap(capacity=4)
    for k in range(100):
        m.put(k, "ns", [k])
    s = m.snapshot()
    del m
    gc.collect()
    assert len(s) == 100
    assert snapshot_contents(s) == {(k, "ns"): [k] for k in range(100)}
    s.release()
    assert s.released


def test_snapshot_versions_multiple_live() -> None:
    m = CopyOnWriteStateMap()
    m.put(1, 0, "x")
    snaps = [m.snapshot() for _ in range(5)]
    versions = [s.version for s in snaps]
    assert all(isinstance(v, int) for v in versions)
    assert versions == sorted(versions) and len(set(versions)) == 5  # strictly increasing
    assert m.snapshot_versions == versions
    assert m.highest_required_snapshot_version == versions[-1]
    snaps[4].release()
    assert m.snapshot_versions == versions[:4]
    assert m.highest_required_snapshot_version == versions[3]
    snaps[1].release()
    assert m.snapshot_versions == [versions[0], versions[2], versions[3]]
    assert m.highest_required_snapshot_version == versions[3]
    snaps[3].release()
    snaps[2].release()
    assert m.highest_required_snapshot_version == versions[0]
    later = m.snapshot()
    assert later.version > versions[-1]
    assert m.snapshot_versions == [versions[0], later.version]
    later.release()
    snaps[0].release()
    assert m.snapshot_versions == [] and m.highest_required_snapshot_version == 0


def test_nested_snapshots_each_see_their_moment() -> None:
    copier = CountingCopier()
    m = CopyOnWriteStateMap(capacity=4, copier=copier)
    expected = []
    snaps = []
    model: dict = {}
    for gen in range(6):
        for k in range(gen * 7, gen * 7 + 30):
            m.transform(k % 40, 0, gen, lambda old, v: (old or []) + [v])
            model[(k % 40, 0)] = model.get((k % 40, 0), []) + [gen]
            st = m.get(k % 40, 0)
            st.append(-gen)  # in place: must not leak into older snapshots
            model[(k % 40, 0)] = model[(k % 40, 0)] + [-gen]
        m.remove(gen, 0)
        model.pop((gen, 0), None)
        snaps.append(m.snapshot())
        expected.append(copy.deepcopy(model))
    for s, exp in zip(snaps, expected):
        assert snapshot_contents(s) == exp
    for s in snaps[::2]:
        s.release()
    for s, exp in zip(snaps[1::2], expected[1::2]):
        assert snapshot_contents(s) == exp
    assert map_contents(m) == model


# --------------------------------------------------------------------------- iteration


def test_iteration_yields_each_entry_once() -> None:
    m = CopyOnWriteStateMap(capacity=4)
    expected = {}
    for k in range(300):
        ns = k % 4
        m.put(k, ns, str(k))
        expected[(k, ns)] = str(k)
    got = list(m)
    assert len(got) == 300
    assert map_contents(m) == expected


@pytest.mark.parametrize("progress", [0.0, 0.1, 0.5, 0.9])
def test_iteration_during_rehash_with_lookups_in_the_loop(progress: float) -> None:
    # how many lookups this (deterministic) rehash takes, measured on an identical map
    probe = CopyOnWriteStateMap()
    fill_until_rehashing(probe)
    total_steps = finish_rehash(probe)

    m = CopyOnWriteStateMap()
    nxt = fill_until_rehashing(m)
    for i in range(int(progress * total_steps)):
        m.get(i, 0)
    assert m.is_rehashing
    seen = []
    was_rehashing = m.is_rehashing
    for i, entry in enumerate(m):
        seen.append(entry)
        # each lookup runs one rehash step, moving entries between tables under the iterator
        m.get(i % nxt, 0)
        m.contains_key(-i, 0)
        m.put(i % nxt, 0, i % nxt)  # overwrite of an existing key: not structural
    assert was_rehashing and not m.is_rehashing
    assert len(seen) == nxt
    assert as_dict_checked(seen) == {(k, 0): k for k in range(nxt)}


def as_dict_checked(entries):
    out = {}
    for k, ns, st in entries:
        assert (k, ns) not in out, f"entry {(k, ns)} yielded twice"
        out[(k, ns)] = st
    return out


@pytest.mark.parametrize(
    "mutation",
    [
        lambda m: m.put("new-key", 0, 1),
        lambda m: m.remove(5, 0),
        lambda m: m.put_and_get_old("new-key", 0, 1),
        lambda m: m.remove_and_get_old(5, 0),
        lambda m: m.transform("new-key", 0, 1, lambda o, v: v),
        lambda m: m.put_many(["new-key"], 0, [1]),
        lambda m: m.remove_many([5], 0),
        lambda m: m.sweep_expired(now=10**9, ttl=1, max_entries=None),
    ],
    ids=[
        "put-new",
        "remove",
        "put_and_get_old-new",
        "remove_and_get_old",
        "transform-new",
        "put_many-new",
        "remove_many",
        "sweep",
    ],
)
def test_structural_change_during_iteration_raises(mutation) -> None:
    m = CopyOnWriteStateMap()
    for k in range(20):
        m.put(k, 0, k, ts=0)
    it = iter(m)
    next(it)
    next(it)
    mutation(m)
    with pytest.raises(RuntimeError):
        next(it)


def test_non_structural_change_during_iteration_is_allowed() -> None:
    m = CopyOnWriteStateMap()
    for k in range(20):
        m.put(k, 0, k)
    seen = set()
    for k, _ns, _st in m:
        seen.add(k)
        m.put(k, 0, -k)  # overwrite existing
        m.remove("absent", 0)  # no-op
        m.set_timestamp(k, 0, 5)
        m.get(k, 0)
    assert seen == set(range(20))
    assert map_contents(m) == {(k, 0): -k for k in range(20)}


def test_snapshot_during_map_iteration_is_allowed() -> None:
    m = CopyOnWriteStateMap(copier=list)
    for k in range(20):
        m.put(k, 0, [k])
    seen = {}
    for k, _ns, st in m:
        seen[k] = st
        with m.snapshot() as s:
            assert len(s) == 20
            m.get(k, 0).append("x")  # copy-on-write during iteration
    assert set(seen) == set(range(20))
    assert map_contents(m) == {(k, 0): [k, "x"] for k in range(20)}


# --------------------------------------------------------------------------- misc


def test_memory_stats() -> None:
    m = CopyOnWriteStateMap(copier=list)
    stats = m.memory_stats()
    assert isinstance(stats, dict)
    for name in ("live_entries", "total_entries", "bytes"):
        assert isinstance(stats[name], int), name
    assert all(isinstance(v, int) for v in stats.values())
    assert stats["live_entries"] == 0
    for k in range(1000):
        m.put(k, 0, [k])
    stats = m.memory_stats()
    assert stats["live_entries"] == 1000
    assert stats["total_entries"] >= 1000
    assert stats["bytes"] > 0
    with m.snapshot():
        for k in range(0, 1000, 2):
            m.remove(k, 0)
        for k in range(1, 1000, 2):
            m.get(k, 0).append(1)
        stats = m.memory_stats()
        assert stats["live_entries"] == 500 == len(m)
        assert stats["total_entries"] >= stats["live_entries"]
