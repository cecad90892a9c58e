"""ValueState's columnar twins against the per-record loop they stand for."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from columns_harness import (
    MAX_PAR,
    Pair,
    as_input,
    forms,
    live_entries,
    mixed_keys,
    namespaces,
    shared_step,
    small_keys,
    ttl_configs,
)
from hypothesis import given, settings
from hypothesis import strategies as st

from cowmap import KeyedStateBackend, KeyGroupRange, ValueStateDescriptor

values = st.one_of(st.integers(0, 5), st.none(), st.sampled_from(["x", "y"]))


@st.composite
def steps(draw: Any, numeric: bool, most: int = 14) -> list[tuple[Any, ...]]:
    keys = small_keys if numeric else mixed_keys
    vals = st.one_of(st.integers(-3, 9), st.none()) if numeric else values
    ops = ["get", "get", "update", "update", "clear", "tick", "ns", "snap", "check"]
    if numeric and most > 3:
        ops += ["rmw", "rmw"]  # a read, then a write of the same keys: the located write
    out = []
    for _ in range(draw(st.integers(1, most))):
        op = draw(st.sampled_from(ops))
        ns = draw(st.one_of(st.none(), namespaces))
        if op in ("get", "update", "clear", "rmw"):
            ks = draw(st.lists(keys, max_size=12))
            vs = draw(st.lists(vals, min_size=len(ks), max_size=len(ks)))
            dtype = draw(st.sampled_from([None, "int64", "float64"])) if numeric else None
            out.append((op, ks, vs, draw(forms), ns, dtype))
            if op == "rmw":  # what runs between the read and the write (snapshots, writes, ...)
                out[-1] += (draw(st.one_of(st.just([]), steps(numeric, most=3))),)
        elif op == "tick":
            out.append((op, draw(st.integers(0, 12))))
        elif op == "ns":
            out.append((op, draw(namespaces)))
        elif op == "check":
            out.append((op, draw(st.integers(0, 5)), draw(st.booleans())))
        else:
            out.append((op,))
    return out


def run(pair: Pair, program: list[tuple[Any, ...]]) -> None:
    col, loop = pair.col_state, pair.loop_state
    for step in program:
        op = step[0]
        if not shared_step(pair, step, "v", "value"):
            _, ks, vs, form, ns, dtype = step[:6]
            before = pair.col.get_current_key()
            if op == "rmw":
                run(pair, [("get", *step[1:6])])
                run(pair, step[6])
                run(pair, [("update", *step[1:6])])
            elif op == "get":
                want = pair.loop_rows(ks, lambda i: loop.value(), ns)
                if dtype is None:
                    assert col.get_many(as_input(ks, form), namespace=ns) == want
                else:
                    got = col.get_many(as_input(ks, form), namespace=ns, dtype=dtype, default=-1)
                    assert got.dtype == np.dtype(dtype)
                    assert got.tolist() == [-1 if v is None else v for v in want]
            elif op == "update":
                vin = as_input(vs, form) if None not in vs else vs
                col.update_many(as_input(ks, form), vin, namespace=ns)
                pair.loop_rows(ks, lambda i, vs=vs: loop.update(vs[i]), ns)
            else:
                col.clear_many(as_input(ks, form), namespace=ns)
                pair.loop_rows(ks, lambda i: loop.clear(), ns)
            assert pair.col.get_current_key() == before  # the current key is unchanged
        a, b = live_entries(pair, "v", "value")
        assert a == b


@settings(max_examples=150, deadline=None)
@given(cfg=ttl_configs(), program=steps(numeric=False))
def test_value_columns_equal_the_loop(cfg: Any, program: Any) -> None:
    pair = Pair(lambda: ValueStateDescriptor("v"), cfg, "get_state")
    pair.col.set_current_key(3)  # a current key the columnar calls must leave alone
    run(pair, program)


@settings(max_examples=100, deadline=None)
@given(cfg=ttl_configs(), program=steps(numeric=True))
def test_value_columns_numeric_equal_the_loop(cfg: Any, program: Any) -> None:
    pair = Pair(lambda: ValueStateDescriptor("v", default_value=None), cfg, "get_state")
    run(pair, program)


def test_mutable_default_is_fresh_per_row() -> None:
    b = KeyedStateBackend(MAX_PAR)
    s = b.get_state(ValueStateDescriptor("v", default_value=[]))
    out = s.get_many([1, 2, 1])
    assert out == [[], [], []]
    assert out[0] is not out[1] and out[0] is not out[2]


def test_get_many_int64_needs_a_default_for_missing_keys() -> None:
    b = KeyedStateBackend(MAX_PAR)
    s = b.get_state(ValueStateDescriptor("v"))
    s.update_many(np.array([1, 2]), np.array([10, 20]))
    assert s.get_many(np.array([2, 1, 3]), dtype=np.int64, default=-1).tolist() == [20, 10, -1]
    with pytest.raises(ValueError, match="needs default="):  # before anything is read
        s.get_many([1, 3], dtype="int64")
    counted = b.get_state(ValueStateDescriptor("c", default_value=0))  # the descriptor's default serves
    assert counted.get_many([5], dtype=np.int64).tolist() == [0]
    f = s.get_many([1, 3], dtype="float64")
    assert f[0] == 10.0 and np.isnan(f[1])
    with pytest.raises(ValueError, match="dtype"):
        s.get_many([1], dtype="int32")


def test_numeric_columns_are_stored_as_python_scalars() -> None:
    b = KeyedStateBackend(MAX_PAR)
    s = b.get_state(ValueStateDescriptor("v"))
    s.update_many(np.array([1, 2], dtype=np.int32), np.array([1.5, 2.5], dtype=np.float32))
    s.update_many(np.array([3]), np.array([7], dtype=np.uint8))
    got = s.get_many([1, 2, 3])
    assert got == [1.5, 2.5, 7] and [type(v) for v in got] == [float, float, int]


def test_keys_outside_the_range_write_nothing() -> None:
    from cowmap import key_group_for

    b = KeyedStateBackend(MAX_PAR, key_group_range=KeyGroupRange(0, 3))
    s = b.get_state(ValueStateDescriptor("v"))
    inside = next(k for k in range(100) if key_group_for(k, MAX_PAR) <= 3)
    outside = next(k for k in range(100) if key_group_for(k, MAX_PAR) > 3)
    for keys in ([inside, outside], np.array([inside, outside])):
        with pytest.raises(ValueError, match=r"keys\[1\] = .* outside this backend's range"):
            s.update_many(keys, [1, 2])
        assert b.num_entries() == 0


@pytest.mark.parametrize(
    ("keys", "values", "err", "match"),
    [
        ([1, 2], [1], ValueError, "same length"),
        (np.zeros((2, 2), dtype=np.int64), [1, 2], ValueError, "one-dimensional"),
        ([1, 2], np.zeros((2, 1)), ValueError, "one-dimensional"),
        ([1, [2]], [1, 2], TypeError, r"keys\[1\]"),
        (np.array([1, None], dtype=object), [1, 2], TypeError, r"keys\[1\].*None"),
        ("ab", [1, 2], TypeError, "column"),
        (5, [1], TypeError, "column"),
        ([1, 2], {"a": 1}, TypeError, "column"),
    ],
)
def test_bad_columns_write_nothing(keys: Any, values: Any, err: type, match: str) -> None:
    b = KeyedStateBackend(MAX_PAR)
    s = b.get_state(ValueStateDescriptor("v"))
    with pytest.raises(err, match=match):
        s.update_many(keys, values)
    assert b.num_entries() == 0


def test_unhashable_namespace_is_refused() -> None:
    b = KeyedStateBackend(MAX_PAR)
    s = b.get_state(ValueStateDescriptor("v"))
    with pytest.raises(TypeError, match="namespace must be hashable"):
        s.get_many([1], namespace=[1])


def test_hostile_callbacks_and_threads_get_clear_errors() -> None:
    """A copier that calls back into the state mid-column, and a second thread
    writing while a column runs, are refused with RuntimeError; nothing crashes and
    the state stays consistent."""
    import threading

    b = KeyedStateBackend(MAX_PAR)
    calls: list[Any] = []

    def copier(v: Any) -> Any:
        calls.append(v)
        s.get_many([1, 2])  # re-entrant: the column holds the maps
        return list(v)

    s = b.get_state(ValueStateDescriptor("v", copier=copier))
    s.update_many([1, 2], [[1], [2]])
    snap = b.snapshot()  # shared values: the next reads copy them
    with pytest.raises(RuntimeError, match="re-entrantly"):
        s.get_many([1, 2])
    assert calls
    snap.release()
    assert s.get_many([1, 2]) == [[1], [2]]

    errors: list[BaseException] = []

    class Slow:
        """A key whose __eq__ lets another thread run mid-column."""

        def __init__(self, k: int) -> None:
            self.k = k

        def __hash__(self) -> int:
            return 7

        def __cowmap_hash__(self) -> int:
            return 7

        def __eq__(self, other: object) -> bool:
            t = threading.Thread(target=lambda: _try(errors, lambda: s.update_many([Slow(9)], [0])))
            t.start()
            t.join()
            return isinstance(other, Slow) and other.k == self.k

    s.update_many([Slow(1)], [1])
    s.update_many([Slow(2)], [2])  # compares with Slow(1): the other thread is refused
    assert errors and all(isinstance(e, RuntimeError) for e in errors)
    assert sorted(k.k for k in b.keys("v") if isinstance(k, Slow)) == [1, 2]


def test_a_read_started_inside_a_read_leaves_no_locations_to_trust() -> None:
    """A namespace whose __eq__ runs another get_many on the same state while a
    get_many of int64 keys is under way: the inner read is refused (the maps are
    busy), the outer one fails with it, and the update_many that follows looks
    its rows up again and writes every one of them."""

    class Window:
        """Equal to another Window of the same name, but never the same object."""

        def __init__(self, name: str) -> None:
            self.name = name

        def __hash__(self) -> int:
            return hash(self.name)

        def __eq__(self, other: object) -> bool:
            if isinstance(other, Window) and reenter:
                reenter.pop()
                s.get_many(np.arange(50, dtype=np.int64) + 1000, namespace=Window("w"))
            return isinstance(other, Window) and other.name == self.name

    b = KeyedStateBackend(MAX_PAR)
    s = b.get_state(ValueStateDescriptor("v", default_value=0))
    keys = np.arange(200, dtype=np.int64)
    s.update_many(keys, keys, namespace=Window("w"))  # stored with one Window object
    reenter = [True]
    with pytest.raises(RuntimeError, match="re-entrantly"):
        s.get_many(keys, namespace=Window("w"), dtype=np.int64)  # an equal one: __eq__ runs
    ns = Window("w")
    s.update_many(keys, keys + 5, namespace=ns)
    assert s.get_many(keys, namespace=ns, dtype=np.int64).tolist() == (keys + 5).tolist()
    assert b.num_entries() == 200


def _try(errors: list[BaseException], fn: Any) -> None:
    try:
        fn()
    except BaseException as e:  # noqa: BLE001
        errors.append(e)


def test_the_callers_key_array_may_change_after_the_call() -> None:
    """The call works on its own copy of an int64 key column."""
    b = KeyedStateBackend(MAX_PAR)
    s = b.get_state(ValueStateDescriptor("v"))
    keys = np.array([1, 2, 3])
    s.update_many(keys, np.array([10, 20, 30]))
    keys[:] = 99
    assert s.get_many([1, 2, 3, 99]) == [10, 20, 30, None]


def test_a_failed_typed_read_loses_no_expired_value() -> None:
    """int64 without a default is refused before the reads, so an expired value
    that would be returned once is still there for the next read."""
    from datetime import timedelta

    from cowmap import StateTtlConfig
    from cowmap.state.ttl import StateVisibility

    now = [0]
    b = KeyedStateBackend(MAX_PAR, time_provider=lambda: now[0])
    d = ValueStateDescriptor("v")
    d.enable_time_to_live(
        StateTtlConfig.new_builder(timedelta(milliseconds=10))
        .set_state_visibility(StateVisibility.ReturnExpiredIfNotCleanedUp)
        .disable_cleanup_in_background()
        .build()
    )
    s = b.get_state(d)
    s.update_many([1], [42])
    now[0] = 100
    with pytest.raises(ValueError, match="needs default="):
        s.get_many(np.array([1, 2]), dtype="int64")
    assert s.get_many([1, 1]) == [42, None]  # returned once, then gone


def test_a_write_after_a_read_sees_the_keys_as_they_are_when_it_is_called() -> None:
    """The write after a read reuses the read's own copy of the keys and their
    key groups only while the caller's column still equals them: a column
    changed in place in between is read afresh, row by row."""
    b = KeyedStateBackend(MAX_PAR)
    s = b.get_state(ValueStateDescriptor("v", default_value=0))
    keys = np.arange(100, dtype=np.int64)
    s.update_many(keys, keys)
    vals = s.get_many(keys, dtype=np.int64) + 1
    keys[:10] += 1000  # changed between the read and the write
    s.update_many(keys, vals)
    assert s.get_many(np.arange(10, dtype=np.int64), dtype=np.int64).tolist() == list(range(10))
    assert s.get_many(keys[:10], dtype=np.int64).tolist() == list(range(1, 11))
    assert s.get_many(np.arange(10, 100, dtype=np.int64), dtype=np.int64).tolist() == list(range(11, 101))
    # a read's own copy is never the caller's: writing through the same array twice stays right
    again = np.arange(100, dtype=np.int64)
    s.update_many(again, s.get_many(again, dtype=np.int64) * 0 + 7)
    again[:] = 5000
    s.update_many(again[:1], np.array([1], dtype=np.int64))
    assert s.get_many(np.arange(100, dtype=np.int64), dtype=np.int64).tolist() == [7] * 100
    assert s.get_many(np.array([5000]), dtype=np.int64).tolist() == [1]
