# cython: language_level=3
"""The async twins of the state methods and the per-request loops of the states'
batch calls, compiled.

Each twin (``async_value``, ``async_put``, ...) queues a request of the record
being processed with the backend's controller (``_controller.pyx``) and returns
its ``StateFuture``; ``cowmap.state.async_methods`` binds them onto the state
classes. The batch helpers (``request_columns``, ...) are the loops of the
states' vectorised ``_batch_<op>`` methods (value_state.py, map_state.py).
"""

cimport cython

from cowmap._future cimport (
    ControllerBase,
    RecordContext,
    StateFuture,
    _as_request,
    _rq_ns,
    _rq_op,
    cm_weakref_get,
)
from cowmap._context cimport KeyContext, StateView


# ------------------------------------------------------------ the async twins
# Bound onto the state classes by cowmap.state.async_methods: each queues a
# request of the record being processed with the backend's controller.


cdef tuple _NO_ARGS = ()
# the request types, as the controller names them (interned: grouped by identity)
cdef str _VALUE = "value"
cdef str _UPDATE = "update"
cdef str _CLEAR = "clear"
cdef str _GET = "get"
cdef str _ADD = "add"
cdef str _ADD_ALL = "add_all"
cdef str _PUT = "put"
cdef str _PUT_ALL = "put_all"
cdef str _REMOVE = "remove"
cdef str _CONTAINS = "contains"
cdef str _IS_EMPTY = "is_empty"


cdef ControllerBase _aec_of(state):
    """The controller of the backend of the view ``state``."""
    if not isinstance(state, StateView):
        raise TypeError(f"async state methods need a state, not {type(state).__name__}")
    cdef KeyContext kc = (<StateView>state)._kc
    if kc is None:
        raise RuntimeError(f"{type(state).__name__} view not initialised (made without its __init__)")
    aec = kc.aec
    if aec is not None:
        aec = cm_weakref_get(aec)
    if aec is None:
        raise RuntimeError(
            f"async calls on state {(<StateView>state)._t.name!r} need an AsyncExecutionController for its backend"
        )
    return <ControllerBase>aec


def request(state, op, *args):
    """Queue request ``op`` (a state method's name) with ``args`` for the record
    being processed; a future of its result."""
    return _aec_of(state).handle_request(state, op, *args)


def async_value(self):
    """A future of ``value()``."""
    return _aec_of(self)._request(self, _VALUE, _NO_ARGS)


def async_update(self, value):
    """A future of None, once ``update(value)`` ran."""
    return _aec_of(self)._request(self, _UPDATE, value, True)


def async_clear(self):
    """A future of None, once ``clear()`` ran."""
    return _aec_of(self)._request(self, _CLEAR, _NO_ARGS)


def async_add(self, value):
    """A future of None, once ``add(value)`` ran."""
    return _aec_of(self)._request(self, _ADD, value, True)


def async_get_value(self):
    """A future of ``get()`` (merging states)."""
    return _aec_of(self)._request(self, _GET, _NO_ARGS)


def async_list_add_all(self, values):
    """A future of None, once ``add_all(values)`` ran."""
    return _aec_of(self)._request(self, _ADD_ALL, list(values) if values is not None else None, True)


def async_list_update(self, values):
    """A future of None, once ``update(values)`` ran."""
    return _aec_of(self)._request(self, _UPDATE, list(values) if values is not None else None, True)


def async_map_get(self, key):
    """A future of ``get(key)``."""
    return _aec_of(self)._request(self, _GET, key, True)


def async_map_put(self, key, value):
    """A future of None, once ``put(key, value)`` ran."""
    return _aec_of(self)._request(self, _PUT, (key, value))


def async_map_put_all(self, entries):
    """A future of None, once ``put_all(entries)`` ran."""
    return _aec_of(self)._request(self, _PUT_ALL, dict(entries) if entries is not None else None, True)


def async_map_remove(self, key):
    """A future of None, once ``remove(key)`` ran."""
    return _aec_of(self)._request(self, _REMOVE, key, True)


def async_map_contains(self, key):
    """A future of ``contains(key)``."""
    return _aec_of(self)._request(self, _CONTAINS, key, True)


def async_map_is_empty(self):
    """A future of ``is_empty()``."""
    return _aec_of(self)._request(self, _IS_EMPTY, _NO_ARGS)


# ------------------------------------------------------------ batch helpers
# The per-request loops of the states' vectorised ``_batch_<op>`` methods
# (value_state.py, map_state.py), in C: each is one call per batch group.


@cython.boundscheck(False)
@cython.wraparound(False)
def request_columns(list reqs not None):
    """``(key groups, keys, namespaces)`` of a list of requests, as three lists."""
    cdef Py_ssize_t i, n = len(reqs)
    cdef list kgs = [None] * n
    cdef list keys = [None] * n
    cdef list nss = [None] * n
    cdef StateFuture r
    cdef RecordContext c
    for i in range(n):
        r = _as_request(reqs[i])
        c = <RecordContext>r._ctx
        kgs[i] = c.key_group
        keys[i] = c.key
        nss[i] = _rq_ns(r)
    return kgs, keys, nss


@cython.boundscheck(False)
@cython.wraparound(False)
def request_args(list reqs not None, Py_ssize_t index):
    """Argument ``index`` of every request, as a list."""
    cdef Py_ssize_t i, n = len(reqs)
    cdef list out = [None] * n
    cdef StateFuture r
    if index < 0:
        raise ValueError(f"index must be >= 0, got {index}")
    for i in range(n):
        r = _as_request(reqs[i])
        args = r._fn3
        if r._one_arg:
            if index != 0:
                raise ValueError(f"request {_rq_op(r)!r} has no argument {index}")
            out[i] = args
            continue
        if args is None or index >= len(args):
            raise ValueError(f"request {_rq_op(r)!r} has no argument {index}")
        out[i] = args[index]
    return out


@cython.boundscheck(False)
@cython.wraparound(False)
def positions(list items not None, obj):
    """The indices of the items that are ``obj`` (identity), as a list."""
    cdef Py_ssize_t i, n = len(items)
    cdef list out = []
    for i in range(n):
        if items[i] is obj:
            out.append(i)
    return out


@cython.boundscheck(False)
@cython.wraparound(False)
def replace_all(list items not None, old, new):
    """Replace, in place, the items that are ``old`` (identity) by ``new``; returns ``items``."""
    cdef Py_ssize_t i, n = len(items)
    for i in range(n):
        if items[i] is old:
            items[i] = new
    return items


@cython.boundscheck(False)
@cython.wraparound(False)
def map_contexts(list keys not None, list namespaces not None, void_namespace, marker):
    """MapState's core namespaces: ``key`` in ``void_namespace``, else
    ``(key, namespace, marker)`` (see map_state.make_ctx)."""
    cdef Py_ssize_t i, n = len(keys)
    if len(namespaces) != n:
        raise ValueError("keys and namespaces must have the same length")
    cdef list out = [None] * n
    for i in range(n):
        ns = namespaces[i]
        out[i] = keys[i] if ns is void_namespace else (keys[i], ns, marker)
    return out
