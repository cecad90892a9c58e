"""State descriptors and ``AggregateFunction``, with PyFlink's names.

A descriptor names a state and says what kind it is; registering it with a
``KeyedStateBackend`` (``get_state``, ``get_list_state``, ...) returns the state
object. Values are stored by reference: the backend copies a value only when a
snapshot still shares it and it is about to be handed out for change, with the
descriptor's ``copier`` (by default: immutable built-ins as they are, anything
else with ``copy.deepcopy``).
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any, Generic, TypeVar

from cowmap.state.ttl import StateTtlConfig

__all__ = [
    "AggregateFunction",
    "AggregatingStateDescriptor",
    "ListStateDescriptor",
    "MapStateDescriptor",
    "ReducingStateDescriptor",
    "StateDescriptor",
    "ValueStateDescriptor",
    "copy_value",
]

IN = TypeVar("IN")
ACC = TypeVar("ACC")
OUT = TypeVar("OUT")

_IMMUTABLE = frozenset({int, float, complex, str, bytes, bool, type(None), frozenset, range})


def copy_value(value: Any) -> Any:
    """The default copier: immutable built-ins (and tuples of them) as they are,
    anything else ``copy.deepcopy``."""
    t = type(value)
    if t in _IMMUTABLE:
        return value
    if t is tuple and all(type(x) in _IMMUTABLE for x in value):
        return value
    return copy.deepcopy(value)


class AggregateFunction(Generic[IN, ACC, OUT]):
    """Incremental aggregation for :class:`AggregatingStateDescriptor` (PyFlink's interface).

    ``add`` and ``merge`` may change the accumulator in place and return it.
    """

    def create_accumulator(self) -> ACC:
        raise NotImplementedError

    def add(self, value: IN, accumulator: ACC) -> ACC:
        raise NotImplementedError

    def get_result(self, accumulator: ACC) -> OUT:
        raise NotImplementedError

    def merge(self, acc_a: ACC, acc_b: ACC) -> ACC:
        raise NotImplementedError


class StateDescriptor:
    """Base of the descriptors: a name, an optional TTL config, a copier, and the
    serializer durable checkpoints write values with (an object with
    ``dumps(obj) -> bytes`` and ``loads(bytes) -> obj``; None: pickle, protocol 5).
    Ints, floats and strs are written without it."""

    kind: str = ""

    def __init__(
        self, name: str, copier: Callable[[Any], Any] | None = None, serializer: Any = None
    ) -> None:
        if not isinstance(name, str):
            raise TypeError(f"state name must be a str, not {type(name).__name__}")
        if not name:
            raise ValueError("state name must not be empty")
        if copier is not None and not callable(copier):
            raise TypeError(f"copier must be callable or None, not {type(copier).__name__}")
        if serializer is not None and not (
            callable(getattr(serializer, "dumps", None)) and callable(getattr(serializer, "loads", None))
        ):
            raise TypeError(f"serializer must have dumps() and loads(), not {type(serializer).__name__}")
        self.name = name
        self.serializer = serializer
        self.copier: Callable[[Any], Any] = copier if copier is not None else copy_value
        self.ttl_config: StateTtlConfig | None = None

    def enable_time_to_live(self, ttl_config: StateTtlConfig) -> None:
        """Give the state a time-to-live (a config with ``UpdateType.Disabled`` turns it off)."""
        if not isinstance(ttl_config, StateTtlConfig):
            raise TypeError(f"ttl_config must be a StateTtlConfig, not {type(ttl_config).__name__}")
        self.ttl_config = ttl_config if ttl_config.is_enabled() else None

    def get_name(self) -> str:
        return self.name

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name!r})"


class ValueStateDescriptor(StateDescriptor):
    """A single value per key and namespace; ``value()`` gives ``default_value`` when unset."""

    kind = "value"

    def __init__(
        self,
        name: str,
        default_value: Any = None,
        copier: Callable[[Any], Any] | None = None,
        serializer: Any = None,
    ) -> None:
        super().__init__(name, copier, serializer)
        self.default_value = default_value


class ListStateDescriptor(StateDescriptor):
    """A list of values per key and namespace."""

    kind = "list"


class MapStateDescriptor(StateDescriptor):
    """A map of user keys to values per key and namespace."""

    kind = "map"


class ReducingStateDescriptor(StateDescriptor):
    """One value per key and namespace, combined with ``reduce_function(a, b)`` on ``add``."""

    kind = "reducing"

    def __init__(
        self,
        name: str,
        reduce_function: Callable[[Any, Any], Any],
        copier: Callable[[Any], Any] | None = None,
        serializer: Any = None,
    ) -> None:
        super().__init__(name, copier, serializer)
        # PyFlink's ReduceFunction (an object with a reduce method) too; but a
        # callable is called as it is: numpy's ufuncs have a reduce method of
        # another meaning (np.add.reduce(array, axis))
        reduce = reduce_function if callable(reduce_function) else getattr(reduce_function, "reduce", None)
        if not callable(reduce):
            raise TypeError(f"reduce_function must be callable, not {type(reduce_function).__name__}")
        self.reduce_function = reduce


class AggregatingStateDescriptor(StateDescriptor):
    """An accumulator per key and namespace, driven by an :class:`AggregateFunction`."""

    kind = "aggregating"

    def __init__(
        self,
        name: str,
        aggregate_function: AggregateFunction,
        copier: Callable[[Any], Any] | None = None,
        serializer: Any = None,
    ) -> None:
        super().__init__(name, copier, serializer)
        for method in ("create_accumulator", "add", "get_result", "merge"):
            if not callable(getattr(aggregate_function, method, None)):
                raise TypeError(f"aggregate_function must have a callable {method}()")
        self.aggregate_function = aggregate_function
