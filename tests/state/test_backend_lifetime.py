"""A dropped backend is freed at once by reference counting: none of its parts
refer back to it in a cycle, so its memory does not wait for a full collection
(which would then pause the process for as long as freeing every entry takes)."""

from __future__ import annotations

import gc
import weakref
from datetime import timedelta
from typing import Any

import pytest
from state_model import SumCount

from cowmap.asyncstate import AsyncExecutionController
from cowmap.state import (
    AggregatingStateDescriptor,
    KeyedStateBackend,
    ListStateDescriptor,
    MapStateDescriptor,
    ReducingStateDescriptor,
    StateTtlConfig,
    ValueStateDescriptor,
)


class Marker:
    """A value whose death is observable (a weak reference to it)."""


def fill(ttl: str, with_controller: bool) -> tuple[weakref.ref, list[weakref.ref]]:
    b = KeyedStateBackend(max_parallelism=8)
    descs: list[Any] = [
        ValueStateDescriptor("v"), ListStateDescriptor("l"), MapStateDescriptor("m"),
        ReducingStateDescriptor("r", lambda x, y: x + y), AggregatingStateDescriptor("a", SumCount()),
    ]
    if ttl:
        builder = StateTtlConfig.new_builder(timedelta(hours=1))
        if ttl == "every record":  # the key context ticks these tables on every set_current_key
            builder = builder.cleanup_incrementally(5, True)
        for d in descs:
            d.enable_time_to_live(builder.build())
    v = b.get_state(descs[0])
    lst = b.get_list_state(descs[1])
    m = b.get_map_state(descs[2])
    r = b.get_reducing_state(descs[3])
    a = b.get_aggregating_state(descs[4])
    for k in range(200):
        b.set_current_key(k)
        v.update([k])
        lst.add(k)
        m.put(k % 3, [k])
        r.add(k)
        a.add(k)
    with b.snapshot():  # copy-on-write runs through the copier
        for k in range(50):
            b.set_current_key(k)
            v.value().append(1)
            m.get(k % 3).append(1)
            lst.add(k)
    if with_controller:
        aec = AsyncExecutionController(b, buffer_timeout_ms=0)
        aec.process(1, lambda _: v.async_update([2]))
        aec.drain()
        del aec
    markers = [Marker() for _ in range(3)]
    b.set_current_key("marked")
    v.update(markers[0])
    m.put("u", markers[1])
    lst.add(markers[2])
    return weakref.ref(b), [weakref.ref(x) for x in markers]


@pytest.mark.parametrize("ttl", ["", "default cleanup", "every record"])
@pytest.mark.parametrize("with_controller", [False, True])
def test_dropped_backend_is_freed_without_the_cycle_collector(ttl: str, with_controller: bool) -> None:
    gc.collect()
    gc.disable()
    try:
        backend, values = fill(ttl, with_controller)
        assert backend() is None, "the backend is kept alive by a reference cycle"
        assert all(x() is None for x in values), "a stored value outlived its backend"
    finally:
        gc.enable()
