"""``ctx.groups(batch)``: a micro-batch's rows grouped by key, with the key current.

The batch is ordered by key once (a stable radix sort of factorized key codes,
in C); a group's :class:`Rows` is then two integers over that order, and a column
of it a slice of the batch's column reordered once on first use — no DataFrame
per key.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np
import pandas as pd

__all__ = ["Rows", "group_rows"]


_REDUCERS = {"sum": np.add, "min": np.minimum, "max": np.maximum}


class _Ordered:
    """A batch and its rows' order by key; columns reordered, and per-group
    aggregates computed, on first use."""

    __slots__ = ("frame", "order", "starts", "_cols", "_aggs")

    def __init__(self, frame: pd.DataFrame, order: np.ndarray, starts: np.ndarray) -> None:
        self.frame = frame
        self.order = order
        self.starts = starts  # each group's first row in the order
        self._cols: dict[str, np.ndarray] = {}
        self._aggs: dict[tuple[str, str], list[Any]] = {}

    def aggregate(self, how: str, name: str) -> list[Any]:
        """``how`` (sum, min, max) of column ``name`` for every group at once
        (``reduceat``, one C pass), as Python numbers by group."""
        agg = self._aggs.get((how, name))
        if agg is None:
            col = self.column(name)
            if col.dtype.kind not in "iufb":
                raise TypeError(f"rows.{how}({name!r}) needs a numeric column, not {col.dtype}")
            agg = self._aggs[(how, name)] = _REDUCERS[how].reduceat(col, self.starts).tolist()
        return agg

    def column(self, name: str) -> np.ndarray:
        col = self._cols.get(name)
        if col is None:
            try:
                values = self.frame[name]
            except KeyError:
                raise KeyError(f"no column {name!r} in the batch (columns: {list(self.frame.columns)})") from None
            col = self._cols[name] = values.to_numpy()[self.order]
        return col


class Rows:
    """The rows of one key in a micro-batch: ``len(rows)``, ``rows["col"]`` (a
    numpy array, in the batch's order), ``rows.sum("col")``, ``rows.min``,
    ``rows.max`` (Python numbers), ``rows.index`` (their positions in the
    batch) and ``rows.to_pandas()``. O(1) to make; a column is O(rows) the
    first time any group reads it (the whole batch's column is reordered then),
    and so is an aggregate (computed then for every group in one pass: O(1)
    per group after, where a numpy call per group costs microseconds)."""

    __slots__ = ("_o", "group", "start", "stop")

    def __init__(self, ordered: _Ordered, group: int, start: int, stop: int) -> None:
        self._o = ordered
        self.group = group
        self.start = start
        self.stop = stop

    def sum(self, name: str) -> Any:
        return self._o.aggregate("sum", name)[self.group]

    def min(self, name: str) -> Any:
        return self._o.aggregate("min", name)[self.group]

    def max(self, name: str) -> Any:
        return self._o.aggregate("max", name)[self.group]

    def __len__(self) -> int:
        return self.stop - self.start

    def __getitem__(self, name: str) -> np.ndarray:
        return self._o.column(name)[self.start : self.stop]

    @property
    def index(self) -> np.ndarray:
        return self._o.order[self.start : self.stop]

    def to_pandas(self) -> pd.DataFrame:
        """These rows as a DataFrame (a copy; the slow way, for code that needs one)."""
        return self._o.frame.iloc[self.index]

    def __repr__(self) -> str:
        return f"<Rows {len(self)} of {len(self._o.order)}>"


def _factorize(frame: pd.DataFrame, keys: Sequence[str]) -> tuple[np.ndarray, list[Any]]:
    """Per row a code of its key (0.. in order of first appearance) and the keys
    by code: scalars for one key column, tuples for several."""
    if len(keys) == 1:
        codes, uniques = pd.factorize(frame[keys[0]], sort=False, use_na_sentinel=True)
        values = uniques.tolist() if hasattr(uniques, "tolist") else list(uniques)
    else:
        codes, uniques = pd.MultiIndex.from_frame(frame[list(keys)]).factorize(sort=False)
        values = [tuple(_plain(v) for v in t) for t in uniques.tolist()]
    if len(codes) and codes.min() < 0:
        raise ValueError(f"a key column ({', '.join(keys)}) holds a null: keys must not be null")
    return codes, values


def _plain(v: Any) -> Any:
    return v.item() if isinstance(v, np.generic) else v


def _stable_order(codes: np.ndarray, ngroups: int) -> np.ndarray:
    """The rows' order by code (codes in ``[0, ngroups)``, ``ngroups`` at most
    the rows, so below 2**32), ties in row order: numpy's stable sort is a radix
    sort for 16-bit ints (O(n), ten times its int64 merge sort on a micro-batch),
    so the codes are sorted 16 bits at a time, low half first."""
    if ngroups <= 1 << 16:
        return np.argsort(codes.astype(np.uint16), kind="stable")
    order = np.argsort((codes & 0xFFFF).astype(np.uint16), kind="stable")
    return order[np.argsort((codes[order] >> 16).astype(np.uint16), kind="stable")]


def group_rows(
    frame: pd.DataFrame, keys: Sequence[str], set_current_key: Callable[[Any], None]
) -> Iterator[tuple[Any, Rows]]:
    """Yield ``(key, rows)`` per distinct key of ``frame`` in order of first
    appearance, each with ``set_current_key(key)`` done. O(n) once, then O(1)
    per group."""
    n = len(frame)
    if n == 0:
        return
    codes, values = _factorize(frame, keys)
    order = _stable_order(codes, len(values))
    bounds = np.zeros(len(values) + 1, dtype=np.int64)
    np.cumsum(np.bincount(codes, minlength=len(values)), out=bounds[1:])
    ordered = _Ordered(frame, order, bounds[:-1])
    starts = bounds.tolist()
    for i, key in enumerate(values):
        set_current_key(key)
        yield key, Rows(ordered, i, starts[i], starts[i + 1])
