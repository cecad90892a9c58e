"""``ListState``: a list of values per key and namespace.

Without TTL the core entry holds a plain Python list. With TTL each element
carries its own timestamp: the list is stored flat, ``[v0, ts0, v1, ts1, ...]``,
and the core entry's timestamp is the newest element's, so the C sweep drops a
list whose elements have all expired; with background cleanup, an append drops
the expired head of a list half expired (a list appended to for ever never
wholly expires). As in Flink, a read keeps the expired elements of a partly
live list (they stay visible under ``ReturnExpiredIfNotCleanedUp``) unless
``OnReadAndWrite`` rewrites it.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

from cowmap import _core
from cowmap._core import StateMapSnapshot
from cowmap.state.async_methods import AsyncListMethods
from cowmap.state.table import State, StateTable
from cowmap.state.ttl import expired

__all__ = ["ListState", "ListTable"]


class ListState(AsyncListMethods, State):
    """A list of values per key and namespace (Flink's ``ListState``).

    ``get()`` returns a new list (``[]`` when empty); None elements are rejected
    with ``ValueError``; ``update([])`` clears.
    """

    __slots__ = ()

    # compiled (cowmap._core): get() gives the current key's elements, oldest first
    # (a new list; [] when there are none)
    get = _core.list_state_get
    # compiled (cowmap._core): append a value (not None) to the current key's list
    add = _core.list_state_add

    # compiled (cowmap._core): add_all(values) appends every element of values (none of
    # them None); update(values) replaces the list with them ([] clears it)
    add_all = _core.list_state_add_all
    update = _core.list_state_update

    # -- columnar twins: a column of keys instead of set_current_key per record

    def get_many(self, keys: Any, *, namespace: Any = None) -> list[list[Any]]:
        """``get()`` of every key of the column ``keys``, in order (a list of
        lists), without changing the current key. ``namespace``: the view's
        current one when None. O(len(keys) + the elements read)."""
        ks, kgs, ns = self._column(keys, namespace)
        return self._each_row(ks, kgs, ns, lambda i: self.get())

    def add_many(self, keys: Any, values: Any, *, namespace: Any = None) -> None:
        """``add(v)`` for every row of the columns ``keys`` and ``values``, in
        order, without changing the current key. ``ValueError`` for a None value
        or columns of different lengths, before anything is written.
        O(len(keys))."""
        from cowmap.state.columns import value_list

        ks, kgs, ns = self._column(keys, namespace)
        vs = value_list(values, len(kgs))
        for i, v in enumerate(vs):
            if v is None:
                raise ValueError(f"values[{i}] is None: a ListState cannot hold None; nothing was written")
        self._each_row(ks, kgs, ns, lambda i: self.add(vs[i]))

    def merge_namespaces(self, target: Any, sources: Iterable[Any]) -> None:
        """Append the lists of ``sources`` (removed) to the list of ``target``,
        elements keeping their timestamps (Flink's ``mergeNamespaces``).

        A target among the sources has its own list merged at its place there;
        a namespace given twice counts once. All arguments are checked before
        anything changes: TypeError for a target or source that is None or
        unhashable or ``sources`` that is no iterable of namespaces,
        RuntimeError without a current key. O(elements merged; with TTL also
        the target's elements, for its newest timestamp).
        """
        srcs = self._merge_sources(target, sources)
        m = self._current_map()
        if m is None or not srcs:
            return
        key = self._kc.key
        merged: list[Any] = []
        for src in srcs:
            lst = m.get(key, src)
            if lst:
                merged.extend(lst)
        # nothing below runs user code: remove and write
        for src in srcs:
            m.remove(key, src)
        if not merged:
            return
        lst = None if target in srcs else m.get(key, target)
        ttl = self._t.ttl
        if lst is None:
            if ttl:
                m.put(key, target, merged, max(merged[1::2]))
            else:
                m.put(key, target, merged)
        else:
            lst.extend(merged)
            if ttl:
                m.set_timestamp(key, target, max(lst[1::2]))


class ListTable(StateTable):
    kind = "list"
    view_class = ListState

    def copy_state(self, state: list[Any]) -> list[Any]:
        copy = self.copy_value
        if not self.ttl:
            return [copy(v) for v in state]
        out = state.copy()  # [v0, ts0, v1, ts1, ...]: copy the values only
        out[0::2] = [copy(v) for v in state[0::2]]
        return out

    def export(self, snap: StateMapSnapshot, now: int | None, ttl: int) -> Iterator[tuple[Any, ...]]:
        """``(key, namespace, values, timestamps)``; timestamps None without TTL
        (``ttl``: the state's TTL when the snapshot was taken, which fixes the stored form)."""
        for key, ns, lst, _ in snap.iter_with_timestamps():
            if not ttl:
                yield key, ns, list(lst), None
                continue
            values, stamps = lst[0::2], lst[1::2]
            if now is not None:
                # Flink's list snapshot filter stops at the first live element
                # (STOP_ON_FIRST_INCLUDED): only expired elements before it go
                first = next((i for i, ts in enumerate(stamps) if not expired(ts, ttl, now)), None)
                if first is None:
                    continue
                values, stamps = values[first:], stamps[first:]
            yield key, ns, values, stamps

    def import_records(self, kg: int, records: Iterator[tuple[Any, ...]]) -> None:
        m = self.map_for_write(kg)
        ttl = self.ttl
        copy = self.copy_value
        # the records have timestamps exactly when this state has TTL: restore
        # refuses a snapshot whose TTL setting differs
        for key, ns, values, stamps in records:
            if not values:
                continue
            values = [copy(v) for v in values]
            old = m.get(key, ns)
            if ttl:
                flat = [x for v, ts in zip(values, stamps) for x in (v, ts)]
                if old is not None:
                    flat = old + flat
                m.put(key, ns, flat, max(flat[1::2]))
            else:
                m.put(key, ns, (old or []) + list(values))
