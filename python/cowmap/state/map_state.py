"""``MapState``: a map of user keys to values per key and namespace, O(1) per entry.

Each user entry is its own entry of its key group's core map, with its own
timestamp (see :mod:`cowmap.state.user_map`, which owns a key group's maps
and the insertion-order lists over them). ``MapTable`` is the state's storage:
one ``KeyGroupUserMap`` per key group. ``MapState`` is the view: its get, put
and contains go straight to the key group's value map, one core lookup each,
and only a new or expired user key costs a call into the user map.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from typing import Any

from cowmap import _core
from cowmap._core import (
    EXPIRED,
    NO_TIMESTAMP,
    FlatStateMap,
    flat_column_lookup,
    multi_get,
    multi_replace,
    user_insert_many,
)
from cowmap._requests import map_contexts, positions, replace_all, request_args, request_columns
from cowmap.state.async_methods import AsyncMapMethods
from cowmap.state.table import VOID_NAMESPACE, State, StateTable
from cowmap.state.user_map import NONE_VALUE, NS_MARKER, KeyGroupUserMap

__all__ = ["MapState", "MapTable"]

#: What ``MapState._lookup`` returns for a user key that is absent or hidden (expired).
_ABSENT = object()
_NAN_USER_KEY = (
    "MapState user keys must not be NaN: a NaN equals no other NaN in Python, so its entry could never be found again"
)


class MapTable(StateTable):
    """A map state's storage: one :class:`KeyGroupUserMap` per key group.

    ``users[kg]`` owns the key group's maps; ``maps[kg]`` (the base class's
    list) is the same key group's value map, ``users[kg].values``, kept as a
    list of its own because the batch calls (``multi_get``, ``multi_replace``)
    take one list of maps indexed by key group, and snapshots and the cleanup
    rotation read it as for every other state.
    """

    kind = "map"

    def __init__(self, backend: Any, descriptor: Any) -> None:
        self.users: list[KeyGroupUserMap | None] = [None] * backend.max_parallelism
        super().__init__(backend, descriptor)

    def copy_state(self, value: Any) -> Any:
        return value if value is NONE_VALUE else self.copy_value(value)

    def map_for_write(self, kg: int, expected: int = 0) -> FlatStateMap:  # type: ignore[override]
        """The value map of key group ``kg``, its user map made if need be. O(1)."""
        m = self.maps[kg]
        if m is None:
            u = self.users[kg] = KeyGroupUserMap(self.copier)
            m = self.maps[kg] = u.values
            self.live.append(kg)
        return m

    def num_entries(self) -> int:
        """The number of (key, namespace) with a user entry. O(key groups)."""
        return sum(u.num_keys() for kg in self.live if (u := self.users[kg]) is not None)

    def keys(self, namespace: Any) -> list[Any]:
        return [key for kg in self.live for key in self.users[kg].keys(namespace)]  # type: ignore[union-attr]

    def sweep(self, kg: int, now: int, max_entries: int | None) -> int:
        return self.users[kg].sweep(now, self.ttl, max_entries)  # type: ignore[union-attr]

    def export(self, snap: Any, now: int | None, ttl: int) -> Iterator[tuple[Any, ...]]:  # a FlatMapSnapshot
        """``(key, namespace, user_key, value, ts)`` per user entry, each key's
        entries in insertion order (see ``KeyGroupUserMap.export``)."""
        return KeyGroupUserMap.export(snap, now, ttl)

    def import_records(self, kg: int, records: Iterator[tuple[Any, ...]]) -> None:
        self.map_for_write(kg)
        self.users[kg].import_records(records, self.copy_value)  # type: ignore[union-attr]

    def _check(self) -> None:
        """Assert every key group's invariant (``KeyGroupUserMap._check``) and that
        ``maps`` mirrors ``users``. O(entries); for tests."""
        for kg, u in enumerate(self.users):
            if u is None:
                assert self.maps[kg] is None, f"key group {kg} has a value map but no user map"
            else:
                assert self.maps[kg] is u.values, f"maps[{kg}] is not users[{kg}].values"
                u._check()
        assert sorted(self.live) == [kg for kg, u in enumerate(self.users) if u is not None]


class MapState(AsyncMapMethods, State):
    """A map of user keys to values per key and namespace (Flink's ``MapState``).

    User keys are hashable and not None. Iteration (``items``, ``keys``,
    ``values``, ``iter``) is in insertion order and returns a list made at the
    call, so the state may be changed while looping over it. ``get``, ``put``,
    ``contains`` and ``remove`` cost O(1) amortised, whatever the number of
    entries per key; iteration and ``clear`` O(the key's entries).

    Not thread-safe: use from the backend's thread.
    """

    # ``_c`` (a compiled field of the view): the core namespace (``make_ctx``) of the
    # current key and namespace, cached for the key object ``_c_key`` it was made for
    # (held, so its identity cannot be reused meanwhile); ``_c_key`` None: nothing
    # cached (no key is None)
    __slots__ = ()
    _t: MapTable

    def set_current_namespace(self, namespace: Any) -> None:
        super().set_current_namespace(namespace)
        self._c_key = None

    # compiled (cowmap._core): the one place the cached core namespace is made
    _ctx = _core.map_state_ctx

    def _kg(self) -> int:
        """The current key group after one access's cleanup step."""
        kg = self._kc.key_group
        if kg is None:
            raise self._no_key()
        t = self._t
        if t.cleanup_size:
            t.cleanup_step()
        return kg

    # compiled (cowmap._core), one core lookup each: get, contains and put are the hot paths;
    # remove(key) removes user key ``key`` if present
    get = _core.map_state_get
    contains = _core.map_state_contains
    put = _core.map_state_put
    remove = _core.map_state_remove

    def put_all(self, entries: Mapping[Any, Any] | Iterable[tuple[Any, Any]]) -> None:
        """``put`` of each ``(user_key, value)``, with one timestamp. O(len(entries))."""
        kg = self._kg()
        t = self._t
        if entries is None:
            return
        items = entries.items() if isinstance(entries, Mapping) else entries
        t.map_for_write(kg)
        insert = t.users[kg].insert  # type: ignore[union-attr]
        ctx = self._ctx()
        ts = self._kc.now() if t.ttl else NO_TIMESTAMP
        for ukey, value in items:
            if ukey is None:
                raise TypeError("MapState user keys must not be None")
            if isinstance(ukey, float) and ukey != ukey:
                raise ValueError(_NAN_USER_KEY)
            insert(ctx, ukey, value, ts)

    def items(self) -> list[tuple[Any, Any]]:
        """``(user_key, value)`` pairs, in insertion order. O(the key's entries)."""
        kg = self._kg()
        t = self._t
        u = t.users[kg]
        if u is None:
            return []
        return u.walk(self._kc.key, self._ns, self._ctx(), self._kc.clock, t.ttl, t.update_on_read, t.return_expired)

    def entries(self) -> list[tuple[Any, Any]]:
        return self.items()

    def keys(self) -> list[Any]:
        """The user keys, in insertion order. O(the key's entries)."""
        return [k for k, _ in self.items()]

    def values(self) -> list[Any]:
        """The values, in insertion order. O(the key's entries)."""
        return [v for _, v in self.items()]

    def is_empty(self) -> bool:
        """Whether no user entry is stored. As in Flink 2.3 this does not look at
        timestamps: entries that expired but were not cleaned up yet count. O(1)."""
        u = self._t.users[self._kg()]
        return u is None or not u.has_entries(self._kc.key, self._ns)

    def clear(self) -> None:
        """Remove every user entry of the current key and namespace. O(its entries)."""
        t = self._t
        kg = self._kc.key_group
        if kg is None:
            raise self._no_key()
        u = t.users[kg]
        if u is not None:
            u.clear_key(self._kc.key, self._ns, self._ctx())
        if t.cleanup_size:
            t.cleanup_step()

    # -- columnar twins: columns of keys and user keys instead of set_current_key per record

    def _user_keys(self, user_keys: Any, n: int) -> list[Any]:
        """The user-key column for ``n`` rows, each checked (not None, hashable)
        before anything is written."""
        import numpy as np

        from cowmap.state.columns import value_list

        uks = value_list(user_keys, n, "user_keys")
        if getattr(getattr(user_keys, "dtype", None), "kind", "O") in "iufb":
            # numbers are hashable: only a nullable column's missing values (None here) are refused
            nones = positions(uks, None)
            if nones:
                raise TypeError(
                    f"user_keys[{nones[0]}] is None: MapState user keys must not be None; nothing was written"
                )
            if user_keys.dtype.kind == "f":
                nans = np.flatnonzero(np.isnan(np.asarray(user_keys, dtype=np.float64)))
                if len(nans):
                    raise ValueError(f"user_keys[{nans[0]}]: {_NAN_USER_KEY}; nothing was written")
            return uks
        for i, uk in enumerate(uks):
            if uk is None:
                raise TypeError(f"user_keys[{i}] is None: MapState user keys must not be None; nothing was written")
            if isinstance(uk, float) and uk != uk:
                raise ValueError(f"user_keys[{i}]: {_NAN_USER_KEY}; nothing was written")
            try:
                hash(uk)
            except TypeError:
                raise TypeError(
                    f"user_keys[{i}] must be hashable, got {type(uk).__name__} {uk!r}; nothing was written"
                ) from None
        return uks

    def _column_ctxs(self, ks: Any, ns: Any) -> tuple[list[Any], list[Any]]:
        """A checked column's keys as a list, and the core namespace of each row."""
        keys = ks.tolist() if hasattr(ks, "tolist") else list(ks)  # an int64 array, or a tuple
        if ns is VOID_NAMESPACE:
            return keys, keys
        return keys, map_contexts(keys, [ns] * len(keys), VOID_NAMESPACE, NS_MARKER)

    def _column_lookup(self, ks: Any, kgs: Any, ns: Any, uks: list[Any]) -> list[Any]:
        """``_lookup`` of every row in one multi-map call: the stored values, with
        ``_ABSENT`` where absent or hidden, TTL handled as the loop does (an
        expired entry is removed by its first row, returned once if the state
        returns expired values; a later row of it finds it absent)."""
        t = self._t
        keys, ctxs = self._column_ctxs(ks, ns)
        groups = kgs.tolist()
        if not t.ttl:
            out = multi_get(t.maps, groups, uks, ctxs)
        else:
            out = multi_get(t.maps, groups, uks, ctxs, self._kc.now(), t.ttl, t.update_on_read)
            for i in positions(out, EXPIRED):
                v = t.maps[groups[i]].remove_and_get_old(uks[i], ctxs[i])
                if v is not None:  # else an earlier row of this entry removed it
                    t.users[groups[i]].unlink(ctxs[i], uks[i])
                out[i] = v if t.return_expired else None
        replace_all(out, None, _ABSENT)
        return replace_all(out, NONE_VALUE, None)

    def get_many(
        self, keys: Any, user_keys: Any, *, namespace: Any = None, dtype: Any = None, default: Any = None
    ) -> Any:
        """``get(user_key)`` for every row of the columns ``keys`` and
        ``user_keys``, in order, without changing the current key: a list, or
        with ``dtype`` (int64 or float64) a numpy array, an absent entry reading
        as ``default`` (None: NaN for float64, ``ValueError`` for int64). One
        multi-map core call. O(len(keys))."""
        from cowmap.state.columns import check_typed, typed

        check_typed(dtype, default)
        ks, kgs, ns = self._column(keys, namespace)
        uks = self._user_keys(user_keys, len(kgs))
        out = replace_all(self._column_lookup(ks, kgs, ns, uks), _ABSENT, None)
        self._column_ticks(len(kgs))
        return typed(out, dtype, default, ks)

    def contains_many(self, keys: Any, user_keys: Any, *, namespace: Any = None) -> Any:
        """``contains(user_key)`` for every row, in order: a numpy bool array.
        Integer keys and user keys in the default namespace are looked up in
        one C pass that makes no Python object (a TTL state that refreshes on
        read excepted); other columns in one multi-map core call. O(len(keys))."""
        import numpy as np

        ks, kgs, ns = self._column(keys, namespace)
        uk = self._int_column(user_keys, len(kgs))
        t = self._t
        if uk is not None and type(ks) is np.ndarray and ns is VOID_NAMESPACE and not t.update_on_read:
            status = flat_column_lookup(t.maps, kgs, uk, ks, self._kc.now() if t.ttl else 0, t.ttl)
            found = status == 1
            rest = np.flatnonzero(status >= 2)
            if len(rest):  # expired entries (the loop removes them) and undecided rows: as the loop, in order
                out = self._column_lookup(ks[rest], kgs[rest], ns, uk[rest].tolist())
                found[rest] = [v is not _ABSENT for v in out]
        else:
            out = self._column_lookup(ks, kgs, ns, self._user_keys(user_keys, len(kgs)))
            found = np.ones(len(out), dtype=np.bool_)
            found[positions(out, _ABSENT)] = False
        self._column_ticks(len(kgs))
        return found

    @staticmethod
    def _int_column(user_keys: Any, n: int) -> Any:
        """``user_keys`` as an int64 array when it is an integer column of ``n``
        rows with no missing value, else None (the general path checks it).
        Only typed columns (numpy, pandas, pyarrow) are tried: a sequence would
        be converted here and again by the general path."""
        import numpy as np

        from cowmap.state.columns import value_column

        if not hasattr(user_keys, "dtype") and not type(user_keys).__module__.startswith("pyarrow"):
            return None
        try:
            col = value_column(user_keys, n, "user_keys")
        except (TypeError, ValueError):
            return None
        return col if type(col) is np.ndarray and col.dtype == np.int64 else None

    def put_many(self, keys: Any, user_keys: Any, values: Any, *, namespace: Any = None) -> None:
        """``put(user_key, value)`` for every row, in order, without changing the
        current key: existing user keys are replaced in one multi-map core call,
        new ones inserted (and linked) row by row. ``ValueError``/``TypeError``
        for columns of different lengths or a None or unhashable user key,
        before anything is written. O(len(keys))."""
        ks, kgs, ns = self._column(keys, namespace)
        uks = self._user_keys(user_keys, len(kgs))
        from cowmap.state.columns import value_list

        vs = value_list(values, len(kgs))
        t = self._t
        maps = self._column_maps(kgs)
        keys_l, ctxs = self._column_ctxs(ks, ns)
        groups = kgs.tolist()
        ts = self._kc.now() if t.ttl else NO_TIMESTAMP
        done = multi_replace(maps, groups, uks, ctxs, replace_all(vs.copy(), None, NONE_VALUE), ts)
        new = positions(done, False)
        if new:  # new user keys, in row order: insert and link them (compiled)
            user_insert_many(t.users, groups, ctxs, keys_l, ns, uks, vs, new, NONE_VALUE, ts)
        self._column_ticks(len(kgs))

    def remove_many(self, keys: Any, user_keys: Any, *, namespace: Any = None) -> None:
        """``remove(user_key)`` for every row, in order. O(len(keys))."""
        ks, kgs, ns = self._column(keys, namespace)
        uks = self._user_keys(user_keys, len(kgs))
        self._each_row(ks, kgs, ns, lambda i: self.remove(uks[i]))

    # -- vectorised forms for the AsyncExecutionController: one core call per batch

    def _batch_get(self, reqs: list[Any]) -> list[Any]:
        t = self._t
        kgs, keys, nss = request_columns(reqs)
        ukeys = request_args(reqs, 0)
        ctxs = map_contexts(keys, nss, VOID_NAMESPACE, NS_MARKER)
        if t.cleanup_size:
            t.tick(len(reqs))
        if not t.ttl:
            out = multi_get(t.maps, kgs, ukeys, ctxs)
        else:
            out = multi_get(t.maps, kgs, ukeys, ctxs, self._kc.clock, t.ttl, t.update_on_read)
            for i in positions(out, EXPIRED):
                v = t.maps[kgs[i]].remove_and_get_old(ukeys[i], ctxs[i])
                t.users[kgs[i]].unlink(ctxs[i], ukeys[i])  # type: ignore[union-attr]
                out[i] = v if t.return_expired else None
        return replace_all(out, NONE_VALUE, None)

    def _batch_put(self, reqs: list[Any]) -> list[Any] | None:
        ukeys = request_args(reqs, 0)
        if positions(ukeys, None):
            return None  # let the requests fail one by one
        t = self._t
        kgs, keys, nss = request_columns(reqs)
        t.prepare_batch_write(kgs)
        ctxs = map_contexts(keys, nss, VOID_NAMESPACE, NS_MARKER)
        values = request_args(reqs, 1)
        ts = self._kc.clock() if t.ttl else NO_TIMESTAMP
        done = multi_replace(t.maps, kgs, ukeys, ctxs, replace_all(values.copy(), None, NONE_VALUE), ts)
        users = t.users
        for i in positions(done, False):  # new user keys: insert and link them
            users[kgs[i]].insert(ctxs[i], ukeys[i], values[i], ts)  # type: ignore[union-attr]
        return [None] * len(reqs)

    __getitem__ = get
    __setitem__ = put
    __delitem__ = remove
    __contains__ = contains

    def __iter__(self) -> Iterator[Any]:
        return iter(self.keys())


MapTable.view_class = MapState
