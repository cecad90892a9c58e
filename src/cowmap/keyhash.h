/*
 * Stable key hashes and Flink's key-group assignment.
 *
 * Python's hash() is salted for str/bytes per process and hash(-1) == -2, so
 * key groups cannot use it: a key must land in the same key group in every
 * process and on every machine. We use Java's hashCode rules, so key groups
 * match Flink's for the same keys:
 *   int   -> Integer.hashCode inside int32, Long.hashCode inside int64,
 *            BigInteger.hashCode beyond (bool counts as int: True == 1)
 *   float -> as the equal int if integral (1.0 == 1), else Double.hashCode
 *   str   -> String.hashCode over UTF-16 code units
 *   bytes -> Arrays.hashCode(byte[]) (signed bytes)
 *   tuple -> Flink's TupleN.hashCode: h = hash(f0); h = 31 * h + hash(fi); () -> 0
 *   None inside a tuple -> 0
 *   other -> int(obj.__cowmap_hash__()) & 0xFFFFFFFF, else TypeError
 * Equal keys (as Python compares them) get equal hashes, as the state map needs.
 */
#ifndef COWMAP_KEYHASH_H
#define COWMAP_KEYHASH_H

#include <Python.h>
#include <stdint.h>
#include <string.h>
#include <math.h>
#include "fastint.h"

static inline uint32_t kh_rotl(uint32_t x, int r) { return (x << r) | (x >> (32 - r)); }

/* Flink's MathUtils.murmurHash: non-negative. */
static inline int32_t kh_murmur(int32_t code) {
    uint32_t c = (uint32_t)code;
    c *= 0xcc9e2d51u;
    c = kh_rotl(c, 15);
    c *= 0x1b873593u;
    c = kh_rotl(c, 13);
    c = c * 5u + 0xe6546b64u;
    c ^= 4u;
    c ^= c >> 16; c *= 0x85ebca6bu; c ^= c >> 13; c *= 0xc2b2ae35u; c ^= c >> 16;
    /* |c|, and 0 for INT32_MIN, without a branch: the sign is a coin toss per
     * key, and a mispredicted branch cost a column of keys 5 ns a key */
    uint32_t neg = 0u - (c >> 31);
    uint32_t a = (c ^ neg) - neg;
    return (int32_t)(a & ~(uint32_t)((int32_t)a >> 31));
}

static inline int32_t kh_int64(int64_t v) {
    if (v >= INT32_MIN && v <= INT32_MAX) return (int32_t)v;       /* Integer.hashCode */
    uint64_t u = (uint64_t)v;
    return (int32_t)(uint32_t)(u ^ (u >> 32));                      /* Long.hashCode */
}

/* The key group of each int64 key, for a power-of-two max parallelism
 * (mask = max parallelism - 1): Flink's murmurHash of Java's hashCode. Pure
 * arithmetic with no branch, so the compiler vectorises the loop; on x86-64
 * an AVX2 build of it is picked at load time where the CPU has AVX2 (the
 * baseline has no 32-bit vector multiply), which makes it ~3x faster. */
#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__) && defined(__GLIBC__)
__attribute__((target_clones("avx2", "default")))
#endif
static void kh_int64_groups_pow2(const int64_t *keys, int32_t *out, Py_ssize_t n, uint32_t mask) {
    for (Py_ssize_t i = 0; i < n; i++) out[i] = (int32_t)((uint32_t)kh_murmur(kh_int64(keys[i])) & mask);
}

/* BigInteger.hashCode: 31-polynomial over the big-endian 32-bit words of |v|,
 * times the sign. Only for ints beyond int64, so public calls are fast enough. */
static int kh_bigint(PyObject *v, int32_t *out) {
    int neg = PyObject_RichCompareBool(v, Py_False, Py_LT); /* False == 0 */
    if (neg < 0) return -1;
    PyObject *a = PyNumber_Absolute(v);
    if (!a) return -1;
    PyObject *bits = PyObject_CallMethod(a, "bit_length", NULL);
    Py_ssize_t nbits = bits ? PyLong_AsSsize_t(bits) : -1;
    Py_XDECREF(bits);
    if (nbits < 0) { Py_DECREF(a); return -1; }
    Py_ssize_t nbytes = (nbits + 31) / 32 * 4;
    PyObject *raw = PyObject_CallMethod(a, "to_bytes", "ns", nbytes, "big");
    Py_DECREF(a);
    if (!raw) return -1;
    const unsigned char *buf = (const unsigned char *)PyBytes_AS_STRING(raw);
    uint32_t h = 0;
    for (Py_ssize_t i = 0; i < nbytes; i += 4) {
        uint32_t w = ((uint32_t)buf[i] << 24) | ((uint32_t)buf[i + 1] << 16) | ((uint32_t)buf[i + 2] << 8) | buf[i + 3];
        h = 31u * h + w;
    }
    Py_DECREF(raw);
    *out = (int32_t)(neg ? (uint32_t)0 - h : h);
    return 0;
}

static int kh_pylong(PyObject *v, int32_t *out) {
    int overflow = 0;
    int64_t x = cm_as_int64(v, &overflow);
    if (!overflow) {
        if (x == -1 && PyErr_Occurred()) return -1;
        *out = kh_int64(x);
        return 0;
    }
    return kh_bigint(v, out);
}

static int kh_hash(PyObject *key, int32_t *out, int depth, int nan_ok);

/* Java's s.hashCode() over n one-byte code units: h = 31 * h + c per unit,
 * four units a step (h * 31^4 + c0 * 31^3 + c1 * 31^2 + c2 * 31 + c3, equal
 * modulo 2^32), so the multiplies do not wait on one another: a column of
 * 15-char keys spent a fifth of its time here. */
static inline uint32_t kh_units8(const uint8_t *c, Py_ssize_t n) {
    uint32_t h = 0;
    Py_ssize_t i = 0;
    for (; i + 4 <= n; i += 4)
        h = h * 923521u + c[i] * 29791u + c[i + 1] * 961u + c[i + 2] * 31u + c[i + 3];
    for (; i < n; i++) h = 31u * h + c[i];
    return h;
}

static int kh_double(double d, int32_t *out, int nan_ok) {
    if (d == d && d >= -9.2233720368547758e18 && d < 9.2233720368547758e18 && (double)(int64_t)d == d) {
        *out = kh_int64((int64_t)d);                                /* 1.0 == 1 */
        return 0;
    }
    if (d == d && d - d == 0.0 && d == floor(d)) {        /* integral beyond int64 */
        PyObject *i = PyLong_FromDouble(d);
        if (!i) return -1;
        int r = kh_pylong(i, out);
        Py_DECREF(i);
        return r;
    }
    if (d != d) {
        if (!nan_ok) {  /* (a NaN equals no NaN in Python: state under one could never be found again) */
            PyErr_SetString(PyExc_ValueError, "a key must not be NaN: a NaN equals no other NaN in Python, so "
                                              "its state could never be found again");
            return -1;
        }
        d = __builtin_nan("");                                      /* Java: canonical NaN */
    }
    uint64_t bits;
    memcpy(&bits, &d, sizeof bits);
    if (d == 0.0) bits = 0;                                         /* -0.0 == 0.0 == 0 */
    *out = (int32_t)(uint32_t)(bits ^ (bits >> 32));                /* Double.hashCode */
    return 0;
}

static int kh_hash(PyObject *key, int32_t *out, int depth, int nan_ok) {
    if (depth > 64) {
        PyErr_SetString(PyExc_ValueError, "key nests tuples more than 64 deep");
        return -1;
    }
    if (PyLong_Check(key)) return kh_pylong(key, out);               /* bool too */
    if (PyUnicode_Check(key)) {
        if (PyUnicode_READY(key) < 0) return -1;
        Py_ssize_t n = PyUnicode_GET_LENGTH(key);
        int kind = PyUnicode_KIND(key);
        const void *data = PyUnicode_DATA(key);
        if (kind == PyUnicode_1BYTE_KIND) { /* one UTF-16 unit per char */
            *out = (int32_t)kh_units8((const uint8_t *)data, n);
            return 0;
        }
        uint32_t h = 0;
        for (Py_ssize_t i = 0; i < n; i++) {
            Py_UCS4 ch = PyUnicode_READ(kind, data, i);
            if (ch >= 0x10000) {                                    /* a UTF-16 surrogate pair */
                ch -= 0x10000;
                h = 31u * h + (uint32_t)(0xD800 + (ch >> 10));
                h = 31u * h + (uint32_t)(0xDC00 + (ch & 0x3FF));
            } else {
                h = 31u * h + (uint32_t)ch;
            }
        }
        *out = (int32_t)h;
        return 0;
    }
    if (PyTuple_Check(key)) {
        Py_ssize_t n = PyTuple_GET_SIZE(key);
        uint32_t h = 0;
        for (Py_ssize_t i = 0; i < n; i++) {
            PyObject *f = PyTuple_GET_ITEM(key, i);
            int32_t fh = 0;
            if (f != Py_None && kh_hash(f, &fh, depth + 1, nan_ok) < 0) return -1;
            h = i == 0 ? (uint32_t)fh : 31u * h + (uint32_t)fh;
        }
        *out = (int32_t)h;
        return 0;
    }
    if (PyBytes_Check(key)) {
        const signed char *b = (const signed char *)PyBytes_AS_STRING(key);
        Py_ssize_t n = PyBytes_GET_SIZE(key);
        uint32_t h = 1;
        for (Py_ssize_t i = 0; i < n; i++) h = 31u * h + (uint32_t)(int32_t)b[i];
        *out = (int32_t)h;
        return 0;
    }
    if (PyFloat_Check(key)) return kh_double(PyFloat_AS_DOUBLE(key), out, nan_ok);
    if (key == Py_None) {
        PyErr_SetString(PyExc_TypeError, "key must not be None");
        return -1;
    }
    PyObject *hook = PyObject_GetAttrString(key, "__cowmap_hash__");
    if (hook) {
        PyObject *r = PyObject_CallNoArgs(hook);
        Py_DECREF(hook);
        if (!r) return -1;
        if (!PyLong_Check(r)) {
            Py_DECREF(r);
            PyErr_SetString(PyExc_TypeError, "__cowmap_hash__() must return an int");
            return -1;
        }
        unsigned long long u = PyLong_AsUnsignedLongLongMask(r);
        Py_DECREF(r);
        if (u == (unsigned long long)-1 && PyErr_Occurred()) return -1;
        *out = (int32_t)(uint32_t)u;
        return 0;
    }
    PyErr_Clear();
    if (PyIndex_Check(key)) {                                       /* numpy integers */
        PyObject *i = PyNumber_Index(key);
        if (!i) return -1;
        int r = kh_pylong(i, out);
        Py_DECREF(i);
        return r;
    }
    PyErr_Format(PyExc_TypeError,
                 "cannot compute a stable key hash for %.100s: keys must be int, float, str, bytes "
                 "or tuples of those, or define __cowmap_hash__() (equal keys must return equal values)",
                 Py_TYPE(key)->tp_name);
    return -1;
}

#endif /* COWMAP_KEYHASH_H */
