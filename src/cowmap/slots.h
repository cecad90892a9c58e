/* Cached access to __slots__ attributes from compiled code.
 *
 * The state views and KeyedStateBackend keep their hot fields in __slots__;
 * the compiled layers read and write them through a per-call-site cache of
 * the member's offset, valid for one exact type and its version tag (CPython
 * gives a type a new tag whenever it or a base changes, so a stale entry never
 * matches). Anything but a plain T_OBJECT_EX member of a type with the
 * generic getattr/setattr takes the ordinary PyObject_GetAttr/SetAttr path,
 * with its errors. */
#ifndef COWMAP_SLOTS_H
#define COWMAP_SLOTS_H

#include <Python.h>
#include "structmember.h"

#ifndef PY_AUDIT_READ
#define PY_AUDIT_READ READ_RESTRICTED
#endif

typedef struct { PyTypeObject *type; unsigned int tag; Py_ssize_t offset; } cowmap_slot_cache;

static inline int cowmap_slot_hit(PyTypeObject *t, const cowmap_slot_cache *c) {
    return t == c->type && c->tag != 0 && t->tp_version_tag == c->tag
        && (t->tp_flags & Py_TPFLAGS_VALID_VERSION_TAG);
}

/* Fill c for t.name if it is a plain object member of t or a base (a
 * descriptor copied from another class has an offset that means nothing in
 * t's instances); `writable` also excludes read-only members. */
static void cowmap_slot_fill(PyTypeObject *t, PyObject *name, cowmap_slot_cache *c, int writable) {
    PyObject *d = _PyType_Lookup(t, name);  /* borrowed; gives t a version tag */
    if (d != NULL && Py_TYPE(d) == &PyMemberDescr_Type
            && PyType_IsSubtype(t, ((PyDescrObject *)d)->d_type)
            && (t->tp_flags & Py_TPFLAGS_VALID_VERSION_TAG) && t->tp_version_tag != 0) {
        PyMemberDef *m = ((PyMemberDescrObject *)d)->d_member;
        if (m->type == T_OBJECT_EX && (m->flags & PY_AUDIT_READ) == 0
                && (!writable || (m->flags & READONLY) == 0)) {
            c->type = t;
            c->tag = t->tp_version_tag;
            c->offset = m->offset;
        }
    }
}

#if defined(__GNUC__)
#define COWMAP_NOINLINE __attribute__((noinline))
#else
#define COWMAP_NOINLINE
#endif

/* The misses: (re)fill the cache, then the ordinary attribute access. */
static COWMAP_NOINLINE PyObject *cowmap_slot_get_slow(PyObject *obj, PyObject *name, cowmap_slot_cache *c) {
    PyTypeObject *t = Py_TYPE(obj);
    if (!cowmap_slot_hit(t, c) && t->tp_getattro == PyObject_GenericGetAttr) {
        cowmap_slot_fill(t, name, c, 0);
    }
    return PyObject_GetAttr(obj, name);
}

static COWMAP_NOINLINE int cowmap_slot_set_slow(PyObject *obj, PyObject *name, cowmap_slot_cache *c, PyObject *v) {
    PyTypeObject *t = Py_TYPE(obj);
    if (!cowmap_slot_hit(t, c) && t->tp_setattro == PyObject_GenericSetAttr) {
        cowmap_slot_fill(t, name, c, 1);
    }
    return PyObject_SetAttr(obj, name, v);
}

/* obj.<name>: new reference, or NULL with an exception set. */
static inline PyObject *cowmap_slot_get(PyObject *obj, PyObject *name, cowmap_slot_cache *c) {
    if (cowmap_slot_hit(Py_TYPE(obj), c)) {
        PyObject *v = *(PyObject **)((char *)obj + c->offset);
        if (v != NULL) {
            Py_INCREF(v);
            return v;
        }
    }
    return cowmap_slot_get_slow(obj, name, c);  /* (an unset slot: its AttributeError) */
}

/* obj.<name> as a borrowed reference when the cache hits and the slot is set;
 * else NULL, with no exception: then use cowmap_slot_get (which also fills the
 * cache). For hot paths that would otherwise pay for a try/except. */
static inline PyObject *cowmap_slot_peek(PyObject *obj, const cowmap_slot_cache *c) {
    if (cowmap_slot_hit(Py_TYPE(obj), c))
        return *(PyObject **)((char *)obj + c->offset);
    return NULL;
}

/* obj.<name> = v: 0, or -1 with an exception set. */
static inline int cowmap_slot_set(PyObject *obj, PyObject *name, cowmap_slot_cache *c, PyObject *v) {
    if (cowmap_slot_hit(Py_TYPE(obj), c)) {
        PyObject **p = (PyObject **)((char *)obj + c->offset);
        PyObject *old = *p;
        Py_INCREF(v);
        *p = v;
        Py_XDECREF(old);
        return 0;
    }
    return cowmap_slot_set_slow(obj, name, c, v);
}

#endif
