# The compiled half of the columnar state calls (cowmap.state.columns): a column
# of rows spread over one state's key-group maps, run by cm_col_run
# (cm_columns.h) in one pass. Included by _core.pyx.

from cpython.mem cimport PyMem_Calloc, PyMem_Free
from cpython.ref cimport Py_DECREF
from libc.string cimport memcmp, memcpy


cdef extern from "Python.h":
    PyObject *_list_new "PyList_New"(Py_ssize_t n) except NULL
    void _list_set "PyList_SET_ITEM"(PyObject *l, Py_ssize_t i, PyObject *o)
    bint _is_exact_float "PyFloat_CheckExact"(PyObject *o)
    double _float_value "PyFloat_AS_DOUBLE"(PyObject *o)
    bint _is_int "PyLong_Check"(PyObject *o)


cdef uint8_t _ROW_TYPED = 0x80  # CM_ROW_TYPED (cm_columns.h)

# get_many's output: a list, or a numpy array of one of these dtypes
COL_LIST = 0
COL_INT64 = 1
COL_FLOAT64 = 2


cdef class _Column:
    """One column call's setup: its rows' key groups and keys, and the maps they
    name (held for the call: Python code a key runs cannot free one)."""
    cdef cm_col c
    cdef list held
    cdef object keys        # the int64 array or the tuple the call reads
    cdef object kgs_arr
    cdef const int32_t[::1] kgs
    cdef const int64_t[::1] ikeys
    cdef uint8_t *seen      # per map: whether a row names its key group

    def __dealloc__(self):
        PyMem_Free(self.c.maps)
        PyMem_Free(self.c.okeys)
        PyMem_Free(self.seen)

    cdef int setup(self, int op, list maps, object kgs, object keys, object namespace,
                   const uint8_t *seen=NULL) except -1:
        """``seen``: the key groups of the rows (one byte per map) when known
        (a read's of the same key groups), else found here."""
        cdef Py_ssize_t i, n, nmaps = len(maps)
        cdef int32_t kg
        cdef uint8_t *checked = NULL
        self.held = []
        self.kgs_arr = kgs
        self.kgs = kgs
        n = self.kgs.shape[0]
        memset(&self.c, 0, sizeof(cm_col))
        self.c.op = op
        self.c.n = n
        self.c.ns = <PyObject *>namespace
        if type(keys) is tuple:
            if len(<tuple>keys) != n:
                raise ValueError(f"{len(<tuple>keys)} keys for {n} key groups")
            self.keys = keys
            self.c.okeys = <PyObject **>PyMem_Calloc(n if n else 1, sizeof(PyObject *))
            if self.c.okeys == NULL:
                raise MemoryError()
            for i in range(n):
                self.c.okeys[i] = <PyObject *>(<tuple>keys)[i]
        else:
            self.ikeys = keys
            if self.ikeys.shape[0] != n:
                raise ValueError(f"{self.ikeys.shape[0]} keys for {n} key groups")
            self.keys = keys
            if n:
                self.c.ikeys = &self.ikeys[0]
        if n:
            self.c.kgs = &self.kgs[0]
        self.c.nmaps = nmaps
        self.c.maps = <cm_map **>PyMem_Calloc(nmaps if nmaps else 1, sizeof(cm_map *))
        self.seen = checked = <uint8_t *>PyMem_Calloc(nmaps if nmaps else 1, 1)
        if self.c.maps == NULL or checked == NULL:
            raise MemoryError()
        # the bounds are checked whatever `seen` says: c.maps is indexed by them
        i = cm_col_seen(&self.kgs[0], n, nmaps, checked if seen == NULL else NULL) if n else -1
        if i >= 0:
            raise ValueError(f"key group {self.kgs[i]} of row {i} is not within 0..{nmaps - 1}")
        if seen != NULL:
            memcpy(checked, seen, nmaps)
        for kg in range(nmaps):
            if not checked[kg]:
                continue
            m = maps[kg]
            if type(m) is CopyOnWriteStateMap:
                self.held.append(m)
                self.c.maps[kg] = &(<CopyOnWriteStateMap>m).m
            elif m is None:
                if op == CM_COL_PUT or op == CM_COL_FOLD:
                    i = next((r for r in range(n) if self.kgs[r] == kg), -1)
                    raise ValueError(f"no map for key group {kg} (row {i}): a write needs its key group's map")
            else:
                raise TypeError(f"maps[{kg}] must be a CopyOnWriteStateMap or None, not {type(m).__name__}")
        return 0


@cython.final
cdef class ColumnLocations:
    """Where a column read (``column_get`` of int64 keys) found each row's entry,
    so that a write of the same column (``column_put`` with the same keys and
    namespace: the read-modify-write of a pandas UDF) skips its lookups. A map's
    rows count while the map has had no entry added or removed and no snapshot
    taken since the read (checked per row as the write runs); any other row is
    looked up as usual, so a stale or foreign one costs time, never a wrong
    write. Holds a copy of the keys, never the maps (a map replaced since, by a
    restore say, is told from its successor by its serial)."""
    cdef object keys        # int64 copy of the read's keys; None: nothing held
    cdef object kgs
    cdef object ns
    # The buffers a call writes or reads through C pointers. A call holds its
    # own references to them while it runs: Python code it runs (a namespace's
    # __eq__) may start another read here, which then takes new buffers, and
    # bumps gen so the first read knows its locations no longer stand.
    cdef object locs_arr    # uint32, one per row: the entry index, 0 = none
    cdef object marks_arr   # bytes of one cm_colmark per map
    cdef bytes seen         # per map: whether a row of the read names its key group
    cdef uint32_t *locs
    cdef cm_colmark *marks
    cdef Py_ssize_t nmaps
    cdef unsigned long gen
    cdef readonly Py_ssize_t written  # rows the last column_put given these wrote through them

    cdef int _begin(self, _Column col, object kgs, object namespace) except -1:
        """Set col up to record its rows' locations (an int64 read) in new
        buffers, forgetting the last read's."""
        import numpy as np
        cdef uint32_t[::1] lv
        cdef uint8_t[::1] mv
        self.keys = None
        self.gen += 1
        self.locs_arr = np.zeros(col.c.n if col.c.n else 1, dtype=np.uint32)
        self.marks_arr = np.zeros((col.c.nmaps if col.c.nmaps else 1) * sizeof(cm_colmark), dtype=np.uint8)
        lv = self.locs_arr
        mv = self.marks_arr
        self.locs = &lv[0]
        self.marks = <cm_colmark *>&mv[0]  # numpy's buffers are aligned for 8-byte fields
        self.nmaps = col.c.nmaps
        col.c.locs = self.locs
        col.c.marks = self.marks
        self.kgs = kgs
        self.ns = namespace
        self.seen = (<char *>col.seen)[:col.c.nmaps]
        return 0

    cdef bint _matches(self, object keys, object namespace):
        cdef const int64_t[::1] a
        cdef const int64_t[::1] b
        if self.keys is None or namespace is not self.ns or type(keys) is tuple:
            return False
        if keys is self.keys:
            return True
        a = keys
        b = self.keys
        return a.shape[0] == b.shape[0] and (a.shape[0] == 0 or memcmp(&a[0], &b[0], a.shape[0] * sizeof(int64_t)) == 0)

    def kgs_for(self, keys, namespace):
        """The read's key groups (an int32 array) when ``keys`` (an int64 array)
        and ``namespace`` are the last read's, else None."""
        return self.kgs if self._matches(keys, namespace) else None

    def reuse(self, keys, namespace):
        """``(keys, key groups)`` of the last read when ``keys`` is a 1-D int64
        numpy array equal to its keys and ``namespace`` is its namespace (the
        read's own copy of the keys, so nothing is copied again), else None."""
        cdef const int64_t[::1] a
        if self.keys is None or namespace is not self.ns or type(keys) is not type(self.keys):
            return None
        if keys.dtype != self.keys.dtype or keys.ndim != 1 or not keys.flags.c_contiguous:
            return None
        return (self.keys, self.kgs) if self._matches(keys, namespace) else None

    def clear(self):
        """Forget the last read (its keys and locations)."""
        self.keys = self.kgs = self.ns = None


cdef object _not_numeric(_Column col, Py_ssize_t i, object state, str want, str dtype):
    key = col.c.ikeys[i] if col.c.ikeys != NULL else (<tuple>col.keys)[i]
    return TypeError(f"the state of key {key!r} is {type(state).__name__} {state!r}, not {want}: "
                     f"it cannot be read into {'an' if dtype == 'int64' else 'a'} {dtype} array (read it with dtype=None)")


cdef bint _is_np_scalar(object o):
    """A numpy number scalar (np.float32, np.int16, ...; not an array), without
    importing numpy here."""
    return type(o).__module__ == "numpy" and getattr(o, "shape", None) == () and hasattr(o, "dtype") and (
        o.dtype.kind in "iuf")


cdef int _release_refs(PyObject **out, Py_ssize_t start, Py_ssize_t n) noexcept:
    cdef Py_ssize_t i
    for i in range(start, n):
        Py_XDECREF(out[i])
        out[i] = NULL
    return 0


def column_get(list maps not None, kgs, keys, namespace, now=0, ttl=0, refresh=False,
               default=None, bint return_expired=False, int out_type=COL_LIST, bint peek=False,
               bint exact=False, ColumnLocations locations=None, bint keys_private=False):
    """Read ``keys[i]`` (an int64 array or a tuple) in ``namespace`` from
    ``maps[kgs[i]]`` (``kgs`` an int32 array) for every row, in order; returns
    ``(values, status)``.

    ``status`` is a uint8 array: 0 absent (or no map), 1 live, 2 expired. With
    ``ttl > 0`` an expired entry is removed as it is read, and its row gets its
    state when ``return_expired`` (``ReturnExpiredIfNotCleanedUp``), else
    ``default``; ``refresh`` sets the timestamps of live entries to ``now``
    (``OnReadAndWrite``). With ``peek`` nothing changes: expired entries stay
    (status 2) and nothing is refreshed. ``values`` is a list (``out_type``
    COL_LIST), absent rows holding ``default``, or an int64 / float64 array
    (COL_INT64, COL_FLOAT64), absent rows holding ``default`` (None: NaN for
    float64, ``ValueError`` for int64, raised before anything is read when
    ``default`` is None). An int64 array takes integer states only and a
    float64 array numbers only (with ``exact``: only Python ints, and ints or
    floats; numpy scalars and anything else are refused): another state is a
    ``TypeError`` naming its key, raised once the reads are done. With
    ``locations``, an int64 column's rows' entries are recorded there for a
    ``column_put`` of the same column (see ``ColumnLocations``), keeping
    ``keys`` itself when ``keys_private`` (a copy nothing else can change), else
    a copy of it. O(len(keys)).
    """
    import numpy as np
    if out_type == COL_INT64 and default is None:
        raise ValueError("an int64 read needs default= for keys with no value (there is no int64 NaN); "
                         "nothing was read")
    cdef _Column col = _Column()
    col.setup(CM_COL_GET, maps, kgs, keys, namespace)
    cdef Py_ssize_t i, n = col.c.n
    cdef int64_t c_now = _as_time(now, "now"), c_ttl = _as_ts(ttl, "ttl")
    status = np.zeros(n, dtype=np.uint8)
    cdef uint8_t[::1] st = status
    cdef PyObject **out = <PyObject **>PyMem_Calloc(n if n else 1, sizeof(PyObject *))
    if out == NULL:
        raise MemoryError()
    col.c.now = c_now
    col.c.ttl = c_ttl
    col.c.refresh = 1 if refresh else 0
    col.c.peek = 1 if peek else 0
    col.c.out = out
    col.c.status = &st[0] if n else NULL
    cdef PyObject *s
    cdef PyObject *lst
    cdef int64_t[::1] iv
    cdef double[::1] fv
    cdef int overflow
    if out_type == COL_INT64:
        values = np.empty(n, dtype=np.int64)
        iv = values
        col.c.iout = &iv[0] if n else NULL
    elif out_type == COL_FLOAT64:
        values = np.empty(n, dtype=np.float64)
        fv = values
        col.c.fout = &fv[0] if n else NULL
    cdef unsigned long gen = 0
    held = None
    if locations is not None:
        locations.clear()
        if col.c.ikeys != NULL:
            locations._begin(col, kgs, namespace)
            held = (locations.locs_arr, locations.marks_arr)  # alive for the run (see ColumnLocations)
            gen = locations.gen
    try:
        cm_col_run(&col.c)
        if col.c.locs != NULL and locations.gen == gen:  # else a read started meanwhile: none stand
            locations.keys = keys if keys_private else np.array(keys, dtype=np.int64, copy=True)
        if out_type == COL_LIST:
            lst = _list_new(n)
            values = <object>lst
            Py_DECREF(values)  # _list_new's reference, now owned by `values`
            for i in range(n):
                s = out[i]
                if s != NULL and (st[i] == 1 or return_expired):
                    out[i] = NULL
                else:
                    Py_XDECREF(s)
                    out[i] = NULL
                    s = <PyObject *>default
                    Py_INCREF(default)
                _list_set(lst, i, s)
            return values, status
        if col.c.typed_live == n:  # every row live and read into the array: nothing else to do
            status.fill(1)
            return values, status
        if out_type == COL_INT64:
            for i in range(n):
                if st[i] & _ROW_TYPED:  # the fast read wrote it
                    st[i] &= ~_ROW_TYPED
                    if st[i] == 1 or return_expired:
                        continue
                s = out[i]
                if s == NULL or not (st[i] == 1 or return_expired):
                    if default is None:
                        key = col.c.ikeys[i] if col.c.ikeys != NULL else (<tuple>col.keys)[i]
                        raise ValueError(f"key {key!r} has no value: pass default= to read "
                                         f"missing keys into an int64 array")
                    values[i] = default
                    continue
                if _is_int(s):
                    overflow = 0
                    iv[i] = cm_as_int64(s, &overflow)
                    if overflow:
                        key = col.c.ikeys[i] if col.c.ikeys != NULL else (<tuple>col.keys)[i]
                        raise OverflowError(f"the state of key {key!r} is {<object>s!r}, beyond int64: it cannot be "
                                            "read into an int64 array (read it with dtype=None)")
                elif not exact and _is_np_scalar(<object>s) and (<object>s).dtype.kind in "iu":
                    values[i] = <object>s  # numpy's integer scalars
                else:
                    raise _not_numeric(col, i, <object>s, "an int", "int64")
            return values, status
        if out_type == COL_FLOAT64:
            dflt = float("nan") if default is None else default
            for i in range(n):
                if st[i] & _ROW_TYPED:
                    st[i] &= ~_ROW_TYPED
                    if st[i] == 1 or return_expired:
                        continue
                s = out[i]
                if s == NULL or not (st[i] == 1 or return_expired):
                    values[i] = dflt
                elif _is_exact_float(s):
                    fv[i] = _float_value(s)
                elif exact and _is_int(s) and type(<object>s) is int:
                    values[i] = <object>s
                elif not exact and (isinstance(<object>s, (int, float)) or _is_np_scalar(<object>s)):
                    values[i] = <object>s
                else:
                    raise _not_numeric(col, i, <object>s, "a number", "float64")
            return values, status
        raise ValueError(f"out_type must be COL_LIST, COL_INT64 or COL_FLOAT64, got {out_type}")
    finally:
        if col.c.typed_live != n:  # else no row holds a reference
            _release_refs(out, 0, n)
        PyMem_Free(out)


def column_put(list maps not None, kgs, keys, namespace, states, ts=NO_TIMESTAMP,
               ColumnLocations locations=None):
    """Write ``states[i]`` to ``keys[i]`` in ``namespace`` of ``maps[kgs[i]]``
    with timestamp ``ts`` for every row (or ``ts[i]`` when ``ts`` is an int64
    array: a restore's), in order; a state None removes the key instead.
    ``states`` is a tuple, or an int64 or float64 array (written as ints /
    floats). Every row's map must exist (``ValueError``). ``locations``: a
    ``column_get``'s, used when ``keys`` and ``namespace`` are that read's.
    Not atomic: when a row fails, the rows before it are written. O(len(keys))."""
    cdef _Column col = _Column()
    cdef bint located = False
    cdef const uint8_t *seen = NULL
    held = None
    if locations is not None:
        locations.written = 0
        located = locations._matches(keys, namespace) and locations.nmaps == len(maps)
        if located and kgs is locations.kgs:  # the read's key groups: so the maps it found them in
            seen = <const uint8_t *><char *>locations.seen
    col.setup(CM_COL_PUT, maps, kgs, keys, namespace, seen)
    if located:
        held = (locations.locs_arr, locations.marks_arr)  # alive for the run (see ColumnLocations)
        col.c.locs = locations.locs
        col.c.marks = locations.marks
    cdef Py_ssize_t i, n = col.c.n
    cdef const int64_t[::1] iv
    cdef const int64_t[::1] tv
    cdef const double[::1] fv
    cdef PyObject **buf = NULL
    if getattr(ts, "dtype", None) is not None:
        if ts.dtype.kind != "i" or ts.dtype.itemsize != 8:
            raise TypeError(f"ts must be an int, a time provider or an int64 array, not a {ts.dtype} array")
        tv = ts
        if tv.shape[0] != n:
            raise ValueError(f"{tv.shape[0]} timestamps for {n} keys")
        col.c.tss = &tv[0] if n else NULL
    else:
        col.c.ts = _as_time(ts)
    if type(states) is tuple:
        if len(<tuple>states) != n:
            raise ValueError(f"{len(<tuple>states)} states for {n} keys")
        buf = <PyObject **>PyMem_Calloc(n if n else 1, sizeof(PyObject *))
        if buf == NULL:
            raise MemoryError()
        for i in range(n):
            buf[i] = <PyObject *>(<tuple>states)[i]
        col.c.states = buf
    else:
        dtype = getattr(states, "dtype", None)
        if dtype is None:
            raise TypeError(f"states must be a tuple or an int64 / float64 array, not {type(states).__name__}")
        if dtype.kind == "i" and dtype.itemsize == 8:
            iv = states
            if iv.shape[0] != n:
                raise ValueError(f"{iv.shape[0]} states for {n} keys")
            col.c.istates = &iv[0] if n else NULL
        elif dtype.kind == "f" and dtype.itemsize == 8:
            fv = states
            if fv.shape[0] != n:
                raise ValueError(f"{fv.shape[0]} states for {n} keys")
            col.c.fstates = &fv[0] if n else NULL
        else:
            raise TypeError(f"states must be a tuple or an int64 / float64 array, not {dtype}")
    try:
        if n:
            cm_col_run(&col.c)
    finally:
        PyMem_Free(buf)
        if locations is not None:
            locations.written = col.c.located

def column_remove(list maps not None, kgs, keys, namespace):
    """Remove ``keys[i]`` in ``namespace`` from ``maps[kgs[i]]`` for every row. O(len(keys))."""
    cdef _Column col = _Column()
    col.setup(CM_COL_REMOVE, maps, kgs, keys, namespace)
    cm_col_run(&col.c)


def column_contains(list maps not None, kgs, keys, namespace):
    """A numpy bool array: whether ``keys[i]`` is mapped in ``namespace`` of
    ``maps[kgs[i]]``, for every row. O(len(keys))."""
    import numpy as np
    cdef _Column col = _Column()
    col.setup(CM_COL_CONTAINS, maps, kgs, keys, namespace)
    out = np.zeros(col.c.n, dtype=np.bool_)
    cdef uint8_t[::1] view = out.view(np.uint8)
    if col.c.n:
        col.c.status = &view[0]
        cm_col_run(&col.c)
    return out


def column_missing(list maps not None, kgs):
    """The distinct key groups of ``kgs`` (an int32 array) whose map is None, in
    the order they first appear: the maps a write must make first. O(len(kgs))."""
    cdef const int32_t[::1] k = kgs
    cdef Py_ssize_t i, n = k.shape[0], nmaps = len(maps)
    cdef list out = []
    cdef uint8_t *seen = <uint8_t *>PyMem_Calloc(nmaps if nmaps else 1, 1)
    if seen == NULL:
        raise MemoryError()
    try:
        for i in range(n):
            kg = k[i]
            if kg < 0 or kg >= nmaps:
                raise ValueError(f"key group {kg} of row {i} is not within 0..{nmaps - 1}")
            if not seen[kg]:
                seen[kg] = 1
                if <PyObject *>maps[kg] == <PyObject *>None:
                    out.append(kg)
    finally:
        PyMem_Free(seen)
    return out


def column_groups(keys):
    """The rows of a column grouped by key, groups numbered in the order their
    keys first appear: ``(first, group)``, ``first[g]`` the row where group
    ``g``'s key first appears (an intp array), ``group[i]`` the group of row
    ``i`` (an intp array). ``keys`` is an int64 array (hashed in C, equal
    values grouped) or a tuple (grouped as dict keys: by ``==``). O(len(keys)).
    """
    import numpy as np
    cdef Py_ssize_t i, n, g = 0, slot
    cdef const int64_t[::1] k
    cdef Py_ssize_t[::1] grp
    cdef Py_ssize_t[::1] fst
    cdef Py_ssize_t *table = NULL
    cdef size_t cap, mask
    cdef uint64_t h
    if type(keys) is tuple:
        n = len(<tuple>keys)
        group = np.empty(n, dtype=np.intp)
        grp = group
        seen = {}
        firsts = []
        for i in range(n):
            key = (<tuple>keys)[i]
            j = seen.get(key, -1)
            if j == -1:
                j = seen[key] = len(firsts)
                firsts.append(i)
            grp[i] = j
        return np.array(firsts, dtype=np.intp), group
    k = keys
    n = k.shape[0]
    group = np.empty(n, dtype=np.intp)
    first = np.empty(n, dtype=np.intp)
    grp = group
    fst = first
    cap = 16
    while cap < 2 * <size_t>n:
        cap <<= 1
    mask = cap - 1
    table = <Py_ssize_t *>PyMem_Calloc(cap, sizeof(Py_ssize_t))  # group + 1; 0 = empty
    if table == NULL:
        raise MemoryError()
    try:
        for i in range(n):
            h = <uint64_t>k[i] * 0x9E3779B97F4A7C15ULL
            slot = <Py_ssize_t>((h >> 32) & mask)
            while table[slot] and k[fst[table[slot] - 1]] != k[i]:
                slot = (slot + 1) & mask
            if not table[slot]:
                fst[g] = i
                g += 1
                table[slot] = g
            grp[i] = table[slot] - 1
    finally:
        PyMem_Free(table)
    return first[:g], group


FOLD_ADD = CM_FOLD_ADD
FOLD_MIN = CM_FOLD_MIN
FOLD_MAX = CM_FOLD_MAX


def column_fold(list maps not None, kgs, keys, namespace, values, int fold, now=0, ttl=0,
                bint return_expired=False, ts=NO_TIMESTAMP):
    """Combine ``values[i]`` (an int64 array) into the int stored for ``keys[i]``
    in ``namespace`` of ``maps[kgs[i]]``, for every row: ``fold`` is FOLD_ADD,
    FOLD_MIN or FOLD_MAX. A stored int is used when present and (with ``ttl >
    0``) unexpired at ``now``, or expired and ``return_expired``; otherwise
    ``values[i]`` is written as it is. Results are written with timestamp ``ts``.
    Rows whose stored value is not an int within int64, or whose result would
    leave int64, are left unchanged: their indices are returned, in order, for
    the caller to add some other way. Every row's map must exist. Keys should be
    distinct (a key twice is folded twice). O(len(keys))."""
    cdef _Column col = _Column()
    col.setup(CM_COL_FOLD, maps, kgs, keys, namespace)
    cdef Py_ssize_t n = col.c.n
    cdef const int64_t[::1] iv = values
    if iv.shape[0] != n:
        raise ValueError(f"{iv.shape[0]} values for {n} keys")
    if fold != CM_FOLD_ADD and fold != CM_FOLD_MIN and fold != CM_FOLD_MAX:
        raise ValueError(f"fold must be FOLD_ADD, FOLD_MIN or FOLD_MAX, got {fold}")
    cdef int64_t c_ttl = _as_ts(ttl, "ttl")
    if c_ttl != 0:
        cm_check_ttl(c_ttl)
    cdef list unfit = []
    col.c.istates = &iv[0] if n else NULL
    col.c.fold = fold
    col.c.now = _as_time(now, "now")
    col.c.ttl = c_ttl
    col.c.return_expired = return_expired
    col.c.ts = _as_time(ts)
    col.c.unfit = <PyObject *>unfit
    if n:
        cm_col_run(&col.c)
    unfit.sort()  # the fast pass and the general pass each note theirs in order
    return unfit
