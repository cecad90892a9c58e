"""``MapState``: a map of user keys to values per key and namespace, O(1) per entry.

Flink's heap backend stores a whole ``HashMap`` per key, so a TTL cleanup visit
or the first write after a snapshot copies the whole user map. Here every user
entry is its own entry of the key group's ``FlatStateMap``, keyed by
``(user_key, ctx)`` where ``ctx`` is the key (or ``(key, namespace, marker)``
outside the void namespace), holding the value itself and its own timestamp: a
``get`` or ``put`` is one lookup, one cache miss in a map far bigger than the
caches (the entries sit in the open-addressed table itself).
For iteration and ``clear()`` a second map holds each entry's links, a tuple
``(prev_user_key, next_user_key)`` (immutable, so no copier; and a tuple of
untracked objects, such as int or str user keys, drops out of the garbage
collector's view at its first collection, so millions of entries add nothing
to a full collection), and a directory entry per ``(key, namespace)``
holds ``[count, head, tail]``: a doubly-linked list in insertion order.
Copy-on-write, C sweeps and snapshots then work per entry (the flat map copies
a page of 256 entries on the first write to it after a snapshot, whatever the
number of entries per key): a read, a write, a cleanup step and the first write
after a snapshot each cost O(1) amortised."""

from __future__ import annotations

from typing import Any, Iterable, Iterator, Mapping

from cowmap._requests import map_contexts, positions, replace_all, request_args, request_columns
from cowmap._core import (
    EXPIRED,
    NO_TIMESTAMP,
    CopyOnWriteStateMap,
    FlatMapSnapshot,
    FlatStateMap,
    multi_get,
    multi_replace,
)
from cowmap.state.async_methods import AsyncMapMethods
from cowmap.state.table import VOID_NAMESPACE, State, StateTable
from cowmap.state.ttl import expired

__all__ = ["MapState", "MapTable"]

_NO_KEY = object()
_NONE = object()  # stands for a None value: a None state reads as "absent"
_NS = object()  # marks a namespaced context; no user key can hold it
#: at most this many times ``cleanup_size`` user entries are examined per cleanup step
_SWEEP_SCALE_CAP = 4


def make_ctx(key: Any, ns: Any) -> Any:
    """The core namespace of a key's user entries: the key itself in the void
    namespace (no tuple to build, hash or follow), else ``(key, ns, _NS)``."""
    return key if ns is VOID_NAMESPACE else (key, ns, _NS)


def split_ctx(ctx: Any) -> tuple[Any, Any]:
    if type(ctx) is tuple and len(ctx) == 3 and ctx[2] is _NS:
        return ctx[0], ctx[1]
    return ctx, VOID_NAMESPACE


class MapTable(StateTable):
    kind = "map"

    def __init__(self, backend: Any, descriptor: Any) -> None:
        self.links: list[CopyOnWriteStateMap | None] = [None] * backend.max_parallelism
        self.dirs: list[CopyOnWriteStateMap | None] = [None] * backend.max_parallelism
        super().__init__(backend, descriptor)

    def copy_state(self, value: Any) -> Any:
        return value if value is _NONE else self.copy_value(value)

    def new_map(self) -> FlatStateMap:  # type: ignore[override]
        # user entries are read one at a time from maps that outgrow the caches:
        # the flat map's lookup costs one cache miss where the chained map's costs two
        return FlatStateMap(copier=self.copy_state)

    def map_for_write(self, kg: int) -> FlatStateMap:  # type: ignore[override]
        m = self.maps[kg]
        if m is None:
            self.links[kg] = CopyOnWriteStateMap()
            self.dirs[kg] = CopyOnWriteStateMap(copier=list.copy)
            m = super().map_for_write(kg)
        return m

    def num_entries(self) -> int:
        return sum(len(self.dirs[kg]) for kg in self.live)  # type: ignore[arg-type]

    def keys(self, namespace: Any) -> list[Any]:
        return [key for kg in self.live for key, ns, _ in self.dirs[kg] if ns == namespace]  # type: ignore[union-attr]

    # ------------------------------------------------------------ the linked list

    def insert(self, kg: int, ctx: Any, ukey: Any, value: Any, ts: int) -> None:
        """Add a user entry that is not there yet, at the tail."""
        self.maps[kg].put(ukey, ctx, _NONE if value is None else value, ts)  # type: ignore[union-attr]
        self.link(kg, ctx, ukey)

    def link(self, kg: int, ctx: Any, ukey: Any) -> None:
        """Link a user entry just added to the value map at the tail of its list."""
        L = self.links[kg]
        d = self.dirs[kg]
        key, ns = split_ctx(ctx)
        dc = d.get(key, ns)  # type: ignore[union-attr]
        if dc is None:
            L.put(ukey, ctx, (None, None))  # type: ignore[union-attr]
            d.put(key, ns, [1, ukey, ukey])  # type: ignore[union-attr]
            return
        tail = dc[2]
        L.put(ukey, ctx, (tail, None))  # type: ignore[union-attr]
        L.put(tail, ctx, (L.get(tail, ctx)[0], ukey))  # type: ignore[union-attr,index]
        dc[0] += 1
        dc[2] = ukey

    def unlink(self, kg: int, ctx: Any, ukey: Any, gone: dict | None = None) -> None:
        """Unlink a user entry already removed from the value map. ``gone``:
        links of entries removed with it, ``(user_key, ctx) -> (prev, next)``."""
        L = self.links[kg]
        d = self.dirs[kg]
        lk = gone[ukey, ctx] if gone else L.remove_and_get_old(ukey, ctx)  # type: ignore[union-attr]
        key, ns = split_ctx(ctx)
        dc = d.get(key, ns)  # type: ignore[union-attr]
        if dc[0] <= 1:
            d.remove(key, ns)  # type: ignore[union-attr]
            return
        dc[0] -= 1
        p, n = lk
        if gone:
            while p is not None and (p, ctx) in gone:
                p = gone[p, ctx][0]
            while n is not None and (n, ctx) in gone:
                n = gone[n, ctx][1]
        if p is None:
            dc[1] = n
        else:
            L.put(p, ctx, (L.get(p, ctx)[0], n))  # type: ignore[union-attr,index]
        if n is None:
            dc[2] = p
        else:
            L.put(n, ctx, (p, L.get(n, ctx)[1]))  # type: ignore[union-attr,index]

    def remove_entry(self, kg: int, ctx: Any, ukey: Any) -> None:
        if self.maps[kg].contains_key(ukey, ctx):  # type: ignore[union-attr]
            self.maps[kg].remove(ukey, ctx)  # type: ignore[union-attr]
            self.unlink(kg, ctx, ukey)

    # ------------------------------------------------------------ TTL, snapshots

    def sweep(self, kg: int, now: int, max_entries: int | None) -> int:
        e = self.maps[kg]
        if max_entries is not None:
            # Flink's budget counts whole user maps; ours counts user entries, so
            # scale it by the mean entries per map, capped to keep a step O(1)
            n_dirs = len(self.dirs[kg])  # type: ignore[arg-type]
            if n_dirs:
                max_entries *= min(max(len(e) // n_dirs, 1), _SWEEP_SCALE_CAP)  # type: ignore[arg-type]
        removed: list[tuple[Any, Any, Any]] = []
        e.sweep_expired(now, self.ttl, max_entries, removed)  # type: ignore[union-attr]
        if len(removed) == 1:
            ukey, ctx, _ = removed[0]
            self.unlink(kg, ctx, ukey)
        elif removed:
            L = self.links[kg]
            gone = {(ukey, ctx): L.remove_and_get_old(ukey, ctx) for ukey, ctx, _ in removed}  # type: ignore[union-attr]
            for ukey, ctx, _ in removed:
                self.unlink(kg, ctx, ukey, gone)
        return len(removed)

    def export(self, snap: FlatMapSnapshot, now: int | None, ttl: int) -> Iterator[tuple[Any, ...]]:
        """``(key, namespace, user_key, value, ts)`` per user entry, in the order
        the entries were added (each key's list order), so a restore that links
        them in this order rebuilds the same lists."""
        for ukey, ctx, value, ts in snap.iter_with_timestamps(True):
            if now is None or not expired(ts, ttl, now):
                key, ns = split_ctx(ctx)
                yield key, ns, ukey, (None if value is _NONE else value), ts

    def import_records(self, kg: int, records: Iterator[tuple[Any, ...]]) -> None:
        e = self.map_for_write(kg)
        copy = self.copy_value
        for key, ns, ukey, value, ts in records:
            ctx = make_ctx(key, ns)
            if e.put(ukey, ctx, _NONE if value is None else copy(value), ts):
                self.link(kg, ctx, ukey)


class MapState(AsyncMapMethods, State):
    """A map of user keys to values per key and namespace (Flink's ``MapState``).

    User keys are hashable and not None. Iteration (``items``, ``keys``,
    ``values``, ``iter``) is in insertion order and returns a list made at the
    call, so the state may be changed while looping over it.
    """

    # the core namespace of the current key and namespace, cached for the key
    # object it was made for (held, so its identity cannot be reused meanwhile)
    __slots__ = ("_c", "_c_key")

    def __init__(self, table: StateTable) -> None:
        super().__init__(table)
        self._c: Any = None
        self._c_key: Any = _NO_KEY

    def set_current_namespace(self, namespace: Any) -> None:
        super().set_current_namespace(namespace)
        self._c_key = _NO_KEY

    def _ctx(self) -> Any:
        key = self._b._key
        if self._c_key is not key:
            self._c = make_ctx(key, self._ns)
            self._c_key = key
        return self._c

    def _kg(self) -> int:
        kg = self._b._kg
        if kg is None:
            raise self._no_key()
        t = self._t
        if t.cleanup_size:
            t.ticks -= 1
            if t.ticks <= 0:
                t.run_cleanup()
        return kg

    def _lookup(self, ukey: Any) -> Any:
        """The value of ``ukey`` after the TTL check (``_NO_KEY`` when absent or hidden)."""
        t = self._t
        b = self._b
        kg = b._kg
        if kg is None:
            raise self._no_key()
        e = t.maps[kg]
        if e is not None:
            ctx = self._c if self._c_key is b._key else self._ctx()
            e.prefetch(ukey, ctx)  # the bucket's miss overlaps the cleanup step and the clock
        if t.cleanup_size:
            t.ticks -= 1
            if t.ticks <= 0:
                t.run_cleanup()
        if e is None:
            return _NO_KEY
        if not t.ttl:
            v = e.get(ukey, ctx)
        else:
            v = e.get_unexpired(ukey, ctx, b._time, t.ttl, t.update_on_read)
            if v is EXPIRED:
                v = e.remove_and_get_old(ukey, ctx)
                t.unlink(kg, ctx, ukey)  # type: ignore[attr-defined]
                if not t.return_expired:
                    return _NO_KEY
        if v is None:
            return _NO_KEY
        return None if v is _NONE else v

    def get(self, key: Any) -> Any:
        """The value of user key ``key``, or None."""
        v = self._lookup(key)
        return None if v is _NO_KEY else v

    def contains(self, key: Any) -> bool:
        return self._lookup(key) is not _NO_KEY

    def put(self, key: Any, value: Any) -> None:
        t = self._t
        b = self._b
        kg = b._kg
        if kg is None:
            raise self._no_key()
        if key is None:
            raise TypeError("MapState user keys must not be None")
        e = t.maps[kg]
        if e is None:
            e = t.map_for_write(kg)
        ctx = self._c if self._c_key is b._key else self._ctx()
        e.prefetch(key, ctx)  # the bucket's miss overlaps the cleanup step and the clock
        if t.cleanup_size:
            t.ticks -= 1
            if t.ticks <= 0:
                t.run_cleanup()
        # one lookup, the clock read inside it; a new user key still needs linking
        if e.put(key, ctx, _NONE if value is None else value, b._time if t.ttl else NO_TIMESTAMP):
            t.link(kg, ctx, key)  # type: ignore[attr-defined]

    def _put(self, kg: int, e: FlatStateMap, ukey: Any, value: Any, ts: int) -> None:
        if ukey is None:
            raise TypeError("MapState user keys must not be None")
        ctx = self._ctx()
        if e.put(ukey, ctx, _NONE if value is None else value, ts):
            self._t.link(kg, ctx, ukey)  # type: ignore[attr-defined]

    def put_all(self, entries: Mapping[Any, Any] | Iterable[tuple[Any, Any]]) -> None:
        kg = self._kg()
        t = self._t
        if entries is None:
            return
        items = entries.items() if isinstance(entries, Mapping) else entries
        e = t.maps[kg]
        if e is None:
            e = t.map_for_write(kg)
        ts = self._b.now() if t.ttl else NO_TIMESTAMP
        for ukey, value in items:
            self._put(kg, e, ukey, value, ts)

    def remove(self, key: Any) -> None:
        kg = self._kg()
        if self._t.maps[kg] is not None:
            self._t.remove_entry(kg, self._ctx(), key)  # type: ignore[attr-defined]

    def _walk(self, kg: int) -> list[tuple[Any, Any]]:
        t = self._t
        e = t.maps[kg]
        if e is None:
            return []
        ctx = self._ctx()
        dc = t.dirs[kg].get(self._b._key, self._ns)  # type: ignore[attr-defined]
        if dc is None:
            return []
        L = t.links[kg]  # type: ignore[attr-defined]
        out: list[tuple[Any, Any]] = []
        ukey = dc[1]
        if not t.ttl:
            while ukey is not None:
                v = e.get(ukey, ctx)
                out.append((ukey, None if v is _NONE else v))
                ukey = L.get(ukey, ctx)[1]
            return out
        now = self._b._time()
        while ukey is not None:
            nxt = L.get(ukey, ctx)[1]
            v = e.get_unexpired(ukey, ctx, now, t.ttl, t.update_on_read)
            if v is EXPIRED:
                v = e.remove_and_get_old(ukey, ctx)
                t.unlink(kg, ctx, ukey)
                if t.return_expired:
                    out.append((ukey, None if v is _NONE else v))
            else:
                out.append((ukey, None if v is _NONE else v))
            ukey = nxt
        return out

    def items(self) -> list[tuple[Any, Any]]:
        """``(user_key, value)`` pairs, in insertion order."""
        return self._walk(self._kg())

    def entries(self) -> list[tuple[Any, Any]]:
        return self.items()

    def keys(self) -> list[Any]:
        return [k for k, _ in self._walk(self._kg())]

    def values(self) -> list[Any]:
        return [v for _, v in self._walk(self._kg())]

    def is_empty(self) -> bool:
        """Whether no user entry is stored. As in Flink 2.3 this does not look at
        timestamps: entries that expired but were not cleaned up yet count."""
        kg = self._kg()
        d = self._t.dirs[kg]  # type: ignore[attr-defined]
        return d is None or not d.contains_key(self._b._key, self._ns)

    def clear(self) -> None:
        t = self._t
        kg = self._b._kg
        if kg is None:
            raise self._no_key()
        e = t.maps[kg]
        if e is not None:
            ctx = self._ctx()
            dc = t.dirs[kg].remove_and_get_old(self._b._key, self._ns)  # type: ignore[attr-defined]
            L = t.links[kg]  # type: ignore[attr-defined]
            ukey = dc[1] if dc is not None else None
            while ukey is not None:
                e.remove(ukey, ctx)
                ukey = L.remove_and_get_old(ukey, ctx)[1]
        if t.cleanup_size:
            t.cleanup_step()

    # -- vectorised forms for the AsyncExecutionController: one core call per batch

    def _batch_get(self, reqs: list[Any]) -> list[Any]:
        t = self._t
        kgs, keys, nss = request_columns(reqs)
        ukeys = request_args(reqs, 0)
        ctxs = map_contexts(keys, nss, VOID_NAMESPACE, _NS)
        if t.cleanup_size:
            t.tick(len(reqs))
        if not t.ttl:
            out = multi_get(t.maps, kgs, ukeys, ctxs)
        else:
            out = multi_get(t.maps, kgs, ukeys, ctxs, self._b._time, t.ttl, t.update_on_read)
            for i in positions(out, EXPIRED):
                v = t.maps[kgs[i]].remove_and_get_old(ukeys[i], ctxs[i])  # type: ignore[union-attr]
                t.unlink(kgs[i], ctxs[i], ukeys[i])  # type: ignore[attr-defined]
                out[i] = v if t.return_expired else None
        return replace_all(out, _NONE, None)  # type: ignore[no-any-return]

    def _batch_put(self, reqs: list[Any]) -> list[Any] | None:
        ukeys = request_args(reqs, 0)
        if positions(ukeys, None):
            return None  # let the requests fail one by one
        t = self._t
        kgs, keys, nss = request_columns(reqs)
        t.prepare_batch_write(kgs)
        ctxs = map_contexts(keys, nss, VOID_NAMESPACE, _NS)
        values = request_args(reqs, 1)
        ts = self._b._time() if t.ttl else NO_TIMESTAMP
        done = multi_replace(t.maps, kgs, ukeys, ctxs, replace_all(values.copy(), None, _NONE), ts)
        for i in positions(done, False):  # new user keys: insert and link them
            t.insert(kgs[i], ctxs[i], ukeys[i], values[i], ts)  # type: ignore[attr-defined]
        return [None] * len(reqs)

    __getitem__ = get
    __setitem__ = put
    __delitem__ = remove
    __contains__ = contains

    def __iter__(self) -> Iterator[Any]:
        return iter(self.keys())


MapTable.view_class = MapState
