"""Regressions found in review: Python code that runs in the middle of an operation (a key's
__hash__, a finalizer, a GC pass) must never crash the map, lose writes or mask errors."""

import gc

import numpy as np
import pytest

from cowmap import CopyOnWriteStateMap


def test_batch_survives_its_key_list_being_cleared_by_a_key_hash() -> None:
    keys: list = []

    class Evil:
        def __init__(self, v: int) -> None:
            self.v = v

        def __hash__(self) -> int:
            keys.clear()  # frees the other keys while the batch walks the list
            return self.v

        def __eq__(self, other: object) -> bool:
            return isinstance(other, Evil) and other.v == self.v

    keys.extend(Evil(i) for i in range(8))
    m = CopyOnWriteStateMap()
    # the batch reads the list live: it notices the list shrank and stops cleanly
    with pytest.raises(RuntimeError, match="list of keys changed size"):
        m.put_many(keys, 0, list(range(8)))
    assert len(m) == sum(1 for _ in m) <= 8
    keys.extend(Evil(i) for i in range(8))
    with pytest.raises(RuntimeError, match="list of keys changed size"):
        m.get_many(keys, 0)
    frozen = tuple(Evil(i) for i in range(8))  # a tuple cannot change under the batch
    m.put_many(frozen, 0, list(range(8)))
    assert m.get_many(frozen, 0) == list(range(8))


def test_put_many_survives_its_state_list_being_cleared_by_a_namespace_hash() -> None:
    states = [object() for _ in range(64)]

    class Ns:
        def __hash__(self) -> int:
            states.clear()
            return 7

        def __eq__(self, other: object) -> bool:
            return isinstance(other, Ns)

    m = CopyOnWriteStateMap()
    with pytest.raises(RuntimeError, match="list of states changed size"):
        m.put_many(np.arange(64, dtype=np.int64), Ns(), states)
    # no entry is left behind without its state
    assert len(m) == sum(1 for _ in m) and all(type(s) is object for _, _, s in m)


def test_errors_keep_their_type_while_released_memory_is_being_reclaimed() -> None:
    m = CopyOnWriteStateMap()
    m.put_many(np.arange(20_000, dtype=np.int64), 0, [object() for _ in range(20_000)])
    snap = m.snapshot()
    m.put_many(np.arange(20_000, dtype=np.int64), 0, [object() for _ in range(20_000)])
    snap.release()
    assert m.memory_stats()["reclaim_pending"] > 0
    with pytest.raises(TypeError, match="None"):
        m.put(None, 0, 1)
    with pytest.raises(TypeError, match="unhashable"):
        m.get_many([[1]], 0)

    def boom(old, value):
        raise ValueError("from fn")

    with pytest.raises(ValueError, match="from fn"):
        m.transform(1, 0, 2, boom)


def test_finalizer_writing_to_the_map_during_put_many_loses_nothing() -> None:
    m = CopyOnWriteStateMap(capacity=16384)  # sizes of the original reproducer
    fired = []

    class State:
        __slots__ = ("v", "hook")

        def __init__(self, v: int, hook: bool = False) -> None:
            self.v, self.hook = v, hook

        def __del__(self) -> None:
            if self.hook and not fired:  # grows the map into a rehash from a finalizer
                fired.append(1)
                for i in range(6000):
                    m.put(i, 1, i)

    n = 9000
    for k in range(n):
        m.put(k, 0, State(-1, hook=(k == 5)))
    m.put_many(np.arange(n, dtype=np.int64), 0, [State(k) for k in range(n)])
    assert fired
    assert [m.get(k, 0).v for k in range(n)] == list(range(n))
    assert len(m) == n + 6000 == sum(1 for _ in m)


def test_snapshot_released_by_a_finalizer_while_iterating_yields_live_objects() -> None:
    m = CopyOnWriteStateMap()

    class St:
        def __init__(self, v: int) -> None:
            self.v = v

    for i in range(4):
        m.put(i, "n", St(i))
    s = m.snapshot()
    it = iter(s)
    for i in range(4):
        m.put(i, "n", St(100 + i))  # the originals now live only in the snapshot

    class Releaser:
        def __del__(self) -> None:
            s.release()

    gc.disable()
    try:
        a, b = Releaser(), Releaser()
        a.o, b.o = b, a  # cyclic garbage whose finalizer releases the snapshot
        del a, b
        keep = [(i, -i, str(i)) for i in range(5000)]  # empty the tuple free list
        gc.set_threshold(1)
        gc.enable()
        try:
            key, ns, state = next(it)
        except RuntimeError:
            return  # released before the read began: a clean error is fine
        assert state.v == key  # the tuple holds the object alive, intact
    finally:
        gc.set_threshold(700)
        gc.enable()
        del keep


def test_copier_is_never_called_with_none() -> None:
    m = CopyOnWriteStateMap(copier=lambda s: s.copy())
    m.put("k", 0, None)
    with m.snapshot():
        assert m.get("k", 0) is None
        assert m.put_and_get_old("k", 0, [1]) is None


def test_int_keys_at_digit_boundaries_round_trip() -> None:
    """Int keys and namespaces are read without the C API where they fit in int64
    (src/cowmap/fastint.h) and stored inline: every boundary of CPython's 30-bit
    digits, and int64's own, must come back as the same value."""
    from cowmap import CopyOnWriteStateMap

    values = sorted({s * (2**b + d) for b in (0, 15, 30, 31, 59, 60, 61, 62, 63, 64, 90)
                     for d in (-1, 0, 1) for s in (1, -1)})
    m = CopyOnWriteStateMap()
    for i, v in enumerate(values):
        m.put(v, v, i)
    assert len(m) == len(values)
    assert sorted((k, ns, s) for k, ns, s in m) == [(v, v, i) for i, v in enumerate(values)]
    for i, v in enumerate(values):
        assert m.get(int(str(v)), int(str(v))) == i  # an equal int, another object
        assert m.get(v, v + 1) is None
