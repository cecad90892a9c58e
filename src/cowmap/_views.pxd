# How compiled code reads the fields of the state views and the backend (their
# __slots__), through a per-call-site cache of each member's offset (slots.h).

from cpython.ref cimport PyObject

cdef extern from "slots.h":
    ctypedef struct cowmap_slot_cache:
        pass
    object cowmap_slot_get(object obj, object name, cowmap_slot_cache *c)
    PyObject *cowmap_slot_peek(object obj, cowmap_slot_cache *c)  # borrowed, NULL: use _get


cdef inline object state_slot(state, str name, cowmap_slot_cache *c, str what):
    """``state.<name>``, a slot of the state views; TypeError "``what`` need a
    state" if ``state`` is none. A cache hit is a plain read: the try block is
    in another function (Cython pays for one on entering the function)."""
    cdef PyObject *p = cowmap_slot_peek(state, c)
    if p != NULL:
        return <object>p
    return state_slot_miss(state, name, c, what)


cdef inline object state_slot_miss(state, str name, cowmap_slot_cache *c, str what):
    try:
        return cowmap_slot_get(state, name, c)
    except AttributeError:
        if hasattr(type(state), name):  # a state, with the slot unset
            raise
        raise TypeError(f"{what} need a state, not {type(state).__name__}") from None
