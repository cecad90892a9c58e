"""A plain-Python reference model of Flink 2.3's heap keyed state with TTL.

Written straight from Flink's TTL wrappers (``AbstractTtlDecorator``,
``TtlValueState``, ``TtlListState``, ``TtlMapState``, ``TtlReduceFunction``,
``TtlAggregateFunction``) and heap states, with no background cleanup: each
physical entry carries its timestamp, and entries disappear only where Flink's
code removes them. ``ttl=None`` models state without TTL.
"""

from __future__ import annotations

import copy
from typing import Any

MAX = (1 << 63) - 1


class Model:
    def __init__(self, ttl: int | None, on_read: bool, return_expired: bool) -> None:
        self.ttl = ttl
        self.on_read = on_read
        self.return_expired = return_expired
        self.now = 0
        # kind -> {(key, ns): physical record}
        self.value: dict[tuple, tuple] = {}
        self.list: dict[tuple, list] = {}
        self.map: dict[tuple, dict] = {}
        self.reducing: dict[tuple, tuple] = {}
        self.aggregating: dict[tuple, tuple] = {}

    # -- TTL primitives
    def expired(self, ts: int) -> bool:
        if self.ttl is None:
            return False
        return min(ts + self.ttl, MAX) <= self.now

    def ts(self) -> int:
        return self.now

    def _checked_get(self, store: dict, k: Any) -> tuple[bool, Any]:
        """getWrappedWithTtlCheckAndUpdate on a (value, ts) record: (found, value)."""
        rec = store.get(k)
        if rec is None:
            return False, None
        v, ts = rec
        if self.expired(ts):
            del store[k]
            return (True, v) if self.return_expired else (False, None)
        if self.on_read:
            store[k] = (v, self.now)
        return True, v

    def _unexpired(self, rec: tuple | None) -> Any:
        """getUnexpired: the value, or None."""
        if rec is None:
            return None
        v, ts = rec
        return None if (self.expired(ts) and not self.return_expired) else v

    # -- value
    def value_get(self, k: tuple) -> Any:
        return self._checked_get(self.value, k)[1]

    def value_update(self, k: tuple, v: Any) -> None:
        if v is None:
            self.value.pop(k, None)
        else:
            self.value[k] = (v, self.now)

    def value_clear(self, k: tuple) -> None:
        self.value.pop(k, None)

    # -- list
    def list_get(self, k: tuple) -> list:
        recs = self.list.get(k)
        if not recs:
            return []
        if self.on_read:
            fresh = [(v, self.now) for v, ts in recs if not self.expired(ts)]
            if fresh:
                self.list[k] = fresh
        out = [v for v, ts in recs if self.return_expired or not self.expired(ts)]
        if not any(not self.expired(ts) for _, ts in recs):
            del self.list[k]
        return out

    def list_add_all(self, k: tuple, vals: list) -> None:
        if vals:
            self.list.setdefault(k, []).extend((v, self.now) for v in vals)

    def list_update(self, k: tuple, vals: list) -> None:
        if vals:
            self.list[k] = [(v, self.now) for v in vals]
        else:
            self.list.pop(k, None)

    def list_clear(self, k: tuple) -> None:
        self.list.pop(k, None)

    def list_merge(self, key: Any, target: Any, sources: list) -> None:
        merged: list = []
        for s in sources:
            merged.extend(self.list.pop((key, s), None) or [])
        if merged:
            self.list.setdefault((key, target), []).extend(merged)

    # -- map
    def _umap(self, k: tuple) -> dict:
        return self.map.get(k, {})

    def _map_checked(self, k: tuple, uk: Any) -> tuple[bool, Any]:
        m = self.map.get(k)
        if m is None:
            return False, None
        found, v = self._checked_get(m, uk)
        if not m:
            del self.map[k]
        return found, v

    def map_get(self, k: tuple, uk: Any) -> Any:
        return self._map_checked(k, uk)[1]

    def map_contains(self, k: tuple, uk: Any) -> bool:
        return self._map_checked(k, uk)[0]

    def map_put(self, k: tuple, uk: Any, v: Any) -> None:
        self.map.setdefault(k, {})[uk] = (v, self.now)

    def map_remove(self, k: tuple, uk: Any) -> None:
        m = self.map.get(k)
        if m is not None:
            m.pop(uk, None)
            if not m:
                del self.map[k]

    def map_is_empty(self, k: tuple) -> bool:
        """Flink 2.3's ``TtlMapState.isEmpty`` ignores timestamps."""
        return k not in self.map

    def map_items(self, k: tuple) -> list:
        out = []
        m = self.map.get(k)
        if m is None:
            return out
        for uk in list(m):
            found, v = self._checked_get(m, uk)
            if found:
                out.append((uk, v))
        if not m:
            del self.map[k]
        return out

    def map_clear(self, k: tuple) -> None:
        self.map.pop(k, None)

    # -- reducing (sum) and aggregating ([sum, count] -> sum * 1000 + count)
    def reducing_get(self, k: tuple) -> Any:
        return self._checked_get(self.reducing, k)[1]

    def reducing_add(self, k: tuple, v: int) -> None:
        prev = self._unexpired(self.reducing.get(k))
        self.reducing[k] = ((v if prev is None else prev + v), self.now)

    def aggregating_get(self, k: tuple) -> Any:
        found, acc = self._checked_get(self.aggregating, k)
        return acc[0] * 1000 + acc[1] if found else None

    def aggregating_add(self, k: tuple, v: int) -> None:
        prev = self._unexpired(self.aggregating.get(k))
        acc = list(prev) if prev is not None else [0, 0]
        self.aggregating[k] = ((acc[0] + v, acc[1] + 1), self.now)

    def merge(self, kind: str, key: Any, target: Any, sources: list) -> None:
        store = getattr(self, kind)
        ttl = self.ttl is not None

        def combine(a: Any, b: Any) -> Any:
            return a + b if kind == "reducing" else (a[0] + b[0], a[1] + b[1])

        def merge_state(a: tuple, b: tuple) -> tuple | None:
            if not ttl:
                return combine(a[0], b[0]), a[1]
            ua, ub = self._unexpired(a), self._unexpired(b)
            if ua is not None and ub is not None:
                return combine(ua, ub), self.now
            if ua is not None:
                return ua, self.now
            if ub is not None:
                return ub, self.now
            return (None, self.now) if kind == "reducing" else None

        merged = None
        for s in sources:
            rec = store.pop((key, s), None)
            if rec is not None:
                merged = rec if merged is None else merge_state(merged, rec)
        if merged is None:
            return
        old = store.get((key, target))
        result = merged if old is None else merge_state(old, merged)
        if result is None or result[0] is None:
            store.pop((key, target), None)
        else:
            store[(key, target)] = result

    def clear(self, kind: str, k: tuple) -> None:
        getattr(self, kind).pop(k, None)

    def copy(self) -> Model:
        return copy.deepcopy(self)


# The aggregate function the state tests share: a mutable accumulator.
from cowmap.state import AggregateFunction  # noqa: E402


class SumCount(AggregateFunction):
    """A mutable accumulator, changed in place: snapshots must not see that."""

    def create_accumulator(self) -> list[int]:
        return [0, 0]

    def add(self, value: int, acc: list[int]) -> list[int]:
        acc[0] += value
        acc[1] += 1
        return acc

    def get_result(self, acc: list[int]) -> int:
        return acc[0] * 1000 + acc[1]

    def merge(self, a: list[int], b: list[int]) -> list[int]:
        a[0] += b[0]
        a[1] += b[1]
        return a
