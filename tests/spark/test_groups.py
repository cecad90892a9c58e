"""``ctx.groups(batch)`` against pandas: every key once, in order of first
appearance, with its rows (columns, positions, sums, minima, maxima) and the
key current while its rows are handled."""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cowmap._groups import group_int64
from cowmap.spark.groups import _stable_order, group_rows

ROWS = st.lists(
    st.tuples(st.integers(-3, 3), st.sampled_from(["a", "b", "ü", ""]), st.integers(-100, 100), st.floats(-1, 1)),
    max_size=60,
)


@settings(max_examples=100, deadline=None)
@given(rows=ROWS, two=st.booleans())
def test_groups_are_pandas_groups_in_first_appearance_order(rows: list, two: bool) -> None:
    frame = pd.DataFrame(rows, columns=["k", "s", "v", "f"]).astype({"k": "int64", "v": "int64", "f": "float64"})
    keys = ["k", "s"] if two else ["k"]
    current: list[Any] = []
    seen = []
    for key, grp in group_rows(frame, keys, current.append):
        assert current[-1] == key  # made current before the group is handed out
        seen.append(key)
        want = frame[[tuple(r) == (key if two else (key,)) for r in frame[keys].itertuples(index=False)]]
        assert type(key) is (tuple if two else int)
        assert len(grp) == len(want)
        assert grp.index.tolist() == want.index.tolist()
        assert grp["v"].tolist() == want["v"].tolist()
        assert grp["s"].tolist() == want["s"].tolist()
        assert grp.sum("v") == want["v"].sum() and type(grp.sum("v")) is int
        assert grp.min("f") == want["f"].min() and grp.max("v") == want["v"].max()
        assert grp.to_pandas().equals(want)
    first_seen = list(dict.fromkeys(tuple(r) if two else r[0] for r in frame[keys].itertuples(index=False)))
    assert seen == first_seen


def test_bad_columns_and_null_keys_are_clear_errors() -> None:
    frame = pd.DataFrame({"k": [1, 2, 1], "s": ["x", "y", "z"]})
    (_, rows), *_ = list(group_rows(frame, ["k"], lambda k: None))
    with pytest.raises(KeyError, match="no column 'nope'"):
        rows["nope"]
    with pytest.raises(TypeError, match="needs a numeric column"):
        rows.sum("s")
    for null in (np.nan, None):
        with pytest.raises(ValueError, match="holds a null or a NaN: keys must not be null"):
            list(group_rows(pd.DataFrame({"k": [1.0, null]}), ["k"], lambda k: None))
        with pytest.raises(ValueError, match="holds a null or a NaN"):
            list(group_rows(pd.DataFrame({"k": [1.0, 2.0], "s": ["a", null]}), ["k", "s"], lambda k: None))
    assert list(group_rows(frame.iloc[:0], ["k"], lambda k: None)) == []


@settings(max_examples=100, deadline=None)
@given(codes=st.lists(st.integers(0, 2**31 - 1) | st.integers(0, 3) | st.integers(65_530, 65_540), max_size=80),
       many=st.booleans())
def test_the_rows_order_by_code_is_a_stable_sort_s(codes: list[int], many: bool) -> None:
    """16 bits at a time (one pass up to 65,536 codes, two beyond): the order a
    stable sort of the codes gives, ties in row order."""
    arr = np.asarray(codes, dtype=np.int64)
    if not many:
        arr = arr % 65_536
    ngroups = int(arr.max()) + 1 if len(arr) else 0
    assert _stable_order(arr, ngroups).tolist() == np.argsort(arr, kind="stable").tolist()


def test_groups_of_more_keys_than_one_radix_pass_takes() -> None:
    keys = np.random.default_rng(3).integers(0, 100_000, 200_000)
    frame = pd.DataFrame({"k": keys, "v": np.arange(len(keys))})
    got = {key: rows.index.tolist() for key, rows in group_rows(frame, ["k"], lambda k: None)}
    assert len(got) > 65_536
    assert got == {k: idx.tolist() for k, idx in frame.groupby("k").indices.items()}


def _reference_groups(keys: list[int]) -> tuple[list[int], list[int], list[int]]:
    """What ``group_int64`` must give, the slow way: keys in order of first
    appearance, row positions key by key (ties in row order), run bounds."""
    rows: dict[int, list[int]] = {}
    for i, k in enumerate(keys):
        rows.setdefault(k, []).append(i)
    order = [i for idx in rows.values() for i in idx]
    bounds = np.cumsum([0] + [len(idx) for idx in rows.values()]).tolist()
    return list(rows), order, bounds


INT64 = st.integers(-(2**63), 2**63 - 1)


@settings(max_examples=200, deadline=None)
@given(keys=st.lists(INT64 | st.integers(-3, 3) | st.integers(0, 2**20).map(lambda i: i << 40), max_size=3000))
def test_integer_keys_are_grouped_in_one_compiled_pass_as_by_hand(keys: list[int]) -> None:
    """Any int64 keys (extremes, keys equal in their low bits, thousands of
    them, so the table grows several times): the keys, order and bounds of
    the slow way, the keys Python ints."""
    values, order, bounds = group_int64(np.asarray(keys, dtype=np.int64))
    want = _reference_groups(keys)
    assert (values, order.tolist(), bounds.tolist()) == want
    assert all(type(v) is int for v in values)
    assert order.dtype == np.int64 and bounds.dtype == np.int64


@settings(max_examples=100, deadline=None)
@given(keys=st.lists(INT64 | st.integers(-3, 3), max_size=300), m=st.integers(1, 70_000))
def test_integer_keys_in_key_group_order_are_the_stable_sort_of_the_groups(keys: list[int], m: int) -> None:
    """With ``key_groups``: the groups of the slow way, stably sorted by the
    key groups the function gives (``key % m``, up to 65,535), which come back
    with them."""
    values, order, bounds, kgs = group_int64(
        np.asarray(keys, dtype=np.int64), lambda u: (u % min(m, 65_536)).astype(np.int64)
    )
    want_keys, want_order, want_bounds = _reference_groups(keys)
    runs = {k: want_order[want_bounds[i] : want_bounds[i + 1]] for i, k in enumerate(want_keys)}
    by_group = sorted(want_keys, key=lambda k: k % min(m, 65_536))  # (sorted is stable)
    assert values == by_group and all(type(v) is int for v in values)
    assert kgs.tolist() == [k % min(m, 65_536) for k in by_group]
    assert order.tolist() == [i for k in by_group for i in runs[k]]
    assert np.diff(bounds).tolist() == [len(runs[k]) for k in by_group]


def test_the_integer_pass_checks_the_key_groups_it_is_given() -> None:
    keys = np.array([5, 6, 5], dtype=np.int64)
    with pytest.raises(ValueError, match=r"must give 2 integer key groups, got int64 of shape \(1,\)"):
        group_int64(keys, lambda u: np.zeros(1, dtype=np.int64))
    with pytest.raises(ValueError, match="integer key groups, got float64"):
        group_int64(keys, lambda u: np.zeros(2))
    with pytest.raises(ValueError, match=r"within 0\.\.65535, got -1\.\.0"):
        group_int64(keys, lambda u: np.array([-1, 0]))
    with pytest.raises(ValueError, match=r"got 0\.\.65536"):
        group_int64(keys, lambda u: np.array([0, 65_536]))
    with pytest.raises(KeyError, match="from the function"):
        group_int64(keys, lambda u: (_ for _ in ()).throw(KeyError("from the function")))
    assert group_int64(keys[:0], lambda u: np.zeros(0, dtype=np.int64))[0] == []


@pytest.mark.parametrize("dtype", ["int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64", "Int64"])
def test_every_integer_column_groups_as_pandas_does(dtype: str) -> None:
    """The compiled pass takes the numpy integer columns int64 holds; uint64
    and pandas' nullable Int64 go the general way: the same groups either way."""
    keys = np.random.default_rng(7).integers(0, 100, 1000)
    frame = pd.DataFrame({"k": pd.Series(keys).astype(dtype), "v": np.arange(1000)})
    got = [(key, rows.index.tolist()) for key, rows in group_rows(frame, ["k"], lambda k: None)]
    assert all(type(key) is int for key, _ in got)
    assert got == [(k, idx.tolist()) for k, idx in frame.groupby("k", sort=False).indices.items()]


def test_the_integer_pass_refuses_other_columns() -> None:
    for bad in (np.array([1.5, 2.0]), np.array(["a"], dtype=object), np.array([2**63], dtype=np.uint64)):
        with pytest.raises(TypeError, match="integers that int64 holds"):
            group_int64(bad)
    with pytest.raises(ValueError, match="dimensions"):
        group_int64(np.zeros((2, 2), dtype=np.int64))
    assert group_int64(np.arange(10)[::2])[0] == [0, 2, 4, 6, 8]  # (a strided view)


def test_many_distinct_integer_keys_with_equal_low_bits() -> None:
    """300,000 keys that differ only above bit 32, each twice: grouped as
    pandas does (a table indexed by the keys' low bits would put them all in
    one slot and take quadratic time)."""
    keys = (np.random.default_rng(5).permutation(300_000).astype(np.int64) << 32) | 7
    keys = np.concatenate([keys, keys[::-1]])
    values, order, bounds = group_int64(keys)
    codes, uniques = pd.factorize(keys, sort=False)
    assert values == uniques.tolist()
    assert order.tolist() == np.argsort(codes, kind="stable").tolist()
    assert np.diff(bounds).tolist() == [2] * 300_000


@settings(max_examples=60, deadline=None)
@given(keys=st.lists(st.integers(-(2**40), 2**40) | st.integers(0, 5), max_size=40), ttl_every_record=st.booleans())
def test_groups_make_each_key_current_as_set_current_key_does(keys: list[int], ttl_every_record: bool) -> None:
    """Through a backend's key context (in C): the same key, key group and
    per-record TTL cleanup steps as ``set_current_key`` per group, and the
    same groups as through a callable."""
    from datetime import timedelta

    from cowmap.state import KeyedStateBackend, KeyGroupRange, StateTtlConfig, ValueStateDescriptor

    frame = pd.DataFrame({"k": np.asarray(keys, dtype=np.int64), "v": np.arange(len(keys))})

    def run(via_context: bool) -> tuple[list[tuple[Any, Any, int, int]], int]:
        now = [0]
        # one key group: each cleanup sweep examines the map that holds the entries
        b = KeyedStateBackend(1, KeyGroupRange(0, 0), time_provider=lambda: now[0], spark_key_types=["bigint"])
        d = ValueStateDescriptor("v")
        cfg = StateTtlConfig.new_builder(timedelta(milliseconds=5))
        d.enable_time_to_live((cfg.cleanup_incrementally(2, True) if ttl_every_record else cfg).build())
        s = b.get_state(d)
        for k in set(keys):  # each key's value written at 0, expired by the time the groups run
            b.set_current_key(k)
            s.update(k)
        now[0] = 10
        seen = []
        for key, rows in group_rows(frame, ["k"], b._kc if via_context else b.set_current_key):
            seen.append((key, b.get_current_key(), b._kc.key_group, len(rows)))
        return seen, sum(len(m) for m in s._t.maps if m is not None)

    via_kc, via_call = run(True), run(False)
    assert via_kc == via_call
    for key, current, kg, _n in via_kc[0]:
        assert current == key and kg is not None


def test_groups_through_a_key_context_take_the_per_record_cleanup_steps() -> None:
    """Each group is a record: with cleanup on every record, a pass over more
    keys than the slowest sweep interval (sweeps back off while they find
    nothing) removes expired entries, as a ``set_current_key`` loop does."""
    from datetime import timedelta

    from cowmap.state import KeyedStateBackend, KeyGroupRange, StateTtlConfig, ValueStateDescriptor
    from cowmap.state.table import CLEANUP_BATCH, CLEANUP_MAX_BACKOFF

    n = 4 * CLEANUP_BATCH * CLEANUP_MAX_BACKOFF
    now = [0]
    b = KeyedStateBackend(1, KeyGroupRange(0, 0), time_provider=lambda: now[0], spark_key_types=["bigint"])
    d = ValueStateDescriptor("v")
    d.enable_time_to_live(StateTtlConfig.new_builder(timedelta(milliseconds=5)).cleanup_incrementally(2, True).build())
    s = b.get_state(d)
    for k in range(n):
        b.set_current_key(k)
        s.update(k)
    now[0] = 10
    for _key, _rows in group_rows(pd.DataFrame({"k": np.arange(n, 2 * n)}), ["k"], b._kc):
        pass
    assert len(s._t.maps[0]) < n


KEY_KINDS = {
    "bigint": (["bigint"], st.integers(-(2**40), 2**40) | st.integers(0, 9)),
    "int": (["int"], st.integers(-(2**31), 2**31 - 1) | st.integers(0, 9)),
    "string": (["string"], st.sampled_from(["a", "b", "ü", "", "key-1", "key-2"])),
    "two": (["bigint", "string"], st.tuples(st.integers(0, 5), st.sampled_from(["x", "y"]))),
    "flink": (None, st.integers(-(2**40), 2**40) | st.integers(0, 9)),
}


@settings(max_examples=40, deadline=None)
@given(data=st.data(), kind=st.sampled_from(sorted(KEY_KINDS)), max_parallelism=st.sampled_from([1, 7, 128, 4096]))
def test_groups_through_a_key_context_come_in_key_group_order(data: Any, kind: str, max_parallelism: int) -> None:
    """Through a backend's key context, the groups are those a callable gets
    (each key once, with the same rows), ordered by key group (each the one
    ``key_group_for`` gives, the one made current), those of one key group in
    order of first appearance."""
    from cowmap.state import KeyedStateBackend

    types, keys_st = KEY_KINDS[kind]
    keys = data.draw(st.lists(keys_st, max_size=60))
    b = KeyedStateBackend(max_parallelism, spark_key_types=types)
    if types is not None and len(types) == 2:
        frame = pd.DataFrame({"a": [k[0] for k in keys], "s": pd.Series([k[1] for k in keys], dtype=object)})
        cols = ["a", "s"]
    else:
        dtype = {"bigint": "int64", "int": "int32", "string": object}.get(kind, "int64")
        frame = pd.DataFrame({"k": pd.Series(keys, dtype=dtype)})
        cols = ["k"]
    frame["v"] = np.arange(len(frame))
    via_kc = []
    for key, rows in group_rows(frame, cols, b._kc):
        assert b.get_current_key() == key and b._kc.key_group == b._kc.key_group_for(key)
        via_kc.append((key, b._kc.key_group, rows.index.tolist(), rows.sum("v")))
    via_call = {key: (rows.index.tolist(), rows.sum("v")) for key, rows in group_rows(frame, cols, lambda k: None)}
    assert {key: (idx, total) for key, _, idx, total in via_kc} == via_call
    assert len(via_kc) == len(via_call)
    first = list(via_call)  # (the callable's order: first appearance)
    order = [(kg, first.index(key)) for key, kg, _, _ in via_kc]
    assert order == sorted(order)


def test_a_key_that_cannot_be_hashed_is_named_not_its_place_among_the_keys() -> None:
    from cowmap.state import KeyedStateBackend

    b = KeyedStateBackend(128, spark_key_types=["int"])
    frame = pd.DataFrame({"k": np.array([7, 7, 7, 8, 8, 2**31 + 1], dtype=np.uint32)})
    with pytest.raises(OverflowError, match=f"^key {2**31 + 1}: "):
        group_rows(frame, ["k"], b._kc)
    s = KeyedStateBackend(128, spark_key_types=["string"])
    with pytest.raises(TypeError, match="^key 5: key column 0 is a Spark string, not int"):
        group_rows(pd.DataFrame({"k": pd.Series(["a", "a", "a", 5], dtype=object)}), ["k"], s._kc)


def test_the_key_group_function_cannot_change_the_keys() -> None:
    def rewrite(u: np.ndarray) -> np.ndarray:
        u[:] = 0
        return np.zeros(len(u), dtype=np.int64)

    with pytest.raises(ValueError, match="read-only"):
        group_int64(np.array([5, 6]), rewrite)


def test_groups_check_the_key_groups_they_are_given() -> None:
    from cowmap._groups import Groups, OrderedBatch
    from cowmap.state import KeyedStateBackend, KeyGroupRange

    b = KeyedStateBackend(64, KeyGroupRange(0, 31), spark_key_types=["bigint"])
    frame = pd.DataFrame({"k": [1, 2]})
    ordered = OrderedBatch(frame, np.arange(2), np.array([0, 1, 2], dtype=np.int64))
    with pytest.raises(ValueError, match="must give 2 key groups, not 1"):
        Groups(ordered, [1, 2], b._kc, np.array([0]))
    with pytest.raises(TypeError, match="go with a KeyContext"):
        Groups(ordered, [1, 2], lambda k: None, np.array([0, 0]))
    it = Groups(ordered, [1, 2], b._kc, np.array([3, 40]))
    assert next(it)[0] == 1 and b._kc.key_group == 3
    with pytest.raises(ValueError, match=r"key_groups\[1\] = 40 is outside the context's range 0\.\.31"):
        next(it)


def test_groups_refuse_a_key_outside_the_backends_range_and_bad_arguments() -> None:
    from cowmap._groups import Groups, OrderedBatch, Rows
    from cowmap.state import KeyedStateBackend, KeyGroupRange

    b = KeyedStateBackend(4096, KeyGroupRange(0, 10), spark_key_types=["bigint"])
    outside = next(k for k in range(10_000) if b._kc.key_group_for(k) > 10)
    inside = next(k for k in range(10_000) if b._kc.key_group_for(k) <= 10)
    frame = pd.DataFrame({"k": [inside, outside]})
    with pytest.raises(ValueError, match=rf"^key {outside} is in key group \d+, outside this backend's range"):
        group_rows(frame, ["k"], b._kc)  # (before any key is made current)
    s = KeyedStateBackend(4096, KeyGroupRange(0, 10), spark_key_types=["string"])
    word = next(w for w in (f"w{i}" for i in range(10_000)) if s._kc.key_group_for(w) > 10)
    with pytest.raises(ValueError, match=f"^key '{word}' is in key group"):
        group_rows(pd.DataFrame({"k": pd.Series([word], dtype=object)}), ["k"], s._kc)
    frame = pd.DataFrame({"k": [outside]})
    with pytest.raises(TypeError, match="made by ctx.groups"):
        Rows()
    ordered = OrderedBatch(frame, np.arange(1), np.array([0, 1], dtype=np.int64))
    with pytest.raises(TypeError, match="KeyContext or a callable"):
        Groups(ordered, [1], 42)
    with pytest.raises(ValueError, match="need 2 bounds"):
        Groups(OrderedBatch(frame, np.arange(1), np.array([0], dtype=np.int64)), [1], print)
    it = Groups(ordered, [1], lambda k: None)
    (key, rows), = list(it)
    assert list(it) == [] and key == 1
    assert len(rows) == 1 and rows["k"].tolist() == [outside] and "Rows 1 of 1" in repr(rows)  # (kept past the loop)


def test_groups_leave_no_references_or_memory_behind() -> None:
    """Many passes over a batch (keys, rows, aggregates, columns): the keys'
    reference counts and the traced memory come back to where they were."""
    import gc
    import sys
    import tracemalloc

    from cowmap.state import KeyedStateBackend

    b = KeyedStateBackend(128, spark_key_types=["string"])
    keys = [f"key-{i}" for i in range(300)]
    frame = pd.DataFrame({"k": pd.Series(keys * 3, dtype=object), "v": np.arange(900)})

    def passes(n: int) -> None:
        for _ in range(n):
            for _key, rows in group_rows(frame, ["k"], b._kc):
                len(rows), rows.sum("v"), rows.max("v"), rows["v"], rows.index
            for _key, rows in group_rows(frame, ["k"], b.set_current_key):
                rows.min("v")

    passes(2)
    b.set_current_key("other")
    gc.collect()
    before = [sys.getrefcount(k) for k in keys]
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        passes(20)
        b.set_current_key("other")
        gc.collect()
        assert tracemalloc.get_traced_memory()[0] - base < 64 * 1024
    finally:
        tracemalloc.stop()
    assert [sys.getrefcount(k) for k in keys] == before
