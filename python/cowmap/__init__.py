"""cowmap: a compiled copy-on-write keyed state store for stream processing.

Modelled on Apache Flink's heap keyed-state backend. The public API is
re-exported here; everything else is private.
"""

from cowmap import _interpreter  # noqa: F401  (refuses a free-threaded interpreter)
from cowmap._version import __version__ as __version__

try:
    from cowmap._core import (
        NO_TIMESTAMP,
        CopyOnWriteStateMap,
        StateIncrementalVisitor,
        StateMapSnapshot,
    )
except ImportError as exc:  # pragma: no cover - only hit on a broken install
    raise ImportError(
        "cowmap's compiled core (cowmap._core) could not be imported. cowmap must be "
        "built, not used from a source checkout: run `pip install .` (or "
        "`pip install -e .` for development) from the project root."
    ) from exc

from cowmap.asyncstate import (
    AsyncExecutionController,
    EpochMode,
    StateFuture,
    StateFutureUtils,
    StateIterator,
)
from cowmap.state import (
    NO_WATERMARK,
    VOID_NAMESPACE,
    AggregateFunction,
    AggregatingState,
    AggregatingStateDescriptor,
    KeyedStateBackend,
    KeyedStateSnapshot,
    KeyGroupRange,
    ListState,
    ListStateDescriptor,
    MapState,
    MapStateDescriptor,
    ReducingState,
    ReducingStateDescriptor,
    StateTtlConfig,
    StateVisibility,
    TimeDomain,
    TimerService,
    TimerSnapshot,
    UpdateType,
    ValueState,
    ValueStateDescriptor,
    default_max_parallelism,
    key_group_for,
    key_group_range_for_operator,
    operator_index_for_key_group,
)

__all__ = [
    "AggregateFunction",
    "AsyncExecutionController",
    "EpochMode",
    "StateFuture",
    "StateFutureUtils",
    "StateIterator",
    "AggregatingState",
    "AggregatingStateDescriptor",
    "CopyOnWriteStateMap",
    "KeyGroupRange",
    "KeyedStateBackend",
    "KeyedStateSnapshot",
    "ListState",
    "ListStateDescriptor",
    "MapState",
    "MapStateDescriptor",
    "NO_TIMESTAMP",
    "NO_WATERMARK",
    "ReducingState",
    "ReducingStateDescriptor",
    "StateIncrementalVisitor",
    "StateMapSnapshot",
    "StateTtlConfig",
    "StateVisibility",
    "TimeDomain",
    "TimerService",
    "TimerSnapshot",
    "UpdateType",
    "VOID_NAMESPACE",
    "ValueState",
    "ValueStateDescriptor",
    "default_max_parallelism",
    "key_group_for",
    "key_group_range_for_operator",
    "operator_index_for_key_group",
]
