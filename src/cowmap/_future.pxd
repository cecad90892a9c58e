# The async layer's futures and record contexts, shared by the controller
# (_controller.pyx) and the async twins of the state methods (_requests.pyx).

from cpython.ref cimport PyObject

cdef extern from "Python.h":
    void PyObject_GC_Track(object o)
    bint PyObject_GC_IsTracked(object o)

cdef extern from "weakref_compat.h":
    object cm_weakref_get(object ref)  # the referent, None once dead


# How a derived future (made by ``then_*``) is completed when the future it
# waits on completes: a code and the user functions in its own fields, so a
# chain step allocates no closure. The future it waits on holds it as a
# callback (see ``_run_callback``).
cdef enum:
    K_SOURCE = 0         # not derived (or its step has run): completed by complete()
    K_APPLY = 1          # fn(result)
    K_ACCEPT = 2         # fn(result); None
    K_COMPOSE = 3        # fn(result) is a future: then K_FORWARD on it
    K_FORWARD = 4        # the result (or exception) of the inner future
    K_COMBINE = 5        # waits for _aux (the other future): then K_COMBINE_BOTH
    K_COMBINE_BOTH = 6   # fn(first result in _val, other's result)
    K_COND_APPLY = 7     # (condition(r), if_true(r) / if_false(r) / None)
    K_COND_ACCEPT = 8    # condition(r) after if_true(r) / if_false(r)
    K_COND_COMPOSE = 9   # branch(r) is a future: then K_COND_FORWARD on it
    K_COND_FORWARD = 10  # (the condition in _val, the inner future's result)
    K_TO_LIST = 11       # [] if result is None else list(result)
    K_REQUEST = 12       # not derived: a request, completed by its batch (see _rq_state)


cdef class StateFuture


cdef class RecordContext:
    cdef public object record
    cdef public object key
    cdef public object key_group
    cdef public object epoch
    cdef public object priority
    cdef public Py_ssize_t seq  # arrival order at its controller
    cdef public Py_ssize_t refs
    cdef public bint holds_key
    cdef bint _waited_for  # holding the key, with other records queued for it
    # waiting for its key: its requests in order (it is queued once per key, in
    # AsyncExecutionController._blocking), handed to the active buffer together
    cdef list _waiting
    cdef object _aec_ref  # a weak reference to the controller (see "GC visibility"), or None
    # set when the record is finished (its count reached 0 and the controller
    # disposed it): it is never referenced or disposed again
    cdef readonly bint _disposed
    # the wave of a batch this record last had a request in (see
    # AsyncExecutionController._run_wave): the first state table it used in
    # that wave (identity only, not a reference) and the others, if any
    cdef Py_ssize_t _wave
    cdef void *_wave_state
    cdef list _wave_states


cdef class ControllerBase:
    """What futures and record contexts call on their controller."""
    cdef int _dispose(self, RecordContext ctx) except -1
    cdef int _step_in_record(self, StateFuture f, StateFuture src) except -1
    cdef StateFuture _request(self, state, str op, object args, bint one_arg=*)


cdef class StateFuture:
    # (thousands are in flight at once, three per record in a get-then-update
    # chain: every field is paid for in memory and in time to make and free)
    cdef readonly object _result
    cdef readonly object _exc
    cdef readonly object _mailbox
    cdef readonly object _ctx
    cdef bint _done
    # the callbacks in registration order: None, the only one (most futures
    # have at most one), or a list of them. A callback is a derived StateFuture
    # (its step runs) or a Python callable taking no arguments.
    cdef object _cb
    # _kind: a derived future's step (K_*), or K_REQUEST. A derived future keeps
    # in _fn.._aux, _val what its step needs; a request (made by
    # AsyncExecutionController._request, one object per request) keeps in
    # _fn.._aux the state, the state method's name, its arguments and the
    # state's namespace at the call (see _rq_state and the others below); its
    # record context is _ctx. The arguments: a tuple, or with _one_arg the
    # single argument itself (no tuple to allocate, track and collect for the
    # commonest requests)
    cdef int _kind
    cdef object _fn
    cdef object _fn2
    cdef object _fn3
    cdef object _aux
    cdef object _val
    cdef bint _one_arg
    cdef bint _inited
    cdef bint _in_batch  # a request being run by a batch wave: tracked after it, if still held
    cdef bint _fn_hidden  # _fn is a user function this (untracked) future untracked, see _then

    cdef int _check_completable(self) except -1
    cdef int _set(self, value, exc) except -1
    cdef int _add_callback(self, cb) except -1
    cdef StateFuture _then(self, int kind, fn, fn2, fn3, aux=*)
    cdef int _step(self, StateFuture src) except -1
    cdef int _apply(self, int kind, r, fn, fn2, fn3) except -1


# What a request (a StateFuture of kind K_REQUEST) keeps in a derived future's fields.
cdef inline object _rq_state(StateFuture r):
    return r._fn


cdef inline object _rq_op(StateFuture r):  # a str
    return r._fn2


cdef inline object _rq_ns(StateFuture r):
    return r._aux


cdef inline object _controller_of(RecordContext rc):
    """``rc``'s controller, or None."""
    if rc._aec_ref is None:
        return None
    return cm_weakref_get(rc._aec_ref)


cdef inline int _track(object o) except -1:
    """Hand ``o`` (back) to the cyclic GC (see "GC visibility" in _future.pyx)."""
    if not PyObject_GC_IsTracked(o):
        PyObject_GC_Track(o)
    return 0


cdef int _born(object o) except -1
cdef int _track_tree(StateFuture root) except -1
cdef int _release_record(RecordContext rc) except -1
cdef RecordContext _new_context()
cdef StateFuture _new_future(mailbox, ctx)
cdef bint _runs_user_code(StateFuture f)
cdef int _callable(fn, str what) except -1
cdef StateFuture _is_future(f, str what)
cdef StateFuture _as_request(r)
