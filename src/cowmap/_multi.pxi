# Calls over all the key-group maps of a state at once (multi_get, multi_put,
# multi_replace: one call for many single-key operations, with prefetch hints
# across the maps; maps_may_expire: whether any map's expiry floor has
# expired). Included by _core.pyx, after both map classes.


cdef extern from "Python.h":
    Py_ssize_t _list_size "PyList_GET_SIZE"(PyObject *l)
    PyObject *_list_item "PyList_GET_ITEM"(PyObject *l, Py_ssize_t i)
    bint _is_exact_int "PyLong_CheckExact"(PyObject *o)

cdef extern from "fastint.h":
    int64_t cm_as_int64(PyObject *o, int *overflow)

cdef enum:
    HINT_D = 12  # items between the three prefetch stages of a multi-map batch and the item's own lookup
    HINT_RING = 64  # > 3 * HINT_D, a power of two: the items resolved and not yet looked up


cdef struct _Hint:
    PyObject *map  # a reference to the item's CopyOnWriteStateMap or FlatStateMap, or NULL: no hint
    uint32_t hash  # the item's composite hash
    bint flat  # map is a FlatStateMap


cdef inline void _hint_resolve(list maps, list kgs, list keys, list namespaces, Py_ssize_t j, _Hint *h) noexcept:
    """Resolve item ``j`` of a multi-map batch once (its map and hash) and run
    its prefetch stage 0; later stages reuse it. A hint only: skipped for
    anything unexpected (the lists may change under a batch whose keys run
    Python code)."""
    cdef int overflow = 0
    cdef int64_t kg
    cdef PyObject *o
    cdef uint32_t hash
    if j >= _list_size(<PyObject *>kgs) or j >= _list_size(<PyObject *>keys) or j >= _list_size(<PyObject *>namespaces):
        return
    o = _list_item(<PyObject *>kgs, j)
    if not _is_exact_int(o):
        return
    kg = cm_as_int64(o, &overflow)  # cannot fail for an exact int
    if overflow or kg < 0 or kg >= _list_size(<PyObject *>maps):
        return
    o = _list_item(<PyObject *>maps, <Py_ssize_t>kg)
    h.flat = <void *>(o.ob_type) == <void *>FlatStateMap
    if <void *>(o.ob_type) != <void *>CopyOnWriteStateMap and not h.flat:
        return
    if not cm_hint_composite(_list_item(<PyObject *>keys, j), _list_item(<PyObject *>namespaces, j), &hash):
        return
    Py_INCREF(<object>o)  # held until its last stage: the lists may drop the map meanwhile
    h.map = o
    h.hash = hash
    _hint_stage(h, 0)


cdef inline void _hint_stage(_Hint *h, int stage) noexcept:
    if h.map == NULL:
        return
    if h.flat:
        fm_hint_at(&(<FlatStateMap>h.map).m, h.hash, stage)
    else:
        cm_hint_at(&(<CopyOnWriteStateMap>h.map).m, h.hash, stage)


cdef inline void _hint_drop(_Hint *h) noexcept:
    cdef PyObject *o = h.map
    h.map = NULL
    Py_XDECREF(o)


cdef inline void _hints_start(_Hint *ring, list maps, list kgs, list keys, list namespaces, Py_ssize_t n) noexcept:
    """Resolve the first 3 * HINT_D items (the loop resolves each later one 3 * HINT_D ahead)."""
    cdef Py_ssize_t j
    memset(ring, 0, HINT_RING * sizeof(_Hint))
    for j in range(min(n, 3 * HINT_D)):
        _hint_resolve(maps, kgs, keys, namespaces, j, &ring[j])


cdef inline void _hints(_Hint *ring, list maps, list kgs, list keys, list namespaces, Py_ssize_t i, Py_ssize_t n) noexcept:
    """The prefetch stages due at item ``i``: the slot of item i+3D, the head
    entry of item i+2D, the state of item i+D (its last stage: its hint is dropped)."""
    cdef _Hint *h
    if i + 3 * HINT_D < n:
        h = &ring[(i + 3 * HINT_D) & (HINT_RING - 1)]
        _hint_drop(h)
        _hint_resolve(maps, kgs, keys, namespaces, i + 3 * HINT_D, h)
    if i + 2 * HINT_D < n:
        _hint_stage(&ring[(i + 2 * HINT_D) & (HINT_RING - 1)], 1)
    if i + HINT_D < n:
        h = &ring[(i + HINT_D) & (HINT_RING - 1)]
        _hint_stage(h, 2)
        _hint_drop(h)


cdef inline void _hints_end(_Hint *ring) noexcept:
    cdef Py_ssize_t j
    for j in range(HINT_RING):
        _hint_drop(&ring[j])


cdef Py_ssize_t _columns_len(list kgs, list keys, list namespaces, list states) except -1:
    """The common length of a multi-map call's columns (``states`` None: no states)."""
    cdef Py_ssize_t n = len(keys)
    if len(kgs) != n or len(namespaces) != n:
        raise ValueError(f"kgs, keys and namespaces must have the same length "
                         f"(got {len(kgs)}, {n} and {len(namespaces)})")
    if states is not None and len(states) != n:
        raise ValueError(f"kgs, keys, namespaces and states must have the same length "
                         f"(got {n} and {len(states)} states)")
    return n


cdef enum:
    _MULTI_GET = 0
    _MULTI_PUT = 1
    _MULTI_REPLACE = 2

_MULTI_NAMES = ("multi_get", "multi_put", "multi_replace")


cdef Py_ssize_t _kg_checked(object o, Py_ssize_t i, list maps) except -1:
    """``o`` = kgs[i] as an index into ``maps``, for what the batch loop does not take
    itself (an integer type other than int: its ``__index__`` may run Python code),
    or to raise: TypeError if it is not an integer, ValueError if it names no map."""
    cdef int overflow = 0
    cdef int64_t kg
    if not PyIndex_Check(o):
        raise TypeError(f"kgs[{i}] must be an int (a key group), not {type(o).__name__}")
    v = PyNumber_Index(o)
    kg = cm_as_int64(<PyObject *>v, &overflow)
    if overflow or kg < 0 or kg >= len(maps):
        raise ValueError(f"kgs[{i}] = {v} is not a key group of the {len(maps)} maps (0 <= kg < {len(maps)})")
    return <Py_ssize_t>kg


cdef int _not_a_map(int op, object m, Py_ssize_t kg) except -1:
    """An item's map that is neither kind: None (a missing map) is absent for a read, an
    error for a put; 0 to skip the item, else raises."""
    if m is None:
        if op != _MULTI_PUT:
            return 0
        raise ValueError(f"multi_put: maps[{kg}] is None; a put needs its key group's map")
    raise TypeError(f"{_MULTI_NAMES[op]}: maps[{kg}] must be a CopyOnWriteStateMap, a FlatStateMap "
                    f"or None, not {type(m).__name__}")


cdef object _changed(int op):
    return RuntimeError(f"{_MULTI_NAMES[op]}: kgs, keys, namespaces or states changed length during "
                        f"the call (from Python code it ran: a key's __eq__/__hash__, a finalizer)")


cdef list _multi(int op, list maps, list kgs, list keys, list namespaces, list states,
                 int64_t t, int64_t ttl, int refresh):
    """The loop of multi_get (``t`` = now), multi_put and multi_replace (``t`` = ts),
    with the prefetch hints; None for multi_put. Not atomic: items before a failing
    one are done."""
    cdef Py_ssize_t n = len(keys), i, kg
    cdef int64_t v
    cdef int overflow
    cdef PyObject *o
    cdef list out = [None] * n if op == _MULTI_GET else [False] * n if op == _MULTI_REPLACE else None
    cdef CopyOnWriteStateMap cm
    cdef FlatStateMap fm
    cdef _Hint ring[HINT_RING]
    if not COWMAP_PLAIN_BATCH:  # the plain build gives no hints (cm_batch.h)
        _hints_start(ring, maps, kgs, keys, namespaces, n)
    try:
        for i in range(n):
            if not COWMAP_PLAIN_BATCH:
                _hints(ring, maps, kgs, keys, namespaces, i, n)
            # Python code the batch runs (a key's __eq__/__hash__, a key group's
            # __index__, a finalizer) may change the lists: each is read after a
            # check of its length with no such code in between.
            if i >= _list_size(<PyObject *>kgs):
                raise _changed(op)
            o = _list_item(<PyObject *>kgs, i)
            if _is_exact_int(o):
                v = cm_as_int64(o, &overflow)  # runs no Python code
                if overflow or v < 0 or v >= _list_size(<PyObject *>maps):
                    _kg_checked(<object>o, i, maps)  # raises
                kg = <Py_ssize_t>v
            else:
                kg = _kg_checked(<object>o, i, maps)
            if i >= _list_size(<PyObject *>keys) or i >= _list_size(<PyObject *>namespaces) or (
                    states is not None and i >= _list_size(<PyObject *>states)):
                raise _changed(op)
            m = <object>_list_item(<PyObject *>maps, kg)
            key = <object>_list_item(<PyObject *>keys, i)
            ns = <object>_list_item(<PyObject *>namespaces, i)
            if op != _MULTI_GET:
                state = <object>_list_item(<PyObject *>states, i)
            if type(m) is FlatStateMap:
                fm = <FlatStateMap>m
                if op == _MULTI_GET:
                    if ttl > 0:
                        out[i] = fm_get_unexpired(&fm.m, key, ns, t, ttl, refresh, EXPIRED)
                    else:
                        out[i] = fm_get(&fm.m, key, ns)
                elif op == _MULTI_PUT:
                    fm_put(&fm.m, key, ns, state, t)
                elif fm_replace(&fm.m, key, ns, state, t) == 1:
                    out[i] = True
            elif type(m) is CopyOnWriteStateMap:
                cm = <CopyOnWriteStateMap>m
                if op == _MULTI_GET:
                    if ttl > 0:
                        out[i] = cm_get_unexpired(&cm.m, key, ns, t, ttl, refresh, EXPIRED)
                    else:
                        out[i] = cm_get(&cm.m, key, ns)
                elif op == _MULTI_PUT:
                    cm_put(&cm.m, key, ns, state, t)
                elif cm_replace(&cm.m, key, ns, state, t) == 1:
                    out[i] = True
            else:
                _not_a_map(op, m, kg)
    finally:
        if not COWMAP_PLAIN_BATCH:
            _hints_end(ring)
    return out


cdef inline int64_t *_floor_of(object m):
    """Where map ``m`` keeps its expiry floor."""
    if type(m) is CopyOnWriteStateMap:
        return &(<CopyOnWriteStateMap>m).m.ts_floor
    return &(<FlatStateMap>m).m.ts_floor


def maps_may_expire(list maps not None, now, ttl):
    """Whether an entry of any map in ``maps`` (``CopyOnWriteStateMap``,
    ``FlatStateMap`` or None) may have expired at ``now`` (see their
    ``expiry_floor``): False means a sweep of any of them would find nothing.
    O(len(maps))."""
    cdef int64_t c_now = _as_time(now, "now"), c_ttl = _as_ts(ttl, "ttl")
    cm_check_ttl(c_ttl)
    for m in maps:
        if m is None:
            continue
        if type(m) is not CopyOnWriteStateMap and type(m) is not FlatStateMap:
            raise TypeError(f"maps must hold CopyOnWriteStateMap, FlatStateMap or None, not {type(m).__name__}")
        # the maps' floors are scattered, each likely a cache miss: request them all first
        CM_PREFETCH(_floor_of(m))
    for m in maps:
        if m is not None and cm_expired(_floor_of(m)[0], c_ttl, c_now):
            return True
    return False


def multi_get(list maps not None, list kgs not None, list keys not None, list namespaces not None, now=0, ttl=0, refresh=False):
    """One call for many single-key reads spread over the maps of a state's key
    groups: item i reads ``(keys[i], namespaces[i])`` in ``maps[kgs[i]]``.

    With ``ttl > 0`` each read is :meth:`CopyOnWriteStateMap.get_unexpired` at
    ``now`` (``refresh``: set the timestamps of live entries to ``now``);
    with ``ttl == 0`` (no TTL) :meth:`CopyOnWriteStateMap.get`; a negative
    ``ttl`` is a ``ValueError``. A missing map (None) reads as absent.
    Returns the list of results (states, None, or :data:`EXPIRED`).

    The four lists have one length (``ValueError``); each ``kgs[i]`` is an
    int with ``0 <= kgs[i] < len(maps)`` (``TypeError``, ``ValueError``) and
    each map a :class:`CopyOnWriteStateMap`, a :class:`FlatStateMap` or None
    (``TypeError``). Not atomic: when an item fails, the items before it are
    done. O(len(keys)).
    """
    _columns_len(kgs, keys, namespaces, None)
    cdef int64_t c_now = _as_time(now, "now"), c_ttl = _as_ts(ttl, "ttl")
    if c_ttl != 0:
        cm_check_ttl(c_ttl)
    return _multi(_MULTI_GET, maps, kgs, keys, namespaces, None, c_now, c_ttl, 1 if refresh else 0)


def multi_put(list maps not None, list kgs not None, list keys not None, list namespaces not None, list states not None, ts=NO_TIMESTAMP):
    """One call for many puts spread over the maps of a state's key groups: item i
    maps ``(keys[i], namespaces[i])`` to ``states[i]`` in ``maps[kgs[i]]`` (which
    must exist: None there is a ``ValueError``), all with timestamp ``ts``.
    Arguments and errors as for :func:`multi_get`; not atomic."""
    _columns_len(kgs, keys, namespaces, states)
    _multi(_MULTI_PUT, maps, kgs, keys, namespaces, states, _as_time(ts), 0, 0)


def multi_replace(list maps not None, list kgs not None, list keys not None, list namespaces not None, list states not None, ts=NO_TIMESTAMP):
    """:meth:`CopyOnWriteStateMap.replace` for many items over a state's key-group
    maps in one call; a list of bools (False: absent or a missing map, nothing
    added). Arguments and errors as for :func:`multi_get`; not atomic."""
    _columns_len(kgs, keys, namespaces, states)
    return _multi(_MULTI_REPLACE, maps, kgs, keys, namespaces, states, _as_time(ts), 0, 0)
