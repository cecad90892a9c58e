"""``ReducingState`` and ``AggregatingState``: one accumulator per key and namespace.

With TTL the accumulator's timestamp is the core entry's. An expired
accumulator is dropped, not merged, unless the visibility is
``ReturnExpiredIfNotCleanedUp`` (then, as in Flink's ``TtlReduceFunction`` and
``TtlAggregateFunction``, it is still used until cleaned up).
"""

from __future__ import annotations

from typing import Any, Callable, Iterable

from cowmap._core import EXPIRED, CopyOnWriteStateMap
from cowmap.state.async_methods import AsyncMergingMethods
from cowmap.state.table import State, StateTable

__all__ = ["AggregatingState", "AggregatingTable", "ReducingState", "ReducingTable"]

_ABSENT = object()


class _MergingState(AsyncMergingMethods, State):
    """The shared TTL logic: read with check-and-update, write with a fresh timestamp."""

    __slots__ = ()

    def _read(self, m: CopyOnWriteStateMap | None, ns: Any) -> Any:
        """Flink's ``getWithTtlCheckAndUpdate``: the accumulator or ``_ABSENT``."""
        if m is None:
            return _ABSENT
        t = self._t
        key = self._b._key
        if not t.ttl:
            acc = m.get(key, ns)
            return _ABSENT if acc is None else acc
        acc = m.get_unexpired(key, ns, self._b._time, t.ttl, t.update_on_read)
        if acc is None:
            return _ABSENT
        if acc is EXPIRED:
            acc = m.remove_and_get_old(key, ns)
            return acc if t.return_expired else _ABSENT
        return acc

    def _usable(self, m: CopyOnWriteStateMap, ns: Any) -> Any:
        """The stored accumulator for a write (Flink's ``getUnexpired``), or ``_ABSENT``."""
        t = self._t
        key = self._b._key
        if not t.ttl:
            acc = m.get(key, ns)
            return _ABSENT if acc is None else acc
        r = m.get_with_timestamp(key, ns)
        if r is None:
            return _ABSENT
        acc, ts = r
        if not t.return_expired and t.is_expired(ts, self._b.now()):
            return _ABSENT
        return acc

    def _write(self, m: CopyOnWriteStateMap, ns: Any, acc: Any) -> None:
        if self._t.ttl:
            m.put(self._b._key, ns, acc, self._b.now())
        else:
            m.put(self._b._key, ns, acc)

    def _combine(self, a: Any, b: Any) -> Any:
        raise NotImplementedError

    def _merge_ttl(self, a: Any, b: Any, now: int) -> tuple[Any, int] | None:
        """Flink's TTL-wrapped merge of two unexpired-or-``_ABSENT`` accumulators."""
        raise NotImplementedError

    def merge_namespaces(self, target: Any, sources: Iterable[Any]) -> None:
        """Merge the accumulators of ``sources`` (removed) into ``target``, as
        Flink's ``AbstractHeapMergingState.mergeNamespaces`` does."""
        t = self._t
        b = self._b
        m = self._current_map()
        if m is None:
            return
        key = b._key
        ttl = t.ttl
        now = b.now() if ttl else 0

        def unexpired(tv: tuple[Any, int]) -> Any:
            v, ts = tv
            if v is None or (not t.return_expired and t.is_expired(ts, now)):
                return _ABSENT
            return v

        def merge(a: tuple[Any, int], c: tuple[Any, int]) -> tuple[Any, int] | None:
            if not ttl:
                return self._combine(a[0], c[0]), 0
            return self._merge_ttl(unexpired(a), unexpired(c), now)

        merged: tuple[Any, int] | None = None
        for src in sources:
            if src is None:
                continue
            r = m.get_with_timestamp(key, src)
            if r is None:
                continue
            m.remove(key, src)
            merged = r if merged is None else merge(merged, r)
        if merged is None:
            return
        old = m.get_with_timestamp(key, target)
        result = merged if old is None else merge(old, merged)
        if result is None or result[0] is None:
            m.remove(key, target)
        elif ttl:
            m.put(key, target, result[0], result[1])
        else:
            m.put(key, target, result[0])




class ReducingState(_MergingState):
    """One value per key and namespace, combined on ``add`` with the reduce function."""

    __slots__ = ()

    def get(self) -> Any:
        """The reduced value, or None."""
        v = self._read(self._map(False), self._ns)
        return None if v is _ABSENT else v

    def add(self, value: Any) -> None:
        if value is None:
            raise ValueError("cannot add None to a ReducingState")
        m = self._map(True)
        assert m is not None
        prev = self._usable(m, self._ns)
        reduce: Callable[[Any, Any], Any] = self._t.descriptor.reduce_function  # type: ignore[attr-defined]
        self._write(m, self._ns, value if prev is _ABSENT else reduce(prev, value))

    def _combine(self, a: Any, b: Any) -> Any:
        return self._t.descriptor.reduce_function(a, b)  # type: ignore[attr-defined]

    def _merge_ttl(self, a: Any, b: Any, now: int) -> tuple[Any, int] | None:
        # TtlReduceFunction: an absent side yields the other (even if that is absent too)
        if a is _ABSENT:
            return (None if b is _ABSENT else b), now
        if b is _ABSENT:
            return a, now
        return self._combine(a, b), now


class AggregatingState(_MergingState):
    """An accumulator per key and namespace, driven by an ``AggregateFunction``."""

    __slots__ = ()

    def get(self) -> Any:
        """``get_result`` of the accumulator, or None when there is none."""
        acc = self._read(self._map(False), self._ns)
        if acc is _ABSENT:
            return None
        return self._t.descriptor.aggregate_function.get_result(acc)  # type: ignore[attr-defined]

    def add(self, value: Any) -> None:
        m = self._map(True)
        assert m is not None
        fn = self._t.descriptor.aggregate_function  # type: ignore[attr-defined]
        acc = self._usable(m, self._ns)
        if acc is _ABSENT:
            acc = fn.create_accumulator()
        self._write(m, self._ns, fn.add(value, acc))

    def _combine(self, a: Any, b: Any) -> Any:
        return self._t.descriptor.aggregate_function.merge(a, b)  # type: ignore[attr-defined]

    def _merge_ttl(self, a: Any, b: Any, now: int) -> tuple[Any, int] | None:
        # TtlAggregateFunction.merge: None when both sides are absent
        if a is _ABSENT:
            return None if b is _ABSENT else (b, now)
        if b is _ABSENT:
            return a, now
        return self._combine(a, b), now


class ReducingTable(StateTable):
    kind = "reducing"
    view_class = ReducingState


class AggregatingTable(StateTable):
    kind = "aggregating"
    view_class = AggregatingState
