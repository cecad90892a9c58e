# cython: language_level=3, boundscheck=False, wraparound=False, embedsignature=True
"""Stable key hashes and Flink's key-group assignment, compiled (see keyhash.h),
and Spark SQL's hash() for key groups that agree with a Spark shuffle (see
sparkhash.h). The current key of a backend, which uses them, is in _context.pyx."""

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
    void kh_int64_groups_pow2(const int64_t *keys, int32_t *out, Py_ssize_t n, uint32_t mask) nogil
    int kh_hash(object key, int32_t *out, int depth, int nan_ok) except -1

#: why a NaN key is refused where state is stored (keyhash.h says it too)
_NAN_KEY = "a NaN equals no other NaN in Python, so its state could never be found again"


cdef inline int _check_max_parallelism(long max_parallelism) except -1:
    if max_parallelism < 1 or max_parallelism > 32768:
        raise ValueError(f"max_parallelism must be within 1..32768, got {max_parallelism}")
    return 0


cdef inline long _key_group(object key, long max_parallelism, bint nan_ok=True) except -1:
    """Flink's key group of ``key``; TypeError for None / unhashable keys,
    ValueError for a NaN unless ``nan_ok`` (Java's hash of it)."""
    cdef int32_t h = 0
    kh_hash(key, &h, 0, nan_ok)
    return kh_murmur(h) % max_parallelism


def key_hash(key):
    """The stable 32-bit hash of ``key``: Java's ``hashCode`` rules (see keyhash.h).

    Equal keys get equal hashes, in every process (unlike ``hash()``, salted for str).
    """
    cdef int32_t h = 0
    kh_hash(key, &h, 0, True)
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
    """``_key_group`` for the key context (_context.pyx): a NaN is refused."""
    return _key_group(key, max_parallelism, False)


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
                kh_hash(key, &h, 0, False)  # (a NaN: refused, its state could never be found)
            except (TypeError, ValueError) as e:
                raise type(e)(f"keys[{i}]: {e}") from None
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
        if n:
            kh_int64_groups_pow2(&arr[0], &out[0], n, mask)
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


# ---------------------------------------------------------------- Spark's hash()

cdef extern from "sparkhash.h":
    int32_t sh_hash_int(int32_t v, int32_t seed)
    int32_t sh_hash_long(int64_t v, int32_t seed)
    int32_t sh_hash_bytes(const char *p, size_t n, int32_t seed)
    int32_t sh_hash_double(double d, int32_t seed)
    int32_t sh_hash_float(float f, int32_t seed)
    int32_t sh_pmod(int32_t h, int32_t n)
    int32_t SH_SEED

cdef extern from "Python.h":
    const char *PyUnicode_AsUTF8AndSize(object s, Py_ssize_t *size) except NULL

# Spark SQL type names -> how hash() reads them (sparkhash.h)
cdef enum:
    SH_INT = 0
    SH_LONG = 1
    SH_STRING = 2
    SH_BINARY = 3
    SH_BOOLEAN = 4
    SH_FLOAT = 5
    SH_DOUBLE = 6

_SPARK_TYPES = {
    "int": SH_INT, "integer": SH_INT, "short": SH_INT, "smallint": SH_INT, "byte": SH_INT, "tinyint": SH_INT,
    "date": SH_INT, "long": SH_LONG, "bigint": SH_LONG, "timestamp": SH_LONG, "string": SH_STRING,
    "binary": SH_BINARY, "boolean": SH_BOOLEAN, "float": SH_FLOAT, "double": SH_DOUBLE,
}


def spark_type_codes(types):
    """The hash readers of Spark SQL type names (``simpleString`` forms such as
    ``"int"``, ``"bigint"``, ``"string"``); ValueError naming an unsupported one."""
    out = []
    for t in types:
        code = _SPARK_TYPES.get(str(t).lower())
        if code is None:
            raise ValueError(
                f"key columns of Spark type {t!r} are not supported (supported: {', '.join(sorted(_SPARK_TYPES))})"
            )
        out.append(code)
    return tuple(out)


cdef int32_t _spark_hash_one(object v, int code, int32_t seed, Py_ssize_t col, bint nan_ok=True) except? -1:
    cdef Py_ssize_t n = 0
    cdef const char *p
    if v is None:
        raise ValueError(f"key column {col} is null: a key must not be null (Spark's hash would skip it)")
    if not nan_ok and (code == SH_FLOAT or code == SH_DOUBLE) and v != v:
        raise ValueError(f"key column {col} is NaN: {_NAN_KEY}")
    if code == SH_INT:
        return sh_hash_int(<int32_t>v, seed)
    if code == SH_LONG:
        return sh_hash_long(<int64_t>v, seed)
    if code == SH_STRING:
        if not isinstance(v, str):
            raise TypeError(f"key column {col} is a Spark string, not {type(v).__name__}")
        p = PyUnicode_AsUTF8AndSize(v, &n)
        return sh_hash_bytes(p, <size_t>n, seed)
    if code == SH_BINARY:
        if not isinstance(v, (bytes, bytearray)):
            raise TypeError(f"key column {col} is a Spark binary, not {type(v).__name__}")
        b = bytes(v)
        return sh_hash_bytes(<const char *>b, <size_t>len(b), seed)
    if code == SH_BOOLEAN:
        return sh_hash_int(1 if v else 0, seed)
    if code == SH_FLOAT:
        return sh_hash_float(<float>v, seed)
    return sh_hash_double(<double>v, seed)


cdef int32_t _spark_hash(object key, tuple codes, bint nan_ok=True) except? -1:
    cdef int32_t h = SH_SEED
    cdef Py_ssize_t i, n = len(codes)
    if n == 1 and type(key) is not tuple:
        return _spark_hash_one(key, codes[0], h, 0, nan_ok)
    if type(key) is not tuple or len(<tuple>key) != n:
        raise ValueError(f"a key of {n} columns must be a tuple of {n} values, not {key!r}")
    for i in range(n):
        h = _spark_hash_one((<tuple>key)[i], codes[i], h, i, nan_ok)
    return h


def spark_hash(key, codes):
    """Spark SQL's ``hash(col, ...)`` of one key: ``key`` a value (one column) or a
    tuple (one value per column), ``codes`` from :func:`spark_type_codes`. An int
    outside its type's range: OverflowError; a null: ValueError. O(len(key))."""
    return _spark_hash(key, tuple(codes))


def spark_key_group(key, codes, long max_parallelism):
    """``pmod(hash(key columns), max_parallelism)``, as Spark computes it."""
    _check_max_parallelism(max_parallelism)
    return sh_pmod(_spark_hash(key, tuple(codes)), <int32_t>max_parallelism)


def spark_key_groups(columns, codes, long max_parallelism):
    """``pmod(hash(key columns), max_parallelism)`` of every row, as an int32
    numpy array: ``columns`` one sequence (numpy array, pandas Series, list)
    per key column (numpy array, pandas Series, pyarrow Array, list), ``codes``
    from :func:`spark_type_codes`. int32/int64 numpy
    columns of int/long keys run in a C loop; other columns value by value.
    A null anywhere: ValueError naming the row. O(rows x columns)."""
    return _spark_key_groups(columns, codes, max_parallelism, True)


cdef object _spark_key_groups(columns, codes, long max_parallelism, bint nan_ok):
    """:func:`spark_key_groups`; a NaN is a ValueError naming the row unless ``nan_ok``."""
    cdef Py_ssize_t i, n, c
    cdef int32_t[::1] h
    cdef const int64_t[::1] a64
    cdef const int32_t[::1] a32
    cdef int code
    import numpy as np
    _check_max_parallelism(max_parallelism)
    if len(columns) != len(codes) or not len(codes):
        raise ValueError(f"{len(columns)} key columns for {len(codes)} key types")
    n = len(columns[0])
    for col in columns:
        if len(col) != n:
            raise ValueError(f"key columns differ in length: {[len(x) for x in columns]}")
    hashes = np.full(n, SH_SEED, dtype=np.int32)
    h = hashes
    for c in range(len(codes)):
        col = columns[c]
        code = codes[c]
        if type(col).__module__.startswith("pyarrow"):  # (to_numpy copies strings only when told to)
            col = col.to_numpy(zero_copy_only=False)
        elif hasattr(col, "to_numpy"):  # pandas
            col = col.to_numpy()
        dtype = getattr(col, "dtype", None)
        if code == SH_LONG and dtype is not None and dtype.kind == "i" and getattr(col, "ndim", 1) == 1:
            a64 = np.ascontiguousarray(col, dtype=np.int64)
            for i in range(n):
                h[i] = sh_hash_long(a64[i], h[i])
            continue
        if code == SH_INT and dtype is not None and dtype.kind in "iu" and getattr(col, "ndim", 1) == 1 and (
            dtype.itemsize <= 4 and dtype != np.uint32 or n and -(2**31) <= col.min() and col.max() < 2**31
        ):  # (wider integers that all fit an int too: the distinct keys of an int column are int64)
            a32 = np.ascontiguousarray(col, dtype=np.int32)
            for i in range(n):
                h[i] = sh_hash_int(a32[i], h[i])
            continue
        vals = col.tolist() if dtype is not None else list(col)
        for i in range(n):
            try:
                h[i] = _spark_hash_one(vals[i], code, h[i], c, nan_ok)
            except (TypeError, ValueError, OverflowError) as e:
                raise type(e)(f"row {i}: {e}") from None
    out = np.empty(n, dtype=np.int32)
    cdef int32_t[::1] o = out
    for i in range(n):
        o[i] = sh_pmod(h[i], <int32_t>max_parallelism)
    return out


cdef long spark_key_group_of(object key, tuple codes, long max_parallelism) except -1:
    """``spark_key_group`` for the key context (_context.pyx): a NaN is refused."""
    return sh_pmod(_spark_hash(key, codes, False), <int32_t>max_parallelism)


def spark_column_key_groups(keys, tuple codes, long max_parallelism, long lo, long hi):
    """:func:`column_key_groups` with Spark's key groups: ``keys`` an int64 array
    or a tuple of keys (tuples for keys of several columns), each checked to be
    within ``lo..hi``."""
    cdef Py_ssize_t i, n
    cdef int32_t[::1] out
    import numpy as np
    _check_max_parallelism(max_parallelism)
    if type(keys) is tuple and len(codes) > 1:
        n = len(<tuple>keys)
        result = np.empty(n, dtype=np.int32)
        out = result
        for i in range(n):
            try:
                out[i] = sh_pmod(_spark_hash((<tuple>keys)[i], codes, False), <int32_t>max_parallelism)
            except (TypeError, ValueError, OverflowError) as e:
                raise type(e)(f"keys[{i}]: {e}") from None
    else:
        result = _spark_key_groups([keys], codes, max_parallelism, False)
        out = result
        n = len(result)
    if lo > 0 or hi < max_parallelism - 1:
        for i in range(n):
            if out[i] < lo or out[i] > hi:
                raise _outside(i, keys[i], out[i], lo, hi)
    return result
