"""``ValueState``: one value per key and namespace; its timestamp lives in the core entry."""

from __future__ import annotations

from typing import Any

from cowmap._core import EXPIRED, NO_TIMESTAMP, multi_get, multi_put
from cowmap._requests import positions, replace_all, request_args, request_columns
from cowmap.state.async_methods import AsyncValueMethods
from cowmap.state.table import State, StateTable

__all__ = ["ValueState", "ValueTable"]


class ValueState(AsyncValueMethods, State):
    """A single value per key and namespace (Flink's ``ValueState``).

    ``value()`` gives the descriptor's ``default_value`` when nothing is stored (or
    the value expired); ``update(None)`` is ``clear()``.
    """

    __slots__ = ("_fresh_default",)

    def __init__(self, table: StateTable) -> None:
        super().__init__(table)
        default = table.descriptor.default_value  # type: ignore[attr-defined]
        self._default = default
        # a mutable default is copied per read, as Flink's getDefaultValue() does
        self._fresh_default = default is not None and table.copy_value(default) is not default

    def _default_value(self) -> Any:
        return self._t.copy_value(self._default) if self._fresh_default else self._default

    def value(self) -> Any:
        t = self._t
        kc = self._kc
        try:  # State._current_map, inlined: value() and update() are the hottest path
            m = t.maps[kc.key_group]
        except TypeError:
            raise self._no_key() from None
        if not t.ttl:
            if m is None:
                return self._default_value() if self._fresh_default else self._default
            v = m.get(kc.key, self._ns)
            if v is None:
                return self._default_value() if self._fresh_default else self._default
            return v
        if t.cleanup_size:  # t.cleanup_step(), inlined: a hot path
            t.ticks -= 1
            if t.ticks <= 0:
                t.run_cleanup()
        if m is None:
            return self._default_value()
        # the time provider, not its time: the map calls it once (the default
        # wall_clock_ms in C, without a Python call)
        v = m.get_unexpired(kc.key, self._ns, kc.clock, t.ttl, t.update_on_read)
        if v is None:
            return self._default_value()
        if v is EXPIRED:
            v = m.remove_and_get_old(kc.key, self._ns)
            return v if t.return_expired else self._default_value()
        return v

    def update(self, value: Any) -> None:
        t = self._t
        kc = self._kc
        if value is None:
            self.clear()
            return
        try:
            m = t.maps[kc.key_group]
        except TypeError:
            raise self._no_key() from None
        if m is None:
            m = t.map_for_write(kc.key_group)
        if not t.ttl:
            m.put(kc.key, self._ns, value)
            return
        if t.cleanup_size:  # t.cleanup_step(), inlined: a hot path
            t.ticks -= 1
            if t.ticks <= 0:
                t.run_cleanup()
        m.put(kc.key, self._ns, value, kc.clock)

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
