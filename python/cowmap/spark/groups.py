"""``ctx.groups(batch)``: a micro-batch's rows grouped by key, with the key current.

The batch is ordered by key once: one compiled pass for a single integer key
column (a hash table of its distinct keys, then a counting sort), else pandas'
factorized key codes and a stable radix sort of them. A group's :class:`Rows`
is then two integers over that order, and a column of it a slice of the
batch's column reordered once on first use — no DataFrame per key. The per-key
part (the iterator, making each key current, ``Rows``) is compiled
(``cowmap._groups``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np
import pandas as pd

from cowmap._context import KeyContext
from cowmap._groups import Groups, OrderedBatch, Rows, group_int64

__all__ = ["Rows", "group_rows"]


def _factorize(frame: pd.DataFrame, keys: Sequence[str]) -> tuple[np.ndarray, list[Any]]:
    """Per row a code of its key (0.. in order of first appearance) and the keys
    by code: scalars for one key column, tuples for several."""
    if len(keys) == 1:
        codes, uniques = pd.factorize(frame[keys[0]], sort=False, use_na_sentinel=True)
        null = len(codes) > 0 and codes.min() < 0
        values = uniques.tolist() if hasattr(uniques, "tolist") else list(uniques)
    else:
        key_frame = frame[list(keys)]
        null = bool(key_frame.isna().to_numpy().any())  # (a MultiIndex codes a null as any other value)
        codes, uniques = pd.MultiIndex.from_frame(key_frame).factorize(sort=False)
        values = [tuple(_plain(v) for v in t) for t in uniques.tolist()]
    if null:
        raise ValueError(
            f"a key column ({', '.join(keys)}) holds a null or a NaN: keys must not be null, and a NaN "
            "(which equals no other NaN in Python) cannot find its state again"
        )
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
    frame: pd.DataFrame, keys: Sequence[str], target: KeyContext | Callable[[Any], object]
) -> Iterator[tuple[Any, Rows]]:
    """``(key, rows)`` per distinct key of ``frame``, each key made current
    first: by ``target``, a backend's :class:`KeyContext` (in C, as its
    ``set_current_key`` does), or a callable taking the key. With a
    KeyContext the keys come in key-group order (of one key group, in order of
    first appearance): one key's state is then near the last one's, in the same
    key group's map, where keys in the batch's order would each read a map of
    their own (a cache miss or two a key over thousands of key groups). With a
    callable, in order of first appearance. O(n) once, then O(1) per group."""
    if len(frame) == 0:
        return iter(())
    int_key = None
    if len(keys) == 1:
        col = frame[keys[0]]
        dtype = col.dtype
        if isinstance(dtype, np.dtype) and (dtype.kind == "i" or (dtype.kind == "u" and dtype.itemsize < 8)):
            int_key = col.to_numpy()  # (no null fits in a numpy int column)
    if not isinstance(target, KeyContext):
        if int_key is not None:  # hashed and counted in one compiled pass
            values, order, bounds = group_int64(int_key)
        else:
            codes, values = _factorize(frame, keys)
            order, bounds = _order(codes, len(values))
        return Groups(OrderedBatch(frame, order, bounds), values, target)
    # in key-group order: the distinct keys' key groups in one call, the groups renumbered by them
    # (stably, a radix sort: a key group fits 16 bits) before the rows are ordered
    if int_key is not None:
        values, order, bounds, kgs = group_int64(int_key, lambda uniques: _key_groups(target, uniques))
    else:
        codes, values = _factorize(frame, keys)
        kgs = _key_groups(target, tuple(values))
        perm = _stable_order(kgs, target.max_parallelism)
        rank = np.empty(len(perm), dtype=np.int64)
        rank[perm] = np.arange(len(perm))
        order, bounds = _order(rank[codes], len(values))
        values = [values[i] for i in perm.tolist()]
        kgs = kgs[perm]
    return Groups(OrderedBatch(frame, order, bounds), values, target, kgs)


def _order(codes: np.ndarray, ngroups: int) -> tuple[np.ndarray, np.ndarray]:
    """The rows by code (ties in row order) and each code's run bounds in them."""
    bounds = np.zeros(ngroups + 1, dtype=np.int64)
    np.cumsum(np.bincount(codes, minlength=ngroups), out=bounds[1:])
    return _stable_order(codes, ngroups), bounds


def _key_groups(kc: KeyContext, keys: np.ndarray | tuple[Any, ...]) -> np.ndarray:
    """The key group of every key of ``keys`` (an int64 array or a tuple) by
    ``kc``'s function, all in ``kc``'s range: else the error
    ``set_current_key`` would give, naming the first key it is for."""
    try:
        return kc.column_key_groups(keys)
    except (TypeError, ValueError, OverflowError) as e:
        error = e  # (it names the key's place among the distinct keys, not the batch's row)
    for key in keys.tolist() if isinstance(keys, np.ndarray) else keys:
        try:
            kg = kc.key_group_for(key)
        except (TypeError, ValueError, OverflowError) as e:
            raise type(e)(f"key {key!r}: {e}") from None
        if not kc.lo <= kg <= kc.hi:
            raise ValueError(
                f"key {key!r} is in key group {kg}, outside this backend's range KeyGroupRange({kc.lo}, {kc.hi})"
            ) from None
    raise error
