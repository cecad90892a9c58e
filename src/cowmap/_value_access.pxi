# ValueState's value() and update(), compiled: the per-key accesses a keyed
# function makes on every record. Written in Python they cost two to three
# times the map call they make (the view's and the table's fields, the TTL
# cleanup counter, the time provider and the call itself, each read by the
# interpreter). Here they read the fields by name (StateView, TableCore) and
# call the map's C functions. cowmap/state/value_state.py binds them as
# ValueState's methods. Included by _core.pyx.

from cowmap._context cimport KeyContext, StateView, TableCore


cdef object _EXPIRED = EXPIRED


cdef int _check_fields(StateView view, TableCore t) except -1:
    """AttributeError for a field deleted from Python (``del table.ttl``): the
    fields are writable member descriptors, and a deleted one is NULL, which
    compiled code must not read."""
    cdef const char *gone = NULL
    if <PyObject *>t.maps == NULL:
        gone = "maps"
    elif <PyObject *>t.ttl == NULL:
        gone = "ttl"
    elif <PyObject *>t.update_on_read == NULL:
        gone = "update_on_read"
    elif <PyObject *>t.return_expired == NULL:
        gone = "return_expired"
    elif <PyObject *>t.cleanup_size == NULL:
        gone = "cleanup_size"
    elif <PyObject *>t.ticks == NULL:
        gone = "ticks"
    elif <PyObject *>view._default == NULL:
        raise AttributeError("the state view's _default was deleted")
    if gone != NULL:
        raise AttributeError(f"the state table's {gone.decode()} was deleted")
    return 0


cdef inline object _absent(StateView view):
    """What a read of no value gives: the descriptor's default (a fresh copy of
    a mutable one, as ValueState._default_value makes)."""
    if view._default is None:
        return None
    return view._default_value()


cdef inline int _cleanup_tick(TableCore t) except -1:
    """One access's incremental cleanup step (StateTable.cleanup_step)."""
    if t.cleanup_size:
        ticks = t.ticks - 1
        t.ticks = ticks
        if ticks <= 0:
            t.run_cleanup()
    return 0


def value_state_value(StateView self):
    """The current key's value in the current namespace; the descriptor's
    ``default_value`` when there is none or it expired. O(1)."""
    cdef KeyContext kc = self._kc
    cdef TableCore t = <TableCore?>self._t
    cdef CopyOnWriteStateMap cm
    cdef int64_t ttl
    _check_fields(self, t)
    key = kc.key
    kg = kc.key_group
    if kg is None:
        raise self._no_key()
    m = (<list?>t.maps)[<Py_ssize_t>kg]
    ns = self._ns
    ttl = t.ttl
    if ttl == 0:
        if m is None:
            return _absent(self)
        v = cm_get(&(<CopyOnWriteStateMap?>m).m, key, ns)
        return _absent(self) if v is None else v
    _cleanup_tick(t)
    if m is None:
        return _absent(self)
    cm = <CopyOnWriteStateMap?>m
    v = cm_get_unexpired(&cm.m, key, ns, _as_time_for(&cm.m, key, ns, kc.clock, "now"), ttl,
                         1 if t.update_on_read else 0, _EXPIRED)
    if v is None:
        return _absent(self)
    if v is _EXPIRED:
        v = cm_remove_and_get_old(&cm.m, key, ns)
        return v if t.return_expired else _absent(self)
    return v


def value_state_update(StateView self, value):
    """Set the current key's value (and, with TTL, its timestamp); None clears it. O(1)."""
    cdef KeyContext kc = self._kc
    cdef TableCore t = <TableCore?>self._t
    cdef CopyOnWriteStateMap cm
    cdef int64_t ttl
    if value is None:
        self.clear()
        return
    _check_fields(self, t)
    key = kc.key
    kg = kc.key_group
    if kg is None:
        raise self._no_key()
    m = (<list?>t.maps)[<Py_ssize_t>kg]
    if m is None:
        m = t.map_for_write(kg)
    cm = <CopyOnWriteStateMap?>m
    ns = self._ns
    ttl = t.ttl
    if ttl == 0:
        cm_put(&cm.m, key, ns, value, CM_NO_TS)
        return
    _cleanup_tick(t)
    cm_put(&cm.m, key, ns, value, _as_time_for(&cm.m, key, ns, kc.clock))
