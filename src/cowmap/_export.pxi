# A snapshot read out whole as columns (cm_export.h): what a checkpoint writes.
# Included by _core.pyx.


def snapshot_columns(StateMapSnapshot snap not None, namespace):
    """``(keys, namespaces, states, timestamps)`` of every entry of ``snap``, in
    storage order (the order the map allocated its entries in):

    - ``keys``: an int64 array when every key is an int that fits in int64, else a list;
    - ``namespaces``: None when every namespace is the object ``namespace``, else a list;
    - ``states``: an int64 array when every state is an exact int that fits in
      int64, a float64 array when every one is an exact float, else a list;
    - ``timestamps``: an int64 array (``NO_TIMESTAMP`` for entries written without one).

    O(entries), no Python object made on the number path. ``RuntimeError`` for a
    released snapshot. May run on another thread than the map's writer.
    """
    import numpy as np
    snap._check()
    cdef size_t n = snap.s.size, got
    idx_arr = np.empty(n + 1, dtype=np.uint32)
    tmp_arr = np.empty(n + 1, dtype=np.uint32)
    keys = np.empty(n, dtype=np.int64)
    states = np.empty(n, dtype=np.int64)
    ts = np.empty(n, dtype=np.int64)
    cdef uint32_t[::1] idx = idx_arr, tmp = tmp_arr
    cdef int64_t[::1] k = keys, s = states, t = ts
    cdef cm_map *m = &snap._map.m
    got = cm_export_indices(m, &snap.s, &idx[0], &tmp[0], n)
    if got != n:
        raise RuntimeError(f"snapshot of {n} entries yielded {got}")
    if n == 0:
        return keys, None, states, ts
    cdef int f = cm_export_numbers(m, &idx[0], n, <PyObject *>namespace, &k[0], &s[0], &t[0])
    key_col = keys if f & CM_X_KEYS_INT else cm_export_list(m, &idx[0], n, 0)
    ns_col = None if f & CM_X_NS_SAME else cm_export_list(m, &idx[0], n, 1)
    if f & CM_X_STATES_INT:
        state_col = states
    elif f & CM_X_STATES_FLOAT:
        state_col = states.view(np.float64)
    else:
        state_col = cm_export_list(m, &idx[0], n, 2)
    return key_col, ns_col, state_col, ts
