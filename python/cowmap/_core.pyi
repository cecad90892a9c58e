"""Type stub for the compiled core (src/cowmap/_core.pyx)."""

from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any, TypeAlias, final

import numpy as np
import numpy.typing as npt
from typing_extensions import Self

# the columns a snapshot's entries are read out as (snapshot_columns and its kin)
_KeyColumn: TypeAlias = npt.NDArray[np.int64] | list[Any]
_NsColumn: TypeAlias = npt.NDArray[np.int64] | list[Any] | None
_StateColumn: TypeAlias = npt.NDArray[np.int64] | npt.NDArray[np.float64] | list[Any]

#: a timestamp in ms, or a time provider returning one (called once per call)
_Time = int | Callable[[], int]

NO_TIMESTAMP: int
"""Timestamp of entries written without one (2**63 - 1): they never expire."""
PLAIN_BATCH: bool
"""True in a build made with the CMake option COWMAP_PLAIN_BATCH=ON, where every batch
takes the plain path (the keys one after another, no pipeline); same results."""
CPYTHON_INTERNALS: bool
"""False in a build made with the CMake option COWMAP_PUBLIC_API_ONLY=ON, where every fast
path through CPython's own structures takes its public-API fallback; same results."""
EXPIRED: object
"""What ``get_unexpired`` returns for an expired entry."""

def block_stats() -> dict[str, Any]:
    """The core's block allocator: ``mapped`` bytes, ``blocks`` in use, ``spare`` bytes
    faulted in ahead, ``prefaulted`` regions so far, ``huge_pages`` policy
    (``"background"``, ``"always"`` or ``"off"``)."""

def wall_clock_ms() -> int:
    """Milliseconds since the Unix epoch (the backend's default time provider)."""

@final
class ManualClock:
    """A time provider whose owner sets the time (``clock.ms = t``), read by the maps in C."""

    ms: int
    def __init__(self, ms: int = 0) -> None: ...
    def __call__(self) -> int: ...
    def __reduce__(self) -> tuple[type[ManualClock], tuple[int]]: ...

_KeysArg = Sequence[Any] | npt.NDArray[np.int64]

# The classes are final (cython.final) and take their arguments in __new__ (__cinit__):
# their __init__ is object's.
@final
class CopyOnWriteStateMap:
    """A chained hash map keyed by ``(key, namespace)`` with copy-on-write snapshots.

    Single writer: methods that change the map (and ``get``, which may run a
    step of incremental rehash or copy a shared state) must not be called from
    two threads at once. A :class:`StateMapSnapshot` may be read from another
    thread while the owner thread keeps writing. A call back into the map from a
    key's ``__eq__``/``__hash__``, a copier or a transform function raises
    ``RuntimeError``, except ``len()``, the properties, ``memory_stats``, ``prefetch``,
    making an iterator or visitor, and reading or releasing a snapshot.
    """

    def __new__(cls, capacity: int = 128, copier: Callable[[Any], Any] | None = None) -> Self: ...
    # -- single-entry operations: O(1) amortised, plus one rehash step (>= 4 entries) while rehashing
    def put(self, key: Any, namespace: Any, state: Any, ts: _Time = ...) -> bool: ...
    def get(self, key: Any, namespace: Any) -> Any: ...
    def get_with_timestamp(self, key: Any, namespace: Any) -> tuple[Any, int] | None: ...
    # ttl (ms) must be > 0, else ValueError
    def get_unexpired(self, key: Any, namespace: Any, now: _Time, ttl: int, refresh: bool = False) -> Any: ...
    def replace(self, key: Any, namespace: Any, state: Any, ts: _Time = ...) -> bool: ...
    def get_touch(self, key: Any, namespace: Any, ts: _Time) -> Any: ...
    def timestamp(self, key: Any, namespace: Any) -> int | None: ...
    def set_timestamp(self, key: Any, namespace: Any, ts: _Time) -> bool: ...
    def prefetch(self, key: Any, namespace: Any) -> None: ...
    def contains_key(self, key: Any, namespace: Any) -> bool: ...
    def remove(self, key: Any, namespace: Any) -> None: ...
    def put_and_get_old(self, key: Any, namespace: Any, state: Any, ts: _Time = ...) -> Any: ...
    def remove_and_get_old(self, key: Any, namespace: Any) -> Any: ...
    def transform(
        self, key: Any, namespace: Any, value: Any, fn: Callable[[Any, Any], Any], ts: _Time = ...
    ) -> None: ...
    # -- batch operations: one Python->C crossing per call; int64 numpy arrays take a fast path
    def get_many(self, keys: _KeysArg, namespace: Any) -> list[Any]: ...
    def put_many(self, keys: _KeysArg, namespace: Any, states: Sequence[Any], ts: _Time = ...) -> None: ...
    def contains_many(self, keys: _KeysArg, namespace: Any) -> npt.NDArray[np.bool_]: ...
    def remove_many(self, keys: _KeysArg, namespace: Any) -> int: ...
    # -- TTL: ttl (ms) must be > 0, else ValueError
    def sweep_expired(
        self, now: _Time, ttl: int, max_entries: int | None = 5, removed: list[tuple[Any, Any, Any]] | None = None
    ) -> int: ...
    @property
    def expiry_floor(self) -> int: ...
    # -- whole map
    def __contains__(self, item: tuple[Any, Any], /) -> bool: ...
    def __len__(self) -> int: ...
    def __iter__(self) -> Iterator[tuple[Any, Any, Any]]: ...
    def snapshot(self, cut: bool = False) -> StateMapSnapshot: ...
    def incremental_visitor(self, max_empty_buckets: int = 128) -> StateIncrementalVisitor: ...
    @property
    def capacity(self) -> int: ...
    @property
    def is_rehashing(self) -> bool: ...
    @property
    def version(self) -> int: ...
    @property
    def highest_required_snapshot_version(self) -> int: ...
    @property
    def snapshot_versions(self) -> list[int]: ...
    @property
    def copier(self) -> Callable[[Any], Any] | None: ...
    def reclaim(self, max_items: int | None = None) -> int: ...
    def memory_stats(self) -> dict[str, int]: ...

@final
class StateMapSnapshot:
    """A consistent, read-only view of a map at the moment ``snapshot()`` was called."""

    @property
    def version(self) -> int: ...
    @property
    def changes(self) -> str | None:
        """Of a cut's snapshot: "known", "untracked" or "lost"; else None."""
    @property
    def released(self) -> bool: ...
    def __len__(self) -> int: ...
    def __iter__(self) -> Iterator[tuple[Any, Any, Any]]: ...
    def iter_with_timestamps(self) -> Iterator[tuple[Any, Any, Any, int]]: ...
    def release(self) -> None: ...
    def __enter__(self) -> StateMapSnapshot: ...
    def __exit__(self, *exc: object) -> None: ...

@final
class FlatStateMap:
    """A ``(key, namespace)`` map with its entries inline in an open-addressed table:
    one cache miss per lookup in a big map. Holds MapState's user entries.

    Threading and re-entrancy as for :class:`CopyOnWriteStateMap`: a call back into the
    map from a key's ``__eq__``/``__hash__`` or a copier raises ``RuntimeError``, except
    ``len()``, the properties, ``prefetch`` and reading or releasing a snapshot.
    """

    def __new__(cls, copier: Callable[[Any], Any] | None = None, max_shift: int | None = None) -> Self: ...
    def __len__(self) -> int: ...
    def __iter__(self) -> Iterator[tuple[Any, Any, Any]]: ...
    @property
    def version(self) -> int: ...
    @property
    def is_rehashing(self) -> bool: ...
    @property
    def segments_depth(self) -> int: ...
    def put(self, key: Any, namespace: Any, state: Any, ts: _Time = ...) -> bool: ...
    def get(self, key: Any, namespace: Any) -> Any: ...
    # ttl (ms) must be > 0, else ValueError
    def get_unexpired(self, key: Any, namespace: Any, now: _Time, ttl: int, refresh: bool = False) -> Any: ...
    def contains_key(self, key: Any, namespace: Any) -> bool: ...
    def timestamp(self, key: Any, namespace: Any) -> int | None: ...
    def remove(self, key: Any, namespace: Any) -> bool: ...
    def remove_and_get_old(self, key: Any, namespace: Any) -> Any: ...
    def prefetch(self, key: Any, namespace: Any) -> None: ...
    def sweep_expired(
        self, now: _Time, ttl: int, max_entries: int | None = 5, removed: list[tuple[Any, Any, Any]] | None = None
    ) -> int: ...
    @property
    def expiry_floor(self) -> int: ...
    def snapshot(self, cut: bool = False) -> FlatMapSnapshot: ...

@final
class FlatMapSnapshot:
    """A consistent, read-only view of a :class:`FlatStateMap`."""

    @property
    def version(self) -> int: ...
    @property
    def changes(self) -> str | None:
        """Of a cut's snapshot: "known", "untracked" or "lost"; else None."""
    @property
    def released(self) -> bool: ...
    def __len__(self) -> int: ...
    def __iter__(self) -> Iterator[tuple[Any, Any, Any]]: ...
    def iter_with_timestamps(self, insertion_order: bool = False) -> Iterator[tuple[Any, Any, Any, int]]: ...
    def release(self) -> None: ...
    def __enter__(self) -> FlatMapSnapshot: ...
    def __exit__(self, *exc: object) -> None: ...

@final
class StateIncrementalVisitor:
    """Visits a map a few bucket chains at a time, tolerating changes and rehash."""

    def __new__(cls, m: CopyOnWriteStateMap, max_empty_buckets: int) -> Self: ...

    def has_next(self) -> bool: ...
    def next_entries(self) -> list[tuple[Any, Any, Any]] | None: ...
    def remove(self, key: Any, namespace: Any) -> None: ...
    def update(self, key: Any, namespace: Any, state: Any) -> None: ...

def flat_column_lookup(
    maps: list[Any], kgs: npt.NDArray[np.int32], keys: npt.NDArray[np.int64], namespaces: npt.NDArray[np.int64],
    now: _Time = 0, ttl: int = 0,
) -> npt.NDArray[np.uint8]: ...
def maps_may_expire(maps: list[Any], now: _Time, ttl: int) -> bool: ...
def multi_get(
    maps: list[CopyOnWriteStateMap | None] | list[FlatStateMap | None],
    kgs: list[int],
    keys: list[Any],
    namespaces: list[Any],
    now: _Time = 0,
    ttl: int = 0,
    refresh: bool = False,
) -> list[Any]:
    """Item i reads ``(keys[i], namespaces[i])`` in ``maps[kgs[i]]``: with ``ttl > 0`` as
    ``get_unexpired``, with ``ttl == 0`` as ``get``; a negative ``ttl`` is a ``ValueError``.

    For all three multi-map calls: the lists have one length (``ValueError``), each
    ``kgs[i]`` is an int in ``[0, len(maps))`` (``TypeError``/``ValueError``), each map
    is a map or None (``TypeError``; None reads as absent, a put into it is a
    ``ValueError``). Not atomic: the items before a failing one are done."""
def multi_put(
    maps: list[CopyOnWriteStateMap | None] | list[FlatStateMap | None],
    kgs: list[int],
    keys: list[Any],
    namespaces: list[Any],
    states: list[Any],
    ts: _Time = ...,
) -> None: ...
def multi_replace(
    maps: list[CopyOnWriteStateMap | None] | list[FlatStateMap | None],
    kgs: list[int],
    keys: list[Any],
    namespaces: list[Any],
    states: list[Any],
    ts: _Time = ...,
) -> list[bool]: ...

COL_LIST: int
COL_INT64: int
COL_FLOAT64: int

_KeyCol = npt.NDArray[np.int64] | tuple[Any, ...]

@final
class ColumnLocations:
    """Where a column read found each row's entry, for a write of the same column."""

    @property
    def written(self) -> int: ...
    def kgs_for(self, keys: _KeyCol, namespace: Any) -> npt.NDArray[np.int32] | None: ...
    def reuse(self, keys: Any, namespace: Any) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int32]] | None: ...
    def clear(self) -> None: ...

def column_get(
    maps: list[Any],
    kgs: npt.NDArray[np.int32],
    keys: _KeyCol,
    namespace: Any,
    now: int = 0,
    ttl: int = 0,
    refresh: bool = False,
    default: Any = None,
    return_expired: bool = False,
    out_type: int = 0,
    peek: bool = False,
    exact: bool = False,
    locations: ColumnLocations | None = None,
    keys_private: bool = False,
) -> tuple[Any, npt.NDArray[np.uint8]]: ...
def column_put(
    maps: list[Any],
    kgs: npt.NDArray[np.int32],
    keys: _KeyCol,
    namespace: Any,
    states: tuple[Any, ...] | npt.NDArray[np.int64] | npt.NDArray[np.float64],
    ts: _Time | npt.NDArray[np.int64] = ...,
    locations: ColumnLocations | None = None,
) -> None: ...
def column_remove(maps: list[Any], kgs: npt.NDArray[np.int32], keys: _KeyCol, namespace: Any) -> None: ...
def column_contains(
    maps: list[Any], kgs: npt.NDArray[np.int32], keys: _KeyCol, namespace: Any
) -> npt.NDArray[np.bool_]: ...
def column_missing(maps: list[Any], kgs: npt.NDArray[np.int32]) -> list[int]: ...
def column_groups(
    keys: npt.NDArray[np.int64] | tuple[Any, ...],
) -> tuple[npt.NDArray[np.intp], npt.NDArray[np.intp]]: ...
FOLD_ADD: int
FOLD_MIN: int
FOLD_MAX: int

def column_fold(
    maps: list[Any],
    kgs: npt.NDArray[np.int32],
    keys: _KeyCol,
    namespace: Any,
    values: npt.NDArray[np.int64],
    fold: int,
    now: int = 0,
    ttl: int = 0,
    return_expired: bool = False,
    ts: int = ...,
) -> list[int]: ...

def user_link(
    links: CopyOnWriteStateMap, dirs: CopyOnWriteStateMap, ctx: Any, key: Any, ns: Any, ukey: Any
) -> None: ...
def user_unlink(
    links: CopyOnWriteStateMap, dirs: CopyOnWriteStateMap, ctx: Any, key: Any, ns: Any, ukey: Any
) -> None: ...
def user_unlink_all(
    links: CopyOnWriteStateMap, dirs: CopyOnWriteStateMap, removed: list[Any], ns_marker: Any, void_ns: Any
) -> None: ...
def user_insert_many(
    users: list[Any],
    groups: list[int],
    ctxs: list[Any],
    keys: list[Any],
    ns: Any,
    ukeys: list[Any],
    values: list[Any],
    rows: Iterable[int],
    none_value: Any,
    ts: _Time | list[int] = ...,
) -> None: ...
def dir_copy(dc: list[Any]) -> list[Any]: ...

def snapshot_changes(
    snap: StateMapSnapshot | FlatMapSnapshot, namespace: Any
) -> tuple[
    _KeyColumn,
    _NsColumn,
    _StateColumn,
    npt.NDArray[np.int64],
    _KeyColumn,
    list[Any] | None,
]:
    """What changed between the previous cut and ``snap`` (a cut whose ``changes`` are
    "known"): the columns of ``snapshot_columns`` for the entries written, then the keys
    and namespaces removed. O(changes). ``ValueError`` when the changes are not known."""

def snapshot_changes_many(
    snaps: list[StateMapSnapshot | FlatMapSnapshot], namespace: Any
) -> tuple[
    _KeyColumn,
    _NsColumn,
    _StateColumn,
    npt.NDArray[np.int64],
    _KeyColumn,
    list[Any] | None,
    npt.NDArray[np.int64],
    npt.NDArray[np.int64],
]:
    """``snapshot_changes`` of several maps in one call: the same six columns over all
    their changes, map after map, then per map the counts of changed entries and of
    removed keys. Every snapshot is checked first. O(changes + maps)."""

TUPLE_COLUMNS_MAX: int

def tuple_columns(rows: list[Any]) -> list[npt.NDArray[np.int64] | npt.NDArray[np.float64]] | None:
    """The columns of ``rows`` when every row is a tuple (exactly) of one length,
    1 to ``TUPLE_COLUMNS_MAX``, whose items at each position are all exact ints
    that fit in int64 or all exact floats: an int64 or float64 array per
    position. None otherwise. One C pass."""

def snapshot_columns_many(
    snaps: list[StateMapSnapshot | FlatMapSnapshot], namespace: Any
) -> tuple[
    _KeyColumn,
    _NsColumn,
    _StateColumn,
    npt.NDArray[np.int64],
    npt.NDArray[np.int64],
]:
    """``snapshot_columns`` (timestamps included) of several snapshots in one call: the
    four columns over all their entries, snapshot after snapshot, then per snapshot how
    many entries it gave. Every snapshot is checked first; the GIL is let go only where
    :class:`ColumnReader` lets go of it (a chained map's entries found, its int rows read).
    O(entries)."""

def snapshot_columns(
    snap: StateMapSnapshot | FlatMapSnapshot, namespace: Any, timestamps: bool = True
) -> tuple[
    _KeyColumn,
    _NsColumn,
    _StateColumn,
    npt.NDArray[np.int64] | None,
]:
    """``(keys, namespaces, states, timestamps)`` of every entry of ``snap`` (a chained
    map's in about allocation order, a flat map's in insertion order): keys an int64 array
    when every key is an int64; namespaces None when every one is ``namespace``, an int64
    array when every one is an exact int64; states an int64 / float64 array when every one
    is an exact int64 / float; otherwise lists; timestamps None unless ``timestamps``.
    ``RuntimeError`` for a released snapshot. One call, the GIL held throughout."""

@final
class ColumnReader:
    """``snapshot_columns(snap, namespace, timestamps)`` a slice of rows a call, so a
    reader on another thread lets the map's writer take the GIL between calls.
    ``RuntimeError`` if the snapshot is released meanwhile."""

    def __new__(cls, snap: StateMapSnapshot | FlatMapSnapshot, namespace: Any, timestamps: bool = True) -> Self: ...
    @property
    def rows(self) -> int: ...
    def read(self, rows: int) -> bool:
        """Read up to ``rows`` more rows; True once every row is read."""
    def columns(
        self,
    ) -> tuple[
        _KeyColumn,
        _NsColumn,
        _StateColumn,
        npt.NDArray[np.int64] | None,
    ]:
        """The columns of ``snapshot_columns`` once every row is read."""

def value_state_value(self: Any) -> Any:
    """ValueState.value, compiled."""

def value_state_update(self: Any, value: Any) -> None:
    """ValueState.update, compiled."""

def map_state_get(self: Any, key: Any) -> Any:
    """MapState.get, compiled."""

def map_state_contains(self: Any, key: Any) -> bool:
    """MapState.contains, compiled."""

def map_state_put(self: Any, key: Any, value: Any) -> None:
    """MapState.put, compiled."""

def map_state_ctx(self: Any) -> Any:
    """MapState._ctx, compiled."""

def reducing_state_get(self: Any) -> Any:
    """ReducingState.get, compiled."""

def reducing_state_add(self: Any, value: Any) -> None:
    """ReducingState.add, compiled."""

def aggregating_state_get(self: Any) -> Any:
    """AggregatingState.get, compiled."""

def aggregating_state_add(self: Any, value: Any) -> None:
    """AggregatingState.add, compiled."""

def list_state_add(self: Any, value: Any) -> None:
    """ListState.add, compiled."""

def list_state_get(self: Any) -> list[Any]:
    """ListState.get, compiled."""

def map_state_remove(self: Any, key: Any) -> None:
    """MapState.remove, compiled."""

def state_clear(self: Any) -> None:
    """State.clear, compiled."""

def list_state_add_all(self: Any, values: Any) -> None:
    """ListState.add_all, compiled."""

def list_state_update(self: Any, values: Any) -> None:
    """ListState.update, compiled."""
