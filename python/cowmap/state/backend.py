"""``KeyedStateBackend``: the registry of keyed states and the current-key context."""

from __future__ import annotations

import inspect
import types
from collections.abc import Callable, Sequence
from typing import Any

from cowmap._context import KeyContext
from cowmap._core import wall_clock_ms
from cowmap._keygroups import spark_type_codes
from cowmap.state.descriptors import (
    AggregatingStateDescriptor,
    ListStateDescriptor,
    MapStateDescriptor,
    ReducingStateDescriptor,
    StateDescriptor,
    ValueStateDescriptor,
)
from cowmap.state.keygroups import FLINK_KEY_HASH, KeyGroupRange, _check_parallelism, spark_key_hash
from cowmap.state.list_state import ListState, ListTable
from cowmap.state.map_state import MapState, MapTable
from cowmap.state.merging_states import AggregatingState, AggregatingTable, ReducingState, ReducingTable
from cowmap.state.snapshot import KeyedStateSnapshot
from cowmap.state.table import VOID_NAMESPACE, State, StateTable
from cowmap.state.timers import TimeDomain, TimerService
from cowmap.state.value_state import ValueState, ValueTable

__all__ = ["KeyedStateBackend"]

_TABLES: dict[str, type[StateTable]] = {
    t.kind: t for t in (ValueTable, ListTable, MapTable, ReducingTable, AggregatingTable)
}


class KeyedStateBackend:
    """Keyed state for one operator instance, like Flink's ``HeapKeyedStateBackend``.

    Set the current key with :meth:`set_current_key`, then use the state objects
    returned by :meth:`get_state` and friends; each reads and writes the entry of
    the current key (and the state's current namespace). Every state keeps one
    :class:`~cowmap.CopyOnWriteStateMap` per key group, so :meth:`snapshot` is
    cheap and consistent, and :meth:`restore` can take any subset of key groups
    (rescaling).

    Args:
        max_parallelism: number of key groups (1..32768), fixed for the job's life.
        key_group_range: the key groups this backend owns (all by default);
            ``set_current_key`` with a key outside it raises ``ValueError``.
        time_provider: a callable returning the current time in milliseconds, for
            TTL (wall-clock time by default). An instance of a class whose
            ``__call__`` is a plain function is called through that function,
            looked up once here (every TTL access reads the time).
        spark_key_types: the Spark SQL types of the key columns (e.g.
            ``["bigint"]``, ``["string", "int"]``): key groups are then Spark's
            ``pmod(hash(key columns), max_parallelism)``, so that they agree with
            rows Spark routed by that expression; a key of several columns is a
            tuple. By default key groups are Flink's (``key_group_for``).

    Not thread-safe: use a backend from one thread (snapshots may be read from others).
    """

    # The current key and what goes with it live in a compiled KeyContext (_kc),
    # which the backend hands to its state views and its async controller.
    # ``set_current_key`` is that context's method, stored on the instance: the
    # hottest sync call, so no Python frame in between.
    __slots__ = (
        "max_parallelism",
        "key_group_range",
        "_kc",
        "set_current_key",
        "_tables",
        "_views",
        "_chain",
        "_timers",
        "key_hash",
        "__weakref__",
    )

    def __init__(
        self,
        max_parallelism: int = 128,
        key_group_range: KeyGroupRange | None = None,
        time_provider: Callable[[], int] | None = None,
        spark_key_types: Sequence[str] | None = None,
    ) -> None:
        _check_parallelism("max_parallelism", max_parallelism)
        if key_group_range is None:
            key_group_range = KeyGroupRange(0, max_parallelism - 1)
        elif not isinstance(key_group_range, KeyGroupRange):
            raise TypeError(f"key_group_range must be a KeyGroupRange, not {type(key_group_range).__name__}")
        elif key_group_range.end >= max_parallelism:
            raise ValueError(f"key_group_range {key_group_range} exceeds max_parallelism {max_parallelism}")
        if time_provider is not None and not callable(time_provider):
            raise TypeError(f"time_provider must be callable, not {type(time_provider).__name__}")
        self.max_parallelism = max_parallelism
        self.key_group_range = key_group_range
        clock = _direct_call(time_provider) if time_provider is not None else wall_clock_ms
        if spark_key_types is not None:
            if isinstance(spark_key_types, str) or not len(spark_key_types):
                raise TypeError("spark_key_types must be a non-empty sequence of Spark SQL type names")
            codes = spark_type_codes(spark_key_types)
            #: the key-to-key-group function, as checkpoints record it
            self.key_hash = spark_key_hash(spark_key_types)
        else:
            codes = None
            self.key_hash = FLINK_KEY_HASH
        self._kc = KeyContext(max_parallelism, key_group_range.start, key_group_range.end, clock, codes)
        #: ``set_current_key(key)``: make ``key`` the key that state accesses read and
        #: write (``TypeError`` for None / unhashable keys, ``ValueError`` for a key
        #: outside the backend's key-group range). Compiled.
        self.set_current_key: Callable[[Any], None] = self._kc.set_current_key
        self.now()  # fail here, not at the first TTL access, if it returns no int
        self._tables: dict[str, StateTable] = {}
        self._views: dict[str, State] = {}
        #: (storage, checkpoint id) the changes the maps track since their last
        #: cut are relative to (cowmap.checkpoint's incremental saves), or None
        self._chain: tuple[str, int] | None = None
        self._timers: dict[str, TimerService] = {}

    # ------------------------------------------------------------ key context

    def get_current_key(self) -> Any:
        """The key set by the last ``set_current_key`` (None before the first)."""
        return self._kc.key

    def get_current_key_group(self) -> int | None:
        """The current key's key group (None before the first ``set_current_key``)."""
        return self._kc.key_group

    def key_group_of(self, key: Any) -> int:
        """The key group of ``key`` by this backend's function (owned or not)."""
        return self._kc.key_group_for(key)

    @property
    def key_context(self) -> KeyContext:
        """The compiled context of the current key, shared with the state views."""
        return self._kc

    def now(self) -> int:
        """The time provider's current time, in milliseconds."""
        return self._kc.now()

    # ------------------------------------------------------------ registration

    def _register(self, descriptor: StateDescriptor, expected: type[StateDescriptor]) -> Any:
        if not isinstance(descriptor, expected):
            raise TypeError(f"expected a {expected.__name__}, not {type(descriptor).__name__}")
        name = descriptor.name
        table = self._tables.get(name)
        view = self._views.get(name)
        if (
            view is not None
            and table is not None
            and table.descriptor is descriptor
            # else enable_time_to_live was called since: apply (or refuse) its config
            and (table.ttl_config is descriptor.ttl_config or table.ttl_config == descriptor.ttl_config)
        ):
            return view
        if table is None:
            table = _TABLES[descriptor.kind](self, descriptor)
            self._tables[name] = table
        else:
            table.configure(descriptor)  # ValueError when the kind differs
        cleanups = self._kc.record_cleanups
        if table.cleanup_every_record and table not in cleanups:
            cleanups.append(table)
        elif not table.cleanup_every_record and table in cleanups:
            cleanups.remove(table)
        view = table.view_class(table)
        self._views[name] = view
        return view

    def get_state(self, descriptor: ValueStateDescriptor) -> ValueState:
        """The value state named ``descriptor.name``, made on first use.

        Registering a name again (or one made by :meth:`restore`, or the same
        descriptor after ``enable_time_to_live``) keeps its data and rebinds the
        descriptor: default value, copier, TTL settings. A state
        keeps the TTL setting it was made with: ValueError, with nothing
        changed, for a descriptor of another kind or one that switches TTL on
        or off (Flink refuses such a state serializer); another TTL, update
        type, visibility or cleanup applies to the stored entries as they are.
        TypeError for a descriptor of the wrong class. O(1).
        """
        return self._register(descriptor, ValueStateDescriptor)

    def get_list_state(self, descriptor: ListStateDescriptor) -> ListState:
        """The list state named ``descriptor.name``; registered again, and
        refused (ValueError) for another kind or TTL switched on or off, as
        :meth:`get_state` says."""
        return self._register(descriptor, ListStateDescriptor)

    def get_map_state(self, descriptor: MapStateDescriptor) -> MapState:
        """The map state named ``descriptor.name``; registered again, and
        refused (ValueError) for another kind or TTL switched on or off, as
        :meth:`get_state` says."""
        return self._register(descriptor, MapStateDescriptor)

    def get_reducing_state(self, descriptor: ReducingStateDescriptor) -> ReducingState:
        """The reducing state named ``descriptor.name``; registered again, and
        refused (ValueError) for another kind or TTL switched on or off, as
        :meth:`get_state` says."""
        return self._register(descriptor, ReducingStateDescriptor)

    def get_aggregating_state(self, descriptor: AggregatingStateDescriptor) -> AggregatingState:
        """The aggregating state named ``descriptor.name``; registered again, and
        refused (ValueError) for another kind or TTL switched on or off, as
        :meth:`get_state` says."""
        return self._register(descriptor, AggregatingStateDescriptor)

    # ------------------------------------------------------------ timers

    def get_timer_service(
        self, name: str, on_timer: Callable[[int, Any, Any, TimeDomain], object] | None = None
    ) -> TimerService:
        """The timer service named ``name`` (Flink's ``InternalTimerService``), made on
        first use; ``on_timer(ts, key, namespace, domain)`` is what its timers call
        when they fire (given again, it replaces the one before; a service made by
        :meth:`restore` has none until then). See :class:`~cowmap.TimerService`. O(1)
        (O(key groups) the first time)."""
        if not isinstance(name, str):
            raise TypeError(f"a timer service's name must be a str, not {type(name).__name__}")
        svc = self._timers.get(name)
        if svc is None:
            svc = self._timers[name] = TimerService(name, self._kc, on_timer, VOID_NAMESPACE, tuple(TimeDomain))
        elif on_timer is not None:
            svc.on_timer = on_timer
        return svc

    def timer_service_names(self) -> list[str]:
        return list(self._timers)

    # ------------------------------------------------------------ whole backend

    def state_names(self) -> list[str]:
        return list(self._tables)

    def _table(self, state_name: str) -> StateTable:
        try:
            return self._tables[state_name]
        except KeyError:
            raise KeyError(f"no state named {state_name!r} (registered: {sorted(self._tables)})") from None

    def keys(self, state_name: str, namespace: Any = VOID_NAMESPACE) -> list[Any]:
        """The keys with an entry in ``state_name`` under ``namespace`` (expired
        entries not yet cleaned up included, as in Flink's ``getKeys``), as a list
        made at the call: states may be used while looping over it."""
        return self._table(state_name).keys(namespace)

    def num_entries(self) -> int:
        """The number of ``(key, namespace)`` entries over all states."""
        return sum(t.num_entries() for t in self._tables.values())

    def snapshot(self, *, cut: bool = False) -> KeyedStateSnapshot:
        """A consistent snapshot of every state, cheap to take (copy-on-write).

        ``cut``: a checkpoint's cut (what ``cowmap.checkpoint`` takes): the
        snapshot also holds what changed since the previous cut, and the
        backend's maps track changes from now on (O(entries / 64) per map
        more, and a bit per entry of memory), and its timer services which
        key groups' timers changed."""
        snap = KeyedStateSnapshot(self.max_parallelism, self.key_group_range, self.now(), self.key_hash)
        if cut:
            self._chain = None  # the changes since the last checkpoint go to this snapshot alone
        for table in self._tables.values():
            snap._add(table, cut)
        for name, svc in self._timers.items():
            snap._timers[name] = svc.snapshot(cut=cut)
        return snap

    def restore(self, snapshot: KeyedStateSnapshot) -> None:
        """Add the entries of ``snapshot`` whose key groups this backend owns.

        Call it once per old snapshot to merge several (scale-in). States the
        backend has not registered yet are created from the snapshot's
        descriptors, with the TTL settings they had at ``snapshot()``.

        A state keeps the TTL setting it was made with, as in Flink (a state
        written without TTL cannot be read with a TTL serializer, nor the
        reverse): ``ValueError`` if a state is registered here with another kind
        or with TTL on where the snapshot's was off (or the reverse), checked for
        every state before anything is restored; registering a restored state
        later with another kind or TTL switched raises ``ValueError`` too.
        Another TTL (both on) is fine: entries keep their timestamps and expire
        by this backend's TTL. Timers of the owned key groups are added to the
        timer services of the same names (made if need be); the watermark is not
        restored. O(restored entries and timers).
        """
        if not isinstance(snapshot, KeyedStateSnapshot):
            raise TypeError(f"expected a KeyedStateSnapshot, not {type(snapshot).__name__}")
        if snapshot.max_parallelism != self.max_parallelism:
            raise ValueError(
                f"snapshot has max_parallelism {snapshot.max_parallelism}, this backend "
                f"{self.max_parallelism}: key groups cannot be mapped"
            )
        if snapshot.key_hash != self.key_hash:
            raise ValueError(
                f"snapshot maps keys to key groups with {snapshot.key_hash!r}, this backend with "
                f"{self.key_hash!r}: its key groups would hold other keys"
            )
        snapshot._check()
        for name, s in snapshot._states.items():  # check everything before changing anything
            table = self._tables.get(name)
            if table is None:
                continue
            if table.kind != s.descriptor.kind:
                raise ValueError(f"state {name!r} is {table.kind} state here but {s.descriptor.kind} in the snapshot")
            if bool(table.ttl) != bool(s.ttl):
                here, there = ("with", "without") if table.ttl else ("without", "with")
                raise ValueError(
                    f"state {name!r} is registered here {here} TTL but was snapshotted {there} TTL: "
                    f"its entries cannot be restored into it"
                )
        kc = self._kc
        for name, s in snapshot._states.items():
            table = self._tables.get(name)
            if table is None:
                table = self._tables[name] = _TABLES[s.descriptor.kind](self, s.descriptor)
            for kg in sorted(s.maps):
                if kc.lo <= kg <= kc.hi:
                    table.import_records(kg, snapshot._entries_of(s, kg))
            table.entries_restored()
        for name, timers in snapshot._timers.items():
            self.get_timer_service(name).restore(timers)

    def __del__(self) -> None:
        # the key context and the tables that clean up on every record refer to
        # each other (it ticks them, they read its key): break that cycle so the
        # state is freed now, not by a later full collection
        kc = getattr(self, "_kc", None)
        if kc is not None:
            kc.record_cleanups.clear()

    def __repr__(self) -> str:
        return (
            f"<KeyedStateBackend max_parallelism={self.max_parallelism} "
            f"key_groups={self.key_group_range} states={sorted(self._tables)}>"
        )


def _direct_call(provider: Callable[[], int]) -> Callable[[], int]:
    """``provider``, or for an instance of a class whose ``__call__`` is a plain
    function, that function bound to it: the same call without the interpreter's
    ``__call__`` lookup through the type on every call (about 600 instructions of
    the ~1,000 a call of a Python-level clock costs)."""
    call = inspect.getattr_static(type(provider), "__call__", None)
    if isinstance(call, types.FunctionType) and not isinstance(provider, type):
        return types.MethodType(call, provider)
    return provider
