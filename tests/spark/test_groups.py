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
    with pytest.raises(ValueError, match="holds a null"):
        list(group_rows(pd.DataFrame({"k": [1.0, np.nan]}), ["k"], lambda k: None))
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
