"""Batch operations: ``get_many``, ``put_many``, ``contains_many``, ``remove_many``.

Each equals the single-entry operations applied in order. ``keys`` may be any sequence of
hashable objects or an int64 numpy array (fast path); int64 keys are the same keys as the equal
Python ints (CPython hash semantics, e.g. ``hash(-1) == -2``, reduction modulo 2**61 - 1).
"""

from __future__ import annotations

import gc
import random
import sys
import weakref
from typing import Any

import numpy as np
import pytest

from cowmap import NO_TIMESTAMP, CopyOnWriteStateMap

from core_helpers import CountingCopier, fill_until_rehashing, map_contents

EDGE_INTS = [
    0,
    1,
    -1,
    -2,
    2,
    2**31 - 1,
    -(2**31),
    2**32,
    2**61 - 2,
    2**61 - 1,  # hashes to 0
    2**61,
    2**62,
    -(2**61) + 1,
    -(2**61),
    2**63 - 1,
    -(2**63),
    -(2**63) + 1,
]


def test_get_many_equals_get() -> None:
    m = CopyOnWriteStateMap(capacity=4)
    for k in range(0, 100, 2):
        m.put(k, "ns", f"v{k}")
    keys = list(range(-5, 105))
    assert m.get_many(keys, "ns") == [m.get(k, "ns") for k in keys]
    assert m.get_many(tuple(keys), "ns") == [m.get(k, "ns") for k in keys]
    assert m.get_many(np.array(keys, dtype=np.int64), "ns") == [m.get(k, "ns") for k in keys]
    assert m.get_many(keys, "other") == [None] * len(keys)


def test_empty_batches() -> None:
    m = CopyOnWriteStateMap()
    m.put(1, 0, 1)
    empty = np.array([], dtype=np.int64)
    for keys in ([], (), empty):
        assert m.get_many(keys, 0) == []
        res = m.contains_many(keys, 0)
        assert isinstance(res, np.ndarray) and res.dtype == np.bool_ and res.shape == (0,)
        assert m.remove_many(keys, 0) == 0
        m.put_many(keys, 0, [])
    assert map_contents(m) == {(1, 0): 1}


@pytest.mark.parametrize("capacity", [128, 1024])  # rehashing during the batches, or not
@pytest.mark.parametrize("ns_a, ns_b", [(-1, -2), (5, 2**61 - 1 + 5)])
def test_batches_tell_apart_namespaces_whose_hashes_collide(ns_a: Any, ns_b: Any, capacity: int) -> None:
    """-1 and -2 (and 5 and 2**61 + 4) are distinct namespaces with one hash: the same key in
    each is two entries with one bucket hash, told apart only by comparing the namespaces."""
    m = CopyOnWriteStateMap(capacity=capacity)
    keys = list(range(200))
    m.put_many(keys, ns_a, [f"a{k}" for k in keys])
    m.put_many(np.array(keys[::2], dtype=np.int64), ns_b, [f"b{k}" for k in keys[::2]])
    for ks in (keys, np.array(keys, dtype=np.int64)):
        assert m.get_many(ks, ns_a) == [f"a{k}" for k in keys]
        assert m.get_many(ks, ns_b) == [f"b{k}" if k % 2 == 0 else None for k in keys]
        assert m.contains_many(ks, ns_b).tolist() == [k % 2 == 0 for k in keys]
    assert m.remove_many(np.array(keys, dtype=np.int64), ns_b) == 100
    assert m.get_many(np.array(keys, dtype=np.int64), ns_a) == [f"a{k}" for k in keys]
    assert len(m) == 200


def test_put_many_equals_puts_in_order() -> None:
    m = CopyOnWriteStateMap(capacity=4)
    ref = CopyOnWriteStateMap(capacity=4)
    keys = [3, "a", (1, 2), 3, 1.5, True, 1, "a"]  # duplicates: the last write wins
    states = list(range(len(keys)))
    m.put_many(keys, "ns", states, ts=12)
    for k, st in zip(keys, states):
        ref.put(k, "ns", st, 12)
    assert map_contents(m) == map_contents(ref)
    assert len(m) == len(ref) == 5
    assert m.get(1, "ns") == 6  # True and 1 are the same key
    assert m.get("a", "ns") == 7
    for k in keys:
        assert m.timestamp(k, "ns") == 12


def test_put_many_default_timestamp() -> None:
    m = CopyOnWriteStateMap()
    m.put_many(np.arange(10, dtype=np.int64), 0, list(range(10)))
    assert all(m.get_with_timestamp(k, 0) == (k, NO_TIMESTAMP) for k in range(10))


def test_contains_many_returns_bool_array() -> None:
    m = CopyOnWriteStateMap()
    m.put_many([1, 2, 3], "n", [None, 0, False])  # falsy states still count
    for keys in ([0, 1, 2, 3, 4], np.array([0, 1, 2, 3, 4], dtype=np.int64)):
        res = m.contains_many(keys, "n")
        assert isinstance(res, np.ndarray)
        assert res.dtype == np.bool_
        assert res.shape == (5,)
        assert res.tolist() == [False, True, True, True, False]


def test_remove_many_counts_and_removes() -> None:
    m = CopyOnWriteStateMap()
    m.put_many(list(range(10)), 0, list(range(10)))
    assert m.remove_many([0, 1, 1, 50, 2], 0) == 3  # duplicate and absent keys are not counted
    assert m.remove_many(np.array([3, 3, 4, -7], dtype=np.int64), 0) == 2
    assert m.remove_many([5], "other-ns") == 0
    assert map_contents(m) == {(k, 0): k for k in range(5, 10)}


@pytest.mark.parametrize("keys", [EDGE_INTS, [k for k in EDGE_INTS if k < 0]])
def test_numpy_int64_keys_are_python_int_keys(keys: list[int]) -> None:
    arr = np.array(keys, dtype=np.int64)
    # numpy -> Python
    m = CopyOnWriteStateMap(capacity=4)
    m.put_many(arr, "ns", [f"s{k}" for k in keys])
    assert len(m) == len(keys)
    for k in keys:
        assert m.get(k, "ns") == f"s{k}", k
        if float(k) == k:  # an exactly representable float is the same key too
            assert m.get(float(k), "ns") == f"s{k}", k
    assert map_contents(m) == {(k, "ns"): f"s{k}" for k in keys}
    # Python -> numpy
    m2 = CopyOnWriteStateMap(capacity=4)
    for k in keys:
        m2.put(k, "ns", f"s{k}")
    assert m2.get_many(arr, "ns") == [f"s{k}" for k in keys]
    assert m2.contains_many(arr, "ns").all()
    assert m2.remove_many(arr[::2], "ns") == len(keys[::2])
    assert map_contents(m2) == {(k, "ns"): f"s{k}" for k in keys[1::2]}


def test_numpy_keys_mix_with_other_key_types() -> None:
    m = CopyOnWriteStateMap()
    m.put_many(np.array([1, 2, 3], dtype=np.int64), 0, ["a", "b", "c"])
    m.put_many(["x", (1, 2), 2.0], 0, ["X", "T", "B2"])  # 2.0 == 2: overwrites
    assert len(m) == 5
    assert m.get_many([1, 2, 3, "x", (1, 2)], 0) == ["a", "B2", "c", "X", "T"]
    assert m.get(np.int64(3), 0) == "c"
    assert m.get_many(np.array([2], dtype=np.int64), 0) == ["B2"]


def test_non_contiguous_and_other_dtype_arrays() -> None:
    m = CopyOnWriteStateMap()
    base = np.arange(20, dtype=np.int64)
    m.put_many(base[::3], "ns", [int(k) for k in base[::3]])  # strided view
    assert map_contents(m) == {(k, "ns"): k for k in range(0, 20, 3)}
    assert m.get_many(base[::-1], "ns") == [k if k % 3 == 0 else None for k in range(19, -1, -1)]
    # other integer dtypes are sequences of hashable numpy scalars equal to the ints
    assert m.get_many(np.array([0, 3, 4], dtype=np.int32), "ns") == [0, 3, None]
    assert m.contains_many(np.array([0, 3, 4], dtype=np.uint8), "ns").tolist() == [True, True, False]
    assert m.remove_many(np.array([0, 3], dtype=np.int16), "ns") == 2


def test_readonly_and_byteswapped_int64_arrays() -> None:
    m = CopyOnWriteStateMap()
    arr = np.arange(10, dtype=np.int64)
    arr.flags.writeable = False
    m.put_many(arr, 0, list(range(10)))
    assert m.get_many(arr, 0) == list(range(10))
    assert m.contains_many(arr, 0).all()
    big_endian = np.arange(10, dtype=">i8")
    assert m.get_many(big_endian, 0) == list(range(10))


def test_two_dimensional_array_is_rejected() -> None:
    m = CopyOnWriteStateMap()
    m.put(1, 0, 1)
    arr = np.arange(6, dtype=np.int64).reshape(2, 3)
    with pytest.raises((TypeError, ValueError)):
        m.get_many(arr, 0)
    with pytest.raises((TypeError, ValueError)):
        m.put_many(arr, 0, [1, 2])
    assert map_contents(m) == {(1, 0): 1}


def test_batches_across_rehash() -> None:
    m = CopyOnWriteStateMap(capacity=4)
    n = 50_000
    keys = np.arange(n, dtype=np.int64) * 7 - n
    m.put_many(keys, "ns", list(range(n)))  # many rehashes inside one batch
    assert len(m) == n
    assert m.get_many(keys, "ns") == list(range(n))
    assert not m.contains_many(keys + 1, "ns").any()
    # a batch of removes while a rehash is in flight
    m2 = CopyOnWriteStateMap()
    nxt = fill_until_rehashing(m2)
    assert m2.remove_many(list(range(0, nxt, 2)), 0) == len(range(0, nxt, 2))
    assert m2.get_many(np.arange(nxt, dtype=np.int64), 0) == [k if k % 2 else None for k in range(nxt)]
    assert m.remove_many(keys[: n // 2], "ns") == n // 2
    assert len(m) == n - n // 2


def test_numpy_batches_while_rehashing_and_sharing() -> None:
    """The int64 fast path must give the same results while a rehash is in flight and while
    entries are shared with a snapshot (copy-on-write)."""
    m = CopyOnWriteStateMap(copier=list)
    nxt = fill_until_rehashing(m)  # states are the int keys
    assert m.is_rehashing
    # small batches (each key is one operation, i.e. one rehash step) while the rehash runs
    start = 0
    batches = 0
    while m.is_rehashing:
        ks = [(start + i * 37) % (nxt + 6) - 3 for i in range(2)]
        start += 1
        arr = np.array(ks, dtype=np.int64)
        if batches % 2:
            assert m.get_many(arr, 0) == [k if 0 <= k < nxt else None for k in ks]
        else:
            assert m.contains_many(arr, 0).tolist() == [0 <= k < nxt for k in ks]
        batches += 1
    assert batches >= 2
    assert m.get_many(np.arange(nxt, dtype=np.int64), 0) == list(range(nxt))

    for k in range(nxt):
        m.put(k, 0, [k])
    with m.snapshot() as s:
        got = m.get_many(np.arange(nxt, dtype=np.int64), 0)
        for st in got:
            st.append("mutated")
        m.put_many(np.arange(0, nxt, 2, dtype=np.int64), 0, [["new"]] * len(range(0, nxt, 2)))
        assert m.remove_many(np.arange(1, nxt, 4, dtype=np.int64), 0) == len(range(1, nxt, 4))
        assert {k: st for k, _, st in s} == {k: [k] for k in range(nxt)}
    expected = {}
    for k in range(nxt):
        if k % 2 == 0:
            expected[(k, 0)] = ["new"]
        elif k % 4 != 1:
            expected[(k, 0)] = [k, "mutated"]
    assert map_contents(m) == expected

    # a numpy put_many that starts (and finishes) a rehash in the middle of the batch
    m2 = CopyOnWriteStateMap()
    m2.put_many(np.arange(97, dtype=np.int64), 0, list(range(97)))
    assert not m2.is_rehashing
    with m2.snapshot() as s2:
        m2.put_many(np.arange(97, 400, dtype=np.int64), 0, list(range(97, 400)))
        assert len(s2) == 97 and {k for k, _, _ in s2} == set(range(97))
    assert m2.get_many(np.arange(400, dtype=np.int64), 0) == list(range(400))


def test_random_batches_match_single_ops() -> None:
    rng = random.Random(5)
    a = CopyOnWriteStateMap(capacity=4)  # batch ops
    b = CopyOnWriteStateMap(capacity=4)  # single ops
    for _rnd in range(300):
        ns = rng.choice([0, "x"])
        n = rng.randrange(0, 40)
        ints = [rng.randrange(-50, 50) for _ in range(n)]
        use_numpy = rng.random() < 0.5
        keys = np.array(ints, dtype=np.int64) if use_numpy else [rng.choice([k, str(k)]) for k in ints]
        key_list = keys.tolist() if use_numpy else keys
        op = rng.randrange(4)
        if op == 0:
            states = [rng.randrange(1000) for _ in key_list]
            ts = rng.choice([None, rng.randrange(100)])
            if ts is None:
                a.put_many(keys, ns, states)
            else:
                a.put_many(keys, ns, states, ts=ts)
            for k, st in zip(key_list, states):
                b.put(k, ns, st, NO_TIMESTAMP if ts is None else ts)
        elif op == 1:
            assert a.get_many(keys, ns) == [b.get(k, ns) for k in key_list]
        elif op == 2:
            assert a.contains_many(keys, ns).tolist() == [b.contains_key(k, ns) for k in key_list]
        else:
            expected = 0
            for k in key_list:
                if b.contains_key(k, ns):
                    b.remove(k, ns)
                    expected += 1
            assert a.remove_many(keys, ns) == expected
        assert len(a) == len(b)
    assert map_contents(a) == map_contents(b)
    assert {(k, ns): a.timestamp(k, ns) for k, ns, _ in a} == {(k, ns): b.timestamp(k, ns) for k, ns, _ in b}


def test_get_many_copy_on_write() -> None:
    copier = CountingCopier(list)
    m = CopyOnWriteStateMap(copier=copier)
    originals = [[k] for k in range(5)]
    m.put_many(np.arange(5, dtype=np.int64), 0, originals)
    assert all(x is y for x, y in zip(m.get_many(np.arange(5, dtype=np.int64), 0), originals))
    assert copier.calls == 0
    with m.snapshot() as s:
        got = m.get_many(np.arange(5, dtype=np.int64), 0)
        assert copier.calls == 5
        assert all(x == y and x is not y for x, y in zip(got, originals))
        again = m.get_many([0, 1, 2, 3, 4], 0)
        assert all(x is y for x, y in zip(got, again)) and copier.calls == 5
        for st in got:
            st.append("changed")
        assert sorted(st for _, _, st in s) == [[k] for k in range(5)]
    # put_many over shared entries does not copy states and does not touch the snapshot
    with m.snapshot() as s2:
        m.put_many([0, 1], 0, [["new0"], ["new1"]])
        assert copier.calls == 5
        assert sorted(st for _, _, st in s2) == [[k, "changed"] for k in range(5)]


# --------------------------------------------------------------------------- errors


def test_length_mismatch_is_value_error() -> None:
    m = CopyOnWriteStateMap()
    m.put(1, 0, "keep")
    with pytest.raises(ValueError):
        m.put_many([1, 2, 3], 0, ["a", "b"])
    with pytest.raises(ValueError):
        m.put_many(np.array([1, 2], dtype=np.int64), 0, ["a", "b", "c"])
    assert map_contents(m) == {(1, 0): "keep"}


@pytest.mark.parametrize(
    "op",
    [
        lambda m, keys, ns: m.get_many(keys, ns),
        lambda m, keys, ns: m.contains_many(keys, ns),
        lambda m, keys, ns: m.remove_many(keys, ns),
        lambda m, keys, ns: m.put_many(keys, ns, [0] * len(keys)),
    ],
    ids=["get_many", "contains_many", "remove_many", "put_many"],
)
def test_batch_type_errors(op) -> None:
    m = CopyOnWriteStateMap()
    m.put(1, 0, "keep")
    with pytest.raises(TypeError):
        op(m, [1, 2], None)  # None namespace
    with pytest.raises(TypeError):
        op(m, np.array([1, 2], dtype=np.int64), None)
    with pytest.raises(TypeError):
        op(m, [1, 2], [0])  # unhashable namespace
    with pytest.raises(TypeError):
        op(m, [None], 0)  # None key
    with pytest.raises(TypeError):
        op(m, [[1]], 0)  # unhashable key
    assert m.get(1, 0) == "keep"


def test_batch_non_sequence_arguments() -> None:
    m = CopyOnWriteStateMap()
    with pytest.raises(TypeError):
        m.get_many(5, 0)  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        m.put_many([1], 0, 5)  # type: ignore[arg-type]
    assert len(m) == 0


# --------------------------------------------------------------------------- multi-map calls


class _CountingKey:
    """A key whose hash counts its calls (the core's prefetch hints must not call it)."""

    calls = 0

    def __init__(self, v: int) -> None:
        self.v = v

    def __hash__(self) -> int:
        _CountingKey.calls += 1
        return hash(self.v)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _CountingKey) and other.v == self.v


@pytest.mark.parametrize("kind", ["int", "str", "custom", "mixed"])
def test_multi_map_calls_match_single_calls_and_hash_user_keys_once(kind: str) -> None:
    from cowmap._core import multi_get, multi_put, multi_replace

    rnd = random.Random(len(kind))
    maps: list = [CopyOnWriteStateMap() for _ in range(8)] + [None]

    def key(i: int) -> object:
        k = kind if kind != "mixed" else ("int", "str", "custom")[i % 3]
        return i if k == "int" else f"k{i}" if k == "str" else _CountingKey(i)

    n = 300
    keys = [key(rnd.randrange(100)) for _ in range(n)]
    kgs = [rnd.randrange(8) for _ in range(n)]
    nss = [rnd.choice(["a", 7, _CountingKey(-1)]) for _ in range(n)]
    ref = [dict() for _ in range(8)]
    multi_put(maps, kgs, keys, nss, list(range(n)))
    for i in range(n):
        ref[kgs[i]][(keys[i], nss[i])] = i
    hashed = sum(isinstance(k, _CountingKey) for k in keys) + sum(isinstance(s, _CountingKey) for s in nss)
    _CountingKey.calls = 0
    got = multi_get(maps, kgs, keys, nss)
    assert _CountingKey.calls == hashed  # once per user-hashed key or namespace: no extra calls
    assert got == [ref[kgs[i]][(keys[i], nss[i])] for i in range(n)]
    _CountingKey.calls = 0
    assert multi_replace(maps, kgs, keys, nss, [-1] * n) == [True] * n
    assert _CountingKey.calls == hashed
    # a missing map reads as absent (the hints skip it too)
    assert multi_get(maps, [8] * 3, keys[:3], nss[:3]) == [None] * 3


def test_multi_map_calls_with_bad_key_groups_still_fail_cleanly() -> None:
    from cowmap._core import multi_get

    maps: list = [CopyOnWriteStateMap() for _ in range(2)]
    with pytest.raises(ValueError, match=r"kgs\[40\] = 5 is not a key group"):
        multi_get(maps, [0] * 40 + [5], list(range(41)), ["n"] * 41)
    with pytest.raises(TypeError, match=r"kgs\[40\] must be an int"):
        multi_get(maps, [0] * 40 + ["x"], list(range(41)), ["n"] * 41)
    with pytest.raises(TypeError, match=r"maps\[0\] must be"):
        multi_get([object()] * 41, [0] * 41, list(range(41)), ["n"] * 41)


class _Payload:
    pass


class _DroppingKey:
    """A key whose __eq__ empties the batch's lists of maps and keys (Python code
    run mid-batch): the prefetch hints must neither crash nor keep maps alive."""

    def __init__(self, v: int, lists: list[list[Any]]) -> None:
        self.v, self.lists = v, lists

    def __hash__(self) -> int:
        return self.v

    def __eq__(self, other: object) -> bool:
        for lst in self.lists:
            lst.clear()
        return isinstance(other, _DroppingKey) and other.v == self.v


def test_multi_map_calls_hold_no_map_after_the_call_even_when_lists_change() -> None:
    from cowmap._core import multi_get, multi_put

    maps = [CopyOnWriteStateMap() for _ in range(4)]
    n = 200
    kgs, keys, nss = [i % 4 for i in range(n)], list(range(n)), ["n"] * n
    multi_put(maps, kgs, keys, nss, list(range(n)))
    before = [sys.getrefcount(m) for m in maps]
    assert multi_get(maps, kgs, keys, nss) == list(range(n))
    with pytest.raises(TypeError):  # fails mid-batch: the hints taken are all dropped
        multi_get(maps, kgs[:100] + ["x"] + kgs[101:], keys, nss)
    assert [sys.getrefcount(m) for m in maps] == before
    # lists emptied by a key's __eq__ while the hints still point at their maps
    payloads = [_Payload() for _ in maps]
    for m, p in zip(maps, payloads):
        m.put("payload", "n", p)
    gone = [weakref.ref(p) for p in payloads]  # (a map has no weakrefs: its states tell it is freed)
    del payloads, m, p
    tmp_maps, tmp_kgs = list(maps), list(kgs)
    del maps
    k = _DroppingKey(5, [])
    multi_put(tmp_maps, [1], [_DroppingKey(5, k.lists)], ["n"], ["v"])  # (whichever __eq__ runs)
    k.lists.extend([tmp_maps, tmp_kgs])
    batch_keys: list[Any] = [k] + keys[1:]
    with pytest.raises(ValueError, match="not a key group of the 0 maps"):  # maps emptied by the key
        multi_get(tmp_maps, [1] + tmp_kgs[1:], batch_keys, nss)
    del tmp_maps, tmp_kgs, k, batch_keys
    gc.collect()
    assert [r() for r in gone] == [None] * 4


def test_put_many_of_the_states_already_held() -> None:
    """A numpy put_many of the very objects the entries hold (mutable states changed in
    place and put back) changes no reference count, still stamps the timestamp, and
    still leaves a snapshot's view alone."""

    class State:
        pass

    keys = np.arange(0, 3000, 3, dtype=np.int64)
    states = [State() for _ in keys]
    m = CopyOnWriteStateMap()
    m.put_many(keys, "ns", states, ts=1)
    before = [sys.getrefcount(s) for s in states]
    m.put_many(keys, "ns", states, ts=2)
    assert [sys.getrefcount(s) for s in states] == before
    assert [m.get_with_timestamp(int(k), "ns") for k in keys] == [(s, 2) for s in states]
    with m.snapshot() as snap:
        m.put_many(keys, "ns", states, ts=3)  # shared with the snapshot: entries copied
        m.put_many(keys[::2], "ns", states[::2], ts=4)  # copied already: held states again
        assert sorted((k, s) for k, _, s in snap) == sorted(zip(keys.tolist(), states))
        assert {ts for *_, ts in snap.iter_with_timestamps()} == {2}
        assert all(m.get_with_timestamp(int(k), "ns")[1] == (4 if i % 2 == 0 else 3) for i, k in enumerate(keys))
    del snap
    gc.collect()
    assert [sys.getrefcount(s) for s in states] == before
    assert [m.get(int(k), "ns") for k in keys] == states


class _State:
    """A state only the map refers to: its weak reference dies with the map's reference."""


def test_put_many_over_a_snapshot_gives_the_copies_the_new_states() -> None:
    """Under a live snapshot a numpy put_many copies each shared entry (and the chain
    entries before it) with the new state in the copy: the live map holds each new
    state once, the snapshot still holds and shows each old one, and its release
    frees the old ones."""
    keys = np.random.default_rng(5).permutation(np.arange(0, 6000, 3, dtype=np.int64))
    m = CopyOnWriteStateMap()
    m.put_many(keys, 0, [_State() for _ in keys], ts=1)
    olds = {int(k): weakref.ref(m.get(int(k), 0)) for k in keys}
    news = [_State() for _ in keys]
    base = [sys.getrefcount(s) for s in news]
    snap = m.snapshot()
    m.put_many(keys, 0, news, ts=2)
    assert [sys.getrefcount(s) for s in news] == [b + 1 for b in base]
    assert all(m.get_with_timestamp(int(k), 0) == (s, 2) for k, s in zip(keys.tolist(), news))
    assert {k: s for k, _, s in snap} == {k: r() for k, r in olds.items()}
    assert {ts for *_, ts in snap.iter_with_timestamps()} == {1}
    snap.release()
    m.reclaim()
    gc.collect()
    assert all(r() is None for r in olds.values())
    assert [sys.getrefcount(s) for s in news] == [b + 1 for b in base]
    assert len(m) == len(keys)


def test_put_many_releases_every_replaced_state() -> None:
    """A numpy put_many replacing states releases each old state once (the releases
    trail the writes in the pipelined path), and holds each new one once."""
    keys = np.arange(0, 4000, 2, dtype=np.int64)
    m = CopyOnWriteStateMap()
    m.put_many(keys, 0, [_State() for _ in keys])
    for rnd in range(3):
        olds = [weakref.ref(m.get(int(k), 0)) for k in keys]
        new = [_State() for _ in keys]
        base = [sys.getrefcount(s) for s in new]
        m.put_many(keys, 0, new)
        assert [r() for r in olds] == [None] * len(keys), rnd
        assert [sys.getrefcount(s) for s in new] == [b + 1 for b in base]
        assert m.get_many(keys, 0) == new
    # repeated keys: the first state put is replaced within the same batch
    dup = np.array([5, 7, 5, 5, 7], dtype=np.int64)
    states = [_State() for _ in dup]
    refs = [weakref.ref(s) for s in states]
    m.put_many(dup, 0, states)
    del states
    assert [r() is not None for r in refs] == [False, False, False, True, True]
    assert m.get(5, 0) is refs[3]() and m.get(7, 0) is refs[4]()


def test_put_many_failing_midway_still_releases_the_states_it_replaced() -> None:
    """A namespace whose ``__eq__`` empties the list of states makes the batch fail
    after some replacements: the states replaced until then are released, none twice."""

    class Ns:
        calls = -1  # counted once armed

        def __hash__(self) -> int:
            return 17

        def __eq__(self, other: object) -> bool:
            if Ns.calls >= 0:
                Ns.calls += 1
                if Ns.calls == 300:
                    states.clear()
            return isinstance(other, Ns)

    keys = np.arange(1000, dtype=np.int64)
    m = CopyOnWriteStateMap()
    m.put_many(keys, Ns(), [_State() for _ in keys])
    olds = [weakref.ref(m.get(int(k), Ns())) for k in keys[:400]]
    states = [_State() for _ in keys]
    Ns.calls = 0
    new_refs = [weakref.ref(s) for s in states]
    with pytest.raises(RuntimeError, match="changed size"):
        m.put_many(keys, Ns(), states)
    gc.collect()
    Ns.calls = -1
    now = [m.get(int(k), Ns()) for k in keys[: len(olds)]]
    done = [s is r() for s, r in zip(now, new_refs)]
    n = sum(done)
    assert 0 < n < len(olds) and done == [True] * n + [False] * (len(olds) - n)  # keys done before the failure
    assert [r() is None for r in olds] == done  # exactly their old states were released
    # the new states put before the failure are held by the map, exactly once
    held = now[:n]
    del now
    m.put(10**6, Ns(), _State())
    held.append(m.get(10**6, Ns()))  # a control: held by one map entry and by `held` only
    assert len({sys.getrefcount(s) for s in held}) == 1
