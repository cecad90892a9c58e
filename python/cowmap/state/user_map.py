"""``KeyGroupUserMap``: one key group's user entries of one ``MapState``.

Flink's heap backend stores a whole ``HashMap`` per key, so a TTL cleanup visit
or the first write after a snapshot copies the whole user map. Here every user
entry is its own entry of one core map, so a read, a write, a cleanup step and
the first write after a snapshot each cost O(1) amortised, whatever the number
of entries per key. A key group's user entries live in three core maps, owned
together by one ``KeyGroupUserMap``:

``values`` (``FlatStateMap``)
    ``(user_key, ctx) -> value``, each entry with its own timestamp. ``ctx`` is
    the key itself in the void namespace (no tuple to build, hash or follow),
    else ``(key, namespace, NS_MARKER)`` (see :func:`make_ctx`). A None value is
    stored as :data:`NONE_VALUE`: the core reads a None state as "absent". The
    flat map keeps its entries inline in an open-addressed table, so a lookup
    in a map far bigger than the caches is one cache miss (the chained map's
    is two), and it copies a page of 256 entries on the first write to it
    after a snapshot. Snapshots, restores and the TTL sweep work on this map.
``links`` (``CopyOnWriteStateMap``)
    ``(user_key, ctx) -> (prev_user_key, next_user_key)``: a doubly-linked list
    per ``(key, namespace)`` in insertion order, for iteration and ``clear()``.
    The links are tuples: immutable, so the map needs no copier, and a tuple of
    untracked objects (int or str user keys, say) drops out of the garbage
    collector's view at its first collection, so millions of entries add
    nothing to a full collection.
``dirs`` (``CopyOnWriteStateMap``)
    ``(key, namespace) -> [count, head, tail]``, one per ``(key, namespace)``
    with at least one user entry (the list is copied on write after a snapshot).
    The lists are kept out of the cyclic collector's view (``dir_copy``), as
    the core maps' contents are: a full collection would otherwise walk one
    list per key.

The invariant (checked by :meth:`KeyGroupUserMap._check`): per ``(key,
namespace)`` the entries reachable from ``head`` through ``links`` are exactly
its entries in ``values``, ``count`` of them, ``prev`` and ``next`` agree,
``tail`` is the last one, and the list's order is the order ``values`` keeps
its entries in (which snapshots export, so a restore rebuilds the same lists).
Every change keeps it, with one allowed lag: an entry may leave ``values``
first (a get that finds it expired, a TTL sweep) and is then unlinked at once,
before anything else reads the list.

Single writer, like the core maps: not safe to change from two threads at once.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import Any

from cowmap._core import (
    EXPIRED,
    CopyOnWriteStateMap,
    FlatMapSnapshot,
    FlatStateMap,
    dir_copy,
    user_link,
    user_unlink,
    user_unlink_all,
)
from cowmap.state.table import VOID_NAMESPACE
from cowmap.state.ttl import expired

__all__ = ["NONE_VALUE", "NS_MARKER", "KeyGroupUserMap", "make_ctx", "split_ctx"]

#: What ``values`` stores for a None value (a None state reads as "absent").
NONE_VALUE = object()
#: Marks a namespaced context ``(key, namespace, NS_MARKER)``: no key or user key is this object.
NS_MARKER = object()
#: At most this many times the cleanup budget of user entries is examined per sweep step.
_SWEEP_SCALE_CAP = 4


def make_ctx(key: Any, ns: Any) -> Any:
    """The core namespace of the user entries of ``key`` in ``ns``: the key
    itself in the void namespace, else ``(key, ns, NS_MARKER)``. O(1)."""
    return key if ns is VOID_NAMESPACE else (key, ns, NS_MARKER)


def split_ctx(ctx: Any) -> tuple[Any, Any]:
    """``(key, namespace)`` of a context made by :func:`make_ctx`. O(1)."""
    if type(ctx) is tuple and len(ctx) == 3 and ctx[2] is NS_MARKER:
        return ctx[0], ctx[1]
    return ctx, VOID_NAMESPACE


class KeyGroupUserMap:
    """The user entries of one map state in one key group (see the module docstring).

    ``copier`` copies a stored value shared with a snapshot before it is handed
    out for change; it may be given :data:`NONE_VALUE` and must return it as is
    (``MapTable.copy_state`` does).

    Callers pass ``ctx`` (from :func:`make_ctx`) and, where the directory is
    read, ``key`` and ``ns`` too: ``MapState`` caches its current ``ctx``, so
    neither side rebuilds it per call.
    """

    __slots__ = ("values", "links", "dirs")

    def __init__(self, copier: Callable[[Any], Any]) -> None:
        self.values = FlatStateMap(copier=copier)
        self.links = CopyOnWriteStateMap()
        self.dirs = CopyOnWriteStateMap(copier=dir_copy)  # untracked lists, see _userlink.pxi

    # ------------------------------------------------------------ size

    def num_keys(self) -> int:
        """How many ``(key, namespace)`` have at least one user entry. O(1)."""
        return len(self.dirs)

    def keys(self, namespace: Any) -> list[Any]:
        """The keys with at least one user entry in ``namespace``. O(keys)."""
        return [key for key, ns, _ in self.dirs if ns == namespace]

    def has_entries(self, key: Any, ns: Any) -> bool:
        """Whether ``key`` in ``ns`` has a user entry (expired or not). O(1)."""
        return self.dirs.contains_key(key, ns)

    # ------------------------------------------------------------ the linked list

    def insert(self, ctx: Any, ukey: Any, value: Any, ts: int) -> bool:
        """Store ``value`` for ``ukey``; a new user key is linked at the tail of
        its list, an existing one keeps its place. True if it was new. O(1)."""
        if self.values.put(ukey, ctx, NONE_VALUE if value is None else value, ts):
            self.link(ctx, ukey)
            return True
        return False

    def link(self, ctx: Any, ukey: Any) -> None:
        """Link a user entry just added to ``values`` at the tail of its list.

        For callers that wrote ``values`` themselves (``MapState.put`` writes
        first and learns from that one lookup whether the key is new). O(1).
        """
        key, ns = split_ctx(ctx)
        user_link(self.links, self.dirs, ctx, key, ns, ukey)  # compiled: see _userlink.pxi

    def unlink(self, ctx: Any, ukey: Any) -> None:
        """Unlink a user entry already removed from ``values``. O(1).

        Reads only ``links`` and ``dirs``, never ``values``: so after several
        entries of one list left ``values`` at once (a sweep), unlinking them
        one after another is plain removal from a doubly-linked list, each
        step seeing the links the step before left.
        """
        key, ns = split_ctx(ctx)
        user_unlink(self.links, self.dirs, ctx, key, ns, ukey)  # compiled: see _userlink.pxi

    def unlink_all(self, removed: list[tuple[Any, Any, Any]]) -> None:
        """Unlink the ``(user_key, ctx, value)`` entries a sweep removed from
        ``values``, in any order, several of one list among them. O(len(removed))."""
        user_unlink_all(self.links, self.dirs, removed, NS_MARKER, VOID_NAMESPACE)  # compiled: see _userlink.pxi

    def remove(self, ctx: Any, ukey: Any) -> bool:
        """Remove a user entry if present; True if it was. O(1)."""
        if self.values.remove(ukey, ctx):
            self.unlink(ctx, ukey)
            return True
        return False

    def clear_key(self, key: Any, ns: Any, ctx: Any) -> None:
        """Remove every user entry of ``key`` in ``ns``. O(its entries)."""
        dc = self.dirs.remove_and_get_old(key, ns)
        if dc is None:
            return
        values, links = self.values, self.links
        ukey = dc[1]
        while ukey is not None:
            values.remove(ukey, ctx)
            ukey = links.remove_and_get_old(ukey, ctx)[1]

    def walk(
        self,
        key: Any,
        ns: Any,
        ctx: Any,
        time: Callable[[], int] | None = None,
        ttl: int = 0,
        refresh: bool = False,
        return_expired: bool = False,
    ) -> list[tuple[Any, Any]]:
        """``(user_key, value)`` of ``key`` in ``ns``, in insertion order. O(its entries).

        With ``ttl``, ``time()`` is read once (only if there are entries) and
        expired entries are removed as they are met (returned once too if
        ``return_expired``); ``refresh`` renews the timestamps of those read.
        """
        dc = self.dirs.get(key, ns)
        if dc is None:
            return []
        values, links = self.values, self.links
        out: list[tuple[Any, Any]] = []
        ukey = dc[1]
        if not ttl:
            while ukey is not None:
                v = values.get(ukey, ctx)
                out.append((ukey, None if v is NONE_VALUE else v))
                ukey = links.get(ukey, ctx)[1]
            return out
        now = time()  # type: ignore[misc]
        while ukey is not None:
            nxt = links.get(ukey, ctx)[1]  # read before an unlink drops the links
            v = values.get_unexpired(ukey, ctx, now, ttl, refresh)
            if v is EXPIRED:
                v = values.remove_and_get_old(ukey, ctx)
                self.unlink(ctx, ukey)
                if return_expired:
                    out.append((ukey, None if v is NONE_VALUE else v))
            else:
                out.append((ukey, None if v is NONE_VALUE else v))
            ukey = nxt
        return out

    # ------------------------------------------------------------ TTL

    def sweep(self, now: int, ttl: int, max_maps: int | None) -> int:
        """Remove user entries expired at ``now``; returns how many were removed.

        ``max_maps`` is Flink's cleanup budget, which counts whole user maps
        (``None``: one full pass). Ours counts user entries, so it is scaled by
        the mean entries per key, capped at ``_SWEEP_SCALE_CAP`` times so a
        step stays O(budget) amortised.
        """
        values = self.values
        max_entries = max_maps
        if max_entries is not None:
            n_keys = len(self.dirs)
            if n_keys:
                max_entries *= min(max(len(values) // n_keys, 1), _SWEEP_SCALE_CAP)
        removed: list[tuple[Any, Any, Any]] = []
        values.sweep_expired(now, ttl, max_entries, removed)
        if removed:
            self.unlink_all(removed)
        return len(removed)

    # ------------------------------------------------------------ snapshots

    @staticmethod
    def export(snap: FlatMapSnapshot, now: int | None, ttl: int) -> Iterator[tuple[Any, ...]]:
        """``(key, namespace, user_key, value, ts)`` per user entry of a snapshot of
        ``values``, each list in its order (the flat map keeps insertion order), so
        :meth:`import_records` in this order rebuilds the same lists. With ``now``,
        entries expired then are left out. O(entries)."""
        for ukey, ctx, value, ts in snap.iter_with_timestamps(True):
            if now is None or not expired(ts, ttl, now):
                key, ns = split_ctx(ctx)
                yield key, ns, ukey, (None if value is NONE_VALUE else value), ts

    def import_records(self, records: Iterable[tuple[Any, ...]], copy: Callable[[Any], Any]) -> None:
        """Add exported records (a restore), values copied with ``copy``. A user key
        already present takes the record's value and keeps its place. O(records)."""
        values = self.values
        for key, ns, ukey, value, ts in records:
            ctx = make_ctx(key, ns)
            if values.put(ukey, ctx, NONE_VALUE if value is None else copy(value), ts):
                self.link(ctx, ukey)

    # ------------------------------------------------------------ invariant

    def _check(self) -> None:
        """Assert the invariant of the module docstring. O(entries); for tests.

        Per ``(key, namespace)``: ``count`` entries reachable from ``head``, each
        one's ``prev`` the one before, ``tail`` the last, each in ``values`` with
        a stored (never None) value. Overall: ``links`` and ``values`` hold the
        same ``(user_key, ctx)`` pairs, every one reached from a directory entry,
        and each list's order is the order ``values`` keeps for snapshots.
        """
        values, links = self.values, self.links
        order: dict[Any, list[Any]] = {}
        reached = 0
        for key, ns, dc in self.dirs:
            count, head, tail = dc
            assert count >= 1, f"empty list kept for {(key, ns)!r}"
            ctx = make_ctx(key, ns)
            walked: list[Any] = []
            prev, ukey = None, head
            while ukey is not None:
                assert len(walked) < count, f"list of {(key, ns)!r} longer than its count {count}"
                lk = links.get(ukey, ctx)
                assert lk is not None, f"{ukey!r} of {(key, ns)!r} is linked but has no links"
                assert lk[0] == prev, f"{ukey!r} of {(key, ns)!r}: prev {lk[0]!r}, expected {prev!r}"
                assert values.contains_key(ukey, ctx), f"{ukey!r} of {(key, ns)!r} is linked but has no value"
                walked.append(ukey)
                prev, ukey = ukey, lk[1]
            assert len(walked) == count, f"list of {(key, ns)!r} has {len(walked)} entries, count {count}"
            assert prev == tail, f"tail of {(key, ns)!r} is {tail!r}, the list ends at {prev!r}"
            order[ctx] = walked
            reached += count
        assert reached == len(links), f"{len(links) - reached} links not reached from any directory entry"
        in_values: dict[Any, list[Any]] = {}
        with values.snapshot() as snap:
            for ukey, ctx, value, _ in snap.iter_with_timestamps(True):
                assert value is not None, f"{ukey!r} stored as None (a None value is NONE_VALUE)"
                assert links.contains_key(ukey, ctx), f"{ukey!r} of {split_ctx(ctx)!r} has a value but no links"
                in_values.setdefault(ctx, []).append(ukey)
        assert in_values == order, "a list's order differs from the order values keeps"
