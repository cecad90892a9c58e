"""One registered state's storage: a ``CopyOnWriteStateMap`` per key group.

This is Flink's ``CopyOnWriteStateTable``: the state objects (``ValueState``, ...)
are thin views that read the backend's current key and key group and the
view's current namespace, and do their work on the map of that key group.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING, Any

from cowmap import _core
from cowmap._context import KeyContext, StateView, TableCopier, TableCore
from cowmap._core import NO_TIMESTAMP, CopyOnWriteStateMap, StateMapSnapshot, column_missing, maps_may_expire
from cowmap.state.descriptors import StateDescriptor
from cowmap.state.ttl import StateVisibility, UpdateType, expired

if TYPE_CHECKING:
    from cowmap.state.backend import KeyedStateBackend

__all__ = ["CLEANUP_BATCH", "NO_TIMESTAMP", "VOID_NAMESPACE", "State", "StateTable", "VoidNamespace"]

#: incremental cleanup sweeps once per this many state accesses (see ``StateTable.cleanup_step``)
CLEANUP_BATCH = 8
#: ... and backs off to at most this many times less often while sweeps find nothing
CLEANUP_MAX_BACKOFF = 64


class VoidNamespace:
    """The namespace of states not scoped to a window (Flink's ``VoidNamespace``)."""

    __slots__ = ()
    _instance: VoidNamespace | None = None

    def __new__(cls) -> VoidNamespace:
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def __repr__(self) -> str:
        return "VOID_NAMESPACE"

    def __reduce__(self) -> str:
        return "VOID_NAMESPACE"  # unpickles to this module's singleton


VOID_NAMESPACE = VoidNamespace()


class StateTable(TableCore):
    """The maps of one state, its TTL settings and its incremental cleanup.

    Subclasses (one per state kind) say how a state is stored, swept, exported
    to snapshots and imported from them. The fields every access reads (the
    maps, the TTL settings, the cleanup counter) are compiled (``TableCore``),
    for the compiled accesses.
    """

    kind = ""
    #: Kind-specific view class made by :meth:`view`.
    view_class: type[State]

    def __init__(self, backend: KeyedStateBackend, descriptor: StateDescriptor) -> None:
        #: the core maps' copier (one for all of them): this table's copy_state
        self.copier = TableCopier(self)
        #: the backend's key context (current key, key group, clock), shared with the views
        self.kc: KeyContext = backend.key_context
        self.name = descriptor.name
        # one map per key group, None until written: CopyOnWriteStateMap, or FlatStateMap for
        # MapState (the async batch calls take either kind in one list)
        self.maps: list[Any] = [None] * backend.max_parallelism
        self.live: list[int] = []  # key groups with a map, in creation order (cleanup rotation)
        self._cursor = 0
        self.ticks = 1  # accesses until the next cleanup sweep
        self._interval = CLEANUP_BATCH
        self._idle_sweeps = 0
        self._unchecked = 0  # accesses since the maps' expiry floors were last read
        self._quiet_at: int | None = None  # the time they last said no entry could have expired
        self.merging = False  # a merge_namespaces of this state is running
        self.configure(descriptor)

    # ------------------------------------------------------------ settings

    def configure(self, descriptor: StateDescriptor) -> None:
        """(Re)bind the descriptor: its copier, functions and TTL settings.

        ValueError, before anything changes, for another kind or for TTL
        switched on or off: a state keeps the TTL setting it was made with (its
        entries are stored with or without timestamps accordingly), as Flink
        refuses a TTL serializer for state written without one and the
        reverse. Another TTL, update type, visibility or cleanup is fine.
        """
        if descriptor.kind != self.kind:
            raise ValueError(
                f"state {descriptor.name!r} is registered as {self.kind} state; cannot use it as {descriptor.kind}"
            )
        cfg = descriptor.ttl_config
        if hasattr(self, "descriptor") and bool(self.ttl) != (cfg is not None):
            have, want = ("with", "without") if self.ttl else ("without", "with")
            raise ValueError(
                f"state {descriptor.name!r} is registered {have} TTL; it cannot be registered {want} TTL "
                f"(its entries are stored {have} timestamps): use another state name"
            )
        self.descriptor = descriptor
        self.ttl_config = cfg
        self.copy_value = descriptor.copier
        self.ttl = cfg.ttl_ms if cfg is not None else 0
        self.update_on_read = cfg is not None and cfg.update_type is UpdateType.OnReadAndWrite
        self.return_expired = cfg is not None and cfg.state_visibility is StateVisibility.ReturnExpiredIfNotCleanedUp
        self.cleanup_size = cfg.incremental_cleanup_size if cfg is not None else 0
        self.cleanup_every_record = self.cleanup_size > 0 and cfg is not None and cfg.run_cleanup_for_every_record
        self.cleanup_full_snapshot = cfg is not None and cfg.cleanup_full_snapshot
        self.entries_restored()  # (a shorter TTL: what was live may have expired)

    # ------------------------------------------------------------ maps

    def new_map(self, capacity: int = 128) -> CopyOnWriteStateMap:
        return CopyOnWriteStateMap(capacity=capacity, copier=self.copier)

    def copy_state(self, state: Any) -> Any:
        """The core's copier: a state shared with a snapshot, copied before a change."""
        return self.copy_value(state)

    def map_for_write(self, kg: int, expected: int = 0) -> CopyOnWriteStateMap:
        """The map of key group ``kg``, made if need be: with room for
        ``expected`` entries without a rehash (a restore knows its count)."""
        m = self.maps[kg]
        if m is None:
            capacity = 128
            while capacity - (capacity >> 2) < expected:  # Flink's threshold: 3/4 of the capacity
                capacity <<= 1
            m = self.maps[kg] = self.new_map(capacity)
            self.live.append(kg)
        return m

    def snapshot_maps(self, cut: bool = False) -> dict[int, StateMapSnapshot]:
        """One core snapshot per key group that has a map (with ``cut``, each a
        checkpoint's cut: see ``CopyOnWriteStateMap.snapshot``)."""
        return {kg: m.snapshot(cut=cut) for kg, m in enumerate(self.maps) if m is not None}

    def num_entries(self) -> int:
        return sum(len(self.maps[kg]) for kg in self.live)

    def keys(self, namespace: Any) -> list[Any]:
        return [key for kg in self.live for key, ns, _ in self.maps[kg] if ns == namespace]

    # ------------------------------------------------------------ TTL

    def now(self) -> int:
        return self.kc.now()

    def is_expired(self, ts: int, now: int) -> bool:
        return expired(ts, self.ttl, now)

    def cleanup_step(self) -> None:
        """One state access's worth of Flink's incremental cleanup.

        Flink examines ``cleanup_size`` entries on every access. Here a sweep
        examines ``CLEANUP_BATCH * cleanup_size`` entries of one map (the maps
        in turn) every ``CLEANUP_BATCH`` accesses, the same rate with fewer
        calls, while sweeps find expired entries. Each round over all the maps
        that finds none doubles the interval, up to ``CLEANUP_MAX_BACKOFF`` times,
        and while the clock reads the time at which the maps' expiry floors said
        no entry could have expired, a step sweeps nothing: a state where nothing
        expires stops paying for cleanup (examining an entry is a cache miss in a
        big map), and the first expired entry found restores the rate.

        Call it as ``if t.cleanup_size: t.cleanup_step()``. The per-record
        accesses of every kind are compiled and take the same step in C
        (``_cleanup_tick`` in ``_state_access.pxi``): a method call alone adds
        3-8% to such an access. O(1) but every ``CLEANUP_BATCH``-th call, which
        sweeps (see :meth:`run_cleanup`).
        """
        self.ticks -= 1
        if self.ticks <= 0:
            self.run_cleanup()

    def prepare_batch_write(self, kgs: list[int]) -> None:
        """Make the maps a batch of writes to key groups ``kgs`` needs, and count
        its accesses for incremental cleanup (one per write)."""
        for kg in set(kgs):
            if self.maps[kg] is None:
                self.map_for_write(kg)
        if self.cleanup_size:
            self.tick(len(kgs))

    def tick(self, n: int) -> None:
        """``n`` accesses' worth of cleanup steps at once (a batch of requests).
        When no entry can have expired (``may_expire``) the steps due are
        skipped: each would find nothing."""
        self.ticks -= n
        if self.ticks <= 0 and n > 1 and not self.may_expire():
            self.ticks = self._interval
            return
        while self.ticks <= 0:
            over = self.ticks
            self.run_cleanup()
            self.ticks += over

    def run_cleanup(self) -> None:
        live = self.live
        if not live:
            self.ticks = CLEANUP_BATCH
            return
        now = self.now()
        # (the maps' expiry floors said at this very time that no entry could have expired, and
        # every write since stamped this time: a micro-batch's fixed time, over fresh keys in
        # thousands of key groups, would otherwise sweep one map after another finding nothing.
        # A restore or a new TTL clears it: see entries_restored.)
        found = 0
        if now != self._quiet_at:
            maps = self.maps
            n = len(live)
            i = self._cursor
            for _ in range(n):  # the next map with entries (empty ones would waste the step)
                if i >= n:
                    i = 0
                if len(maps[live[i]]):
                    break
                i += 1
            else:
                self.ticks = self._interval  # every map is empty
                return
            self._cursor = i + 1
            found = self.sweep(live[i], now, self.cleanup_size * CLEANUP_BATCH)
            if not found:
                self._unchecked += self._interval
                if self._unchecked >= len(maps):  # (reading the floors is O(key groups))
                    self._unchecked = 0
                    if not self.may_expire(now):
                        self._quiet_at = now
        if found:
            self._interval = CLEANUP_BATCH
            self._idle_sweeps = 0
        else:
            self._idle_sweeps += 1
            # back off only after a whole round over the maps found nothing
            if self._idle_sweeps >= len(live) and self._interval < CLEANUP_BATCH * CLEANUP_MAX_BACKOFF:
                self._interval *= 2
                self._idle_sweeps = 0
        self.ticks = self._interval

    def entries_restored(self) -> None:
        """Entries came in with timestamps of their own (a restore) or the TTL
        changed: the next cleanup steps sweep again, whatever the clock reads."""
        self._quiet_at = None

    def may_expire(self, now: int | None = None) -> bool:
        """Whether an entry may have expired at ``now`` (the clock's time by
        default): False when the maps' expiry floors (``expiry_floor`` of each
        key group's map, chained or flat) say none has. O(maps)."""
        return maps_may_expire(self.maps, self.now() if now is None else now, self.ttl)

    def sweep(self, kg: int, now: int, max_entries: int | None) -> int:
        """Remove expired entries of key group ``kg`` (whole states expire together
        by default); returns how many were removed."""
        return self.maps[kg].sweep_expired(now, self.ttl, max_entries)

    # ------------------------------------------------------------ snapshots

    def export(self, snap: StateMapSnapshot, now: int | None, ttl: int) -> Iterator[tuple[Any, ...]]:
        """Flat records of one key group's snapshot: ``(key, namespace, value, ts)``.
        ``ttl``: the state's TTL when the snapshot was taken (0: none). With ``now``
        (full-snapshot cleanup) values expired at ``now`` are left out. The values are
        the stored objects, not copies."""
        for key, ns, state, ts in snap.iter_with_timestamps():
            if now is None or not expired(ts, ttl, now):
                yield key, ns, state, ts

    def import_records(self, kg: int, records: Iterator[tuple[Any, ...]]) -> None:
        """Add exported records of key group ``kg`` (a restore), copying the values
        so the restored state shares nothing with the snapshot's source."""
        m = self.map_for_write(kg)
        copy = self.copy_value
        for key, ns, state, ts in records:
            m.put(key, ns, copy(state), ts)


class State(StateView):
    """Base of the state views: the current namespace and the backend's key context.

    Its fields are compiled (``StateView``: ``_t`` the table, ``_kc`` the backend's
    key context, ``_ns`` the current namespace, ``VOID_NAMESPACE`` by default,
    ``_default`` what a read of no value gives), so the async layer and the
    compiled accesses read them by field; ``set_current_namespace`` /
    ``get_current_namespace`` come from there too.
    """

    __slots__ = ()

    def __init__(self, table: StateTable) -> None:
        super().__init__(table, table.kc, VOID_NAMESPACE)

    @property
    def name(self) -> str:
        return self._t.name

    def _current_map(self) -> CopyOnWriteStateMap | None:
        """The current key group's map (None until it has one); RuntimeError without a key."""
        try:
            return self._t.maps[self._kc.key_group]
        except TypeError:  # no current key: key_group is None
            raise self._no_key() from None

    # compiled (cowmap._core): remove the current key's state in the current namespace
    clear = _core.state_clear

    def _merge_sources(self, target: Any, sources: Iterable[Any]) -> dict[Any, None]:
        """Check a ``merge_namespaces`` call before it changes anything: the
        distinct namespaces of ``sources`` in order (as dict keys: membership in
        O(1)). RuntimeError without a current key, TypeError for a target or
        source that is None or unhashable, or ``sources`` that is no iterable
        (a str or bytes is taken for one namespace given by mistake)."""
        if self._kc.key_group is None:
            raise self._no_key()
        if target is None:
            raise TypeError("target namespace must not be None (use VOID_NAMESPACE for no namespace)")
        try:
            hash(target)
        except TypeError:
            raise TypeError(f"target namespace must be hashable, got {type(target).__name__} {target!r}") from None
        if (type(sources) is not list and type(sources) is not tuple) and (
            isinstance(sources, (str, bytes)) or not hasattr(sources, "__iter__")
        ):
            raise TypeError(f"sources must be an iterable of namespaces, not {type(sources).__name__}")
        out: dict[Any, None] = {}
        for ns in sources:
            if ns is None:
                raise TypeError("source namespace must not be None (use VOID_NAMESPACE for no namespace)")
            try:
                out[ns] = None
            except TypeError:
                raise TypeError(f"source namespace must be hashable, got {type(ns).__name__} {ns!r}") from None
        return out

    # ------------------------------------------------------------ columns

    def _column(self, keys: Any, namespace: Any, locations: Any = None) -> tuple[Any, Any, Any]:
        """A columnar call's ``(keys, key groups, namespace)``, all checked before
        anything is written: ``keys`` as the compiled calls take them, their key
        groups (``ValueError`` for one outside the backend's range, ``TypeError``
        for a key with no stable hash) and ``namespace``, the view's current one
        when None. The key groups are ``locations``' (a ``ColumnLocations``)
        when it holds a read of the same keys, as this backend computed them."""
        from cowmap.state.columns import key_column  # numpy: loaded by the first columnar call

        if namespace is None:
            namespace = self._ns
        else:
            try:
                hash(namespace)
            except TypeError:
                raise TypeError(
                    f"namespace must be hashable, got {type(namespace).__name__} {namespace!r}"
                ) from None
            if isinstance(namespace, float) and namespace != namespace:
                raise ValueError("namespace must not be NaN: a NaN equals no other NaN in Python, so its state "
                                 "could never be found again")
        if locations is not None:
            same = locations.reuse(keys, namespace)  # the read's own copy and key groups
            if same is not None:
                return same[0], same[1], namespace
        ks = key_column(keys)
        kgs = None if locations is None else locations.kgs_for(ks, namespace)
        if kgs is None:
            kgs = self._kc.column_key_groups(ks)
        return ks, kgs, namespace

    def _each_row(self, ks: Any, kgs: Any, namespace: Any, fn: Callable[[int], Any]) -> list[Any]:
        """``fn(i)`` for every row ``i`` of a checked column (``_column``), with
        the row's key current as ``set_current_key`` makes it (a record starts)
        and ``namespace`` current; the current key and namespace are restored
        after. The per-record loop itself, for the columnar calls that have no
        faster path."""
        kc = self._kc
        key0, kg0, ns0 = kc.key, kc.key_group, self._ns
        keys = ks.tolist() if hasattr(ks, "tolist") else ks  # an int64 array, or a tuple
        groups = kgs.tolist()
        swap = namespace is not ns0
        if swap:
            self.set_current_namespace(namespace)
        out = []
        try:
            enter = kc.enter_row
            for i, k in enumerate(keys):
                enter(k, groups[i])
                out.append(fn(i))
        finally:
            kc.restore_key(key0, kg0)
            if swap:
                self.set_current_namespace(ns0)
        return out

    def _column_maps(self, kgs: Any) -> list[Any]:
        """The table's maps, with a map made for every key group of ``kgs``
        that has none (what a column of writes needs)."""
        t = self._t
        if None in t.maps:  # else every key group has its map already
            for kg in column_missing(t.maps, kgs):
                t.map_for_write(kg)
        return t.maps

    def _column_ticks(self, n: int) -> None:
        """The cleanup a loop of ``n`` records, each making one access, would
        run: a step per record of every table that cleans up on every record
        (``set_current_key``), and one per access of this state's."""
        for t in self._kc.record_cleanups:
            t.tick(n)
        if self._t.cleanup_size:
            self._t.tick(n)

    def _no_key(self) -> RuntimeError:
        return RuntimeError(f"no current key: call set_current_key() before using state {self._t.name!r}")

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self._t.name!r}>"
