"""``KeyedStateSnapshot``: one consistent, releasable snapshot of a backend's states."""

from __future__ import annotations

import copy
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from cowmap.state.descriptors import StateDescriptor
from cowmap.state.keygroups import FLINK_KEY_HASH, KeyGroupRange
from cowmap.state.timers import TimeDomain, TimerSnapshot

if TYPE_CHECKING:
    from cowmap.state.table import StateTable

__all__ = ["KeyedStateSnapshot"]


@dataclass
class _StateSnapshot:
    table: StateTable
    #: the state's descriptor object (which the caller may change later: see ``descriptor``)
    live_descriptor: StateDescriptor
    #: the TTL config the state had at the snapshot
    ttl_config: Any
    #: per key group: a core snapshot (StateMapSnapshot, or FlatMapSnapshot for map state)
    maps: dict[int, Any]
    #: the time of the snapshot when expired values are to be left out, else None
    cleanup_now: int | None
    #: the state's TTL (ms, 0 for none) when the snapshot was taken
    ttl: int

    @property
    def descriptor(self) -> StateDescriptor:
        """The descriptor as the state used it at the snapshot, TTL config included: a
        later ``enable_time_to_live`` on the caller's object must not change a restore.
        Copied only when that happened (taking a snapshot copies nothing)."""
        d = self.live_descriptor
        if d.ttl_config is self.ttl_config:
            return d
        d = copy.copy(d)
        d.ttl_config = self.ttl_config
        return d


class KeyedStateSnapshot:
    """The states of a :class:`KeyedStateBackend` as they were at ``snapshot()``.

    Taking it costs O(number of key-group maps); the backend keeps working and
    the snapshot stays unchanged (copy-on-write). Read it with :meth:`entries`,
    hand it to ``KeyedStateBackend.restore`` (any number of times, into any
    backends of the same ``max_parallelism``), and :meth:`release` it (or use it
    as a context manager) so the backend stops copying on its behalf.
    """

    def __init__(
        self, max_parallelism: int, key_group_range: KeyGroupRange, timestamp: int, key_hash: str = FLINK_KEY_HASH
    ) -> None:
        self.max_parallelism = max_parallelism
        #: the backend's key-to-key-group function (``KeyedStateBackend.key_hash``)
        self.key_hash = key_hash
        self.key_group_range = key_group_range
        #: the backend's time when the snapshot was taken (ms)
        self.timestamp = timestamp
        self._states: dict[str, _StateSnapshot] = {}
        #: per timer service: its timers (copy-on-write per key group)
        self._timers: dict[str, TimerSnapshot] = {}
        self._released = False

    def _add(self, table: StateTable, cut: bool = False) -> None:
        cleanup_now = self.timestamp if table.ttl and table.cleanup_full_snapshot else None
        self._states[table.name] = _StateSnapshot(
            table, table.descriptor, table.ttl_config, table.snapshot_maps(cut), cleanup_now, table.ttl
        )

    def _check(self) -> None:
        if self._released:
            raise RuntimeError("this snapshot has been released")

    @property
    def released(self) -> bool:
        return self._released

    def state_names(self) -> list[str]:
        self._check()
        return list(self._states)

    def kind(self, state_name: str) -> str:
        """``"value"``, ``"list"``, ``"map"``, ``"reducing"`` or ``"aggregating"``."""
        return self._state(state_name).descriptor.kind

    def descriptor(self, state_name: str) -> StateDescriptor:
        """The state's descriptor as it was at ``snapshot()`` (a copy, with the
        TTL config the state had then)."""
        return self._state(state_name).descriptor

    def _state(self, state_name: str) -> _StateSnapshot:
        self._check()
        try:
            return self._states[state_name]
        except KeyError:
            raise KeyError(f"no state {state_name!r} in this snapshot (has {sorted(self._states)})") from None

    def key_groups(self, state_name: str) -> list[int]:
        return sorted(self._state(state_name).maps)

    def entries(self, state_name: str, key_groups: KeyGroupRange | None = None) -> Iterator[tuple[Any, ...]]:
        """Flat records of one state, key group by key group:

        - value, reducing, aggregating: ``(key, namespace, value, ts)``;
        - list: ``(key, namespace, values, timestamps)`` (timestamps None without TTL);
        - map: ``(key, namespace, user_key, value, ts)``, each key's and namespace's
          user entries in insertion order.

        ``ts`` is the last-access time in ms (``NO_TIMESTAMP`` without TTL). With
        ``cleanup_full_snapshot`` values expired at the snapshot's time are left out.
        The values are the stored objects (shared with the backend until it
        changes them): read them, don't mutate them.
        """
        s = self._state(state_name)
        for kg in sorted(s.maps):
            if key_groups is None or kg in key_groups:
                yield from self._entries_of(s, kg)

    def _entries_of(self, s: _StateSnapshot, kg: int) -> Iterator[tuple[Any, ...]]:
        self._check()
        return s.table.export(s.maps[kg], s.cleanup_now, s.ttl)

    def timer_service_names(self) -> list[str]:
        self._check()
        return list(self._timers)

    def timers(self, service: str, key_groups: KeyGroupRange | None = None) -> Iterator[tuple[Any, ...]]:
        """The timers of timer service ``service``, key group by key group:
        ``(domain, ts, key, namespace)``, in no particular order within a key group."""
        self._check()
        try:
            snap = self._timers[service]
        except KeyError:
            raise KeyError(f"no timer service {service!r} in this snapshot (has {sorted(self._timers)})") from None
        for kg in snap.key_groups():
            if key_groups is None or kg in key_groups:
                for domain in TimeDomain:
                    ts, keys, nss = snap.columns(kg, domain)
                    for i in range(len(keys)):
                        yield domain, ts[i], keys[i], nss[i]

    def _release_key_groups(self, kgs: list[int]) -> None:
        """Release the part of key groups ``kgs`` early (a checkpoint writer done
        with them), so the backend stops copying those key groups' writes.
        O(states * len(kgs)), in one call: a block of a checkpoint holds up to
        thousands of key groups."""
        for s in self._states.values():
            pop = s.maps.pop
            for kg in kgs:
                snap = pop(kg, None)
                if snap is not None:
                    snap.release()

    def release(self) -> None:
        """Let the backend stop preserving this snapshot's data. Idempotent."""
        if self._released:
            return
        self._released = True
        for s in self._states.values():
            for snap in s.maps.values():
                snap.release()
        for timers in self._timers.values():
            timers.release()

    def __enter__(self) -> KeyedStateSnapshot:
        self._check()
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()

    def __repr__(self) -> str:
        state = "released" if self._released else f"states={sorted(self._states)}"
        return f"<KeyedStateSnapshot max_parallelism={self.max_parallelism} {state}>"
