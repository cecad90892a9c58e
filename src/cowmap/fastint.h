/*
 * The int64 value of a Python int without a call into the interpreter.
 *
 * Hashing a key starts with its value, and PyLong_AsLongLongAndOverflow is an
 * out-of-line call of ~40 instructions: a sizeable part of a single-key lookup
 * (two per lookup, key and namespace). Ints of up to three 30-bit digits that
 * fit in int64 are read here from CPython 3.11's digit array; anything else
 * (other layouts, 15-bit digits, bigger values) goes to the API call.
 */
#ifndef COWMAP_FASTINT_H
#define COWMAP_FASTINT_H

#include <Python.h>
#include <stdint.h>

#include "cpython_internals.h"

/* CPython 3.11's int: a signed digit count in ob_size, then the digits */
#define CM_LONG_DIGITS_311 \
    (CM_CPYTHON_INTERNALS && PY_VERSION_HEX >= 0x030B0000 && PY_VERSION_HEX < 0x030C0000 && PyLong_SHIFT == 30)
/* 3.12+: compact ints have an unstable but public inline reader */
#define CM_LONG_COMPACT_312 (CM_CPYTHON_INTERNALS && PY_VERSION_HEX >= 0x030C0000)

/* 1 with *out set if `o` (a PyLong, or a subclass) was read here, 0 if not. */
static inline int cm_fast_int(PyObject *o, int64_t *out) {
#if CM_LONG_DIGITS_311
    Py_ssize_t size = Py_SIZE(o);
    Py_ssize_t n = size < 0 ? -size : size;
    const digit *d = ((PyLongObject *)o)->ob_digit;
    uint64_t u;
    if (n == 0)
        u = 0;
    else if (n == 1)
        u = d[0];
    else if (n == 2)
        u = (uint64_t)d[0] | ((uint64_t)d[1] << 30);
    else if (n == 3 && d[2] < 8u) /* < 2**63 */
        u = (uint64_t)d[0] | ((uint64_t)d[1] << 30) | ((uint64_t)d[2] << 60);
    else
        return 0;
    *out = size < 0 ? -(int64_t)u : (int64_t)u;
    return 1;
#elif CM_LONG_COMPACT_312
    if (!PyUnstable_Long_IsCompact((PyLongObject *)o)) return 0;
    *out = (int64_t)PyUnstable_Long_CompactValue((PyLongObject *)o);
    return 1;
#else
    (void)o; (void)out;
    return 0;
#endif
}

/* PyLong_AsLongLongAndOverflow, with the read above first. */
static inline int64_t cm_as_int64(PyObject *o, int *overflow) {
    int64_t v;
    if (cm_fast_int(o, &v)) {
        *overflow = 0;
        return v;
    }
    return (int64_t)PyLong_AsLongLongAndOverflow(o, overflow);
}

/* Rewrite, in place, the value of a float that nothing but the caller can
 * see (exact type, one reference: the caller's), so a column of floats
 * written over floats allocates nothing and frees nothing. 1 done, 0 not
 * (another type, another holder, no CPython internals): the caller then
 * makes a new object. */
static inline int cm_float_rewrite(PyObject *o, double v) {
#if CM_CPYTHON_INTERNALS
    if (Py_REFCNT(o) != 1 || !PyFloat_CheckExact(o)) return 0;
    ((PyFloatObject *)o)->ob_fval = v; /* the same field on 3.10 to 3.13 */
    return 1;
#else
    (void)o; (void)v;
    return 0;
#endif
}

#endif
