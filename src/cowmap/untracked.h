/*
 * Allocation for the async layer's hot objects (StateFuture, RecordContext):
 * they are born untracked by the cyclic GC and recycled through a small free
 * list per type.
 *
 * Why: the controller keeps the objects it makes hidden from the GC while they
 * are in flight (see _future.pyx, "GC visibility"), but CPython's default
 * allocation (and Cython's free lists) track every new object, so each one was
 * tracked and at once untracked again: two linked-list updates that touch
 * neighbouring objects, three or four times per record. Objects made from
 * Python are tracked: by __init__, and by tp_new when called from Python
 * (``T.__new__(T)``); the controller calls the type's C tp_new function
 * directly, not through the slot.
 *
 * Only exact instances of an installed type come here: a Python subclass gets
 * CPython's own tp_alloc/tp_free when it is created.
 *
 * Swapping the allocation slots of a ready type is outside the public C API:
 * it is done only where CM_CPYTHON_INTERNALS holds (cpython_internals.h), on
 * the versions it was checked on (3.10 to 3.13). Elsewhere
 * cm_untracked_install installs nothing and says so, and the controller
 * untracks each object it makes instead (_future.pyx, _born).
 */
#ifndef COWMAP_UNTRACKED_H
#define COWMAP_UNTRACKED_H

#include <Python.h>
#include <string.h>

#include "cpython_internals.h"

#define CM_UNTRACKED_POOLS (CM_CPYTHON_INTERNALS && PY_VERSION_HEX < 0x030E0000)

#if CM_UNTRACKED_POOLS

#define CM_POOL_MAX 4096
#define CM_POOLS 2

typedef struct {
    PyTypeObject *tp;
    newfunc tp_new; /* the type's own */
    int n;
    PyObject *items[CM_POOL_MAX];
} cm_pool;

static cm_pool cm_pools[CM_POOLS];

static inline PyObject *cm_pool_alloc(cm_pool *p, PyTypeObject *tp) {
    PyObject *o;
    if (tp == p->tp && p->n > 0) {
        o = p->items[--p->n];
        memset((char *)o + sizeof(PyObject), 0, (size_t)tp->tp_basicsize - sizeof(PyObject));
        return PyObject_Init(o, tp); /* type and a reference count of 1 */
    }
    o = PyObject_GC_New(PyObject, tp); /* initialised, not tracked */
    if (o != NULL)
        memset((char *)o + sizeof(PyObject), 0, (size_t)tp->tp_basicsize - sizeof(PyObject));
    return o;
}

/* tp_free: the type's tp_dealloc calls it once the object is untracked and
 * cleared. (No installed type has a tp_finalize, so none carries the GC's
 * "finalized" flag into its next life.) */
static inline void cm_pool_free(cm_pool *p, void *op) {
    if (Py_TYPE((PyObject *)op) == p->tp && p->n < CM_POOL_MAX) {
        p->items[p->n++] = (PyObject *)op;
        return;
    }
    PyObject_GC_Del(op);
}

#define CM_POOL_FUNCS(i)                                                                  \
    static PyObject *cm_alloc_##i(PyTypeObject *tp, Py_ssize_t nitems) {                  \
        (void)nitems; /* fixed-size types only (checked at install) */                    \
        return cm_pool_alloc(&cm_pools[i], tp);                                           \
    }                                                                                     \
    static void cm_free_##i(void *op) { cm_pool_free(&cm_pools[i], op); }                 \
    static PyObject *cm_new_##i(PyTypeObject *tp, PyObject *args, PyObject *kw) {          \
        PyObject *o = cm_pools[i].tp_new(tp, args, kw);                                   \
        if (o != NULL && !PyObject_GC_IsTracked(o))                                       \
            PyObject_GC_Track(o);                                                         \
        return o;                                                                         \
    }
CM_POOL_FUNCS(0)
CM_POOL_FUNCS(1)

#endif /* CM_UNTRACKED_POOLS */

/* Make the GC type ``type`` (fixed-size, no tp_finalize, not yet instantiated)
 * allocate through pool ``slot``: 1 done, 0 not in this build, -1 error. */
static int cm_untracked_install(PyObject *type, int slot) {
#if !CM_UNTRACKED_POOLS
    (void)type; (void)slot;
    return 0;
#else
    static allocfunc allocs[CM_POOLS] = {cm_alloc_0, cm_alloc_1};
    static freefunc frees[CM_POOLS] = {cm_free_0, cm_free_1};
    static newfunc news[CM_POOLS] = {cm_new_0, cm_new_1};
    PyTypeObject *tp = (PyTypeObject *)type;
    if (slot < 0 || slot >= CM_POOLS || cm_pools[slot].tp != NULL || !PyType_IS_GC(tp) ||
        tp->tp_itemsize != 0 || tp->tp_finalize != NULL || tp->tp_new == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "cowmap: bad untracked-allocation install");
        return -1;
    }
    cm_pools[slot].tp = tp;
    cm_pools[slot].tp_new = tp->tp_new;
    tp->tp_new = news[slot];
    tp->tp_alloc = allocs[slot];
    tp->tp_free = frees[slot];
    return 1;
#endif
}

#endif
