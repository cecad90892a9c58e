# A snapshot read out whole as columns (cm_export.h): what a checkpoint writes.
# Included by _core.pyx.

from cpython.mem cimport PyMem_RawCalloc, PyMem_RawFree, PyMem_RawMalloc


def snapshot_columns(snap, namespace):
    """``(keys, namespaces, states, timestamps)`` of every entry of ``snap`` (a
    ``StateMapSnapshot``, read in about storage order: the order the map
    allocated its entries in; or a ``FlatMapSnapshot``, read in insertion order):

    - ``keys``: an int64 array when every key is an int that fits in int64, else a list;
    - ``namespaces``: None when every namespace is the object ``namespace``, an
      int64 array when every one is an exact int that fits in int64, else a list;
    - ``states``: an int64 array when every state is an exact int that fits in
      int64, a float64 array when every one is an exact float, else a list;
    - ``timestamps``: an int64 array (``NO_TIMESTAMP`` for entries written without one).

    O(entries) (and a sort of the positions for a flat snapshot), no Python
    object made on the number path. ``RuntimeError`` for a released snapshot,
    ``TypeError`` for anything else. May run on another thread than the map's writer.
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
    ts = np.empty(n, dtype=np.int64)
    if n == 0:
        return keys, None, states, ts
    cdef int64_t[::1] kv = keys, nv = nss, sv = states, tv = ts
    cdef const cm_entry **ents = <const cm_entry **>PyMem_RawMalloc(n * sizeof(void *))
    cdef uint64_t *seen = NULL
    if ents == NULL:
        raise MemoryError()
    try:
        if cs is not None:
            seen = <uint64_t *>PyMem_RawCalloc((cs._map.m.next_unused + 63) // 64, sizeof(uint64_t))
            if seen == NULL:
                raise MemoryError()
            got = cm_export_entries(&cs._map.m, &cs.s, ents, seen, n)
        else:
            order = fm_snap_order(&fs.s, &got)
            if got == n:
                for k in range(n):
                    ents[k] = fm_snap_at(&fs.s, &order[k])
        if got != n:
            raise RuntimeError(f"snapshot of {n} entries yielded {got}")
        f = cm_export_numbers(ents, n, <PyObject *>namespace, &kv[0], &nv[0], &sv[0], &tv[0])
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
    finally:
        PyMem_RawFree(ents)
        PyMem_RawFree(seen)
        PyMem_RawFree(order)
    return key_col, ns_col, state_col, ts
