# cython: language_level=3
"""A micro-batch's rows grouped by key, each key made current in C (``ctx.groups``).

The Python side (cowmap.spark.groups) orders the batch by key once, here too for
a single integer key column (``group_int64``: one pass, no pandas). What is left
is per key, and compiled here: making the key current, a ``Rows`` of two
integers, its length and its per-group aggregates, with no Python frame per key
(a generator and Python methods cost ~0.5 µs a key, as much as the state
accesses the user's loop makes).
"""

cimport cython
from libc.stdint cimport int32_t, int64_t, uint64_t
from libc.stdlib cimport calloc, free, malloc, realloc

from cowmap._context cimport KeyContext

import numpy as np

cdef dict _REDUCERS = {"sum": np.add, "min": np.minimum, "max": np.maximum}


cdef inline uint64_t _mix(uint64_t x) noexcept nogil:
    # Murmur3's 64-bit finalizer: keys that differ only in high bits spread over the table
    x ^= x >> 33
    x *= 0xff51afd7ed558ccdULL
    x ^= x >> 33
    x *= 0xc4ceb9fe1a85ec53ULL
    x ^= x >> 33
    return x


cdef Py_ssize_t _codes_of(const int64_t* keys, Py_ssize_t n, int32_t* codes, int64_t** uniques) noexcept nogil:
    """Per row the code of its key (0.. in order of first appearance) and, in
    ``*uniques`` (malloc'ed), the distinct keys by code; returns their count,
    -1 without memory. The table is open-addressing, at most half full, and
    holds codes only (4 bytes a slot, the key read from ``*uniques``); it grows
    with the distinct keys, so it stays small enough for the cache (pandas'
    factorize sizes its table by the rows: three times slower here)."""
    cdef Py_ssize_t cap = 1024, mask = cap - 1, i, j, c, ngroups = 0
    cdef int64_t key
    cdef int32_t slot
    cdef int32_t* table = <int32_t*>calloc(cap, sizeof(int32_t))  # a code + 1 per slot, 0 for empty
    cdef int64_t* seen = <int64_t*>malloc((cap // 2) * sizeof(int64_t))
    cdef void* grown
    if table == NULL or seen == NULL:
        free(table)
        free(seen)
        return -1
    for i in range(n):
        key = keys[i]
        j = <Py_ssize_t>(_mix(<uint64_t>key) & <uint64_t>mask)
        while True:
            slot = table[j]
            if slot == 0:
                seen[ngroups] = key
                ngroups += 1
                table[j] = <int32_t>ngroups
                codes[i] = <int32_t>(ngroups - 1)
                break
            if seen[slot - 1] == key:
                codes[i] = slot - 1
                break
            j = (j + 1) & mask
        if ngroups * 2 >= cap:  # room for cap // 2 keys: the codes rehashed into a table twice the size
            grown = realloc(seen, cap * sizeof(int64_t))
            if grown == NULL:
                free(table)
                free(seen)
                return -1
            seen = <int64_t*>grown
            free(table)
            cap *= 2
            mask = cap - 1
            table = <int32_t*>calloc(cap, sizeof(int32_t))
            if table == NULL:
                free(seen)
                return -1
            for c in range(ngroups):
                j = <Py_ssize_t>(_mix(<uint64_t>seen[c]) & <uint64_t>mask)
                while table[j] != 0:
                    j = (j + 1) & mask
                table[j] = <int32_t>(c + 1)
    free(table)
    uniques[0] = seen
    return ngroups


def group_int64(keys, key_groups=None):
    """``(keys, order, bounds)`` of an int64 key column: its distinct keys in
    order of first appearance (Python ints, as pandas' ``factorize`` gives
    them), the row positions by key (ties in row order) and the int64 bounds
    of each key's run in them. O(n): a pass through a hash table of the
    distinct keys, then a counting sort, both without the GIL. ``TypeError``
    for a column of another type (uint64 included: not every value fits).

    ``key_groups``: a function giving the key groups (ints in ``0..65535``) of
    an int64 array of distinct keys; the keys are then in key-group order (of
    one key group, in order of first appearance), and the result is ``(keys,
    order, bounds, their key groups)``."""
    arr = np.asarray(keys)
    if arr.dtype.kind not in "iu" or arr.dtype.itemsize > 8 or arr.dtype == np.uint64:
        raise TypeError(f"group_int64 groups a column of integers that int64 holds, not {arr.dtype}")
    cdef const int64_t[::1] k = np.ascontiguousarray(arr, dtype=np.int64)
    cdef Py_ssize_t n = k.shape[0], c, i, ngroups = 0
    cdef int32_t[::1] rank
    cdef int32_t* r
    cdef int64_t[::1] u
    if n > 0x7FFFFFFF:  # (codes are int32)
        raise ValueError(f"a batch of {n} rows is too long to group (at most 2**31 - 1)")
    cdef int32_t* codes = <int32_t*>malloc(n * sizeof(int32_t) + 1)
    cdef int64_t* seen = NULL
    if codes == NULL:
        raise MemoryError("no memory to group a batch's keys")
    try:
        if n:
            with nogil:
                ngroups = _codes_of(&k[0], n, codes, &seen)
            if ngroups < 0:
                raise MemoryError("no memory to group a batch's keys")
        bounds_arr = np.zeros(ngroups + 1, dtype=np.int64)
        order_arr = np.empty(n, dtype=np.int64)
        if key_groups is None:
            values = [seen[c] for c in range(ngroups)]
        else:
            uniques = np.empty(ngroups, dtype=np.int64)
            u = uniques
            for c in range(ngroups):
                u[c] = seen[c]
            uniques.flags.writeable = False  # (they become the keys: the function only reads them)
            kgs = np.asarray(key_groups(uniques))
            if kgs.shape != (ngroups,) or kgs.dtype.kind not in "iu":
                raise ValueError(
                    f"key_groups must give {ngroups} integer key groups, got {kgs.dtype} of shape {kgs.shape}"
                )
            if ngroups and (kgs.min() < 0 or kgs.max() > 0xFFFF):
                raise ValueError(f"key groups must be within 0..65535, got {kgs.min()}..{kgs.max()}")
            # (16-bit keys: numpy's stable sort of them is a radix sort)
            perm = np.argsort(kgs.astype(np.uint16), kind="stable")
            rank_arr = np.empty(ngroups, dtype=np.int32)
            rank_arr[perm] = np.arange(ngroups, dtype=np.int32)
            rank = rank_arr
            if ngroups:
                r = &rank[0]
                with nogil:
                    for i in range(n):
                        codes[i] = r[codes[i]]
            values = uniques[perm].tolist()
            kgs = kgs[perm]
        _counting_sort(codes, n, ngroups, bounds_arr, order_arr)
    finally:
        free(codes)
        free(seen)
    if key_groups is None:
        return values, order_arr, bounds_arr
    return values, order_arr, bounds_arr, kgs


cdef void _counting_sort(const int32_t* codes, Py_ssize_t n, Py_ssize_t ngroups,
                         int64_t[::1] bounds, int64_t[::1] order) noexcept:
    """The rows by code, ties in row order: counts, their running sum (each
    code's start), then every row put at its code's cursor; each cursor ends at
    the next code's start, so the bounds are the cursors moved one place up."""
    cdef Py_ssize_t i, c
    with nogil:
        for i in range(n):
            bounds[codes[i]] += 1
        c = 0
        for i in range(ngroups):
            c, bounds[i] = c + bounds[i], c
        for i in range(n):
            order[bounds[codes[i]]] = i
            bounds[codes[i]] += 1
        for i in range(ngroups, 0, -1):
            bounds[i] = bounds[i - 1]
        bounds[0] = 0


@cython.final
@cython.auto_pickle(False)
cdef class OrderedBatch:
    """A batch and its rows' order by key; columns reordered, and per-group
    aggregates computed, on first use."""

    cdef readonly object frame
    cdef readonly object order      # the batch's row positions, by key
    cdef readonly object bounds     # group i is rows bounds[i]..bounds[i + 1] of the order (int64)
    cdef dict _cols
    cdef dict _aggs                 # (how, column) -> a Python number per group

    def __init__(self, frame, order, bounds):
        self.frame = frame
        self.order = order
        self.bounds = bounds
        self._cols = {}
        self._aggs = {}

    cpdef object column(self, object name):
        """Column ``name`` in the order by key (a numpy array)."""
        col = self._cols.get(name)
        if col is None:
            try:
                values = self.frame[name]
            except KeyError:
                raise KeyError(f"no column {name!r} in the batch (columns: {list(self.frame.columns)})") from None
            col = self._cols[name] = values.to_numpy()[self.order]
        return col

    cpdef list aggregate(self, str how, object name):
        """``how`` (sum, min, max) of column ``name`` for every group at once
        (``reduceat``, one C pass), as Python numbers by group."""
        agg = self._aggs.get((how, name))
        if agg is None:
            col = self.column(name)
            if col.dtype.kind not in "iufb":
                raise TypeError(f"rows.{how}({name!r}) needs a numeric column, not {col.dtype}")
            agg = self._aggs[(how, name)] = _REDUCERS[how].reduceat(col, self.bounds[:-1]).tolist()
        return agg


@cython.final
@cython.auto_pickle(False)
cdef class Rows:
    """The rows of one key in a micro-batch: ``len(rows)``, ``rows["col"]`` (a
    numpy array, in the batch's order), ``rows.sum("col")``, ``rows.min``,
    ``rows.max`` (Python numbers), ``rows.index`` (their positions in the
    batch) and ``rows.to_pandas()``. O(1) to make; a column is O(rows) the
    first time any group reads it (the whole batch's column is reordered then),
    and so is an aggregate (computed then for every group in one pass: O(1)
    per group after, where a numpy call per group costs microseconds)."""

    cdef OrderedBatch _o            # None only in one made by Rows.__new__, which every method refuses
    cdef readonly Py_ssize_t group, start, stop

    def __init__(self, *args, **kwargs):
        raise TypeError("Rows are made by ctx.groups(batch), not directly")

    cdef inline OrderedBatch _batch(self):
        if self._o is None:
            raise TypeError("Rows are made by ctx.groups(batch), not directly")
        return self._o

    def sum(self, name):
        return self._batch().aggregate("sum", name)[self.group]

    def min(self, name):
        return self._batch().aggregate("min", name)[self.group]

    def max(self, name):
        return self._batch().aggregate("max", name)[self.group]

    def __len__(self):
        return self.stop - self.start

    def __getitem__(self, name):
        return self._batch().column(name)[self.start:self.stop]

    @property
    def index(self):
        return self._batch().order[self.start:self.stop]

    def to_pandas(self):
        """These rows as a DataFrame (a copy; the slow way, for code that needs one)."""
        return self._batch().frame.iloc[self.index]

    def __repr__(self):
        return f"<Rows {self.stop - self.start} of {len(self._batch().order)}>"


@cython.final
@cython.auto_pickle(False)
cdef class Groups:
    """The iterator of ``(key, rows)`` over an :class:`OrderedBatch`: group ``i``
    has key ``keys[i]`` and the batch's rows ``bounds[i]..bounds[i + 1]``. Each
    key is made current before its pair is returned: through ``target``'s
    ``set_current_key`` in C when it is a :class:`KeyContext` (the same check
    and per-record TTL cleanup step), else by calling ``target(key)``.

    ``key_groups`` (with a KeyContext): each group's key group, computed for
    the whole batch at once, so no key is hashed again. They are trusted to be
    the keys' (a key of another key group would be stored where no lookup
    finds it); each is checked against the context's range as it is used."""

    cdef OrderedBatch _o
    cdef list _keys
    cdef const int64_t[::1] _bounds
    cdef const int64_t[::1] _kgs   # None without key_groups
    cdef KeyContext _kc
    cdef object _set_key
    cdef Py_ssize_t _i

    def __init__(self, OrderedBatch ordered not None, list keys not None, target, key_groups=None):
        cdef const int64_t[::1] b = ordered.bounds
        if b.shape[0] != len(keys) + 1:
            raise ValueError(f"{len(keys)} groups need {len(keys) + 1} bounds, got {b.shape[0]}")
        if isinstance(target, KeyContext):
            self._kc = target
        elif callable(target):
            self._set_key = target
        else:
            raise TypeError(f"target must be a KeyContext or a callable, not {type(target).__name__}")
        if key_groups is not None:
            if self._kc is None:
                raise TypeError("key_groups go with a KeyContext target")
            self._kgs = np.ascontiguousarray(key_groups, dtype=np.int64)
            if self._kgs.shape[0] != len(keys):
                raise ValueError(f"key_groups must give {len(keys)} key groups, not {self._kgs.shape[0]}")
        self._o = ordered
        self._keys = keys
        self._bounds = b
        self._i = 0

    def __iter__(self):
        return self

    def __next__(self):
        cdef Py_ssize_t i = self._i
        cdef long kg
        if i >= len(self._keys):
            raise StopIteration
        key = self._keys[i]
        if self._kc is None:
            self._set_key(key)
        elif self._kgs is not None:
            kg = self._kgs[i]
            if not self._kc.lo <= kg <= self._kc.hi:
                raise ValueError(f"key_groups[{i}] = {kg} is outside the context's range {self._kc.lo}..{self._kc.hi}")
            self._kc.switch(key, kg)
        else:
            self._kc.switch(key, self._kc.key_group_of(key))
        cdef Rows rows = Rows.__new__(Rows)
        rows._o = self._o
        rows.group = i
        rows.start = <Py_ssize_t>self._bounds[i]
        rows.stop = <Py_ssize_t>self._bounds[i + 1]
        self._i = i + 1
        return key, rows
