"""Shared pieces of the checkpoint tests: a backend with every state kind, and
its whole contents as plain data to compare."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from cowmap.state import (
    AggregateFunction,
    AggregatingStateDescriptor,
    KeyedStateBackend,
    ListStateDescriptor,
    MapStateDescriptor,
    ReducingStateDescriptor,
    StateTtlConfig,
    ValueStateDescriptor,
)

TTL_MS = 1000


class SumCount(AggregateFunction):
    """A mutable ``[sum, count]`` accumulator (pickled by reference to this module)."""

    def create_accumulator(self) -> list[int]:
        return [0, 0]

    def add(self, value: int, accumulator: list[int]) -> list[int]:
        accumulator[0] += value
        accumulator[1] += 1
        return accumulator

    def get_result(self, accumulator: list[int]) -> tuple[int, int]:
        return accumulator[0], accumulator[1]

    def merge(self, acc_a: list[int], acc_b: list[int]) -> list[int]:
        acc_a[0] += acc_b[0]
        acc_a[1] += acc_b[1]
        return acc_a


def add(a: Any, b: Any) -> Any:
    return a + b


def descriptors(ttl: bool) -> dict[str, Any]:
    """One descriptor per kind, each with TTL when ``ttl``."""
    ds: dict[str, Any] = {
        "value": ValueStateDescriptor("value"),
        "list": ListStateDescriptor("list"),
        "map": MapStateDescriptor("map"),
        "reducing": ReducingStateDescriptor("reducing", add),
        "aggregating": AggregatingStateDescriptor("aggregating", SumCount()),
    }
    if ttl:
        cfg = StateTtlConfig.new_builder(timedelta(milliseconds=TTL_MS)).build()
        for d in ds.values():
            d.enable_time_to_live(cfg)
    return ds


def register(backend: KeyedStateBackend, ttl: bool, timers: bool = True) -> dict[str, Any]:
    """A state of each kind (with a timer service named "timers" when ``timers``)."""
    ds = descriptors(ttl)
    if timers:
        backend.get_timer_service("timers", lambda ts, key, ns, domain: None)
    return {
        "value": backend.get_state(ds["value"]),
        "list": backend.get_list_state(ds["list"]),
        "map": backend.get_map_state(ds["map"]),
        "reducing": backend.get_reducing_state(ds["reducing"]),
        "aggregating": backend.get_aggregating_state(ds["aggregating"]),
    }


def contents(backend: KeyedStateBackend) -> dict[str, list[tuple[Any, ...]]]:
    """Every state's records (``KeyedStateSnapshot.entries``) and every timer
    service's timers (as ``"timers:" + name``), in a canonical order."""
    with backend.snapshot() as snap:
        out = {
            name: sorted((tuple(_plain(x) for x in r) for r in snap.entries(name)), key=repr)
            for name in sorted(snap.state_names())
            if any(True for _ in snap.entries(name))
        }
        for name in snap.timer_service_names():
            timers = sorted(((int(d), ts, _plain(k), ns) for d, ts, k, ns in snap.timers(name)), key=repr)
            if timers:
                out["timers:" + name] = timers
        return out


def _plain(x: Any) -> Any:
    return list(x) if isinstance(x, (list, tuple)) else x


class Clock:
    def __init__(self) -> None:
        self.now = 0

    def __call__(self) -> int:
        return self.now


class JsonSerializer:
    """A serializer other than pickle: values as UTF-8 JSON."""

    name = "json-utf8"

    @staticmethod
    def dumps(obj: Any) -> bytes:
        import json

        return json.dumps(obj).encode()

    @staticmethod
    def loads(data: bytes) -> Any:
        import json

        return json.loads(data)
