"""``ValueState``: one value per key and namespace; its timestamp lives in the core entry."""

from __future__ import annotations

from typing import Any

from cowmap import _core
from cowmap._core import (
    COL_LIST,
    EXPIRED,
    NO_TIMESTAMP,
    ColumnLocations,
    column_get,
    column_put,
    column_remove,
    multi_get,
    multi_put,
)
from cowmap._requests import positions, replace_all, request_args, request_columns
from cowmap.state.async_methods import AsyncValueMethods
from cowmap.state.table import State, StateTable

__all__ = ["ValueState", "ValueTable"]


#: ``get_many``'s default: the descriptor's default value
_DESCRIPTOR: Any = object()


class ValueState(AsyncValueMethods, State):
    """A single value per key and namespace (Flink's ``ValueState``).

    ``value()`` gives the descriptor's ``default_value`` when nothing is stored (or
    the value expired); ``update(None)`` is ``clear()``.
    """

    __slots__ = ("_fresh_default", "_locations")

    def __init__(self, table: StateTable) -> None:
        super().__init__(table)
        # where the last int64 get_many found its rows, for an update_many of the same keys
        self._locations = ColumnLocations()
        default = table.descriptor.default_value  # type: ignore[attr-defined]
        self._default = default
        # a mutable default is copied per read, as Flink's getDefaultValue() does
        self._fresh_default = default is not None and table.copy_value(default) is not default

    def _default_value(self) -> Any:
        """The descriptor's default value (a copy of a mutable one)."""
        return self._t.copy_value(self._default) if self._fresh_default else self._default

    # compiled (cowmap._core): value() and update() are the hottest per-key path
    value = _core.value_state_value
    update = _core.value_state_update

    # -- columnar twins: a column of keys instead of set_current_key per record

    def get_many(self, keys: Any, *, namespace: Any = None, dtype: Any = None, default: Any = _DESCRIPTOR) -> Any:
        """``value()`` of every key of the column ``keys``, in order: what a loop of
        ``set_current_key(k); value()`` returns (TTL reads, refreshes and expired
        entries included), without changing the current key.

        ``keys``: a numpy array, pandas Series/Index, pyarrow array or any
        sequence. ``namespace``: the view's current one when None. Returns a
        list, or with ``dtype`` (int64 or float64) a numpy array; a key with no
        value reads as ``default`` (the descriptor's default value unless
        given; for float64 None is NaN; an int64 read needs one, else
        ``ValueError`` before anything is read).
        ``TypeError``/``ValueError`` for a bad key or one outside the backend's
        key-group range, before anything is read. O(len(keys)), a few C passes.
        """
        import numpy as np

        from cowmap.state.columns import check_typed

        dflt = self._default if default is _DESCRIPTOR else default
        code = check_typed(dtype, dflt)
        loc = self._locations
        ks, kgs, ns = self._column(keys, namespace, loc)
        t = self._t
        if t.ttl:
            values, status = column_get(
                t.maps, kgs, ks, ns, self._kc.now(), t.ttl, t.update_on_read, dflt, t.return_expired, code,
                locations=loc, keys_private=True,
            )
        else:
            values, status = column_get(
                t.maps, kgs, ks, ns, 0, 0, False, dflt, False, code, locations=loc, keys_private=True
            )
        if default is _DESCRIPTOR and self._fresh_default and code == COL_LIST:
            hidden = status != 1 if not t.return_expired else status == 0
            for i in np.flatnonzero(hidden).tolist():
                values[i] = self._default_value()
        self._column_ticks(len(kgs))
        return values

    def update_many(self, keys: Any, values: Any, *, namespace: Any = None) -> None:
        """``update(v)`` for every row of the columns ``keys`` and ``values``, in
        order (a later row of the same key wins; a None value clears), without
        changing the current key. Integer and float columns read back as Python
        ints and floats. Right after ``get_many`` of the same int64 keys (a
        read-modify-write) the rows it found are written without a lookup.
        ``ValueError`` for columns of different lengths, and
        for bad keys as :meth:`get_many`, before anything is written.
        O(len(keys)), a few C passes."""
        from cowmap.state.columns import value_column

        loc = self._locations
        ks, kgs, ns = self._column(keys, namespace, loc)
        vs = value_column(values, len(kgs))
        t = self._t
        maps = self._column_maps(kgs)
        column_put(maps, kgs, ks, ns, vs, self._kc.now() if t.ttl else NO_TIMESTAMP, locations=loc)
        self._column_ticks(len(kgs))

    def clear_many(self, keys: Any, *, namespace: Any = None) -> None:
        """``clear()`` for every key of the column ``keys``, without changing the
        current key. O(len(keys))."""
        ks, kgs, ns = self._column(keys, namespace)
        column_remove(self._t.maps, kgs, ks, ns)
        self._column_ticks(len(kgs))

    # -- vectorised forms for the AsyncExecutionController: one core call per batch

    def _batch_value(self, reqs: list[Any]) -> list[Any]:
        t = self._t
        kgs, keys, nss = request_columns(reqs)
        if t.cleanup_size:
            t.tick(len(reqs))
        if not t.ttl:
            out = multi_get(t.maps, kgs, keys, nss)
        else:
            out = multi_get(t.maps, kgs, keys, nss, self._kc.clock, t.ttl, t.update_on_read)
            for i in positions(out, EXPIRED):
                v = t.maps[kgs[i]].remove_and_get_old(keys[i], nss[i])
                out[i] = v if t.return_expired else None
        if self._fresh_default:
            for i in positions(out, None):
                out[i] = self._default_value()
            return out
        return replace_all(out, None, self._default)

    def _batch_update(self, reqs: list[Any]) -> list[Any] | None:
        values = request_args(reqs, 0)
        if positions(values, None):
            return None  # update(None) is clear(): let the requests run one by one
        t = self._t
        kgs, keys, nss = request_columns(reqs)
        t.prepare_batch_write(kgs)
        multi_put(t.maps, kgs, keys, nss, values, self._kc.clock if t.ttl else NO_TIMESTAMP)
        return [None] * len(reqs)


class ValueTable(StateTable):
    kind = "value"
    view_class = ValueState
