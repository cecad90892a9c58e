# MapState's insertion-order lists, compiled: linking a new user entry at the
# tail of its (key, namespace)'s list, and unlinking a removed one. The lists
# and their invariant are described in cowmap/state/user_map.py
# (KeyGroupUserMap), whose methods call these, as do MapState's compiled
# accesses (_state_access.pxi). Included by _core.pyx.


cdef extern from "Python.h":
    void PyObject_GC_UnTrack(void *op)


cdef tuple _NO_LINKS = (None, None)


cdef list _dir_entry(object count, object head, object tail):
    """A directory entry ``[count, head, tail]``, out of the cyclic collector's
    view: a MapState has one per (key, namespace), and a full collection would
    otherwise walk every one of them (the maps themselves are not traversed, so
    nothing a collection could free is hidden by this)."""
    cdef list dc = [count, head, tail]
    PyObject_GC_UnTrack(<void *>dc)
    return dc


def dir_copy(list dc not None):
    """The directory map's copier: a copy of ``[count, head, tail]``, untracked
    like the original."""
    return _dir_entry(dc[0], dc[1], dc[2])


cdef int _link(CopyOnWriteStateMap links, CopyOnWriteStateMap dirs, object ctx, object key, object ns,
               object ukey) except -1:
    """Link user entry ``ukey`` (just added to the values map) at the tail of the
    list of ``key`` in ``ns`` (core namespace ``ctx``)."""
    dc = cm_get(&dirs.m, key, ns)  # [count, head, tail], copied first if a snapshot shares it
    if dc is None:
        cm_put(&links.m, ukey, ctx, _NO_LINKS, CM_NO_TS)
        cm_put(&dirs.m, key, ns, _dir_entry(1, ukey, ukey), CM_NO_TS)
        return 0
    tail = (<list>dc)[2]
    cm_put(&links.m, ukey, ctx, (tail, None), CM_NO_TS)
    before = cm_get(&links.m, tail, ctx)
    if before is None:
        raise RuntimeError(f"MapState list of {key!r} is broken: its tail {tail!r} has no links")
    cm_put(&links.m, tail, ctx, ((<tuple>before)[0], ukey), CM_NO_TS)
    (<list>dc)[0] = (<list>dc)[0] + 1
    (<list>dc)[2] = ukey
    return 0


cdef int _unlink(CopyOnWriteStateMap links, CopyOnWriteStateMap dirs, object ctx, object key, object ns,
                 object ukey) except -1:
    """Unlink user entry ``ukey`` of ``key`` in ``ns`` (core namespace ``ctx``),
    already removed from the values map. Reads only ``links`` and ``dirs``:
    entries a sweep removed together unlink one after another, each step seeing
    the links the one before left."""
    old = cm_remove_and_get_old(&links.m, ukey, ctx)
    if old is None:
        raise RuntimeError(f"MapState list of {key!r} is broken: user key {ukey!r} has no links")
    prev = (<tuple?>old)[0]
    nxt = (<tuple>old)[1]
    dc = cm_get(&dirs.m, key, ns)  # [count, head, tail], copied first if a snapshot shares it
    if dc is None:
        raise RuntimeError(f"MapState list of {key!r} is broken: it has no directory entry")
    if (<list?>dc)[0] <= 1:  # the list's last entry: the directory entry goes too
        cm_remove(&dirs.m, key, ns)
        return 0
    (<list>dc)[0] = (<list>dc)[0] - 1
    if prev is None:
        (<list>dc)[1] = nxt
    else:
        before = cm_get(&links.m, prev, ctx)
        if before is None:
            raise RuntimeError(f"MapState list of {key!r} is broken: {prev!r} has no links")
        cm_put(&links.m, prev, ctx, ((<tuple?>before)[0], nxt), CM_NO_TS)
    if nxt is None:
        (<list>dc)[2] = prev
    else:
        after = cm_get(&links.m, nxt, ctx)
        if after is None:
            raise RuntimeError(f"MapState list of {key!r} is broken: {nxt!r} has no links")
        cm_put(&links.m, nxt, ctx, (prev, (<tuple?>after)[1]), CM_NO_TS)
    return 0


def user_unlink(CopyOnWriteStateMap links not None, CopyOnWriteStateMap dirs not None, ctx, key, ns, ukey):
    """Unlink user entry ``ukey``, already removed from the values map, from the
    insertion-order list of ``key`` in ``ns`` (``ctx`` its core namespace);
    the list's last entry takes its directory entry with it. O(1)."""
    _unlink(links, dirs, ctx, key, ns, ukey)


def user_unlink_all(CopyOnWriteStateMap links not None, CopyOnWriteStateMap dirs not None, list removed not None,
                    ns_marker, void_ns):
    """Unlink the ``(user_key, ctx, value)`` entries a sweep removed from the
    values map, in any order, several of one list among them. A ``ctx`` is the
    key itself in the namespace ``void_ns``, else ``(key, ns, ns_marker)``.
    O(len(removed))."""
    for item in removed:
        ukey = (<tuple?>item)[0]
        ctx = (<tuple>item)[1]
        if type(ctx) is tuple and len(<tuple>ctx) == 3 and (<tuple>ctx)[2] is ns_marker:
            _unlink(links, dirs, ctx, (<tuple>ctx)[0], (<tuple>ctx)[1], ukey)
        else:
            _unlink(links, dirs, ctx, ctx, void_ns, ukey)


def user_link(CopyOnWriteStateMap links not None, CopyOnWriteStateMap dirs not None, ctx, key, ns, ukey):
    """Link user entry ``ukey``, just added to the values map, at the tail of the
    insertion-order list of ``key`` in ``ns`` (``ctx`` its core namespace):
    ``links`` maps ``(ukey, ctx)`` to ``(prev, next)``, ``dirs`` maps ``(key, ns)``
    to ``[count, head, tail]``. O(1)."""
    _link(links, dirs, ctx, key, ns, ukey)


def user_insert_many(list users not None, list groups not None, list ctxs not None, list keys not None, ns,
                     list ukeys not None, list values not None, rows, none_value, ts=NO_TIMESTAMP):
    """Store ``values[i]`` for user key ``ukeys[i]`` of ``keys[i]`` in ``ns`` for
    each row ``i`` of ``rows`` (in order), in ``users[groups[i]]`` (a
    KeyGroupUserMap: its ``values``, ``links`` and ``dirs`` maps), linking each
    new user key at the tail of its list; a None value is stored as
    ``none_value``. ``ts``: one timestamp (or time provider) for every row, or
    a list of one per row (indexed like the other lists). O(len(rows))."""
    cdef list per_row = ts if type(ts) is list else None
    cdef int64_t c_ts = _as_time(ts) if per_row is None else 0
    cdef FlatStateMap fm
    for i in rows:
        u = users[groups[i]]
        fm = <FlatStateMap?>u.values
        ctx = ctxs[i]
        ukey = ukeys[i]
        v = values[i]
        if per_row is not None:
            c_ts = per_row[i]
        if fm_put(&fm.m, ukey, ctx, none_value if v is None else v, c_ts) == 1:
            _link(<CopyOnWriteStateMap?>u.links, <CopyOnWriteStateMap?>u.dirs, ctx, keys[i], ns, ukey)
