"""``ReducingState`` and ``AggregatingState``: one accumulator per key and namespace.

With TTL the accumulator's timestamp is the core entry's. An expired
accumulator is dropped, not merged, unless the visibility is
``ReturnExpiredIfNotCleanedUp`` (then, as in Flink's ``TtlReduceFunction`` and
``TtlAggregateFunction``, it is still used until cleaned up).
"""

from __future__ import annotations

import numbers
import operator
from collections.abc import Callable, Iterable
from typing import Any

from cowmap import _core
from cowmap._core import (
    COL_FLOAT64,
    FOLD_ADD,
    FOLD_MAX,
    FOLD_MIN,
    NO_TIMESTAMP,
    CopyOnWriteStateMap,
    column_fold,
    column_get,
    column_groups,
    column_put,
)
from cowmap.state.async_methods import AsyncMergingMethods
from cowmap.state.table import State, StateTable

__all__ = ["AggregatingState", "AggregatingTable", "ReducingState", "ReducingTable"]

_ABSENT = object()


def _ufunc_of(fn: Any) -> Any:
    """The numpy ufunc a reduce function is, for ``add_many`` to fold a column
    with: np.add (or operator.add), np.minimum, np.maximum; else None."""
    import numpy as np

    if fn is operator.add or fn is np.add:
        return np.add
    if fn is np.minimum or fn is np.maximum:
        return fn
    return None


class _MergingState(AsyncMergingMethods, State):
    """What the two share: the columnar twins and ``merge_namespaces``. Their
    ``get`` and ``add`` are compiled (``_state_access.pxi``): a read checks the
    TTL and updates (Flink's ``getWithTtlCheckAndUpdate``), a write uses the
    unexpired accumulator (``getUnexpired``) and stamps the result."""

    __slots__ = ()

    def get(self) -> Any:
        raise NotImplementedError

    def add(self, value: Any) -> None:
        raise NotImplementedError

    # -- columnar twins: a column of keys instead of set_current_key per record

    def get_many(self, keys: Any, *, namespace: Any = None, dtype: Any = None, default: Any = None) -> Any:
        """``get()`` of every key of the column ``keys``, in order, without
        changing the current key: a list, or with ``dtype`` (int64 or float64) a
        numpy array, a key with nothing stored reading as ``default`` (None: NaN
        for float64; an int64 read needs one, else ``ValueError`` before
        anything is read). O(len(keys))."""
        from cowmap.state.columns import check_typed, typed

        check_typed(dtype, default)
        ks, kgs, ns = self._column(keys, namespace)
        out = self._each_row(ks, kgs, ns, lambda i: self.get())
        return typed(out, dtype, default, ks)

    def add_many(self, keys: Any, values: Any, *, namespace: Any = None) -> None:
        """``add(v)`` for every row of the columns ``keys`` and ``values``, in
        order, without changing the current key. ``ValueError`` for columns of
        different lengths (and, for a ``ReducingState``, a None value) before
        anything is written. O(len(keys)) calls of the state's function."""
        from cowmap.state.columns import value_list

        ks, kgs, ns = self._column(keys, namespace)
        vs = value_list(values, len(kgs))
        self._check_values(vs)
        self._each_row(ks, kgs, ns, lambda i: self.add(vs[i]))

    def _check_values(self, vs: list[Any]) -> None:
        """Refuse a column of values ``add`` would refuse, before anything is written."""

    def _merge_function(self) -> Callable[[Any, Any], Any]:
        """The function that merges two accumulators (it may change the first)."""
        raise NotImplementedError

    def _merge_ttl(
        self, a: Any, b: Any, now: int, combine: Callable[[Any, Any], Any]
    ) -> tuple[Any, int] | None:
        """Flink's TTL-wrapped merge of two unexpired-or-``_ABSENT`` accumulators."""
        raise NotImplementedError

    def merge_namespaces(self, target: Any, sources: Iterable[Any]) -> None:
        """Merge the accumulators of ``sources`` (removed) into ``target``, as
        Flink's ``AbstractHeapMergingState.mergeNamespaces`` does: the sources
        folded in order, then ``merge(target's, folded)``.

        A target among the sources has its own accumulator merged at its place
        there; a namespace given twice counts once. All arguments are checked
        before anything changes: TypeError for a target or source that is None
        or unhashable or ``sources`` that is no iterable of namespaces,
        RuntimeError without a current key.

        Atomic: the result is computed before the state is written, and the
        reduce/merge function only ever changes copies (made with the
        descriptor's copier) of the stored accumulators, so if it raises the
        state is as before. The function may read this state (it sees the
        state before the merge) but must not change it: changes to the target
        or the sources are replaced by the merge's result, and calling
        ``merge_namespaces`` of this state from it raises RuntimeError.
        O(sources) calls of the function, plus a copy of each stored
        accumulator it is to change (free for immutable accumulators).
        """
        srcs = self._merge_sources(target, sources)  # RuntimeError without a current key
        t = self._t
        m = t.maps[self._kc.key_group]
        if m is None or not srcs:
            return
        if t.merging:
            raise RuntimeError(f"merge_namespaces of state {t.name!r} called from its own reduce/merge function")
        key = self._kc.key  # the function may switch keys: the merge stays with this one
        ttl = t.ttl
        t.merging = True
        try:
            if ttl:
                result = self._merged_ttl(m, key, target, srcs)
            else:
                acc = self._merged(m, key, target, srcs)
                result = acc if acc is _ABSENT else (acc, 0)
        finally:
            t.merging = False
        if result is _ABSENT:
            return
        # nothing below runs user code: write the target, remove the sources
        for src in srcs:
            m.remove(key, src)
        if result is None or result[0] is None:
            m.remove(key, target)
        elif ttl:
            m.put(key, target, result[0], result[1])
        else:
            m.put(key, target, result[0])

    def _merged(self, m: CopyOnWriteStateMap, key: Any, target: Any, srcs: dict[Any, None]) -> Any:
        """Without TTL: the accumulator (None: none) that merging ``srcs`` into
        ``target`` of ``key`` leaves in ``target``; ``_ABSENT`` when no source
        has one. Changes nothing in ``m``."""
        fn = self._merge_function()
        copy = self._t.copy_value
        # ids of the stored accumulators read: the function may change its first
        # argument, so a stored one is copied first (an id reused meanwhile only
        # costs a needless copy)
        stored: set[int] = set()
        merged: Any = _ABSENT
        for src in srcs:
            v = m.get(key, src)
            if v is None:
                continue
            merged = v if merged is _ABSENT else fn(copy(merged) if id(merged) in stored else merged, v)
            stored.add(id(v))
        if merged is _ABSENT:
            return _ABSENT
        if target in srcs:
            return merged
        old = m.get(key, target)
        return merged if old is None else fn(copy(old), merged)

    def _merged_ttl(self, m: CopyOnWriteStateMap, key: Any, target: Any, srcs: dict[Any, None]) -> Any:
        """With TTL: the ``(accumulator, ts)`` (or None: none) that merging
        ``srcs`` into ``target`` of ``key`` leaves in ``target``; ``_ABSENT``
        when no source has one. Changes nothing in ``m``."""
        t = self._t
        now = self._kc.now()
        fn = self._merge_function()
        copy = t.copy_value
        stored: set[int] = set()  # as in _merged

        def combine(a: Any, b: Any) -> Any:
            return fn(copy(a) if id(a) in stored else a, b)

        def unexpired(tv: tuple[Any, int]) -> Any:
            v, ts = tv
            if v is None or (not t.return_expired and t.is_expired(ts, now)):
                return _ABSENT
            return v

        def merge(a: tuple[Any, int], c: tuple[Any, int]) -> tuple[Any, int] | None:
            return self._merge_ttl(unexpired(a), unexpired(c), now, combine)

        def get(ns: Any) -> tuple[Any, int] | None:
            r = m.get_with_timestamp(key, ns)
            if r is not None:
                stored.add(id(r[0]))
            return r

        merged: tuple[Any, int] | None = None
        for src in srcs:
            r = get(src)
            if r is not None:
                merged = r if merged is None else merge(merged, r)
        if merged is None:
            return _ABSENT
        old = None if target in srcs else get(target)
        return merged if old is None else merge(old, merged)


class ReducingState(_MergingState):
    """One value per key and namespace, combined on ``add`` with the reduce function."""

    __slots__ = ()

    # compiled (cowmap._core): get() gives the reduced value or None; add(value)
    # reduces a value (not None) in with the descriptor's reduce_function
    get = _core.reducing_state_get
    add = _core.reducing_state_add

    def _check_values(self, vs: list[Any]) -> None:
        for i, v in enumerate(vs):
            if v is None:
                raise ValueError(f"values[{i}] is None: cannot add None to a ReducingState; nothing was written")

    def add_many(self, keys: Any, values: Any, *, namespace: Any = None) -> None:
        """``add(v)`` for every row of the columns ``keys`` and ``values``, in
        order, without changing the current key; ``ValueError`` for a None value
        or columns of different lengths, before anything is written.

        With ``np.add``, ``np.minimum``, ``np.maximum`` or ``operator.add`` as
        the reduce function and an integer or float column, the column is
        reduced per key in numpy first, each key's rows folded in row order onto
        its stored value (so float sums round as the loop's do), and every key
        is then read and written once: a few C passes. Otherwise one ``add`` per
        row. O(len(keys))."""
        import numpy as np

        from cowmap.state.columns import value_column

        ks, kgs, ns = self._column(keys, namespace)
        n = len(kgs)
        vs = value_column(values, n)
        fn = self._t.descriptor.reduce_function
        fold = _ufunc_of(fn)
        if fold is not None and isinstance(vs, np.ndarray) and self._fold_column(fold, ks, kgs, ns, vs):
            self._column_ticks(n)
            return
        vals = vs.tolist() if isinstance(vs, np.ndarray) else list(vs)
        self._check_values(vals)
        if fold is fn:  # a numpy ufunc takes numbers: refuse anything else before a row is added
            for i, v in enumerate(vals):
                if not isinstance(v, numbers.Number):
                    raise TypeError(
                        f"values[{i}] is {type(v).__name__} {v!r}: {fn.__name__} reduces numbers; "
                        "nothing was written"
                    )
        self._each_row(ks, kgs, ns, lambda i: self.add(vals[i]))

    def _fold_ints(
        self, fold: Any, ks: Any, kgs: Any, ns: Any, vs: Any, first: Any, group: Any, gkeys: Any, gkgs: Any, now: int
    ) -> bool:
        """``add_many`` of an int64 column: each key's rows folded in numpy (exact:
        ints), then one C pass folds that into each key's stored int and writes it
        (``column_fold``: one lookup per key). Keys whose stored value is no int64
        int, or whose result would leave int64, get their rows added one by one."""
        import numpy as np

        t = self._t
        if fold is np.add:
            if float(np.abs(vs.astype(np.float64)).sum()) >= 2.0**62:
                return False  # the batch's own sums could leave int64: row by row
            acc = np.zeros(len(first), dtype=np.int64)
            kind = FOLD_ADD
        else:
            info = np.iinfo(np.int64)
            acc = np.full(len(first), info.max if fold is np.minimum else info.min, dtype=np.int64)
            kind = FOLD_MIN if fold is np.minimum else FOLD_MAX
        fold.at(acc, group, vs)
        unfit = column_fold(
            self._column_maps(gkgs), gkgs, gkeys, ns, acc, kind, now, t.ttl, t.return_expired,
            now if t.ttl else NO_TIMESTAMP,
        )
        if unfit:
            rows = np.flatnonzero(np.isin(group, unfit))
            sub = ks[rows] if isinstance(ks, np.ndarray) else tuple(ks[i] for i in rows.tolist())
            vals = vs[rows].tolist()
            self._each_row(sub, np.ascontiguousarray(kgs[rows]), ns, lambda i: self.add(vals[i]))
        return True

    def _fold_column(self, fold: Any, ks: Any, kgs: Any, ns: Any, vs: Any) -> bool:
        """``add_many`` through numpy: False, with nothing changed, when a stored
        value does not suit (not a Python number, or an int sum that could leave
        int64), for the caller to add row by row."""
        import numpy as np

        t = self._t
        first, group = column_groups(ks)
        gkeys = ks[first] if isinstance(ks, np.ndarray) else tuple(ks[i] for i in first.tolist())
        gkgs = np.ascontiguousarray(kgs[first])
        now = self._kc.now() if t.ttl else 0
        if vs.dtype.kind == "i":  # value_column gives int64 or float64
            return self._fold_ints(fold, ks, kgs, ns, vs, first, group, gkeys, gkgs, now)
        try:  # Flink's getUnexpired per key: nothing refreshed or removed; Python numbers only
            prev, status = column_get(
                t.maps, gkgs, gkeys, ns, now, t.ttl, False, 0, t.return_expired, COL_FLOAT64, True, True
            )
        except (TypeError, OverflowError, ValueError):
            return False  # a stored value numpy must not convert (a numpy scalar, an array): row by row
        usable = (status == 1) | (status == 2) if t.return_expired else status == 1
        acc = np.where(usable, prev, vs[first])
        apply = np.ones(len(vs), dtype=np.bool_)
        apply[first[~usable]] = False  # a key with nothing usable starts from its first row
        fold.at(acc, group[apply], vs[apply])
        column_put(self._column_maps(gkgs), gkgs, gkeys, ns, acc, now if t.ttl else NO_TIMESTAMP)
        return True

    def _merge_function(self) -> Callable[[Any, Any], Any]:
        return self._t.descriptor.reduce_function

    def _merge_ttl(
        self, a: Any, b: Any, now: int, combine: Callable[[Any, Any], Any]
    ) -> tuple[Any, int] | None:
        # TtlReduceFunction: an absent side yields the other (even if that is absent too)
        if a is _ABSENT:
            return (None if b is _ABSENT else b), now
        if b is _ABSENT:
            return a, now
        return combine(a, b), now


class AggregatingState(_MergingState):
    """An accumulator per key and namespace, driven by an ``AggregateFunction``."""

    __slots__ = ()

    # compiled (cowmap._core): get() gives get_result of the accumulator or None;
    # add(value) adds with the AggregateFunction
    get = _core.aggregating_state_get
    add = _core.aggregating_state_add

    def _merge_function(self) -> Callable[[Any, Any], Any]:
        return self._t.descriptor.aggregate_function.merge

    def _merge_ttl(
        self, a: Any, b: Any, now: int, combine: Callable[[Any, Any], Any]
    ) -> tuple[Any, int] | None:
        # TtlAggregateFunction.merge: None when both sides are absent
        if a is _ABSENT:
            return None if b is _ABSENT else (b, now)
        if b is _ABSENT:
            return a, now
        return combine(a, b), now


class ReducingTable(StateTable):
    kind = "reducing"
    view_class = ReducingState


class AggregatingTable(StateTable):
    kind = "aggregating"
    view_class = AggregatingState
