# cython: language_level=3, boundscheck=False, wraparound=False, embedsignature=True
"""Stable key hashes and Flink's key-group assignment, compiled (see keyhash.h).
The current key of a backend, which uses them, is in _context.pyx."""

from libc.stdint cimport int32_t, int64_t, uint32_t


cdef extern from *:
    """
    #if defined(__GNUC__)
    #define KH_PREFETCH(p) __builtin_prefetch(p)
    #else
    #define KH_PREFETCH(p) ((void)(p))
    #endif
    """
    void KH_PREFETCH(const void *p)

cdef extern from "Python.h":
    ctypedef struct PyObject
    PyObject *_tuple_item "PyTuple_GET_ITEM"(object t, Py_ssize_t i)

cdef extern from "keyhash.h":
    int32_t kh_murmur(int32_t code)
    int32_t kh_int64(int64_t v)
    int kh_hash(object key, int32_t *out, int depth) except -1

cdef inline int _check_max_parallelism(long max_parallelism) except -1:
    if max_parallelism < 1 or max_parallelism > 32768:
        raise ValueError(f"max_parallelism must be within 1..32768, got {max_parallelism}")
    return 0


cdef inline long _key_group(object key, long max_parallelism) except -1:
    """Flink's key group of ``key``; TypeError for None / unhashable keys."""
    cdef int32_t h = 0
    kh_hash(key, &h, 0)
    return kh_murmur(h) % max_parallelism


def key_hash(key):
    """The stable 32-bit hash of ``key``: Java's ``hashCode`` rules (see keyhash.h).

    Equal keys get equal hashes, in every process (unlike ``hash()``, salted for str).
    """
    cdef int32_t h = 0
    kh_hash(key, &h, 0)
    return h


def murmur_hash(code):
    """Flink's ``MathUtils.murmurHash`` of a 32-bit int (non-negative result)."""
    if not -2**31 <= code < 2**31:
        raise ValueError(f"code must be a 32-bit int, got {code}")
    return kh_murmur(<int32_t>code)


def key_group_for(key, long max_parallelism):
    """The key group of ``key``: ``murmur_hash(key_hash(key)) % max_parallelism``. O(len(key))."""
    _check_max_parallelism(max_parallelism)
    return _key_group(key, max_parallelism)


def key_groups_for(keys, long max_parallelism):
    """Key groups of many keys as an int32 numpy array; int64 arrays take a C loop."""
    cdef Py_ssize_t i, n
    cdef const int64_t[::1] arr
    cdef int32_t[::1] out
    import numpy as np  # here, not at module level: `import cowmap` alone does not load numpy
    _check_max_parallelism(max_parallelism)
    dtype = getattr(keys, "dtype", None)
    if dtype is not None and dtype.kind in "iu" and getattr(keys, "ndim", 0) == 1 and not (
            dtype.kind == "u" and dtype.itemsize == 8):
        arr = np.ascontiguousarray(keys, dtype=np.int64)
        n = arr.shape[0]
        result = np.empty(n, dtype=np.int32)
        out = result
        for i in range(n):
            out[i] = kh_murmur(kh_int64(arr[i])) % max_parallelism
        return result
    if dtype is not None:
        keys = keys.tolist()
    seq = list(keys)
    n = len(seq)
    result = np.empty(n, dtype=np.int32)
    out = result
    for i in range(n):
        out[i] = _key_group(seq[i], max_parallelism)
    return result


cdef long key_group_of(object key, long max_parallelism) except -1:
    """``_key_group`` for the key context (_context.pyx)."""
    return _key_group(key, max_parallelism)


def column_key_groups(keys, long max_parallelism, long lo, long hi):
    """The key group of every key of a column (an int64 array or a tuple), as an
    int32 array, each checked to be within ``lo..hi`` (a backend's range).

    ``TypeError`` naming the row for a key with no stable hash (None, unhashable),
    ``ValueError`` naming the row and key for a key group outside the range.
    O(len(keys)); int64 arrays in a C loop.
    """
    cdef Py_ssize_t i, n
    cdef const int64_t[::1] arr
    cdef int32_t[::1] out
    cdef int32_t h = 0
    cdef long kg
    cdef uint32_t mask
    import numpy as np
    _check_max_parallelism(max_parallelism)
    pow2 = max_parallelism & (max_parallelism - 1) == 0
    mask = <uint32_t>(max_parallelism - 1)
    if type(keys) is tuple:
        n = len(<tuple>keys)
        result = np.empty(n, dtype=np.int32)
        out = result
        for i in range(n):
            if i + 8 < n:  # the key objects are scattered: their first touch is a cache miss
                KH_PREFETCH(_tuple_item(keys, i + 8))
            key = (<tuple>keys)[i]
            try:
                kh_hash(key, &h, 0)
            except TypeError as e:
                raise TypeError(f"keys[{i}]: {e}") from None
            kg = kh_murmur(h) % max_parallelism
            if kg < lo or kg > hi:
                raise _outside(i, key, kg, lo, hi)
            out[i] = <int32_t>kg
        return result
    arr = keys
    n = arr.shape[0]
    result = np.empty(n, dtype=np.int32)
    out = result
    if pow2:  # kh_murmur is non-negative: % is a mask, without a division per key
        for i in range(n):
            out[i] = <int32_t>(<uint32_t>kh_murmur(kh_int64(arr[i])) & mask)
    else:
        for i in range(n):
            out[i] = <int32_t>(kh_murmur(kh_int64(arr[i])) % max_parallelism)
    if lo > 0 or hi < max_parallelism - 1:
        for i in range(n):
            if out[i] < lo or out[i] > hi:
                raise _outside(i, arr[i], out[i], lo, hi)
    return result


cdef object _outside(Py_ssize_t i, object key, long kg, long lo, long hi):
    return ValueError(f"keys[{i}] = {key!r} is in key group {kg}, outside this backend's range "
                      f"KeyGroupRange({lo}, {hi}); nothing was written")
