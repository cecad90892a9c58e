# cython: language_level=3
"""A micro-batch's rows grouped by key, each key made current in C (``ctx.groups``).

The Python side (cowmap.spark.groups) orders the batch by key once; what is left
is per key, and compiled here: making the key current, a ``Rows`` of two
integers, its length and its per-group aggregates, with no Python frame per key
(a generator and Python methods cost ~0.5 µs a key, as much as the state
accesses the user's loop makes).
"""

cimport cython
from libc.stdint cimport int64_t

from cowmap._context cimport KeyContext

import numpy as np

cdef dict _REDUCERS = {"sum": np.add, "min": np.minimum, "max": np.maximum}


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
    and per-record TTL cleanup step), else by calling ``target(key)``."""

    cdef OrderedBatch _o
    cdef list _keys
    cdef const int64_t[::1] _bounds
    cdef KeyContext _kc
    cdef object _set_key
    cdef Py_ssize_t _i

    def __init__(self, OrderedBatch ordered not None, list keys not None, target):
        cdef const int64_t[::1] b = ordered.bounds
        if b.shape[0] != len(keys) + 1:
            raise ValueError(f"{len(keys)} groups need {len(keys) + 1} bounds, got {b.shape[0]}")
        if isinstance(target, KeyContext):
            self._kc = target
        elif callable(target):
            self._set_key = target
        else:
            raise TypeError(f"target must be a KeyContext or a callable, not {type(target).__name__}")
        self._o = ordered
        self._keys = keys
        self._bounds = b
        self._i = 0

    def __iter__(self):
        return self

    def __next__(self):
        cdef Py_ssize_t i = self._i
        if i >= len(self._keys):
            raise StopIteration
        key = self._keys[i]
        if self._kc is not None:
            self._kc.switch(key, self._kc.key_group_of(key))
        else:
            self._set_key(key)
        cdef Rows rows = Rows.__new__(Rows)
        rows._o = self._o
        rows.group = i
        rows.start = <Py_ssize_t>self._bounds[i]
        rows.stop = <Py_ssize_t>self._bounds[i + 1]
        self._i = i + 1
        return key, rows
