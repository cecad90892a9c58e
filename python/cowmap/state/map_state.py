"""``MapState``: a map of user keys to values per key and namespace, O(1) per entry.

Flink's heap backend stores a whole ``HashMap`` per key, so a TTL cleanup visit
or the first write after a snapshot copies the whole user map. Here every user
entry is its own core entry, keyed by ``(user_key, (key, namespace))``, with its
own timestamp; a small directory entry per ``(key, namespace)`` holds
``[count, head, tail]`` of a doubly-linked list threaded through the entries'
cells ``[value, prev_user_key, next_user_key]`` for iteration and ``clear()``.
Copy-on-write, C sweeps and snapshots then work per entry: a read, a write, a
cleanup step and the first write after a snapshot each touch O(1) cells.
"""

from __future__ import annotations

from typing import Any, Iterable, Iterator, Mapping

from cowmap._core import EXPIRED, NO_TIMESTAMP, CopyOnWriteStateMap, StateMapSnapshot
from cowmap.state.table import State, StateTable

__all__ = ["MapState", "MapTable"]

_NO_KEY = object()
#: at most this many times ``cleanup_size`` user entries are examined per cleanup step
_SWEEP_SCALE_CAP = 4


class MapTable(StateTable):
    kind = "map"

    def __init__(self, backend: Any, descriptor: Any) -> None:
        self.dirs: list[CopyOnWriteStateMap | None] = [None] * backend.max_parallelism
        super().__init__(backend, descriptor)

    def copy_state(self, cell: list[Any]) -> list[Any]:
        return [self.copy_value(cell[0]), cell[1], cell[2]]

    def map_for_write(self, kg: int) -> CopyOnWriteStateMap:
        m = self.maps[kg]
        if m is None:
            self.dirs[kg] = CopyOnWriteStateMap(copier=list.copy)
            m = super().map_for_write(kg)
        return m

    def num_entries(self) -> int:
        return sum(len(self.dirs[kg]) for kg in self.live)  # type: ignore[arg-type]

    def keys(self, namespace: Any) -> Iterator[Any]:
        for kg in self.live:
            for key, ns, _ in self.dirs[kg]:  # type: ignore[union-attr]
                if ns == namespace:
                    yield key

    # ------------------------------------------------------------ the linked list

    def insert(self, kg: int, ctx: tuple[Any, Any], ukey: Any, value: Any, ts: int) -> None:
        """Add a user entry that is not there yet, at the tail."""
        e = self.maps[kg]
        d = self.dirs[kg]
        key, ns = ctx
        dc = d.get(key, ns)  # type: ignore[union-attr]
        if dc is None:
            e.put(ukey, ctx, [value, None, None], ts)  # type: ignore[union-attr]
            d.put(key, ns, [1, ukey, ukey])  # type: ignore[union-attr]
            return
        tail = dc[2]
        e.put(ukey, ctx, [value, tail, None], ts)  # type: ignore[union-attr]
        e.get(tail, ctx)[2] = ukey  # type: ignore[union-attr,index]
        dc[0] += 1
        dc[2] = ukey

    def unlink(self, kg: int, ctx: tuple[Any, Any], cell: list[Any], gone: dict | None = None) -> None:
        """Fix the links around a user entry already removed from the core map.
        ``gone``: other entries removed with it, ``(user_key, ctx) -> cell``."""
        e = self.maps[kg]
        d = self.dirs[kg]
        key, ns = ctx
        dc = d.get(key, ns)  # type: ignore[union-attr]
        if dc[0] <= 1:
            d.remove(key, ns)  # type: ignore[union-attr]
            return
        dc[0] -= 1
        p, n = cell[1], cell[2]
        if gone:
            while p is not None and (p, ctx) in gone:
                p = gone[p, ctx][1]
            while n is not None and (n, ctx) in gone:
                n = gone[n, ctx][2]
        if p is None:
            dc[1] = n
        else:
            e.get(p, ctx)[2] = n  # type: ignore[union-attr,index]
        if n is None:
            dc[2] = p
        else:
            e.get(n, ctx)[1] = p  # type: ignore[union-attr,index]

    def remove_entry(self, kg: int, ctx: tuple[Any, Any], ukey: Any) -> None:
        cell = self.maps[kg].remove_and_get_old(ukey, ctx)  # type: ignore[union-attr]
        if cell is not None:
            self.unlink(kg, ctx, cell)

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
            ukey, ctx, cell = removed[0]
            self.unlink(kg, ctx, cell)
        elif removed:
            gone = {(ukey, ctx): cell for ukey, ctx, cell in removed}
            for ukey, ctx, cell in removed:
                self.unlink(kg, ctx, cell, gone)
        return len(removed)

    def export(self, snap: StateMapSnapshot, now: int | None) -> Iterator[tuple[Any, ...]]:
        """``(key, namespace, user_key, value, ts)`` per user entry."""
        for ukey, ctx, cell, ts in snap.iter_with_timestamps():
            if now is None or not self.is_expired(ts, now):
                yield ctx[0], ctx[1], ukey, cell[0], ts

    def import_records(self, kg: int, records: Iterator[tuple[Any, ...]]) -> None:
        e = self.map_for_write(kg)
        for key, ns, ukey, value, ts in records:
            ctx = (key, ns)
            cell = e.get(ukey, ctx)
            if cell is None:
                self.insert(kg, ctx, ukey, value, ts)
            else:
                cell[0] = value
                e.set_timestamp(ukey, ctx, ts)


class MapState(State):
    """A map of user keys to values per key and namespace (Flink's ``MapState``).

    User keys are hashable and not None. Iteration (``items``, ``keys``,
    ``values``, ``iter``) is in insertion order and returns a list made at the
    call, so the state may be changed while looping over it.
    """

    __slots__ = ("_c", "_epoch")

    def __init__(self, table: StateTable) -> None:
        super().__init__(table)
        self._c: tuple[Any, Any] = (None, None)
        self._epoch = -1

    def set_current_namespace(self, namespace: Any) -> None:
        super().set_current_namespace(namespace)
        self._epoch = -1

    def _ctx(self) -> tuple[Any, Any]:
        b = self._b
        if self._epoch != b._epoch:
            self._c = (b._key, self._ns)
            self._epoch = b._epoch
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
        if t.cleanup_size:
            t.ticks -= 1
            if t.ticks <= 0:
                t.run_cleanup()
        e = t.maps[kg]
        if e is None:
            return _NO_KEY
        ctx = self._c if self._epoch == b._epoch else self._ctx()
        if not t.ttl:
            cell = e.get(ukey, ctx)
            return _NO_KEY if cell is None else cell[0]
        cell = e.get_unexpired(ukey, ctx, b._time(), t.ttl, t.update_on_read)
        if cell is None:
            return _NO_KEY
        if cell is EXPIRED:
            cell = e.remove_and_get_old(ukey, ctx)
            t.unlink(kg, ctx, cell)  # type: ignore[attr-defined]
            return cell[0] if t.return_expired else _NO_KEY
        return cell[0]

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
        if t.cleanup_size:
            t.ticks -= 1
            if t.ticks <= 0:
                t.run_cleanup()
        e = t.maps[kg]
        if e is None:
            e = t.map_for_write(kg)
        if key is None:
            raise TypeError("MapState user keys must not be None")
        ctx = self._c if self._epoch == b._epoch else self._ctx()
        if t.ttl:
            ts = b._time()
            cell = e.get_touch(key, ctx, ts)
        else:
            ts = NO_TIMESTAMP
            cell = e.get(key, ctx)
        if cell is None:
            t.insert(kg, ctx, key, value, ts)  # type: ignore[attr-defined]
        else:
            cell[0] = value

    def _put(self, kg: int, e: CopyOnWriteStateMap, ukey: Any, value: Any, ts: int) -> None:
        if ukey is None:
            raise TypeError("MapState user keys must not be None")
        ctx = self._ctx()
        cell = e.get(ukey, ctx) if ts == NO_TIMESTAMP else e.get_touch(ukey, ctx, ts)
        if cell is None:
            self._t.insert(kg, ctx, ukey, value, ts)  # type: ignore[attr-defined]
        else:
            cell[0] = value

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
        key, ns = ctx = self._ctx()
        dc = t.dirs[kg].get(key, ns)  # type: ignore[attr-defined]
        if dc is None:
            return []
        out: list[tuple[Any, Any]] = []
        ukey = dc[1]
        if not t.ttl:
            while ukey is not None:
                cell = e.get(ukey, ctx)
                out.append((ukey, cell[0]))
                ukey = cell[2]
            return out
        now = self._b.now()
        while ukey is not None:
            cell, ts = e.get_with_timestamp(ukey, ctx)
            nxt = cell[2]
            if t.is_expired(ts, now):
                e.remove(ukey, ctx)
                t.unlink(kg, ctx, cell)
                if t.return_expired:
                    out.append((ukey, cell[0]))
            else:
                if t.update_on_read:
                    e.set_timestamp(ukey, ctx, now)
                out.append((ukey, cell[0]))
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
            key, ns = ctx = self._ctx()
            d = t.dirs[kg]  # type: ignore[attr-defined]
            dc = d.remove_and_get_old(key, ns)
            ukey = dc[1] if dc is not None else None
            while ukey is not None:
                cell = e.remove_and_get_old(ukey, ctx)
                ukey = cell[2]
        if t.cleanup_size:
            t.cleanup_step()

    __getitem__ = get
    __setitem__ = put
    __delitem__ = remove
    __contains__ = contains

    def __iter__(self) -> Iterator[Any]:
        return iter(self.keys())


MapTable.view_class = MapState
