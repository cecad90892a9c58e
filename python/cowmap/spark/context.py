"""``StateContext``: what a processor's ``open``, ``process`` and ``on_timer`` see."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Any

import pandas as pd

from cowmap.spark.groups import Rows, group_rows
from cowmap.state import (
    AggregatingState,
    AggregatingStateDescriptor,
    KeyedStateBackend,
    KeyGroupRange,
    ListState,
    ListStateDescriptor,
    MapState,
    MapStateDescriptor,
    ReducingState,
    ReducingStateDescriptor,
    TimeDomain,
    TimerService,
    ValueState,
    ValueStateDescriptor,
)

__all__ = ["StateContext"]


class StateContext:
    """The keyed state of one partition (a key-group range) in one micro-batch.

    Register states in ``open`` with :meth:`get_state` and friends (the same
    names and descriptors as :class:`~cowmap.KeyedStateBackend`'s), and timers
    with :meth:`get_timer_service`. In ``process``, use the states' columnar
    twins on the batch's key column(s), or loop over :meth:`groups` for
    per-key code. TTL and processing-time timers follow
    :attr:`batch_timestamp_ms` (the micro-batch's time, the same on a retry),
    never the wall clock. Used from the task's thread only.
    """

    def __init__(
        self,
        backend: KeyedStateBackend,
        keys: Sequence[str],
        partition_id: int,
        batch_id: int,
        batch_timestamp_ms: int,
        watermark_ms: int,
        on_timer: Callable[[int, Any, Any, TimeDomain], object],
    ) -> None:
        self.backend = backend
        #: the key column names
        self.keys = list(keys)
        #: this task's partition, and the key groups it owns
        self.partition_id = partition_id
        self.key_group_range: KeyGroupRange = backend.key_group_range
        #: the micro-batch (a batch query counts its runs over the same state)
        self.batch_id = batch_id
        #: the micro-batch's time (Spark's ``current_timestamp()``), in ms
        self.batch_timestamp_ms = batch_timestamp_ms
        #: the event-time watermark before this batch's rows (NO_WATERMARK at first)
        self.watermark_ms = watermark_ms
        #: while ``on_timer`` runs: the firing timer's domain and namespace
        self.timer_domain: TimeDomain | None = None
        self.timer_namespace: Any = None
        self._on_timer = on_timer
        self.set_current_key: Callable[[Any], None] = backend.set_current_key

    @property
    def current_key(self) -> Any:
        return self.backend.get_current_key()

    # ------------------------------------------------------------ state

    def get_state(self, descriptor: ValueStateDescriptor) -> ValueState:
        return self.backend.get_state(descriptor)

    def get_list_state(self, descriptor: ListStateDescriptor) -> ListState:
        return self.backend.get_list_state(descriptor)

    def get_map_state(self, descriptor: MapStateDescriptor) -> MapState:
        return self.backend.get_map_state(descriptor)

    def get_reducing_state(self, descriptor: ReducingStateDescriptor) -> ReducingState:
        return self.backend.get_reducing_state(descriptor)

    def get_aggregating_state(self, descriptor: AggregatingStateDescriptor) -> AggregatingState:
        return self.backend.get_aggregating_state(descriptor)

    def get_timer_service(self, name: str = "timers") -> TimerService:
        """The timer service ``name``; its timers call the processor's
        ``on_timer(key, timestamp, ctx)`` at the end of a micro-batch: event-time
        ones once the watermark passes them, processing-time ones once the batch
        time does."""
        return self.backend.get_timer_service(name, self._on_timer)

    # ------------------------------------------------------------ rows

    def groups(self, batch: pd.DataFrame) -> Iterator[tuple[Any, Rows]]:
        """``(key, rows)`` per distinct key of ``batch``, with the key current
        while its rows are handled: a scalar for one key column, a tuple for
        several. The keys come in key-group order (those of one key group in
        order of first appearance), so that each key's state is near the last
        one's. See :class:`~cowmap.spark.Rows`."""
        return group_rows(batch, self.keys, self.backend._kc)

    def __repr__(self) -> str:
        r = self.key_group_range
        return f"<StateContext partition={self.partition_id} key_groups={r.start}..{r.end} batch={self.batch_id}>"
