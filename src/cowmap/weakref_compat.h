/*
 * The object of a weak reference, as a new reference (None once it is dead):
 * PyWeakref_GetRef from CPython 3.13, where the borrowed-reference
 * PyWeakref_GetObject is deprecated; PyWeakref_GetObject before.
 */
#ifndef COWMAP_WEAKREF_COMPAT_H
#define COWMAP_WEAKREF_COMPAT_H

#include <Python.h>

static inline PyObject *cm_weakref_get(PyObject *ref) {
#if PY_VERSION_HEX >= 0x030D0000
    PyObject *o;
    if (PyWeakref_GetRef(ref, &o) < 0) return NULL;
    if (o == NULL) {
        Py_INCREF(Py_None);
        return Py_None;
    }
    return o;
#else
    PyObject *o = PyWeakref_GetObject(ref); /* borrowed */
    Py_XINCREF(o);
    return o;
#endif
}

#endif
