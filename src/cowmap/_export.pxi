# A snapshot read out as columns: whole (cm_export.h), what a full checkpoint
# writes, or what changed since the previous cut (cm_changes.h), what an
# incremental one writes. Included by _core.pyx.

from cpython.mem cimport PyMem_RawMalloc


def snapshot_columns(snap, namespace, timestamps=True):
    """``(keys, namespaces, states, timestamps)`` of every entry of ``snap`` (a
    ``StateMapSnapshot``, read in about storage order: the order the map
    allocated its entries in; or a ``FlatMapSnapshot``, read in insertion order):

    - ``keys``: an int64 array when every key is an int that fits in int64, else a list;
    - ``namespaces``: None when every namespace is the object ``namespace``, an
      int64 array when every one is an exact int that fits in int64, else a list;
    - ``states``: an int64 array when every state is an exact int that fits in
      int64, a float64 array when every one is an exact float, else a list;
    - ``timestamps``: an int64 array (``NO_TIMESTAMP`` for entries written without one);
      None when ``timestamps`` is false (a state without TTL: 8 bytes an entry not written).

    O(entries) (and a sort of the positions for a flat snapshot), no Python
    object made on the number path. ``RuntimeError`` for a released snapshot
    (released by another thread during the read-out, too), ``TypeError`` for
    anything else. May run on another thread than the map's writer; the GIL
    is let go every few thousand rows, so that writer is not held up long.
    """
    import numpy as np
    cdef size_t n, got = 0, k
    cdef StateMapSnapshot cs = None
    cdef FlatMapSnapshot fs = None
    cdef fm_pos *order = NULL
    if type(snap) is StateMapSnapshot:
        cs = <StateMapSnapshot>snap
        cs._check()
        n = cs.s.size
    elif type(snap) is FlatMapSnapshot:
        fs = <FlatMapSnapshot>snap
        fs._check()
        n = fs.s.size
    else:
        raise TypeError(f"expected a StateMapSnapshot or FlatMapSnapshot, not {type(snap).__name__}")
    keys = np.empty(n, dtype=np.int64)
    nss = np.empty(n, dtype=np.int64)
    states = np.empty(n, dtype=np.int64)
    ts = np.empty(n, dtype=np.int64) if timestamps else None
    if n == 0:
        return keys, None, states, ts
    cdef const cm_entry **ents = NULL
    try:
        if cs is not None:
            ents = _chained_entries(cs, n)
            return _entry_columns(ents, n, namespace, keys, nss, states, ts, &cs._released)
        ents = <const cm_entry **>PyMem_RawMalloc(n * sizeof(void *))
        if ents == NULL:
            raise MemoryError()
        order = fm_snap_order(&fs.s, &got)
        if order == NULL:
            raise MemoryError()
        if got != n:
            raise RuntimeError(f"snapshot of {n} entries yielded {got}")
        return _entry_columns(ents, n, namespace, keys, nss, states, ts, &fs._released, fs, order)
    finally:
        PyMem_RawFree(ents)
        PyMem_RawFree(order)


cdef const cm_entry **_chained_entries(StateMapSnapshot cs, size_t n) except NULL:
    """The n entries of chained snapshot cs, in index order (PyMem_RawFree them)."""
    cdef const cm_entry **ents = <const cm_entry **>PyMem_RawMalloc(n * sizeof(void *) + 1)
    if ents == NULL:
        raise MemoryError()
    cdef uint64_t *seen = <uint64_t *>PyMem_RawCalloc((cs._map.m.next_unused + 63) // 64, sizeof(uint64_t))
    if seen == NULL:
        PyMem_RawFree(ents)
        raise MemoryError()
    cdef size_t got = cm_export_entries(&cs._map.m, &cs.s, ents, seen, n)
    PyMem_RawFree(seen)
    if got != n:
        PyMem_RawFree(ents)
        raise RuntimeError(f"snapshot of {n} entries yielded {got}")
    return ents


# Rows read out between two chances for another thread to take the GIL (about
# a millisecond: the states read lie scattered), so that a checkpoint written
# on a thread stalls the thread processing records briefly, whatever the size
# of a key group.
cdef enum:
    EXPORT_SLICE = 16384


cdef tuple _entry_columns(const cm_entry **ents, size_t n, namespace, keys, nss, states, ts,
                          const bint *released, FlatMapSnapshot fs=None, const fm_pos *order=NULL):
    """The columns of snapshot_columns from n entries (the arrays of n rows
    given) of a snapshot whose ``_released`` is at ``released`` (NULL: read
    out at once, the GIL held). Between slices another thread may run: a
    chained snapshot's entries stay put meanwhile (a write copies them), a
    flat one's may be moved to a page copy, so with ``order`` each slice of
    ``ents`` is found anew in flat snapshot ``fs`` first."""
    import numpy as np
    if n == 0:
        return keys, None, states, ts
    cdef int64_t[::1] kv = keys, nv = nss, sv = states, tv
    cdef int64_t *tp = NULL
    cdef size_t at = 0, stop, k
    cdef int f = CM_X_ALL
    if ts is not None:
        tv = ts
        tp = &tv[0]
    while True:
        stop = n if released == NULL else min(at + EXPORT_SLICE, n)
        if order != NULL:
            for k in range(at, stop):
                ents[k] = fm_snap_at(&fs.s, &order[k])
        # (prefetching no further than the entries found)
        f &= cm_export_numbers(ents, at, stop, n if order == NULL else stop, <PyObject *>namespace,
                               &kv[0], &nv[0], &sv[0], tp)
        at = stop
        if at == n:
            break
        with nogil:  # nothing is read meanwhile: a thread waiting for the GIL takes it here
            pass
        if released[0]:  # by another thread meanwhile: the entries may be freed
            raise RuntimeError("the snapshot was released while it was being read out")
    cdef bint objects = (not f & CM_X_KEYS_INT or not f & (CM_X_NS_SAME | CM_X_NS_INT)
                         or not f & (CM_X_STATES_INT | CM_X_STATES_FLOAT))
    if order != NULL and objects:
        for k in range(n):  # the objects are read now, all at once: found anew (no slice has gone stale)
            ents[k] = fm_snap_at(&fs.s, &order[k])
    return _columns_of(f, ents, n, keys, nss, states, ts)


cdef tuple _columns_of(int f, const cm_entry **ents, size_t n, keys, nss, states, ts):
    """The columns of entries ents[0..n) from the number columns filled with
    flags f: the arrays where their flags held, else lists of the objects."""
    import numpy as np
    key_col = keys if f & CM_X_KEYS_INT else cm_export_list(ents, n, 0)
    if f & CM_X_NS_SAME:
        ns_col = None
    elif f & CM_X_NS_INT:
        ns_col = nss
    else:
        ns_col = cm_export_list(ents, n, 1)
    if f & CM_X_STATES_INT:
        state_col = states
    elif f & CM_X_STATES_FLOAT:
        state_col = states.view(np.float64)
    else:
        state_col = cm_export_list(ents, n, 2)
    return key_col, ns_col, state_col, ts


cdef str _changes_status(bint cut, bint tracked, bint lost):
    if not cut:
        return None
    return "untracked" if not tracked else "lost" if lost else "known"


def snapshot_changes(snap, namespace):
    """What changed in a map between the previous checkpoint cut and ``snap``
    (a snapshot taken with ``cut=True`` whose ``changes`` are ``"known"``): ``(keys,
    namespaces, states, timestamps, removed_keys, removed_namespaces)``.

    The first four are the columns of ``snapshot_columns`` for every entry of
    ``snap`` written since the previous cut (of a flat map, with a few unchanged
    neighbours: its entries are found by home slot); the removed ones are the
    keys and namespaces removed since then (an int64 array or a list, and None
    when every namespace is ``namespace``), some maybe written again since.
    O(changes), not O(entries). ``ValueError`` when the changes are not known.
    """
    import numpy as np
    cdef StateMapSnapshot cs = None
    cdef FlatMapSnapshot fs = None
    cdef cm_ptrvec v
    cdef const cm_gonelog *gone
    cdef const cm_entry **gp = NULL
    cdef int64_t[::1] gk
    if type(snap) is StateMapSnapshot:
        cs = <StateMapSnapshot>snap
        cs._check()
        gone = &cs.ch.gone
    elif type(snap) is FlatMapSnapshot:
        fs = <FlatMapSnapshot>snap
        fs._check()
        gone = &fs.gone
    else:
        raise TypeError(f"expected a StateMapSnapshot or FlatMapSnapshot, not {type(snap).__name__}")
    if snap.changes != "known":
        raise ValueError(f"the snapshot's changes are not known ({snap.changes or 'not taken with cut=True'})")
    memset(&v, 0, sizeof(v))
    try:
        if cs is not None:
            cm_changed_entries(&cs._map.m, &cs.ch, &v)
        else:
            fm_changed_entries(&fs.s, fs.bits, &v)
        n = v.n
        upserts = _entry_columns(<const cm_entry **>v.a, n, namespace, np.empty(n, dtype=np.int64),
                                 np.empty(n, dtype=np.int64), np.empty(n, dtype=np.int64),
                                 np.empty(n, dtype=np.int64), &cs._released if cs is not None else NULL)
        gkeys = np.empty(gone.n, dtype=np.int64)
        if gone.n == 0:
            return upserts + (gkeys, None)
        gk = gkeys
        f = cm_gone_numbers(gone, <PyObject *>namespace, &gk[0])
        if f == CM_X_KEYS_INT | CM_X_NS_SAME:
            return upserts + (gkeys, None)
        gp = <const cm_entry **>PyMem_RawMalloc(gone.n * sizeof(void *))
        if gp == NULL:
            raise MemoryError()
        cm_gone_ptrs(gone, gp)
        key_col = gkeys if f & CM_X_KEYS_INT else cm_export_list(gp, gone.n, 0)
        ns_col = None if f & CM_X_NS_SAME else cm_export_list(gp, gone.n, 1)
        return upserts + (key_col, ns_col)
    finally:
        PyMem_RawFree(v.a)
        PyMem_RawFree(gp)
