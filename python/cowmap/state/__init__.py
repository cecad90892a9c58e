"""Flink-style keyed state on top of the compiled map (see docs/architecture.md#keyed-state).

    >>> from datetime import timedelta
    >>> from cowmap.state import KeyedStateBackend, StateTtlConfig, ValueStateDescriptor
    >>> clock = [0]
    >>> backend = KeyedStateBackend(time_provider=lambda: clock[0])
    >>> desc = ValueStateDescriptor("count", default_value=0)
    >>> desc.enable_time_to_live(StateTtlConfig.new_builder(timedelta(seconds=1)).build())
    >>> count = backend.get_state(desc)
    >>> backend.set_current_key("user-1")
    >>> count.update(count.value() + 1)
    >>> count.value()
    1
    >>> clock[0] = 1000  # one TTL later: expired
    >>> count.value()
    0
"""

from cowmap.state.backend import KeyedStateBackend
from cowmap.state.descriptors import (
    AggregateFunction,
    AggregatingStateDescriptor,
    ListStateDescriptor,
    MapStateDescriptor,
    ReducingStateDescriptor,
    StateDescriptor,
    ValueStateDescriptor,
)
from cowmap.state.keygroups import (
    KeyGroupRange,
    default_max_parallelism,
    key_group_for,
    key_group_range_for_operator,
    operator_index_for_key_group,
)
from cowmap.state.list_state import ListState
from cowmap.state.map_state import MapState
from cowmap.state.merging_states import AggregatingState, ReducingState
from cowmap.state.snapshot import KeyedStateSnapshot
from cowmap.state.table import VOID_NAMESPACE, State, VoidNamespace
from cowmap.state.timers import NO_WATERMARK, TimeDomain, TimerService, TimerSnapshot
from cowmap.state.ttl import StateTtlConfig, StateVisibility, TtlTimeCharacteristic, UpdateType
from cowmap.state.value_state import ValueState

__all__ = [
    "AggregateFunction",
    "AggregatingState",
    "AggregatingStateDescriptor",
    "KeyGroupRange",
    "KeyedStateBackend",
    "KeyedStateSnapshot",
    "ListState",
    "ListStateDescriptor",
    "MapState",
    "MapStateDescriptor",
    "NO_WATERMARK",
    "ReducingState",
    "ReducingStateDescriptor",
    "State",
    "StateDescriptor",
    "StateTtlConfig",
    "StateVisibility",
    "TimeDomain",
    "TimerService",
    "TimerSnapshot",
    "TtlTimeCharacteristic",
    "UpdateType",
    "VOID_NAMESPACE",
    "ValueState",
    "ValueStateDescriptor",
    "VoidNamespace",
    "default_max_parallelism",
    "key_group_for",
    "key_group_range_for_operator",
    "operator_index_for_key_group",
]
