/* Fields of compiled objects that Python code reads on hot paths.
 *
 * Cython exposes a `cdef public` field to Python through a getter function,
 * which costs about twice a __slots__ read (the interpreter specialises reads
 * of slot members, not of getters). The key context and the state views are
 * read from Python on every state access, so their fields are exposed here as
 * member descriptors, exactly what __slots__ makes: the compiled code reads
 * the struct field by name (a rename breaks the build), Python reads it at
 * slot speed. The offsets come from offsetof on the Cython structs, so they
 * cannot drift from the layout either. */
#ifndef COWMAP_MEMBERS_H
#define COWMAP_MEMBERS_H

#include <Python.h>
#include <stddef.h>
#include <string.h>
#include "structmember.h"

/* Add a member descriptor `name` for the object field at `offset` of type
 * `type` (read-only unless `writable`). The PyMemberDef (and its copy of the
 * name) lives as long as the process, as the type does. */
static int cm_expose_member(PyObject *type, const char *name, Py_ssize_t offset, int writable) {
    PyTypeObject *tp = (PyTypeObject *)type;
    size_t len = strlen(name) + 1;
    PyMemberDef *m = (PyMemberDef *)PyMem_Calloc(1, sizeof(PyMemberDef) + len);
    PyObject *d;
    int r;
    if (m == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    memcpy((char *)(m + 1), name, len); /* the name lives with the definition */
    m->name = (const char *)(m + 1);
    m->type = T_OBJECT_EX;
    m->offset = offset;
    m->flags = writable ? 0 : READONLY;
    d = PyDescr_NewMember(tp, m);
    if (d == NULL)
        return -1; /* (m is leaked: the process is failing to import anyway) */
    r = PyDict_SetItemString(tp->tp_dict, name, d);
    Py_DECREF(d);
    if (r == 0)
        PyType_Modified(tp);
    return r;
}

#endif
