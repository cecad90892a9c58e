# cython: language_level=3
"""The hot parts of the async state layer, compiled: ``StateFuture``, the
``AsyncExecutionController`` with its record contexts and requests, the async
twins of the state methods and the per-request loops of the states' batch calls.

The Python API lives in ``cowmap.asyncstate`` (future.py, controller.py) and
``cowmap.state.async_methods``, which re-export these; see there for the semantics.
"""

cimport cython
from cpython.pythread cimport PyThread_get_thread_ident

from cpython.ref cimport Py_REFCNT, PyObject
from cpython.weakref cimport PyWeakref_CheckRef

cdef extern from "Python.h":
    int Py_EnterRecursiveCall(const char *where)  # nonzero: RecursionError set
    void Py_LeaveRecursiveCall()
    PyObject *PyDict_SetDefault(object d, object key, object default) except NULL  # borrowed
    void PyObject_GC_Track(object o)
    void PyObject_GC_UnTrack(object o)
    bint PyObject_GC_IsTracked(object o)
    bint PyFunction_Check(object o)  # exactly a Python function (a def or lambda)
    PyObject *PyFunction_GET_CLOSURE(object fn)  # borrowed; NULL without free variables
    PyObject *PyWeakref_GetObject(object ref) except NULL  # borrowed; None once dead

cdef extern from "untracked.h":
    int cm_untracked_install(object type, int slot) except -1

cdef extern from "slots.h":
    ctypedef struct cowmap_slot_cache:
        pass
    object cowmap_slot_get(object obj, object name, cowmap_slot_cache *c)
    PyObject *cowmap_slot_peek(object obj, cowmap_slot_cache *c)  # borrowed, NULL: use _get

from cowmap._keygroups cimport key_group_in_range, switch_key

import collections
import enum
import threading
import weakref

cdef class StateFuture
cdef class RecordContext
cdef class AsyncExecutionController

cdef object _PENDING = object()  # the result of a pending future


# ------------------------------------------------------------ GC visibility
# The controller keeps thousands of requests, derived futures and record contexts
# in flight; tracked by the cyclic GC, each young collection would walk them all
# (about a sixth of the async path's time). So the ones it makes are untracked
# while in flight (born so: see untracked.h; those made from Python are tracked
# by __init__), under one invariant: every untracked future is pending and
# reachable from a request in the controller's buffers (active, blocking) through
# the callback links (_cb, _aux) of untracked futures, and every untracked record
# context is in flight and referenced by them or the controller. A derived future
# made untracked also hides its user function (a lambda made per record,
# typically) until its step has run: else each young collection would walk and
# promote the in-flight ones. A future is tracked (with the function it hid)
# when it completes (a request run by a batch wave: after its group, and only if
# something besides the wave still holds it), when it becomes a callback of a
# tracked future, or when it is posted as a mail; a context when it is disposed;
# and all of them when the controller is deallocated or a record or a batch
# fails. Neither contexts nor the backend hold the controller strongly (weak
# references), so a dropped controller is freed by reference counting and can
# hand its in-flight objects back to the GC.

cdef inline int _track(object o) except -1:
    if not PyObject_GC_IsTracked(o):
        PyObject_GC_Track(o)
    return 0


cdef inline int _hide_fn(fn):
    """Untrack the Python function ``fn`` and its closure tuple; whether it was tracked."""
    cdef PyObject *closure
    if not PyFunction_Check(fn) or not PyObject_GC_IsTracked(fn):
        return False
    PyObject_GC_UnTrack(fn)
    closure = PyFunction_GET_CLOSURE(fn)
    if closure != NULL and PyObject_GC_IsTracked(<object>closure):
        PyObject_GC_UnTrack(<object>closure)
    return True


cdef inline int _show_fn(fn) except -1:
    """Undo ``_hide_fn`` (CPython frees a function as a tracked object: this
    must run before the hiding future's reference to ``fn`` goes)."""
    cdef PyObject *closure = PyFunction_GET_CLOSURE(fn)
    _track(fn)
    if closure != NULL:
        _track(<object>closure)
    return 0


cdef inline int _track_future(StateFuture f) except -1:
    """Track ``f`` and the user function it hid (see ``StateFuture._then``)."""
    if f._fn_hidden:
        f._fn_hidden = False
        _show_fn(f._fn)
    _track(f)
    return 0


cdef int _track_tree(StateFuture root) except -1:
    """Track ``root`` and the untracked futures (and contexts) linked from it."""
    cdef StateFuture f
    cdef list todo = [root]
    while todo:
        f = <StateFuture>todo.pop()
        if PyObject_GC_IsTracked(f):  # visible already (its links: tracked or in the buffers)
            continue
        _track_future(f)
        if type(f._ctx) is RecordContext:
            _track(f._ctx)
        for link in (f._cb, f._aux) if type(f._cb) is not list else (f._aux, *f._cb):
            if type(link) is StateFuture:
                todo.append(link)
    return 0


cdef int _track_pending(list cbs, Py_ssize_t start) except -1:
    """Track the derived futures among ``cbs[start:]``: callbacks that will never
    run (an earlier one raised), left pending outside the controller's buffers."""
    cdef Py_ssize_t j
    for j in range(start, len(cbs)):
        if type(cbs[j]) is StateFuture:
            _track_tree(<StateFuture>cbs[j])
    return 0


cdef inline int _retain(object ctx) except -1:
    if type(ctx) is RecordContext:
        (<RecordContext>ctx).refs += 1
    else:
        ctx.retain()
    return 0


cdef inline int _release(object ctx) except -1:
    if type(ctx) is RecordContext:
        return _release_record(<RecordContext>ctx)
    ctx.release()
    return 0


cdef int _release_record(RecordContext rc) except -1:
    rc.refs -= 1
    if rc.refs == 0:
        # a record is disposed once: a context already disposed is not counted
        # again (see _new_future), and if it is, reaching 0 again does nothing
        if not rc._disposed:
            aec = _controller_of(rc)
            if aec is not None:
                rc._disposed = True
                (<AsyncExecutionController>aec)._dispose(rc)
    elif rc.refs < 0:
        raise RuntimeError("record context released more often than retained")
    return 0


cdef class RecordContext:
    """One input record in flight: its key, key group, epoch and reference count."""

    cdef public object record
    cdef public object key
    cdef public object key_group
    cdef public object epoch
    cdef public object priority
    cdef public Py_ssize_t refs
    cdef public bint holds_key
    cdef bint _waited_for  # holding the key, with other records' requests queued for it
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

    def __init__(self, aec, record, key, key_group, epoch, priority=0):
        if aec is not None and not isinstance(aec, AsyncExecutionController):
            raise TypeError(f"aec must be an AsyncExecutionController or None, not {type(aec).__name__}")
        self.record = record
        self.key = key
        self.key_group = key_group
        self.epoch = epoch
        self.priority = priority
        self.refs = 0
        self.holds_key = False
        self._disposed = False
        self._aec_ref = None if aec is None else (<AsyncExecutionController>aec)._self_ref
        _track(self)  # (born untracked, see "GC visibility")

    @property
    def _aec(self):
        """The controller of this record (None without one, or once it is gone)."""
        return _controller_of(self)

    def retain(self):
        self.refs += 1

    def release(self):
        _release_record(self)

    def __repr__(self):
        return f"<RecordContext key={self.key!r} refs={self.refs}>"


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
    return <object>PyWeakref_GetObject(rc._aec_ref)


@cython.auto_pickle(False)  # a copy would share the callbacks and what they hold
cdef class StateFuture:
    """A value that a state request will produce, with Flink's ``then_*`` chaining."""

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

    def __class_getitem__(cls, item):
        return cls

    def __dealloc__(self):
        if self._fn_hidden:  # (see _then)
            _show_fn(self._fn)

    @property
    def _state(self):
        """A request's state (None if not a request)."""
        return _rq_state(self) if self._kind == K_REQUEST else None

    @property
    def _op(self):
        """A request's state method name (None if not a request)."""
        return _rq_op(self) if self._kind == K_REQUEST else None

    @property
    def _ns(self):
        """A request's namespace (None if not a request)."""
        return _rq_ns(self) if self._kind == K_REQUEST else None

    @property
    def _args(self):
        """A request's arguments, as a tuple (None if not a request)."""
        if self._kind != K_REQUEST:
            return None
        return (self._fn3,) if self._one_arg else self._fn3

    def __init__(self, mailbox=None, context=None):
        # the controller's futures are requests it still holds: re-running
        # __init__ on one would drop its record context from under it
        if self._inited:
            raise RuntimeError("StateFuture.__init__ called on an initialised future")
        if context is not None and type(context) is not RecordContext and not (
                callable(getattr(context, "retain", None)) and callable(getattr(context, "release", None))):
            raise TypeError(f"context must have retain() and release(), not {type(context).__name__}")
        self._inited = True
        self._result = _PENDING
        self._exc = None
        self._done = False
        self._cb = None
        self._kind = K_SOURCE
        self._mailbox = mailbox
        self._ctx = context
        if context is not None:
            _retain(context)
        _track(self)  # (born untracked, see "GC visibility")

    # ------------------------------------------------------------ completion

    def is_done(self):
        return self._done

    def get(self):
        """The result of a completed future (raises its exception; RuntimeError if pending)."""
        if not self._done:
            raise RuntimeError("the future is not complete yet")
        if self._exc is not None:
            raise self._exc
        return self._result

    def complete(self, value):
        """Complete with ``value``; callable from any thread (callbacks run on the task thread)."""
        self._finish(value, None)

    def complete_exceptionally(self, exc):
        if not isinstance(exc, BaseException):
            raise TypeError(f"expected an exception, not {type(exc).__name__}")
        self._finish(None, exc)

    def _finish(self, value, exc):
        mb = self._mailbox
        if mb is not None and not mb.is_task_thread():
            mb.post(lambda: self._finish_here(value, exc))
        else:
            self._set(value, exc)

    def _finish_here(self, value, exc):
        """Complete now, on the task thread, running the callbacks."""
        self._set(value, exc)

    cdef int _set(self, value, exc) except -1:
        """Complete and run the callbacks in order. With a context, each callback
        holds a reference until it has run and the pending future one until all
        have; a callback that raises stops the others (their references are
        released) and the exception propagates."""
        cdef Py_ssize_t n, i, j
        if self._done:
            raise RuntimeError("the future is already complete")
        self._result = value
        self._exc = exc
        self._done = True
        if not self._in_batch:  # (else _run_wave decides, see there)
            _track_future(self)  # (see "GC visibility")
        cb = self._cb
        self._cb = None
        ctx = self._ctx
        if type(cb) is not list:
            if ctx is None:
                if cb is not None:
                    _run_callback(cb, self)
                return 0
            try:
                if cb is not None:
                    try:
                        _run_callback(cb, self)
                    finally:
                        _release(ctx)  # the reference the callback held
            finally:
                _release(ctx)  # the reference the pending future held
            return 0
        cbs = <list>cb
        n = len(cbs)
        if ctx is None:
            for i in range(n):
                try:
                    _run_callback(cbs[i], self)
                except BaseException:
                    _track_pending(cbs, i + 1)
                    raise
            return 0
        i = 0
        try:
            for i in range(n):
                try:
                    _run_callback(cbs[i], self)
                finally:
                    _release(ctx)  # the reference callback i held
        except BaseException:
            for j in range(i + 1, n):  # callbacks that will not run now
                _release(ctx)
            _track_pending(cbs, i + 1)
            raise
        finally:
            _release(ctx)  # the reference the pending future held
        return 0

    # ------------------------------------------------------------ chaining

    cdef int _add_callback(self, cb) except -1:
        """Run ``cb`` when complete (now if already); counts as a registered callback."""
        if self._done:
            return _run_callback(cb, self)
        if self._ctx is not None:
            _retain(self._ctx)  # released by _set once cb has run
        if type(cb) is StateFuture and PyObject_GC_IsTracked(self):
            _track_tree(<StateFuture>cb)  # no longer reachable from the controller only
        if self._cb is None:
            self._cb = cb
        elif type(self._cb) is list:
            (<list>self._cb).append(cb)
        else:
            self._cb = [self._cb, cb]
        return 0

    def _on_done(self, cb):
        """Run the callable ``cb()`` when complete (now if already)."""
        _callable(cb, "cb")
        self._add_callback(cb)

    cdef StateFuture _then(self, int kind, fn, fn2, fn3, aux=None):
        """A derived future completed by step ``kind`` once this one completes."""
        cdef StateFuture out = _new_future(self._mailbox, self._ctx)
        if PyObject_GC_IsTracked(self):
            _track(out)
        else:  # untracked: reachable from self's links, as self is from the controller's buffers
            if kind <= K_COMPOSE:
                # a user function (typically a lambda made per record, with its
                # closure) held only until the step runs: hidden with ``out``,
                # so young collections do not walk and promote thousands of
                # them (see "GC visibility"); shown again by _step, __dealloc__
                # or _track_future, before this reference to it goes
                out._fn_hidden = _hide_fn(fn)
        out._kind = kind
        out._fn = fn
        out._fn2 = fn2
        out._fn3 = fn3
        out._aux = aux
        self._add_callback(out)
        return out

    cdef int _step(self, StateFuture src) except -1:
        """Run this derived future's step now that ``src`` (what it waits on) is complete."""
        cdef int kind = self._kind
        if kind == K_FORWARD or kind == K_COND_FORWARD or kind == K_COMBINE_BOTH:
            # waiting on a second future, which may have no mailbox (or another):
            # completed off the task thread, it must not run this one's callbacks
            # (the record's) there; the step runs as a mail, as _finish would
            mb = self._mailbox
            if mb is not None and src._mailbox is not mb and not mb.is_task_thread():
                _post_step(mb, self, src)
                return 0
        fn = self._fn
        if kind == K_FORWARD or kind == K_COND_FORWARD or kind == K_COMBINE_BOTH:
            # the second future is complete: this one completes with it, from
            # what the first step left in _val (the condition, the first result)
            self._kind = K_SOURCE
            self._aux = None
            self._fn = None
            first = self._val
            self._val = None
            if kind == K_FORWARD:
                return self._set(src._result, src._exc)
            if src._exc is not None:
                return self._set(None, src._exc)
            if kind == K_COND_FORWARD:
                return self._set((first, src._result), None)
            try:
                value = fn(first, src._result)
            except BaseException as exc:
                self._set(None, exc)
                raise
            return self._set(value, None)
        # a step on the result of the future this one was derived from: its
        # failure fails this future; an exception raised by the user function
        # fails it too and propagates (it fails the processing)
        fn2 = self._fn2
        fn3 = self._fn3
        self._kind = K_SOURCE
        self._fn = None
        self._fn2 = None
        self._fn3 = None
        if self._fn_hidden:  # visible again before it can be freed (see _then)
            self._fn_hidden = False
            _show_fn(fn)
        if src._exc is not None:
            self._aux = None
            return self._set(None, src._exc)
        try:
            self._apply(kind, src._result, fn, fn2, fn3)
        except BaseException as exc:
            if not self._done:
                self._set(None, exc)
            raise
        return 0

    cdef int _apply(self, int kind, r, fn, fn2, fn3) except -1:
        cdef StateFuture inner
        if kind == K_APPLY:
            return self._set(fn(r), None)
        if kind == K_ACCEPT:
            fn(r)
            return self._set(None, None)
        if kind == K_COMPOSE:
            inner = _is_future(fn(r), "then_compose's function must return")
            self._kind = K_FORWARD
            self._aux = inner  # (for the GC: the inner future and this one refer to each other)
            return inner._add_callback(self)
        if kind == K_COMBINE:
            other = <StateFuture>self._aux
            self._val = r
            self._fn = fn
            self._kind = K_COMBINE_BOTH
            return other._add_callback(self)
        if kind == K_COND_APPLY:
            if fn(r):
                return self._set((True, fn2(r)), None)
            return self._set((False, fn3(r) if fn3 is not None else None), None)
        if kind == K_COND_ACCEPT:
            ok = bool(fn(r))
            if ok:
                fn2(r)
            elif fn3 is not None:
                fn3(r)
            return self._set(ok, None)
        if kind == K_COND_COMPOSE:
            ok = bool(fn(r))
            branch = fn2 if ok else fn3
            if branch is None:
                return self._set((False, None), None)
            inner = _is_future(branch(r), "then_conditionally_compose's function must return")
            self._val = ok
            self._kind = K_COND_FORWARD
            self._aux = inner
            return inner._add_callback(self)
        if kind == K_TO_LIST:
            return self._set([] if r is None else list(r), None)
        raise RuntimeError(f"not a derived future (step {kind})")

    def then_apply(self, fn):
        """A future of ``fn(result)``."""
        _callable(fn, "fn")
        return self._then(K_APPLY, fn, None, None)

    def then_accept(self, action):
        """A future of None, completed after ``action(result)`` ran."""
        _callable(action, "action")
        return self._then(K_ACCEPT, action, None, None)

    def then_compose(self, fn):
        """A future of the result of the future ``fn(result)`` returns."""
        _callable(fn, "fn")
        return self._then(K_COMPOSE, fn, None, None)

    def then_combine(self, other, fn):
        """A future of ``fn(result, other's result)``, once both are complete."""
        _is_future(other, "then_combine's other must be")
        _callable(fn, "fn")
        return self._then(K_COMBINE, fn, None, None, other)

    def then_conditionally_apply(
        self, condition, if_true, if_false = None
    ):
        """A future of ``(condition(result), the applied branch's result or None)``."""
        _callable(condition, "condition")
        _callable(if_true, "if_true")
        return self._then(K_COND_APPLY, condition, if_true, if_false)

    def then_conditionally_accept(
        self, condition, if_true, if_false = None
    ):
        """A future of ``condition(result)``, completed after the chosen action ran."""
        _callable(condition, "condition")
        _callable(if_true, "if_true")
        return self._then(K_COND_ACCEPT, condition, if_true, if_false)

    def then_conditionally_compose(
        self,
        condition,
        if_true,
        if_false = None):
        """A future of ``(condition(result), the chosen branch future's result or None)``."""
        _callable(condition, "condition")
        _callable(if_true, "if_true")
        return self._then(K_COND_COMPOSE, condition, if_true, if_false)

    def __repr__(self):
        if not self._done:
            return "<StateFuture pending>"
        if self._exc is not None:
            return f"<StateFuture failed: {self._exc!r}>"
        return f"<StateFuture done: {self._result!r}>"


# (see "GC visibility"; each type's pool is in untracked.h)
cm_untracked_install(StateFuture, 0)
cm_untracked_install(RecordContext, 1)


cdef inline int _run_callback(cb, StateFuture src) except -1:
    """Run a callback of ``src``, which has just completed."""
    cdef int r
    if type(cb) is StateFuture:
        # a derived future's step completes it and runs its callbacks in turn:
        # a long chain recurses in C, so count it against the interpreter's
        # recursion limit (RecursionError, not a C stack overflow)
        if Py_EnterRecursiveCall(" while completing a StateFuture chain"):
            return -1
        try:
            r = (<StateFuture>cb)._step(src)
        finally:
            Py_LeaveRecursiveCall()
        return r
    cb()
    return 0


def _post_step(mb, StateFuture f not None, StateFuture src not None):
    """Run ``f``'s step on ``src`` as a mail on the task thread (see StateFuture._step)."""
    _track_tree(f)  # held by the mail now, not the controller's buffers
    mb.post(lambda: _resume_step(f, src))


cdef int _resume_step(StateFuture f, StateFuture src) except -1:
    """``f``'s step on the task thread, with its record current if it has one."""
    ctx = f._ctx
    if type(ctx) is RecordContext:
        aec = _controller_of(<RecordContext>ctx)
        if aec is not None:
            return (<AsyncExecutionController>aec)._step_in_record(f, src)
    return f._step(src)


cdef StateFuture _new_future(mailbox, ctx):
    """``StateFuture(mailbox, ctx)`` without the Python call, untracked."""
    cdef StateFuture f = StateFuture.__new__(StateFuture)
    f._inited = True
    f._result = _PENDING
    f._mailbox = mailbox
    if ctx is not None:
        if type(ctx) is RecordContext and (<RecordContext>ctx)._disposed:
            # derived from a future of a finished record (a then_* or
            # combine_all after it completed): nothing of the record is left
            # to hold, so the new future is not counted against it
            return f
        f._ctx = ctx
        _retain(ctx)
    return f


cdef inline bint _runs_user_code(StateFuture f):
    """Whether completing ``f`` runs user code: it does unless its callbacks are
    only forwarding steps (a ``then_compose``'s inner future handing its result
    on) whose own callbacks run none."""
    cdef StateFuture d
    while True:
        cb = f._cb
        if cb is None:
            return False
        if type(cb) is not StateFuture:  # a callable, or several callbacks
            return True
        d = <StateFuture>cb
        if d._kind != K_FORWARD and d._kind != K_COND_FORWARD:
            return True
        f = d


cdef cowmap_slot_cache _key_get
cdef str _KEY = "_key"


cdef inline int _switch_key(AsyncExecutionController aec, RecordContext ctx) except -1:
    """Make ``ctx``'s key current on the backend before a record's callbacks run
    (Flink switches the key with the record context): ``set_current_key`` minus
    what process() already did for this key (its key group, the range check)."""
    backend = aec.backend
    if cowmap_slot_get(backend, _KEY, &_key_get) is not ctx.key:
        switch_key(backend, ctx.key, ctx.key_group)
    return 0


cdef inline int _callable(fn, str what) except -1:
    if not callable(fn):
        raise TypeError(f"{what} must be callable, not {type(fn).__name__}")
    return 0


cdef inline StateFuture _is_future(f, str what):
    """``f`` as a StateFuture; TypeError "``what`` a StateFuture, not ..." if it is not."""
    if not isinstance(f, StateFuture):
        raise TypeError(f"{what} a StateFuture, not {type(f).__name__}")
    return <StateFuture>f


cdef StateFuture _as_request(r):
    """``r`` as a request (the future of a queued state request); ValueError if it is none."""
    if not isinstance(r, StateFuture):
        raise TypeError(f"expected a request (StateFuture), not {type(r).__name__}")
    if type((<StateFuture>r)._ctx) is not RecordContext or (<StateFuture>r)._kind != K_REQUEST:
        raise ValueError("not a request: a StateFuture without a record context and state method")
    return <StateFuture>r


class StateFutureUtils:
    """Helpers with Flink's names."""

    @staticmethod
    def completed_future(value):
        cdef StateFuture f = _new_future(None, None)
        f._set(value, None)
        return f

    @staticmethod
    def completed_void_future():
        return StateFutureUtils.completed_future(None)

    @staticmethod
    def combine_all(futures):
        """A future of every result, in input order, once the last one completes."""
        cdef StateFuture out
        if not hasattr(futures, "__iter__"):
            raise TypeError(f"combine_all needs an iterable of StateFutures, not {type(futures).__name__}")
        fs = [_is_future(f, "combine_all's input must be") for f in futures]
        if not fs:
            return StateFutureUtils.completed_future([])
        first = <StateFuture>fs[0]
        out = _new_future(first._mailbox, first._ctx)
        _track(out)
        left = [len(fs)]

        def one_done():
            left[0] -= 1
            if left[0] == 0 and not out._done:
                failed = next(((<StateFuture>f)._exc for f in fs if (<StateFuture>f)._exc is not None), None)
                out._set(None if failed else [(<StateFuture>f)._result for f in fs], failed)

        for f in fs:
            (<StateFuture>f)._add_callback(one_done)
        return out

    @staticmethod
    def to_iterable(future):
        """A future of a list of what the iterable result of ``future`` yields."""
        return _is_future(future, "to_iterable's input must be")._then(K_TO_LIST, None, None, None)



# ------------------------------------------------------------ the controller

_SYNC_POINT = "sync_point"
cdef tuple _NO_ARGS = ()

# The request types of the state methods, by name: a request's op is one of
# these objects (so grouping compares identities) and its batch form, if the
# state has one, is ``_batch_<op>``.
cdef dict _OPS = {}
cdef dict _BATCH_NAMES = {}
for _name in ("value", "update", "clear", "get", "add", "add_all", "put", "put_all", "remove",
              "contains", "items", "keys", "values", "is_empty", _SYNC_POINT):
    _OPS[_name] = _name
    _BATCH_NAMES[_name] = "_batch_" + _name
del _name

cdef str _VALUE = _OPS["value"]
cdef str _UPDATE = _OPS["update"]
cdef str _CLEAR = _OPS["clear"]
cdef str _GET = _OPS["get"]
cdef str _ADD = _OPS["add"]
cdef str _ADD_ALL = _OPS["add_all"]
cdef str _PUT = _OPS["put"]
cdef str _PUT_ALL = _OPS["put_all"]
cdef str _REMOVE = _OPS["remove"]
cdef str _CONTAINS = _OPS["contains"]
cdef str _IS_EMPTY = _OPS["is_empty"]
cdef str _SYNC = _OPS[_SYNC_POINT]


cdef str _batch_name(str op):
    name = _BATCH_NAMES.get(op)
    return <str>name if name is not None else "_batch_" + op


class EpochMode(enum.Enum):
    """How non-record actions (watermarks, timers) order against records."""

    #: the trigger action waits for every earlier record (Flink's default)
    SERIAL_BETWEEN_EPOCH = 0
    #: the trigger action runs at once; the final action after the earlier records
    PARALLEL_BETWEEN_EPOCH = 1


@cython.final
cdef class _Epoch:
    """The records between two non-record actions, and the actions to run after them."""

    cdef public Py_ssize_t records
    cdef public bint closed
    cdef public list actions

    def __init__(self):
        self.records = 0
        self.closed = False
        self.actions = []


cdef inline bint _same_group(StateFuture a, StateFuture b):
    return _rq_state(a) is _rq_state(b) and (_rq_op(a) is _rq_op(b) or _rq_op(a) == _rq_op(b))


@cython.no_gc_clear  # its buffers must outlive a GC clear: __dealloc__ walks them
cdef class AsyncExecutionController:
    """Runs the async state requests of records, one record per key at a time.

    Args:
        backend: the :class:`~cowmap.state.KeyedStateBackend` whose states are used.
        batch_size: requests per batch (Flink's default 1000).
        buffer_timeout_ms: a non-full batch runs this long after its first request.
        max_in_flight_records: back pressure bound (Flink's default 6000).
        epoch_mode: see :class:`EpochMode`.
        mailbox: the task thread's mailbox (a new one by default, owned by the
            thread that makes the controller).

    Memory: the futures and record contexts the controller keeps in flight are
    hidden from the cyclic garbage collector while they are (it would walk
    thousands of them per collection), and so are the Python functions given
    to ``then_apply``/``then_accept``/``then_compose`` of an in-flight future,
    with their closures, until they have run (``gc.is_tracked`` says False
    meanwhile); completed, failed, or left when the controller is dropped or
    fails, they are handed back to it. So drop a
    controller after :meth:`drain` or after it raised: a controller dropped
    with records in flight whose callbacks refer back to the controller itself
    is never freed.
    """

    cdef public object backend
    cdef public Py_ssize_t batch_size
    cdef public object buffer_timeout_ms
    cdef public Py_ssize_t max_in_flight_records
    cdef public object epoch_mode
    cdef public object mailbox
    cdef public Py_ssize_t batches_run
    cdef public Py_ssize_t requests_run
    cdef public Py_ssize_t core_calls
    cdef RecordContext _current
    cdef list _active
    cdef dict _blocking
    cdef dict _holders
    cdef Py_ssize_t _in_flight
    cdef _Epoch _epoch
    cdef object _epochs
    cdef Py_ssize_t _buffer_seq
    cdef Py_ssize_t _wave_seq
    cdef unsigned long _task_thread
    cdef object _self_ref  # weakref.ref(self): what contexts and the backend hold
    cdef object __weakref__
    # the first exception a user callback raised in the batch being run (it is
    # raised once the whole batch ran) and the first the controller ever saw
    # come out of a batch or a mail (drain raises it rather than wait for ever)
    cdef object _batch_error
    cdef object _failure


    def __init__(self, backend, batch_size=1000, buffer_timeout_ms=1000, max_in_flight_records=6000, epoch_mode=EpochMode.SERIAL_BETWEEN_EPOCH, mailbox=None):
        for name, v in (("batch_size", batch_size), ("max_in_flight_records", max_in_flight_records)):
            if not isinstance(v, int) or isinstance(v, bool) or v <= 0:
                raise ValueError(f"{name} must be a positive int, got {v!r}")
        if not isinstance(buffer_timeout_ms, (int, float)) or buffer_timeout_ms < 0:
            raise ValueError(f"buffer_timeout_ms must be >= 0, got {buffer_timeout_ms!r}")
        if not isinstance(epoch_mode, EpochMode):
            raise TypeError(f"epoch_mode must be an EpochMode, not {type(epoch_mode).__name__}")
        if not callable(getattr(backend, "set_current_key", None)):
            raise TypeError(f"backend must be a KeyedStateBackend, not {type(backend).__name__}")
        self.backend = backend
        self.batch_size = batch_size
        self.buffer_timeout_ms = buffer_timeout_ms
        self.max_in_flight_records = max_in_flight_records
        self.epoch_mode = epoch_mode
        if mailbox is None:
            from cowmap.asyncstate.mailbox import Mailbox

            mailbox = Mailbox()
        self.mailbox = mailbox
        self._task_thread = mailbox._task_thread  # the mailbox's task thread is ours
        self._current = None
        self._active = []
        self._blocking = {}
        self._holders = {}  # key -> the record in flight for it
        self._in_flight = 0
        self._epoch = _Epoch()
        self._epochs = collections.deque([self._epoch])
        self._buffer_seq = 0  # bumped per batch run: stale timeouts are skipped
        self._wave_seq = 0
        #: gauges
        self.batches_run = 0
        self.requests_run = 0
        #: calls made into the state layer to run requests (a vectorised group counts once)
        self.core_calls = 0
        self._self_ref = weakref.ref(self)
        backend._aec = self._self_ref  # weak (see "GC visibility")

    def __dealloc__(self):
        # dropped with records in flight: hand their futures and contexts back
        # to the GC, which can then collect any cycles through them
        self._track_in_flight()

    cdef int _track_in_flight(self) except -1:
        """Track every in-flight future and context (see "GC visibility")."""
        if self._active is not None:
            for r in self._active:
                _track_tree(<StateFuture>r)
        if self._blocking is not None:
            for q in self._blocking.values():
                for r in q:
                    _track_tree(<StateFuture>r)
        if self._holders is not None:
            for ctx in self._holders.values():
                _track(ctx)
        if self._current is not None:
            _track(self._current)
        return 0

    # ------------------------------------------------------------ gauges

    @property
    def in_flight_records(self):
        return self._in_flight

    @property
    def active_size(self):
        return len(self._active)

    @property
    def blocking_size(self):
        return sum(len(q) for q in self._blocking.values())

    @property
    def blocked_keys(self):
        return len(self._blocking)

    @property
    def occupied_keys(self):
        return len(self._holders)

    @property
    def current_context(self):
        return self._current

    # ------------------------------------------------------------ records

    def process(self, key, fn, record=None, priority=0):
        """Run ``fn(record)`` now as the processing of a record of ``key``.

        ``priority``: among the records waiting for a busy key, higher goes first
        (e.g. derived work such as timers); equal priorities keep arrival order.
        """
        cdef RecordContext ctx, previous
        self._check_thread()
        if type(priority) is not int and not isinstance(priority, int):
            # compared when a busy key is handed over (_dispose): too late to fail there
            raise TypeError(f"priority must be an int, not {type(priority).__name__}")
        while self._in_flight >= self.max_in_flight_records:
            if not self._make_progress():
                raise RuntimeError("in-flight limit reached and nothing can run (a request never completes?)")
        backend = self.backend
        kg = key_group_in_range(backend, key)  # validates the key
        switch_key(backend, key, kg)  # (backend.set_current_key, without the Python call)
        ctx = RecordContext.__new__(RecordContext)
        ctx.record = record
        ctx.key = key
        ctx.key_group = kg
        ctx.epoch = self._epoch
        ctx.priority = priority
        ctx.refs = 1  # held while fn runs
        ctx._aec_ref = self._self_ref  # (untracked: see "GC visibility")
        self._epoch.records += 1
        self._in_flight += 1
        previous = self._current
        self._current = ctx
        try:
            fn(record)
        except BaseException:
            self._track_in_flight()  # the record's processing fails (see trigger)
            raise
        finally:
            self._current = previous
            _release_record(ctx)
        if len(self._active) >= self.batch_size:
            self.trigger()

    def handle_request(self, state, op, *args):
        """Queue a request of the current record; a future of its result."""
        if type(op) is not str:
            raise TypeError(f"op must be a str (a state method's name), not {type(op).__name__}")
        if state is None:  # (only sync points, queued by sync_point, have none)
            raise TypeError(f"handle_request needs a state for op {op!r}, not None")
        return self._request(state, <str>_OPS.get(op, op), args)

    cdef StateFuture _request(self, state, str op, object args, bint one_arg=False):
        """Queue a request of the current record; the future of its result,
        which is the request itself (it carries the state, op and arguments):
        ``args`` is a tuple, or with ``one_arg`` the single argument."""
        cdef RecordContext ctx = self._current
        cdef StateFuture req
        if ctx is None:
            raise RuntimeError("async state calls must be made inside AsyncExecutionController.process")
        if state is None:
            ns = None
        else:
            ns = _state_slot(state, _NS, &_ns_slot, "async state requests")
        req = _new_future(self.mailbox, ctx)  # (untracked: see "GC visibility")
        req._kind = K_REQUEST
        req._fn = state
        req._fn2 = op
        req._fn3 = args
        req._aux = ns
        req._one_arg = one_arg
        if ctx.holds_key or self._try_occupy(ctx):
            self._insert_active(req)
        else:
            q = self._blocking.get(ctx.key)
            if q is None:
                q = self._blocking[ctx.key] = collections.deque()
            q.append(req)
        return req

    def sync_point(self, callback):
        """Run ``callback`` once the current record holds its key (at once if it does)."""
        _callable(callback, "sync_point's callback")
        return self._request(None, _SYNC, _NO_ARGS).then_accept(lambda _: callback())

    cdef bint _try_occupy(self, RecordContext ctx) except -1:
        """Take ctx's key if it is free (one dict probe); whether ctx holds it."""
        holder = <object>PyDict_SetDefault(self._holders, ctx.key, ctx)
        if holder is ctx:
            ctx.holds_key = True
            return True
        (<RecordContext?>holder)._waited_for = True  # (its _dispose hands the key on)
        return False

    cdef int _insert_active(self, StateFuture req) except -1:
        if _rq_op(req) is _SYNC:  # needs nothing from the state: done as soon as runnable
            return self._complete(req, None, None)
        active = self._active
        active.append(req)
        if len(active) == 1 and self.buffer_timeout_ms > 0:
            self._arm_timeout()
        return 0

    cdef int _dispose(self, RecordContext ctx) except -1:
        cdef _Epoch ep
        cdef object error = None
        _track(ctx)  # out of flight (see "GC visibility")
        self._in_flight -= 1
        if ctx.holds_key:
            ctx.holds_key = False
            del self._holders[ctx.key]
            q = self._blocking.get(ctx.key) if ctx._waited_for else None
            if q:  # the next record of this key takes it, with all its waiting requests
                nxt = (<StateFuture>q[0])._ctx
                for r in q:  # the first of the highest priority
                    if (<RecordContext?>(<StateFuture>r)._ctx).priority > (<RecordContext?>nxt).priority:
                        nxt = (<StateFuture>r)._ctx
                self._holders[ctx.key] = nxt
                (<RecordContext?>nxt).holds_key = True
                mine = [r for r in q if (<StateFuture>r)._ctx is nxt]
                rest = [r for r in q if (<StateFuture>r)._ctx is not nxt]
                (<RecordContext?>nxt)._waited_for = bool(rest)
                if rest:
                    self._blocking[ctx.key] = collections.deque(rest)
                else:
                    del self._blocking[ctx.key]
                for r in mine:
                    # a sync point runs here: if its callback raises, the record's
                    # other requests and this one's epoch are still seen to
                    try:
                        self._insert_active(<StateFuture>r)
                    except BaseException as exc:
                        if error is None:
                            error = exc
        ep = <_Epoch?>ctx.epoch
        ep.records -= 1
        if ep.records == 0 and ep.closed:
            self._finish_epochs()
        if error is not None:
            raise error
        return 0

    # ------------------------------------------------------------ batches

    def trigger(self):
        """Run the active buffer as one batch now; returns how many requests ran.

        A batch runs in waves so each (state table, key) sees its requests in order;
        within a wave the requests of one state and type go to the state in one
        vectorised call where it has one (``_batch_<op>``), else one by one.

        An exception raised by a callback (user code run as a request completes)
        does not abandon the batch: every request of the batch still runs and
        completes (the futures of the failing chain fail with the exception),
        then the first such exception is raised here, on the task thread. As in
        Flink, that fails the task: the controller keeps it, and if records can
        then never finish (a callback that raised skipped the other callbacks
        of its future), :meth:`drain` raises instead of waiting for ever.
        """
        cdef list batch
        cdef Py_ssize_t n
        self._check_thread()
        batch = self._active
        if not batch:
            return 0
        self._active = []
        self._buffer_seq += 1
        self.batches_run += 1
        n = len(batch)
        self.requests_run += n
        self._batch_error = None
        try:
            while batch:
                batch = self._run_wave(batch)
        except BaseException:
            # requests of the batch not completed are in none of the buffers now
            for r in batch:
                _track_tree(<StateFuture>r)
            raise
        exc = self._batch_error
        if exc is not None:
            self._batch_error = None
            if self._failure is None:
                self._failure = exc
                # the task fails: if the controller is then dropped with records in
                # flight, the GC must see them all (see "GC visibility")
                self._track_in_flight()
            raise exc
        return n

    cdef list _run_wave(self, list batch):
        """Run the first request of each (state table, key) in ``batch``, grouped by
        (state, op) in order of first appearance; the requests left over."""
        cdef list groups = []
        cdef list rest = []
        cdef list group = None
        cdef list g
        cdef dict index = None
        cdef StateFuture req
        cdef RecordContext ctx
        cdef Py_ssize_t wave
        self._wave_seq += 1
        wave = self._wave_seq
        for item in batch:
            req = <StateFuture>item
            ctx = <RecordContext?>req._ctx
            # A key's requests in a batch all belong to one record (the record
            # holding the key: another can only take it once all of them are
            # done), so its context marks which states it used in this wave --
            # by table, not view: two views of one table are one state.
            table = _table_of(_rq_state(req))
            if ctx._wave != wave:
                ctx._wave = wave
                ctx._wave_state = <void *>table
                ctx._wave_states = None
            elif not _first_use_in_wave(ctx, table):
                rest.append(req)
                continue
            if group is None or not _same_group(<StateFuture>group[0], req):
                group = None
                if index is None:
                    for g in groups:
                        if _same_group(<StateFuture>g[0], req):
                            group = g
                            break
                    if group is None and len(groups) >= 8:  # many groups: index them
                        index = {(id(_rq_state(<StateFuture>g[0])), _rq_op(<StateFuture>g[0])): g for g in groups}
                else:
                    group = index.get((id(_rq_state(req)), _rq_op(req)))
                if group is None:
                    group = []
                    groups.append(group)
                    if index is not None:
                        index[(id(_rq_state(req)), _rq_op(req))] = group
            req._in_batch = True  # (see _track_if_kept)
            group.append(req)
        for g in groups:
            try:
                self._run_group(g)
            except BaseException as exc:  # the other groups still run (see trigger)
                if self._batch_error is None:
                    self._batch_error = exc
            finally:
                _track_if_kept(g)
        return rest

    def _run_group(self, reqs):
        """Run one group of a wave: requests of one state and op, at most one per key.

        Every request of the group completes even if a callback raises; the
        first exception is raised after the last one (see trigger)."""
        cdef StateFuture first, req
        cdef Py_ssize_t i, n
        cdef object error = None
        if type(reqs) is not list or not reqs:
            raise TypeError("_run_group needs a non-empty list of requests")
        n = len(<list>reqs)
        for i in range(n):
            _as_request((<list>reqs)[i])
        first = <StateFuture>(<list>reqs)[0]
        state = _rq_state(first)
        vector = getattr(state, _batch_name(_rq_op(first)), None) if state is not None else None
        if vector is not None:
            failed = None
            try:
                results = vector(reqs)
            except Exception as exc:  # the whole call failed: fail every request of it
                failed = exc
                results = None
            if results is not None:
                if type(results) is not list:
                    results = list(results)
                if len(<list>results) != n:  # a broken batch method: it fails the task too
                    failed = error = RuntimeError(
                        f"{type(state).__name__}.{_batch_name(_rq_op(first))} returned {len(<list>results)} results "
                        f"for {n} requests"
                    )
            if failed is not None or results is not None:
                self.core_calls += 1
                for i in range(n):
                    error = self._complete_noting(
                        <StateFuture>(<list>reqs)[i], None if failed is not None else (<list>results)[i], failed, error)
                if error is not None:
                    raise error
                return
        backend = self.backend
        for i in range(n):
            req = <StateFuture>(<list>reqs)[i]
            self.core_calls += 1
            failed = None
            try:
                backend.set_current_key((<RecordContext?>req._ctx).key)
                if state._ns is not _rq_ns(req):
                    state.set_current_namespace(_rq_ns(req))
                method = getattr(state, _rq_op(req))
                value = method(req._fn3) if req._one_arg else method(*req._fn3)
            except Exception as exc:  # a failing request fails its future (and its chain)
                value = None
                failed = exc
            error = self._complete_noting(req, value, failed, error)
        if error is not None:
            raise error

    cdef object _complete_noting(self, StateFuture req, value, exc, first_error):
        """``_complete`` for one request of a group, which completes them all even
        if callbacks raise: the first exception raised so far (``first_error``,
        or what this completion raised)."""
        try:
            self._complete(req, value, exc)
        except BaseException as e:
            return e if first_error is None else first_error
        return first_error

    cdef int _complete(self, StateFuture req, value, exc) except -1:
        """Complete a request's future with its record current, so the callbacks'
        own async calls belong to that record, and (if it has callbacks) with the
        record's key current on the backend, so they read and write its state
        (as Flink switches the key with the record context)."""
        cdef RecordContext ctx = <RecordContext?>req._ctx
        if _runs_user_code(req):  # only then is the key needed
            _switch_key(self, ctx)
        previous = self._current
        self._current = ctx
        try:
            req._set(value, exc)  # on the task thread already
        finally:
            self._current = previous
        return 0

    cdef int _step_in_record(self, StateFuture f, StateFuture src) except -1:
        """Run the step of ``f`` (a future of a record) on ``src`` as ``_complete``
        completes a request: with the record current, and its key if callbacks run."""
        cdef RecordContext ctx = <RecordContext>f._ctx
        if (f._kind != K_FORWARD and f._kind != K_COND_FORWARD) or _runs_user_code(f):
            _switch_key(self, ctx)
        previous = self._current
        self._current = ctx
        try:
            f._step(src)
        finally:
            self._current = previous
        return 0

    def _arm_timeout(self):
        seq = self._buffer_seq
        mailbox = self.mailbox
        ref = self._self_ref  # a pending timer does not keep the controller alive

        def fire():
            mailbox.post(lambda: _on_timeout(ref, seq))

        timer = threading.Timer(self.buffer_timeout_ms / 1000.0, fire)
        timer.daemon = True
        timer.start()

    def _on_timeout(self, seq):
        """Run the batch buffered at sequence ``seq`` if it has not run yet."""
        if seq == self._buffer_seq and self._active:  # else that batch already ran
            self.trigger()

    def _make_progress(self):
        """Run a batch or pending mails; False when there was nothing to do."""
        if self.trigger():
            return True
        return self.mailbox.run_available() > 0

    def drain(self, timeout=None):
        """Run batches and mails until no record is in flight (before a snapshot).

        An exception from a batch or a mail propagates (see :meth:`trigger`). Once
        one has, records its failing chain left unfinished never finish: when
        nothing else can run, drain raises a RuntimeError from that first failure
        rather than wait for ever (the task has failed, as in Flink)."""
        self._check_thread()
        while self._in_flight:
            try:
                progressed = self._make_progress()
            except BaseException as exc:
                if self._failure is None:
                    self._failure = exc
                raise
            if not progressed:
                if self._failure is not None:
                    raise RuntimeError(
                        f"{self._in_flight} records can never finish: a callback failed earlier "
                        f"({self._failure!r})"
                    ) from self._failure
                if not self.mailbox.run_until(lambda: len(self.mailbox) > 0 or not self._in_flight, timeout):
                    raise TimeoutError(f"{self._in_flight} records still in flight after {timeout} s")

    # ------------------------------------------------------------ epochs

    def process_non_record(self, trigger_action=None, final_action=None, mode=None):
        """Close the current epoch: in serial mode ``trigger_action`` and then
        ``final_action`` run once every earlier record is done (and later records
        wait for that); in parallel mode ``trigger_action`` runs now and
        ``final_action`` after the earlier records. ``mode`` overrides the
        controller's ``epoch_mode`` for this call."""
        self._check_thread()
        mode = self.epoch_mode if mode is None else mode
        ep = self._epoch
        ep.closed = True
        if mode is EpochMode.SERIAL_BETWEEN_EPOCH:
            if trigger_action is not None:
                ep.actions.append(trigger_action)
        elif trigger_action is not None:
            trigger_action()
        if final_action is not None:
            ep.actions.append(final_action)
        self._epoch = _Epoch()
        self._epochs.append(self._epoch)
        if mode is EpochMode.SERIAL_BETWEEN_EPOCH:
            self.drain()  # serial: the next records wait for this epoch to finish
        self._finish_epochs()

    def _finish_epochs(self):
        epochs = self._epochs
        while epochs and (<_Epoch>epochs[0]).closed and (<_Epoch>epochs[0]).records == 0:
            for action in (<_Epoch>epochs.popleft()).actions:
                action()

    cdef int _check_thread(self) except -1:
        if PyThread_get_thread_ident() != self._task_thread:
            raise RuntimeError("the AsyncExecutionController must be used from its task thread")
        return 0


cdef int _track_if_kept(list group) except -1:
    """After a wave ran ``group``: track (see "GC visibility") each of its requests
    that something besides the wave still holds. Completed there, most are only
    held by the wave's lists, and are freed with them: tracking them at
    completion would only have the collections walk and promote them meanwhile."""
    cdef Py_ssize_t i
    cdef StateFuture req
    for i in range(len(group)):
        req = <StateFuture>group[i]
        req._in_batch = False
        # held by: the wave's input list, this group, ``req``
        if not req._done or Py_REFCNT(req) > 3:
            _track_tree(req)
    return 0


def _on_timeout(ref, seq):
    aec = ref()
    if aec is not None:  # (else the controller is gone, and its batch with it)
        aec._on_timeout(seq)


cdef cowmap_slot_cache _t_slot
cdef str _T = "_t"


cdef inline object _table_of(state):
    """The table a state view is over (``state._t``; the state itself if it has none)."""
    if state is None:
        return None
    cdef PyObject *p = cowmap_slot_peek(state, &_t_slot)
    if p != NULL:
        return <object>p
    return _table_of_miss(state)


cdef object _table_of_miss(state):
    try:
        return cowmap_slot_get(state, _T, &_t_slot)
    except AttributeError:
        return state


cdef bint _first_use_in_wave(RecordContext ctx, state) except -1:
    """Whether ``state`` (a table) is new among those ``ctx`` used in the current wave (and note it)."""
    if ctx._wave_state == <void *>state:
        return False
    if ctx._wave_states is None:
        ctx._wave_states = [state]
        return True
    for s in ctx._wave_states:
        if s is state:
            return False
    ctx._wave_states.append(state)
    return True


# ------------------------------------------------------------ the async twins
# Bound onto the state classes by cowmap.state.async_methods: each queues a
# request of the record being processed with the backend's controller.


cdef cowmap_slot_cache _b_slot
cdef cowmap_slot_cache _ns_slot
cdef cowmap_slot_cache _aec_get
cdef str _B = "_b"
cdef str _AEC = "_aec"
cdef str _NS = "_ns"


cdef inline object _state_slot(state, str name, cowmap_slot_cache *c, str what):
    """``state.<name>``, a slot of the state views; TypeError "``what`` need a
    state" if ``state`` is none. A cache hit is a plain read: the try block is
    in another function (Cython pays for one on entering the function)."""
    cdef PyObject *p = cowmap_slot_peek(state, c)
    if p != NULL:
        return <object>p
    return _state_slot_miss(state, name, c, what)


cdef object _state_slot_miss(state, str name, cowmap_slot_cache *c, str what):
    try:
        return cowmap_slot_get(state, name, c)
    except AttributeError:
        if hasattr(type(state), name):  # a state, with the slot unset
            raise
        raise TypeError(f"{what} need a state, not {type(state).__name__}") from None


cdef AsyncExecutionController _aec_of(state):
    b = _state_slot(state, _B, &_b_slot, "async state methods")
    aec = cowmap_slot_get(b, _AEC, &_aec_get)
    if PyWeakref_CheckRef(aec):
        aec = <object>PyWeakref_GetObject(aec)
    if aec is None:
        raise RuntimeError(
            f"async calls on state {state._t.name!r} need an AsyncExecutionController for its backend"
        )
    return <AsyncExecutionController?>aec


def request(state, op, *args):
    """Queue request ``op`` (a state method's name) with ``args`` for the record
    being processed; a future of its result."""
    if type(op) is not str:
        raise TypeError(f"op must be a str (a state method's name), not {type(op).__name__}")
    return _aec_of(state)._request(state, <str>_OPS.get(op, op), args)


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
