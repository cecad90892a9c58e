# cython: language_level=3, boundscheck=False, wraparound=False, embedsignature=True
"""Stable key hashes and Flink's key-group assignment, compiled (see keyhash.h), and
the current-key switch of a ``KeyedStateBackend`` built on them."""

from libc.stdint cimport int32_t, int64_t


cdef extern from "keyhash.h":
    int32_t kh_murmur(int32_t code)
    int32_t kh_int64(int64_t v)
    int kh_hash(object key, int32_t *out, int depth) except -1

cdef extern from "slots.h":
    ctypedef struct cowmap_slot_cache:
        pass
    object cowmap_slot_get(object obj, object name, cowmap_slot_cache *c)
    int cowmap_slot_set(object obj, object name, cowmap_slot_cache *c, object v) except -1


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


# ------------------------------------------------------------ the backend's current key
# KeyedStateBackend keeps these in __slots__; set_current_key is the hottest call of
# the sync path and the controller switches keys for every record, so both are C.

cdef str _KEY = "_key"
cdef str _KG = "_kg"
cdef str _CLEANUPS = "_record_cleanups"
cdef str _MAXP = "max_parallelism"
cdef str _LO = "_lo"
cdef str _HI = "_hi"
cdef cowmap_slot_cache _key_set, _kg_set, _key_get, _kg_get, _cleanups_get
cdef cowmap_slot_cache _maxp_get, _lo_get, _hi_get


cdef int switch_key(object backend, object key, object key_group) except -1:
    """Make ``key`` (already validated, of ``key_group``) current on ``backend``:
    the last steps of ``set_current_key``, which the async controller also takes
    for keys it validated before."""
    cowmap_slot_set(backend, _KEY, &_key_set, key)
    cowmap_slot_set(backend, _KG, &_kg_set, key_group)
    cleanups = cowmap_slot_get(backend, _CLEANUPS, &_cleanups_get)
    if cleanups:  # TTL states that clean up on every record
        for t in cleanups:
            t.cleanup_step()
    return 0


cdef int restore_key(object backend, object key, object key_group) except -1:
    """Make ``key`` current on ``backend`` again after code that switched keys
    (a batch, a nested record): no record starts, so no cleanup step runs."""
    cowmap_slot_set(backend, _KEY, &_key_set, key)
    cowmap_slot_set(backend, _KG, &_kg_set, key_group)
    return 0


cdef object current_key(object backend):
    return cowmap_slot_get(backend, _KEY, &_key_get)


cdef object current_key_group(object backend):
    return cowmap_slot_get(backend, _KG, &_kg_get)


cdef object key_group_in_range(object backend, object key):
    """The key group of ``key`` on ``backend``; ValueError if the backend does not own it."""
    cdef long maxp = cowmap_slot_get(backend, _MAXP, &_maxp_get)
    cdef long lo = cowmap_slot_get(backend, _LO, &_lo_get)
    cdef long hi = cowmap_slot_get(backend, _HI, &_hi_get)
    cdef long kg = _key_group(key, maxp)
    if not lo <= kg <= hi:
        raise ValueError(
            f"key {key!r} is in key group {kg}, outside this backend's range {backend.key_group_range}"
        )
    return kg


def set_current_key(backend, key):
    """Make ``key`` the key that state accesses read and write."""
    switch_key(backend, key, key_group_in_range(backend, key))
