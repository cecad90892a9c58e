# The per-key accesses a keyed function makes on every record, compiled:
# ValueState's value() and update(), ReducingState's and AggregatingState's
# get() and add(), ListState's get(), add(), add_all() and update(), clear()
# of those four kinds, MapState's get(), contains(), put() and remove().
# Written in Python they cost two to three times the map call they make (the
# view's and the table's fields, the TTL cleanup counter, the time provider and
# the call itself, each read by the interpreter). Here they read the fields by
# name (StateView, TableCore) and call the maps' C functions.
# The state classes (cowmap/state/*_state.py) bind them as their methods.
# Included by _core.pyx.

from cowmap._context cimport KeyContext, StateView, TableCore


cdef object _EXPIRED = EXPIRED


cdef int _check_fields(StateView view, TableCore t) except -1:
    """AttributeError for a field deleted from Python (``del table.ttl``): the
    fields are writable member descriptors, and a deleted one is NULL, which
    compiled code must not read. Python code can run at every call out (a key's
    hash, the clock, a cleanup sweep freeing values, another thread then): so
    an access checks the fields first, reads what it needs into locals before
    it calls out, and checks again before it reads more after a call out."""
    cdef const char *gone = NULL
    if <PyObject *>t.maps == NULL:
        gone = "maps"
    elif <PyObject *>t.ttl == NULL:
        gone = "ttl"
    elif <PyObject *>t.update_on_read == NULL:
        gone = "update_on_read"
    elif <PyObject *>t.return_expired == NULL:
        gone = "return_expired"
    elif <PyObject *>t.cleanup_size == NULL:
        gone = "cleanup_size"
    elif <PyObject *>t.ticks == NULL:
        gone = "ticks"
    elif <PyObject *>view._default == NULL or <PyObject *>view._c == NULL or <PyObject *>view._c_key == NULL:
        raise AttributeError("a field of the state view (_default, _c, _c_key) was deleted")
    if gone != NULL:
        raise AttributeError(f"the state table's {gone.decode()} was deleted")
    return 0


cdef inline object _absent(StateView view, object default):
    """What a read of no value gives: the descriptor's default ``default`` (a
    fresh copy of a mutable one, as ValueState._default_value makes)."""
    if default is None:
        return None
    return view._default_value()


cdef inline int _cleanup_tick(TableCore t) except -1:
    """One access's incremental cleanup step (StateTable.cleanup_step)."""
    if t.cleanup_size:
        ticks = t.ticks - 1
        t.ticks = ticks
        if ticks <= 0:
            t.run_cleanup()
    return 0


cdef object _NO_STATE = object()  # what _stored and _usable give when there is nothing to use


cdef object _stored(StateView self, TableCore t, KeyContext kc):
    """Flink's ``getWithTtlCheckAndUpdate`` for the current key and namespace:
    the stored state after the TTL check (an expired one is removed, and
    returned only under ``ReturnExpiredIfNotCleanedUp``; a live one is
    refreshed under ``OnReadAndWrite``), else ``_NO_STATE``. One access's
    cleanup step. The caller has checked the fields."""
    cdef CopyOnWriteStateMap cm
    cdef int64_t ttl
    cdef int refresh
    cdef bint return_expired
    key = kc.key
    kg = kc.key_group
    if kg is None:
        raise self._no_key()
    m = (<list?>t.maps)[<Py_ssize_t>kg]
    ns = self._ns
    ttl = t.ttl
    if ttl == 0:
        if m is None:
            return _NO_STATE
        v = cm_get(&(<CopyOnWriteStateMap?>m).m, key, ns)
        return _NO_STATE if v is None else v
    refresh = 1 if t.update_on_read else 0
    return_expired = t.return_expired
    _cleanup_tick(t)
    if m is None:
        return _NO_STATE
    cm = <CopyOnWriteStateMap?>m
    v = cm_get_unexpired(&cm.m, key, ns, _as_time_for(&cm.m, key, ns, kc.clock, "now"), ttl, refresh, _EXPIRED)
    if v is _EXPIRED:
        v = cm_remove_and_get_old(&cm.m, key, ns)
        if not return_expired:
            return _NO_STATE
    return _NO_STATE if v is None else v


cdef CopyOnWriteStateMap _map_for_write(StateView self, TableCore t, KeyContext kc):
    """The current key group's map after one access's cleanup step, made if
    there is none; the fields checked again after."""
    kg = kc.key_group
    if kg is None:
        raise self._no_key()
    m = (<list?>t.maps)[<Py_ssize_t>kg]
    _cleanup_tick(t)
    if m is None:
        m = t.map_for_write(kg)
    _check_fields(self, t)
    return <CopyOnWriteStateMap?>m


cdef object _usable(CopyOnWriteStateMap cm, KeyContext kc, object key, object ns, int64_t ttl,
                    bint return_expired):
    """Flink's ``getUnexpired``: the stored state for a write (copied if a
    snapshot shares it), else ``_NO_STATE``; an expired one is left in place
    (and still used under ``ReturnExpiredIfNotCleanedUp``), nothing refreshed."""
    if ttl == 0 or return_expired:
        v = cm_get(&cm.m, key, ns)
    else:
        v = cm_get_unexpired(&cm.m, key, ns, _as_time_for(&cm.m, key, ns, kc.clock, "now"), ttl, 0, _EXPIRED)
        if v is _EXPIRED:
            return _NO_STATE
    return _NO_STATE if v is None else v


cdef inline int64_t _write_ts(CopyOnWriteStateMap cm, KeyContext kc, object key, object ns, int64_t ttl) except? -1:
    """A write's timestamp: with TTL the clock's time, read last (after the state's function, if any)."""
    return _as_time_for(&cm.m, key, ns, kc.clock) if ttl else CM_NO_TS


cdef int _clear(StateView self, TableCore t, KeyContext kc) except -1:
    """Remove the current key's state in the view's namespace, then take one
    access's cleanup step. The caller has checked the fields."""
    key = kc.key
    kg = kc.key_group
    if kg is None:
        raise self._no_key()
    m = (<list?>t.maps)[<Py_ssize_t>kg]
    if m is not None:
        cm_remove(&(<CopyOnWriteStateMap?>m).m, key, self._ns)
    _cleanup_tick(t)
    return 0


def state_clear(StateView self):
    """Remove the current key's state in the current namespace. O(1)."""
    cdef TableCore t = <TableCore?>self._t
    _check_fields(self, t)
    _clear(self, t, self._kc)


def value_state_value(StateView self):
    """The current key's value in the current namespace; the descriptor's
    ``default_value`` when there is none or it expired. O(1)."""
    cdef TableCore t = <TableCore?>self._t
    _check_fields(self, t)
    default = self._default
    v = _stored(self, t, self._kc)
    return _absent(self, default) if v is _NO_STATE else v


def value_state_update(StateView self, value):
    """Set the current key's value (and, with TTL, its timestamp); None clears it. O(1)."""
    cdef KeyContext kc = self._kc
    cdef TableCore t = <TableCore?>self._t
    _check_fields(self, t)
    if value is None:
        _clear(self, t, kc)
        return
    key = kc.key
    ns = self._ns
    cdef CopyOnWriteStateMap cm = _map_for_write(self, t, kc)
    cm_put(&cm.m, key, ns, value, _write_ts(cm, kc, key, ns, t.ttl))


# ------------------------------------------------------------ ReducingState, AggregatingState, ListState

def reducing_state_get(StateView self):
    """The reduced value of the current key, or None. O(1)."""
    cdef TableCore t = <TableCore?>self._t
    _check_fields(self, t)
    v = _stored(self, t, self._kc)
    return None if v is _NO_STATE else v


def reducing_state_add(StateView self, value):
    """Reduce ``value`` (not None) into the current key's value with the
    descriptor's ``reduce_function`` (the value itself when there is none). The
    result goes to the key current when ``add`` was called, whatever the
    function does. O(1) plus the function."""
    cdef KeyContext kc = self._kc
    cdef TableCore t = <TableCore?>self._t
    if value is None:
        raise ValueError("cannot add None to a ReducingState")
    _check_fields(self, t)
    key = kc.key
    ns = self._ns
    cdef CopyOnWriteStateMap cm = _map_for_write(self, t, kc)
    cdef int64_t ttl = t.ttl
    cdef bint return_expired = t.return_expired
    prev = _usable(cm, kc, key, ns, ttl, return_expired)
    acc = value if prev is _NO_STATE else t.descriptor.reduce_function(prev, value)
    cm_put(&cm.m, key, ns, acc, _write_ts(cm, kc, key, ns, ttl))


def aggregating_state_get(StateView self):
    """``get_result`` of the current key's accumulator, or None. O(1) plus the function."""
    cdef TableCore t = <TableCore?>self._t
    _check_fields(self, t)
    acc = _stored(self, t, self._kc)
    if acc is _NO_STATE:
        return None
    return t.descriptor.aggregate_function.get_result(acc)


def aggregating_state_add(StateView self, value):
    """Add ``value`` to the current key's accumulator with the
    ``AggregateFunction`` (a new accumulator when there is none). The result
    goes to the key current when ``add`` was called, whatever the function
    does. O(1) plus the function."""
    cdef KeyContext kc = self._kc
    cdef TableCore t = <TableCore?>self._t
    _check_fields(self, t)
    key = kc.key
    ns = self._ns
    cdef CopyOnWriteStateMap cm = _map_for_write(self, t, kc)
    cdef int64_t ttl = t.ttl
    cdef bint return_expired = t.return_expired
    fn = t.descriptor.aggregate_function
    acc = _usable(cm, kc, key, ns, ttl, return_expired)
    if acc is _NO_STATE:
        acc = fn.create_accumulator()
    acc = fn.add(value, acc)
    cm_put(&cm.m, key, ns, acc, _write_ts(cm, kc, key, ns, ttl))


cdef list _list_values(object values, str what):
    """The elements of ``values`` as a new list: ValueError for None (or a
    None element), TypeError for a str or bytes (one value given by mistake)."""
    if values is None:
        raise ValueError(f"the list of values to {what} must not be None")
    if isinstance(values, (str, bytes)):
        raise TypeError(f"expected an iterable of values to {what}, not {type(values).__name__}")
    cdef list out = list(values)
    for v in out:
        if v is None:
            raise ValueError("a ListState cannot hold None")
    return out


cdef list _stamped(list vals, object now):
    """``[v0, now, v1, now, ...]``: the flat form of a list with TTL."""
    cdef list out = []
    for v in vals:
        out.append(v)
        out.append(now)
    return out


def list_state_get(StateView self):
    """The current key's elements, oldest first (a new list; ``[]`` when there
    are none). With TTL each element has its own timestamp: a partly expired
    list keeps its expired elements (visible under
    ``ReturnExpiredIfNotCleanedUp``) unless ``OnReadAndWrite`` rewrites it with
    the live ones, freshly stamped; a wholly expired one is removed. O(elements)."""
    cdef KeyContext kc = self._kc
    cdef TableCore t = <TableCore?>self._t
    cdef CopyOnWriteStateMap cm
    cdef int64_t now
    cdef Py_ssize_t i, n
    cdef bint live, all_live = True, any_live = False
    _check_fields(self, t)
    key = kc.key
    kg = kc.key_group
    if kg is None:
        raise self._no_key()
    m = (<list?>t.maps)[<Py_ssize_t>kg]
    ns = self._ns
    cdef int64_t ttl = t.ttl
    cdef bint on_read = t.update_on_read
    cdef bint return_expired = t.return_expired
    _cleanup_tick(t)
    if m is None:
        return []
    cm = <CopyOnWriteStateMap?>m
    lst = cm_get(&cm.m, key, ns)  # a private copy if a snapshot shares it: it may be rewritten below
    if lst is None:
        return []
    if ttl == 0:
        return list(lst)
    now = _as_time_for(&cm.m, key, ns, kc.clock, "now")
    flat = <list?>lst  # [v0, ts0, v1, ts1, ...]
    n = len(flat) - len(flat) % 2
    for i in range(1, n, 2):
        if cm_expired(flat[i], ttl, now):
            all_live = False
        else:
            any_live = True
    values = flat[0:n:2]
    if all_live:
        if on_read:
            stamp = now
            for i in range(1, n, 2):
                flat[i] = stamp
            cm_set_timestamp(&cm.m, key, ns, now)
        return values
    if not any_live:
        cm_remove(&cm.m, key, ns)
        return values if return_expired else []
    if return_expired and not on_read:
        return values
    kept = []  # the live elements
    for i in range(0, n, 2):
        if not cm_expired(flat[i + 1], ttl, now):
            kept.append(flat[i])
    if on_read:  # Flink rewrites the live elements with fresh timestamps
        stamp = now
        cm_put(&cm.m, key, ns, _stamped(kept, stamp), now)
    return values if return_expired else kept


cdef int _append(StateView self, TableCore t, KeyContext kc, object value, list vals) except -1:
    """Append ``value`` (not None) to the current key's list, or with ``vals``
    (checked, not empty) every element of ``vals`` instead."""
    cdef int64_t now
    _check_fields(self, t)
    key = kc.key
    ns = self._ns
    cdef CopyOnWriteStateMap cm = _map_for_write(self, t, kc)
    cdef int64_t ttl = t.ttl
    lst = cm_get(&cm.m, key, ns)  # a private copy if a snapshot shares it
    if ttl == 0:
        if lst is None:
            cm_put(&cm.m, key, ns, [value] if vals is None else vals, CM_NO_TS)
        elif vals is None:
            lst.append(value)
        else:
            lst.extend(vals)
        return 0
    # with TTL the list is flat, [v0, ts0, v1, ts1, ...], the entry's timestamp the newest element's
    now = _as_time_for(&cm.m, key, ns, kc.clock, "now")
    stamp = now
    flat = [value, stamp] if vals is None else _stamped(vals, stamp)
    if lst is None:
        cm_put(&cm.m, key, ns, flat, now)
    else:
        if t.cleanup_size:
            _drop_expired_head(<list?>lst, ttl, now)
        lst.extend(flat)
        cm_set_timestamp(&cm.m, key, ns, now)
    return 0


cdef int _drop_expired_head(list flat, int64_t ttl, int64_t now) except -1:
    """Background cleanup of a list that keeps growing: the sweep drops a list
    once its newest element expired, so an append drops the expired elements
    before the first live one, once the middle element has expired (appends
    stamp in time order, so then about half the list goes): O(1) amortised per
    append, and the list holds at most about twice its live elements."""
    cdef Py_ssize_t i = 1, n = len(flat)
    if n < 2 or not cm_expired(flat[2 * (n // 4) + 1], ttl, now):
        return 0
    while i < n and cm_expired(flat[i], ttl, now):
        i += 2
    del flat[:i - 1]
    return 0


def list_state_add(StateView self, value):
    """Append ``value`` (not None) to the current key's list. O(1) amortised."""
    if value is None:
        raise ValueError("a ListState cannot hold None")
    _append(self, <TableCore?>self._t, self._kc, value, None)


def list_state_add_all(StateView self, values):
    """Append every element of ``values`` (none of them None) to the current
    key's list; nothing (not even the key's check) for no elements. O(len(values))."""
    cdef list vals = _list_values(values, "add")
    if vals:
        _append(self, <TableCore?>self._t, self._kc, None, vals)


def list_state_update(StateView self, values):
    """Replace the current key's list with the elements of ``values``; ``[]``
    clears it. O(len(values))."""
    cdef KeyContext kc = self._kc
    cdef TableCore t = <TableCore?>self._t
    cdef int64_t now
    cdef list vals = _list_values(values, "update")
    _check_fields(self, t)
    key = kc.key
    ns = self._ns
    cdef CopyOnWriteStateMap cm = _map_for_write(self, t, kc)
    if not vals:
        cm_remove(&cm.m, key, ns)
    elif t.ttl == 0:
        cm_put(&cm.m, key, ns, vals, CM_NO_TS)
    else:
        now = _as_time_for(&cm.m, key, ns, kc.clock, "now")
        cm_put(&cm.m, key, ns, _stamped(vals, now), now)


# ------------------------------------------------------------ MapState

# cowmap.state's markers, read at the first MapState access (cowmap.state imports this module),
# before anything else the access does
cdef object _VOID = None        # VOID_NAMESPACE
cdef object _NONE_VALUE = None  # what a user map stores for a None value
cdef object _NS_MARKER = None   # the last item of a namespaced core namespace
cdef object _MAP_ABSENT = object()
cdef str _NAN_USER_KEY = ("MapState user keys must not be NaN: a NaN equals no other NaN in Python, so its "
                          "entry could never be found again")


cdef int _map_markers() except -1:
    global _VOID, _NONE_VALUE, _NS_MARKER
    from cowmap.state.user_map import NONE_VALUE, NS_MARKER, VOID_NAMESPACE
    _NONE_VALUE = NONE_VALUE
    _NS_MARKER = NS_MARKER
    _VOID = VOID_NAMESPACE
    return 0


cdef inline object _map_ctx(StateView view, object key):
    """The core namespace of ``key``'s user entries in the view's namespace
    (user_map.make_ctx), cached on the view for the key object."""
    if view._c_key is key:
        return view._c
    ns = view._ns
    c = key if ns is _VOID else (key, ns, _NS_MARKER)
    view._c = c
    view._c_key = key
    return c


def map_state_ctx(StateView self):
    """The core namespace of the current key's user entries in the view's
    namespace, cached on the view (MapState's calls other than the hot three)."""
    if _VOID is None:
        _map_markers()
    _check_fields(self, <TableCore?>self._t)
    return _map_ctx(self, self._kc.key)


cdef inline void _map_prefetch(FlatStateMap e, object ukey, object ctx) noexcept:
    """Start the miss on the user entry's slot: it overlaps the cleanup step and the clock."""
    cdef uint32_t h
    if cm_hint_composite(<PyObject *>ukey, <PyObject *>ctx, &h):
        fm_prefetch(&e.m, h)


cdef object _map_lookup(StateView self, object ukey):
    """The value of the current key's user key ``ukey`` after the TTL check
    (``_MAP_ABSENT`` when absent or hidden); an expired entry found is removed."""
    cdef KeyContext kc = self._kc
    cdef TableCore t = <TableCore?>self._t
    cdef FlatStateMap e = None
    if _VOID is None:  # (before the fields are checked: it runs Python code)
        _map_markers()
    _check_fields(self, t)
    key = kc.key
    kg = kc.key_group
    if kg is None:
        raise self._no_key()
    m = (<list?>t.maps)[<Py_ssize_t>kg]
    ns = self._ns
    cdef int64_t ttl = t.ttl
    cdef int refresh = 1 if t.update_on_read else 0
    cdef bint return_expired = t.return_expired
    ctx = None
    if m is not None:
        e = <FlatStateMap?>m
        ctx = _map_ctx(self, key)
        _map_prefetch(e, ukey, ctx)
    _cleanup_tick(t)
    if e is None:
        hash(ukey)  # (an unhashable user key is a TypeError whether or not the key group has entries)
        return _MAP_ABSENT
    if ttl == 0:
        v = fm_get(&e.m, ukey, ctx)
    else:
        v = fm_get_unexpired(&e.m, ukey, ctx, _flat_time_for(&e.m, ukey, ctx, kc.clock, "now"), ttl, refresh,
                             _EXPIRED)
        if v is _EXPIRED:
            v = fm_remove_and_get_old(&e.m, ukey, ctx)
            u = t.users[kg]
            _unlink(<CopyOnWriteStateMap?>u.links, <CopyOnWriteStateMap?>u.dirs, ctx, key, ns, ukey)
            if not return_expired:
                return _MAP_ABSENT
    if v is None:
        return _MAP_ABSENT
    return None if v is _NONE_VALUE else v


def map_state_get(StateView self, key):
    """The value of user key ``key``, or None. O(1)."""
    v = _map_lookup(self, key)
    return None if v is _MAP_ABSENT else v


def map_state_contains(StateView self, key):
    """Whether user key ``key`` has a (visible) value. O(1)."""
    return _map_lookup(self, key) is not _MAP_ABSENT


def map_state_put(StateView self, key, value):
    """Set user key ``key`` to ``value``; a new key goes last in iteration order. O(1)."""
    cdef KeyContext kc = self._kc
    cdef TableCore t = <TableCore?>self._t
    cdef FlatStateMap e
    cdef int64_t ts = CM_NO_TS
    if _VOID is None:  # (before the fields are checked: it runs Python code)
        _map_markers()
    _check_fields(self, t)
    k = kc.key
    kg = kc.key_group
    if kg is None:
        raise self._no_key()
    if key is None:
        raise TypeError("MapState user keys must not be None")
    if isinstance(key, float) and key != key:
        raise ValueError(_NAN_USER_KEY)
    m = (<list?>t.maps)[<Py_ssize_t>kg]
    if m is None:
        m = t.map_for_write(kg)
        _check_fields(self, t)
    e = <FlatStateMap?>m
    ns = self._ns
    ctx = _map_ctx(self, k)
    _map_prefetch(e, key, ctx)
    cdef bint ttl = t.ttl != 0
    _cleanup_tick(t)
    if ttl:
        ts = _flat_time_for(&e.m, key, ctx, kc.clock)
    # one lookup, the clock read inside it; a new user key still needs linking
    if fm_put(&e.m, key, ctx, _NONE_VALUE if value is None else value, ts) == 1:
        u = t.users[kg]
        _link(<CopyOnWriteStateMap?>u.links, <CopyOnWriteStateMap?>u.dirs, ctx, k, ns, key)


def map_state_remove(StateView self, key):
    """Remove user key ``key`` if present. O(1)."""
    cdef KeyContext kc = self._kc
    cdef TableCore t = <TableCore?>self._t
    if _VOID is None:  # (before the fields are checked: it runs Python code)
        _map_markers()
    _check_fields(self, t)
    k = kc.key
    kg = kc.key_group
    if kg is None:
        raise self._no_key()
    ns = self._ns
    ctx = _map_ctx(self, k)
    _cleanup_tick(t)
    u = t.users[kg]
    if u is None:
        hash(key)  # (an unhashable user key is a TypeError whether or not the key group has entries)
    elif fm_remove(&(<FlatStateMap?>u.values).m, key, ctx, NULL) == 1:
        _unlink(<CopyOnWriteStateMap?>u.links, <CopyOnWriteStateMap?>u.dirs, ctx, k, ns, key)
