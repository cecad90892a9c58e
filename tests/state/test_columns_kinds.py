"""The columnar twins of ListState, MapState, ReducingState and AggregatingState
against the per-record loop they stand for."""

from __future__ import annotations

import operator
from typing import Any

import numpy as np
import pandas as pd
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
from state_model import SumCount

from cowmap import (
    AggregatingStateDescriptor,
    KeyedStateBackend,
    ListStateDescriptor,
    MapStateDescriptor,
    ReducingStateDescriptor,
)

# kind -> (descriptor factory, backend getter, write op, read op(s))
KINDS: dict[str, tuple[Any, str]] = {
    "list": (lambda: ListStateDescriptor("s"), "get_list_state"),
    "map": (lambda: MapStateDescriptor("s"), "get_map_state"),
    "reducing": (lambda: ReducingStateDescriptor("s", operator.add), "get_reducing_state"),
    "reducing_np": (lambda: ReducingStateDescriptor("s", np.add), "get_reducing_state"),
    "aggregating": (lambda: AggregatingStateDescriptor("s", SumCount()), "get_aggregating_state"),
}
SNAP_KIND = {"reducing_np": "reducing"}
OPS = {
    "list": ["get", "add"],
    "map": ["get", "contains", "put", "put", "remove"],
    "reducing": ["get", "add", "add"],
    "reducing_np": ["get", "add", "add"],
    "aggregating": ["get", "add", "add"],
}


@st.composite
def programs(draw: Any, kind: str) -> list[tuple[Any, ...]]:
    out = []
    keys = small_keys if kind == "reducing_np" else mixed_keys
    for _ in range(draw(st.integers(1, 12))):
        op = draw(st.sampled_from([*OPS[kind], "tick", "ns", "snap", "check"]))
        if op in OPS[kind]:
            ks = draw(st.lists(keys, max_size=10))
            n = len(ks)
            uks = draw(st.lists(st.one_of(st.integers(0, 4), st.sampled_from(["u", "v"])), min_size=n, max_size=n))
            vs = draw(st.lists(st.integers(-5, 9), min_size=n, max_size=n))
            if kind == "map":
                vs = [None if v < -3 else v for v in vs]  # a map value may be None
            out.append((op, ks, uks, vs, draw(forms), draw(st.one_of(st.none(), namespaces))))
        elif op == "tick":
            out.append((op, draw(st.integers(0, 12))))
        elif op == "ns":
            out.append((op, draw(namespaces)))
        elif op == "check":
            out.append((op, draw(st.integers(0, 5)), draw(st.booleans())))
        else:
            out.append((op,))
    return out


def run(kind: str, pair: Pair, program: list[tuple[Any, ...]]) -> None:
    col, loop = pair.col_state, pair.loop_state
    skind = SNAP_KIND.get(kind, kind)
    for step in program:
        op = step[0]
        if not shared_step(pair, step, "s", skind):
            _, ks, uks, vs, form, ns = step
            k_in = as_input(ks, form)
            before = pair.col.get_current_key()
            if kind == "map":
                u_in = as_input(uks, form) if form != "arrow" else uks
                if op == "get":
                    want = pair.loop_rows(ks, lambda i, uks=uks: loop.get(uks[i]), ns)
                    assert col.get_many(k_in, u_in, namespace=ns) == want
                elif op == "contains":
                    want = pair.loop_rows(ks, lambda i, uks=uks: loop.contains(uks[i]), ns)
                    assert col.contains_many(k_in, u_in, namespace=ns).tolist() == want
                elif op == "put":
                    col.put_many(k_in, u_in, vs, namespace=ns)
                    pair.loop_rows(ks, lambda i, uks=uks, vs=vs: loop.put(uks[i], vs[i]), ns)
                else:
                    col.remove_many(k_in, u_in, namespace=ns)
                    pair.loop_rows(ks, lambda i, uks=uks: loop.remove(uks[i]), ns)
            elif op == "get":
                want = pair.loop_rows(ks, lambda i: loop.get(), ns)
                assert col.get_many(k_in, namespace=ns) == want
            else:
                v_in = np.array(vs, dtype=np.int64) if form == "numpy" else vs
                col.add_many(k_in, v_in, namespace=ns)
                pair.loop_rows(ks, lambda i, vs=vs: loop.add(vs[i]), ns)
            assert pair.col.get_current_key() == before
        a, b = live_entries(pair, "s", skind)
        assert a == b
        if kind == "map":  # the insertion-order lists the column calls keep (compiled links)
            pair.col._tables["s"]._check()
            if pair.cfg is None or pair.cfg["cleanup"] == "off":  # else cleanup timing may reorder
                orders = []
                for bk in (pair.col, pair.loop):
                    with bk.snapshot() as snap:
                        orders.append([r[:3] for r in snap.entries("s") if pair.visible(r[4], pair.now)])
                assert orders[0] == orders[1]


@pytest.mark.parametrize("kind", list(KINDS))
@settings(max_examples=60, deadline=None)
@given(data=st.data())
def test_columns_equal_the_loop(kind: str, data: Any) -> None:
    cfg = data.draw(ttl_configs())
    program = data.draw(programs(kind))
    make, getter = KINDS[kind]
    pair = Pair(make, cfg, getter)
    pair.col.set_current_key("current")
    run(kind, pair, program)


@st.composite
def int_map_programs(draw: Any) -> list[tuple[Any, ...]]:
    """MapState programs on integer keys and user keys in the default namespace
    (the contains_many path that makes no Python object), with user keys that
    are equal floats and bools put now and then (which that path must leave to
    the general lookup), the clock moving (entries expire) and snapshots."""
    out = []
    for _ in range(draw(st.integers(1, 14))):
        op = draw(st.sampled_from(["contains", "contains", "put", "put", "remove", "get", "tick", "snap", "check"]))
        if op in ("contains", "put", "remove", "get"):
            n = draw(st.integers(0, 12))
            ks = draw(st.lists(st.integers(-1, 3), min_size=n, max_size=n))
            uks: list[Any] = draw(st.lists(st.integers(0, 3), min_size=n, max_size=n))
            form = draw(st.sampled_from(["numpy", "numpy", "pandas"]))
            if op == "put" and draw(st.integers(0, 4)) == 0:  # an equal float or bool as the stored user key
                uks = [float(u) if u % 2 else bool(u & 2) if u in (0, 2) else u for u in uks]
                form = "list"
            vs = draw(st.lists(st.integers(-5, 9), min_size=n, max_size=n))
            out.append((op, ks, uks, vs, form, None))
        elif op == "tick":
            out.append((op, draw(st.integers(0, 20))))
        elif op == "check":
            out.append((op, draw(st.integers(0, 5)), draw(st.booleans())))
        else:
            out.append((op,))
    return out


@settings(max_examples=200, deadline=None)
@given(data=st.data())
def test_map_contains_many_of_int_columns_equals_the_loop(data: Any) -> None:
    cfg = data.draw(ttl_configs())
    pair = Pair(KINDS["map"][0], cfg, "get_map_state")
    pair.col.set_current_key("current")
    run("map", pair, data.draw(int_map_programs()))


def test_reducing_get_many_dtype() -> None:
    b = KeyedStateBackend(MAX_PAR)
    s = b.get_reducing_state(ReducingStateDescriptor("r", np.add))
    s.add_many(np.array([1, 2, 1]), np.array([1.5, 2.0, 0.25]))
    assert s.get_many([1, 2, 3], dtype=np.float64, default=0.0).tolist() == [1.75, 2.0, 0.0]
    with pytest.raises(ValueError, match="needs default="):
        s.get_many(np.array([1, 3]), dtype=np.int64)


@pytest.mark.parametrize(
    ("getter", "desc", "call", "err", "match"),
    [
        ("get_list_state", ListStateDescriptor("s"), lambda s: s.add_many([1, 2], [1, None]), ValueError, "None"),
        (
            "get_reducing_state",
            ReducingStateDescriptor("s", operator.add),
            lambda s: s.add_many([1, 2], [1, None]),
            ValueError,
            "None",
        ),
        ("get_map_state", MapStateDescriptor("s"), lambda s: s.put_many([1, 2], [1, None], [1, 2]), TypeError, "None"),
        ("get_map_state", MapStateDescriptor("s"), lambda s: s.put_many([1, 2], [1, [2]], [1, 2]), TypeError, "hash"),
        (  # a nullable numeric column's missing user key
            "get_map_state",
            MapStateDescriptor("s"),
            lambda s: s.put_many(np.array([1, 2]), pd.array([1, None], dtype="Int64"), [1, 2]),
            TypeError,
            r"user_keys\[1\] is None",
        ),
        ("get_map_state", MapStateDescriptor("s"), lambda s: s.put_many([1, 2], [1], [1, 2]), ValueError, "length"),
        ("get_list_state", ListStateDescriptor("s"), lambda s: s.add_many([1, 2], [1]), ValueError, "length"),
        ("get_list_state", ListStateDescriptor("s"), lambda s: s.add_many([[1], 2], [1, 2]), TypeError, r"keys\[0\]"),
    ],
)
def test_bad_columns_write_nothing(getter: str, desc: Any, call: Any, err: type, match: str) -> None:
    b = KeyedStateBackend(MAX_PAR)
    s = getattr(b, getter)(desc)
    with pytest.raises(err, match=match):
        call(s)
    assert b.num_entries() == 0


def test_a_ufunc_reduce_function_is_called_as_it_is() -> None:
    """np.add has a reduce method of its own (np.add.reduce(array, axis)): the
    descriptor must call the ufunc, not take it for a PyFlink ReduceFunction."""

    class FlinkStyle:
        def reduce(self, a: int, b: int) -> int:
            return a * b

    b = KeyedStateBackend(MAX_PAR)
    s = b.get_reducing_state(ReducingStateDescriptor("r", np.add))
    f = b.get_reducing_state(ReducingStateDescriptor("f", FlinkStyle()))
    b.set_current_key(1)
    for v in (2, 3):
        s.add(v)
        f.add(v)
    assert s.get() == 5 and f.get() == 6


@pytest.mark.parametrize("fn", [np.add, np.minimum, np.maximum, operator.add])
@settings(max_examples=40, deadline=None)
@given(data=st.data())
def test_ufunc_reducing_folds_as_the_loop(fn: Any, data: Any) -> None:
    """The numpy fold of add_many gives the loop's values bit for bit: floats
    summed in row order onto the stored value, ints and floats mixed."""
    cfg = data.draw(ttl_configs())
    pair = Pair(lambda: ReducingStateDescriptor("s", fn), cfg, "get_reducing_state")
    floats = st.floats(-1e6, 1e6, allow_nan=False, width=64)
    for _ in range(data.draw(st.integers(1, 6))):
        ks = data.draw(st.lists(small_keys, max_size=12))
        n = len(ks)
        if data.draw(st.booleans()):
            vs = np.array(data.draw(st.lists(floats, min_size=n, max_size=n)), dtype=np.float64)
        else:
            vs = np.array(data.draw(st.lists(st.integers(-(2**40), 2**40), min_size=n, max_size=n)), dtype=np.int64)
        ns = data.draw(st.one_of(st.none(), namespaces))
        pair.col_state.add_many(np.array(ks, dtype=np.int64), vs, namespace=ns)
        pair.loop_rows(ks, lambda i, vs=vs: pair.loop_state.add(vs.tolist()[i]), ns)
        a, b = live_entries(pair, "s", "reducing")
        assert a == b
        pair.now += data.draw(st.integers(0, 15))


def test_reducing_int_fold_that_could_leave_int64_adds_row_by_row() -> None:
    b = KeyedStateBackend(MAX_PAR)
    s = b.get_reducing_state(ReducingStateDescriptor("s", operator.add))
    big = 2**62
    s.add_many(np.array([1, 1, 1]), np.array([big, big, big], dtype=np.int64))
    b.set_current_key(1)
    assert s.get() == 3 * big  # Python ints, as the loop's operator.add makes them


@pytest.mark.parametrize("fn", [np.add, np.minimum, np.maximum, operator.add])
def test_int_fold_hands_unfit_keys_to_the_loop(fn: Any) -> None:
    """A key whose stored value is no int of int64 (a float, a big Python int, a
    str) or whose sum would leave int64 is added row by row, as the loop does;
    the other keys of the column take the C fold."""
    pair = Pair(lambda: ReducingStateDescriptor("s", fn), None, "get_reducing_state")
    first = np.array([1.5, 2**63 - 10, 7, 3], dtype=object)
    for b in (pair.col, pair.loop):  # the stored values, written one by one
        s = b.get_reducing_state(ReducingStateDescriptor("s", fn))
        for k, v in zip([1, 2, 3, 4], first.tolist()):
            b.set_current_key(k)
            s.add(v)
    keys = [1, 2, 3, 4, 2, 1, 5]
    vals = np.array([2, 2, 5, -4, 20, 1, 9], dtype=np.int64)  # key 2's sum leaves int64
    try:
        pair.col_state.add_many(np.array(keys), vals)
        got_error = None
    except Exception as e:  # noqa: BLE001  # the loop must fail alike
        got_error = type(e)
    if got_error is None:
        pair.loop_rows(keys, lambda i: pair.loop_state.add(vals.tolist()[i]))
    else:
        with pytest.raises(got_error):
            pair.loop_rows(keys, lambda i: pair.loop_state.add(vals.tolist()[i]))
    a, b = live_entries(pair, "s", "reducing")
    assert a == b


@pytest.mark.parametrize(
    ("keys", "values", "err", "match"),
    [
        (np.array([1 + 2j, 3j]), np.array([1, 2]), TypeError, r"keys\[0\]"),  # complex: no stable key hash
        ([1, 2], ["a", "b"], TypeError, r"values\[0\] is str"),  # np.add reduces numbers
        ([1, 2], np.array([[1, 2]]), ValueError, "one-dimensional"),
        ([1, 2], np.array([1, 2, 3]), ValueError, "same length"),
    ],
)
def test_bad_reducing_columns_write_nothing(keys: Any, values: Any, err: type, match: str) -> None:
    b = KeyedStateBackend(MAX_PAR)
    s = b.get_reducing_state(ReducingStateDescriptor("r", np.add))
    with pytest.raises(err, match=match):
        s.add_many(keys, values)
    assert b.num_entries() == 0


def test_float_keys_are_keys() -> None:
    """A float64 key column is a column of Python floats, as the loop over tolist() sees it."""
    b = KeyedStateBackend(MAX_PAR)
    s = b.get_reducing_state(ReducingStateDescriptor("r", np.add))
    s.add_many(np.array([1.5, 2.0, 1.5]), np.array([1, 2, 3]))
    assert s.get_many([1.5, 2, 2.0]) == [4, 2, 2]  # 2.0 == 2, as dict keys


@pytest.mark.parametrize("fn", [np.add, operator.add])
@pytest.mark.parametrize("stored", [np.float32(0.1), np.array([1.0, 2.0]), np.int16(3), True])
def test_float_fold_leaves_numpy_accumulators_to_the_loop(fn: Any, stored: Any) -> None:
    """A stored numpy scalar or array is folded as the loop folds it (float32
    arithmetic, element-wise), not converted to a Python float first."""
    pair = Pair(lambda: ReducingStateDescriptor("s", fn), None, "get_reducing_state")
    for b, s in ((pair.col, pair.col_state), (pair.loop, pair.loop_state)):
        b.set_current_key(1)
        s.add(stored)
    pair.col_state.add_many(np.array([1, 1]), np.array([0.2, 0.3]))
    pair.loop_rows([1, 1], lambda i: pair.loop_state.add([0.2, 0.3][i]))
    pair.col.set_current_key(1)
    pair.loop.set_current_key(1)
    got, want = pair.col_state.get(), pair.loop_state.get()
    assert type(got) is type(want) and np.array_equal(got, want)
