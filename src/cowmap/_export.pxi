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
    object made on the number path, in one call (:class:`ColumnReader` reads
    a slice a call). A chained snapshot's entries are found, and those whose
    columns need no Python object read, without the GIL. ``RuntimeError`` for
    a released snapshot, ``TypeError`` for anything else. May run on another
    thread than the map's writer.
    """
    r = ColumnReader(snap, namespace, timestamps)
    r.read(r.rows)
    return r.columns()


@cython.final
cdef class ColumnReader:
    """``snapshot_columns(snap, namespace, timestamps)`` a slice of rows a
    call, for a reader on another thread than the map's writer: between two
    calls the writer may take the GIL (a long read-out in one call would hold
    it up to the end where its rows need Python objects read).

    ``read(rows)`` reads up to ``rows`` more and returns whether all are read;
    ``columns()`` then gives what ``snapshot_columns`` gives. A chained
    snapshot's entries stay put while the map is written (a write copies
    them), so they are found and, as far as their rows need no Python object,
    read without the GIL, the snapshot pinned meanwhile (a release waits for
    the read); a flat snapshot's may move to a page copy, so each slice finds
    its entries anew, with the GIL. ``RuntimeError`` if the snapshot is
    released meanwhile."""
    cdef object namespace, keys, nss, states, ts
    cdef StateMapSnapshot cs
    cdef FlatMapSnapshot fs
    cdef const cm_entry **ents
    cdef fm_pos *order
    cdef size_t n, at
    cdef int f

    def __cinit__(self, snap, namespace, timestamps=True):
        import numpy as np
        cdef size_t got = 0
        self.f = CM_X_ALL
        if type(snap) is StateMapSnapshot:
            self.cs = <StateMapSnapshot>snap
            self.cs._check()
            self.n = self.cs.s.size
        elif type(snap) is FlatMapSnapshot:
            self.fs = <FlatMapSnapshot>snap
            self.fs._check()
            self.n = self.fs.s.size
        else:
            raise TypeError(f"expected a StateMapSnapshot or FlatMapSnapshot, not {type(snap).__name__}")
        self.namespace = namespace
        self.keys = np.empty(self.n, dtype=np.int64)
        self.nss = np.empty(self.n, dtype=np.int64)
        self.states = np.empty(self.n, dtype=np.int64)
        self.ts = np.empty(self.n, dtype=np.int64) if timestamps else None
        if self.n == 0:
            return
        self.ents = <const cm_entry **>PyMem_RawMalloc(self.n * sizeof(void *))
        if self.ents == NULL:
            raise MemoryError()
        if self.cs is not None:
            got = _chained_entries(self.cs, self.ents, self.n)
        else:
            self.order = fm_snap_order(&self.fs.s, &got)
            if self.order == NULL:
                raise MemoryError()
        if got != self.n:
            raise RuntimeError(f"snapshot of {self.n} entries yielded {got}")

    def __dealloc__(self):
        PyMem_RawFree(self.ents)
        PyMem_RawFree(self.order)

    @property
    def rows(self):
        return self.n

    cdef int _check(self) except -1:
        if (self.cs._released if self.cs is not None else self.fs._released):
            raise RuntimeError("the snapshot was released while it was being read out")
        return 0

    cdef void _find(self, size_t lo, size_t hi):
        cdef size_t k
        for k in range(lo, hi):
            self.ents[k] = fm_snap_at(&self.fs.s, &self.order[k])

    def read(self, size_t rows):
        """Read up to ``rows`` more rows; True once every row is read."""
        cdef size_t stop = self.n if rows >= self.n - self.at else self.at + rows
        cdef int64_t[::1] kv, nv, sv, tv
        cdef int64_t *tp = NULL
        cdef size_t at
        if self.at < stop:
            self._check()
            kv, nv, sv = self.keys, self.nss, self.states
            if self.ts is not None:
                tv = self.ts
                tp = &tv[0]
            if self.order != NULL:
                self._find(self.at, stop)
            at = _numbers_bare(None if self.cs is None else [self.cs], self.ents, self.at, stop, self.n,
                               self.namespace, &kv[0], &nv[0], &sv[0], tp, &self.f)
            if at < stop:  # (a flat snapshot's entries prefetched no further than those found)
                self.f &= cm_export_numbers(self.ents, at, stop, self.n if self.order == NULL else stop,
                                            <PyObject *>self.namespace, &kv[0], &nv[0], &sv[0], tp)
            self.at = stop
        return self.at == self.n

    def columns(self):
        """``(keys, namespaces, states, timestamps)`` once every row is read."""
        if self.at != self.n:
            raise RuntimeError(f"{self.at} of {self.n} rows read")
        if self.n == 0:
            return self.keys, None, self.states, self.ts
        self._check()
        cdef int f = self.f
        if self.order != NULL and (not f & CM_X_KEYS_INT or not f & (CM_X_NS_SAME | CM_X_NS_INT)
                                   or not f & (CM_X_STATES_INT | CM_X_STATES_FLOAT)):
            self._find(0, self.n)  # objects to read, all in this call: found anew (a slice may be stale)
        return _columns_of(f, self.ents, self.n, self.keys, self.nss, self.states, self.ts)


cdef size_t _chained_entries(StateMapSnapshot cs, const cm_entry **ents, size_t n) except? 0:
    """The n entries of chained snapshot cs into ents, in index order; how many there were."""
    cdef size_t got = 0
    _gather_chained([cs], &ents, &n, &got)
    return got


cdef int _gather_chained(list snaps, const cm_entry ***ents, const size_t *ns, size_t *got) except -1:
    """The entries of each chained snapshot snaps[i] (ns[i] of them) into
    ents[i], how many into got[i]: all in one stretch without the GIL (each
    through a private view of its map, the snapshot pinned meanwhile)."""
    cdef Py_ssize_t m = len(snaps), i
    if m == 0:
        return 0  # (letting go of the GIL for nothing would cost a wait to take it back)
    cdef StateMapSnapshot cs
    cdef cm_map *views = <cm_map *>PyMem_RawCalloc(m, sizeof(cm_map))
    cdef uint64_t **seen = <uint64_t **>PyMem_RawCalloc(m, sizeof(void *))
    cdef const cm_snap **ss = <const cm_snap **>PyMem_RawCalloc(m, sizeof(void *))
    cdef Py_ssize_t pinned = 0
    try:
        if views == NULL or seen == NULL or ss == NULL:
            raise MemoryError()
        for i in range(m):
            cs = <StateMapSnapshot>snaps[i]
            seen[i] = <uint64_t *>PyMem_RawCalloc((cs._map.m.next_unused + 63) // 64, sizeof(uint64_t))
            if seen[i] == NULL or cm_export_view(&cs._map.m, &views[i]) < 0:
                raise MemoryError()
            ss[i] = &cs.s
        for i in range(m):
            (<StateMapSnapshot>snaps[i])._pin()
            pinned += 1
        with nogil:
            for i in range(m):
                got[i] = cm_export_entries(&views[i], ss[i], ents[i], seen[i], ns[i])
    finally:
        for i in range(pinned):
            (<StateMapSnapshot>snaps[i])._unpin()
        for i in range(m):
            if seen != NULL:
                PyMem_RawFree(seen[i])
            if views != NULL:
                cm_export_view_free(&views[i])
        PyMem_RawFree(views)
        PyMem_RawFree(seen)
        PyMem_RawFree(ss)
    return 0


cdef tuple _numbers_then_columns(const cm_entry **ents, size_t n, namespace, list pins=None):
    """The columns of snapshot_columns (with timestamps) of entries ents[0..n),
    in one call; without the GIL as far as it may go when every entry is of one
    of the chained snapshots ``pins``."""
    import numpy as np
    keys, nss, states, ts = (np.empty(n, dtype=np.int64) for _ in range(4))
    if n == 0:
        return keys, None, states, ts
    cdef int64_t[::1] kv = keys, nv = nss, sv = states, tv = ts
    cdef int f = CM_X_ALL
    cdef size_t at = _numbers_bare(pins, ents, 0, n, n, namespace, &kv[0], &nv[0], &sv[0], &tv[0], &f)
    if at < n:
        f &= cm_export_numbers(ents, at, n, n, <PyObject *>namespace, &kv[0], &nv[0], &sv[0], &tv[0])
    return _columns_of(f, ents, n, keys, nss, states, ts)


cdef size_t _numbers_bare(list pins, const cm_entry **ents, size_t start, size_t stop, size_t n, namespace,
                          int64_t *kp, int64_t *np_, int64_t *sp, int64_t *tp, int *f) except? 0:
    """cm_export_numbers_bare of ents[start..stop) without the GIL, the chained
    snapshots ``pins`` (which hold every entry) pinned meanwhile; start when
    ``pins`` is None or the first row needs the GIL anyway."""
    cdef int64_t ns0_val = 0
    cdef int ns0_int
    cdef size_t at
    cdef const PyObject *ns0 = <PyObject *>namespace
    if pins is None or start >= stop or not cm_export_bare_row(ents[start], ns0):
        return start
    ns0_int = cm_export_int(<PyObject *>namespace, &ns0_val)
    for cs in pins:
        (<StateMapSnapshot>cs)._pin()
    try:
        with nogil:
            at = cm_export_numbers_bare(ents, start, stop, n, ns0, ns0_int, ns0_val, kp, np_, sp, tp, f)
    finally:
        for cs in pins:
            (<StateMapSnapshot>cs)._unpin()
    return at


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
        upserts = _numbers_then_columns(<const cm_entry **>v.a, n, namespace, None if cs is None else [cs])
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


cdef list _all_chained(list snaps):
    """snaps when each is a chained snapshot (their entries stay put: a numbers
    pass may go without the GIL), else None."""
    for s in snaps:
        if type(s) is not StateMapSnapshot:
            return None
    return snaps


cdef const cm_gonelog *_checked_gone(object snap) except NULL:
    """The removal log of a snapshot whose changes are known (checked)."""
    cdef StateMapSnapshot cs
    cdef FlatMapSnapshot fs
    if type(snap) is StateMapSnapshot:
        cs = <StateMapSnapshot>snap
        cs._check()
        if snap.changes != "known":
            raise ValueError(f"the snapshot's changes are not known ({snap.changes or 'not taken with cut=True'})")
        return &cs.ch.gone
    if type(snap) is FlatMapSnapshot:
        fs = <FlatMapSnapshot>snap
        fs._check()
        if snap.changes != "known":
            raise ValueError(f"the snapshot's changes are not known ({snap.changes or 'not taken with cut=True'})")
        return &fs.gone
    raise TypeError(f"expected a StateMapSnapshot or FlatMapSnapshot, not {type(snap).__name__}")


def snapshot_changes_many(list snaps not None, namespace):
    """:func:`snapshot_changes` of several maps in one call (an increment's key
    groups): the same six columns over all their changes, one map's after the
    other's, then two int64 arrays: per map, how many changed entries and how
    many removed keys it gave. Every snapshot is checked before anything is
    read. O(changes + maps)."""
    import numpy as np
    cdef Py_ssize_t m = len(snaps), i
    cdef cm_ptrvec v
    cdef const cm_gonelog *gone
    cdef const cm_entry **gp = NULL
    cdef size_t before, total = 0, at = 0
    cdef int f = CM_X_KEYS_INT | CM_X_NS_SAME
    cdef int rc
    cdef StateMapSnapshot cs
    cdef FlatMapSnapshot fs
    cdef int64_t[::1] gk
    for i in range(m):
        total += _checked_gone(snaps[i]).n
    counts = np.empty(m, dtype=np.int64)
    gcounts = np.empty(m, dtype=np.int64)
    cdef int64_t[::1] cv = counts, gv = gcounts
    memset(&v, 0, sizeof(v))
    try:
        for i in range(m):
            before = v.n
            snap = snaps[i]
            if type(snap) is StateMapSnapshot:
                cs = <StateMapSnapshot>snap
                rc = cm_changed_entries(&cs._map.m, &cs.ch, &v)
                gone = &cs.ch.gone
            else:
                fs = <FlatMapSnapshot>snap
                rc = fm_changed_entries(&fs.s, fs.bits, &v)
                gone = &fs.gone
            if rc < 0:
                raise MemoryError()
            cv[i] = <int64_t>(v.n - before)
            gv[i] = <int64_t>gone.n
        upserts = _numbers_then_columns(<const cm_entry **>v.a, v.n, namespace, _all_chained(snaps))
        gkeys = np.empty(total, dtype=np.int64)
        if total == 0:
            return upserts + (gkeys, None, counts, gcounts)
        gk = gkeys
        for i in range(m):
            gone = _checked_gone(snaps[i])
            if gone.n:
                f &= cm_gone_numbers(gone, <PyObject *>namespace, &gk[at])
                at += gone.n
        if f == CM_X_KEYS_INT | CM_X_NS_SAME:
            return upserts + (gkeys, None, counts, gcounts)
        gp = <const cm_entry **>PyMem_RawMalloc(total * sizeof(void *))
        if gp == NULL:
            raise MemoryError()
        at = 0
        for i in range(m):
            gone = _checked_gone(snaps[i])
            cm_gone_ptrs(gone, &gp[at])
            at += gone.n
        key_col = gkeys if f & CM_X_KEYS_INT else cm_export_list(gp, total, 0)
        ns_col = None if f & CM_X_NS_SAME else cm_export_list(gp, total, 1)
        return upserts + (key_col, ns_col, counts, gcounts)
    finally:
        PyMem_RawFree(v.a)
        PyMem_RawFree(gp)


def snapshot_columns_many(list snaps not None, namespace):
    """:func:`snapshot_columns` (timestamps included) of several snapshots in
    one call (a full checkpoint's block of key groups): the four columns over
    all their entries, one snapshot's after the other's, then an int64 array
    of how many entries each gave. Every snapshot is checked before anything
    is read. The GIL is let go only where :class:`ColumnReader` lets go of it,
    so callers keep the total to about a block (a reader reads one snapshot a
    slice at a time). O(entries)."""
    import numpy as np
    cdef Py_ssize_t m = len(snaps), i
    cdef size_t total = 0, at = 0, got, n, k
    cdef StateMapSnapshot cs
    cdef FlatMapSnapshot fs
    cdef fm_pos *order = NULL
    cdef const cm_entry **ents = NULL
    counts = np.empty(m, dtype=np.int64)
    cdef int64_t[::1] cv = counts
    for i in range(m):
        snap = snaps[i]
        if type(snap) is StateMapSnapshot:
            cs = <StateMapSnapshot>snap
            cs._check()
            total += cs.s.size
        elif type(snap) is FlatMapSnapshot:
            fs = <FlatMapSnapshot>snap
            fs._check()
            total += fs.s.size
        else:
            raise TypeError(f"expected a StateMapSnapshot or FlatMapSnapshot, not {type(snap).__name__}")
    ents = <const cm_entry **>PyMem_RawMalloc((total if total else 1) * sizeof(void *))
    chained = [s for s in snaps if type(s) is StateMapSnapshot]
    cdef Py_ssize_t c = len(chained)
    cdef const cm_entry ***cents = <const cm_entry ***>PyMem_RawMalloc((c if c else 1) * sizeof(void *))
    cdef size_t *cn = <size_t *>PyMem_RawMalloc((c if c else 1) * sizeof(size_t))
    cdef size_t *cgot = <size_t *>PyMem_RawCalloc(c if c else 1, sizeof(size_t))
    try:
        if ents == NULL or cents == NULL or cn == NULL or cgot == NULL:
            raise MemoryError()
        c = 0
        for i in range(m):  # where each snapshot's entries go; a flat one's found now, with the GIL
            snap = snaps[i]
            if type(snap) is StateMapSnapshot:
                n = (<StateMapSnapshot>snap).s.size
                cents[c], cn[c] = &ents[at], n
                c += 1
            else:
                fs = <FlatMapSnapshot>snap
                n = fs.s.size
                got = 0
                if n:
                    order = fm_snap_order(&fs.s, &got)
                    if order == NULL:
                        raise MemoryError()
                    for k in range(got):
                        ents[at + k] = fm_snap_at(&fs.s, &order[k])
                    PyMem_RawFree(order)
                    order = NULL
                if got != n:
                    raise RuntimeError(f"snapshot of {n} entries yielded {got}")
            cv[i] = <int64_t>n
            at += n
        _gather_chained(chained, cents, cn, cgot)  # the chained ones' without the GIL, in one go
        for i in range(c):
            if cgot[i] != cn[i]:
                raise RuntimeError(f"snapshot of {cn[i]} entries yielded {cgot[i]}")
        return _numbers_then_columns(ents, total, namespace, chained if len(chained) == m else None) + (counts,)
    finally:
        PyMem_RawFree(ents)
        PyMem_RawFree(order)
        PyMem_RawFree(cents)
        PyMem_RawFree(cn)
        PyMem_RawFree(cgot)


cdef extern from "Python.h":  # (_list_item, _is_exact_int and cm_as_int64: _multi.pxi's)
    bint _is_exact_tuple "PyTuple_CheckExact"(PyObject *o)
    Py_ssize_t _tuple_size "PyTuple_GET_SIZE"(PyObject *o)
    PyObject *_tuple_item "PyTuple_GET_ITEM"(PyObject *o, Py_ssize_t i)

cdef enum:
    _TUPLE_MAX = 64  # the longest tuple tuple_columns takes apart (a wider one is rarely a record of numbers)

TUPLE_COLUMNS_MAX = _TUPLE_MAX  # (for show: the bound used is the C constant, which no rebinding changes)


def tuple_columns(list rows not None):
    """The columns of ``rows`` when every row is a tuple (exactly) of one length,
    1 to ``TUPLE_COLUMNS_MAX``, whose items at each position are all exact ints
    that fit in int64 or all exact floats: an int64 or float64 array per
    position. None otherwise (bools, subclasses, other types, ragged rows): the
    caller keeps its serializer. One C pass, no Python code run."""
    import numpy as np
    cdef Py_ssize_t n = len(rows), k, i, j
    cdef PyObject *row
    cdef PyObject *item
    cdef int overflow = 0
    cdef int64_t v
    cdef double d
    cdef int64_t[:, ::1] data
    cdef uint8_t[_TUPLE_MAX] is_float
    if n == 0:
        return None
    row = _list_item(<PyObject *>rows, 0)
    if not _is_exact_tuple(row):
        return None
    k = _tuple_size(row)
    if k == 0 or k > _TUPLE_MAX:
        return None
    for j in range(k):
        item = _tuple_item(row, j)
        if _is_exact_int(item):
            is_float[j] = 0
        elif _is_exact_float(item):
            is_float[j] = 1
        else:
            return None
    out = np.empty((k, n), dtype=np.int64)
    data = out
    for i in range(n):  # (nothing below runs Python code: the list cannot change meanwhile)
        row = _list_item(<PyObject *>rows, i)
        if not _is_exact_tuple(row) or _tuple_size(row) != k:
            return None
        for j in range(k):
            item = _tuple_item(row, j)
            if is_float[j]:
                if not _is_exact_float(item):
                    return None
                d = _float_value(item)
                memcpy(&data[j, i], &d, sizeof(double))
            else:
                if not _is_exact_int(item):
                    return None
                v = cm_as_int64(item, &overflow)
                if overflow:
                    return None
                data[j, i] = v
    return [out[j].view(np.float64) if is_float[j] else out[j] for j in range(k)]
