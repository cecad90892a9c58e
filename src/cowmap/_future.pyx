# cython: language_level=3
"""The async layer's futures and record contexts, compiled: ``StateFuture`` (Flink's
``then_*`` chaining, completed on the task thread), ``StateFutureUtils`` and the
``RecordContext`` that counts a record's pending work; and how in-flight objects are
kept out of the cyclic GC's sight.

The Python API lives in ``cowmap.asyncstate`` (future.py), which re-exports these.
The controller (``_controller.pyx``) drives them through ``ControllerBase``.
"""

cimport cython

from cpython.ref cimport PyObject

cdef extern from "Python.h":
    int Py_EnterRecursiveCall(const char *where)  # nonzero: RecursionError set
    void Py_LeaveRecursiveCall()
    int Py_GetRecursionLimit()
    void PyObject_GC_UnTrack(object o)
    bint PyFunction_Check(object o)  # exactly a Python function (a def or lambda)
    PyObject *PyFunction_GET_CLOSURE(object fn)  # borrowed; NULL without free variables

cdef extern from "untracked.h":
    int cm_untracked_install(object type, int slot) except -1  # 1 installed, 0 not in this build

import os
import weakref

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

# The switch: COWMAP_ASYNC_GC_HIDE=0 in the environment at import turns the
# hiding off (every object is tracked from birth, as CPython does by default),
# so the tests can check that nothing depends on it but the collector's cost.
cdef bint _hide = os.environ.get("COWMAP_ASYNC_GC_HIDE", "1") != "0"


def gc_hiding():
    """Whether in-flight futures and contexts are hidden from the cyclic GC."""
    return _hide


cdef bint _pooled = False  # born untracked (untracked.h); else born tracked, untracked here


cdef int _born(object o) except -1:
    """A future or context just made by the controller: hidden unless the switch is off."""
    if not _hide:
        _track(o)
    elif not _pooled and PyObject_GC_IsTracked(o):
        PyObject_GC_UnTrack(o)
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
                (<ControllerBase>aec)._dispose(rc)
    elif rc.refs < 0:
        raise RuntimeError("record context released more often than retained")
    return 0


cdef class RecordContext:
    """One input record in flight: its key, key group, epoch and reference count."""

    def __init__(self, aec, record, key, key_group, epoch, priority=0):
        if aec is not None and not isinstance(aec, ControllerBase):
            raise TypeError(f"aec must be an AsyncExecutionController or None, not {type(aec).__name__}")
        self.record = record
        self.key = key
        self.key_group = key_group
        self.epoch = epoch
        self.priority = priority
        self.refs = 0
        self.holds_key = False
        self._disposed = False
        self._aec_ref = None if aec is None else weakref.ref(aec)
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


cdef class ControllerBase:
    """What futures and record contexts call on their controller
    (``AsyncExecutionController`` in _controller.pyx implements it)."""

    cdef int _dispose(self, RecordContext ctx) except -1:
        raise NotImplementedError

    cdef int _step_in_record(self, StateFuture f, StateFuture src) except -1:
        raise NotImplementedError

    cdef StateFuture _request(self, state, str op, object args, bint one_arg=False):
        raise NotImplementedError


@cython.auto_pickle(False)  # a copy would share the callbacks and what they hold
cdef class StateFuture:
    """A value that a state request will produce, with Flink's ``then_*`` chaining."""

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
        """Complete with ``value``; callable from any thread (callbacks run on the task thread).

        Only a source future (made with ``StateFuture()``) is completed by hand:
        the future of an async state call is completed by its batch (by hand only
        once its controller is gone), and one made by ``then_*`` by its step
        (RuntimeError)."""
        self._check_completable()
        self._finish(value, None)

    def complete_exceptionally(self, exc):
        """Fail with ``exc``; the same rules as :meth:`complete`."""
        if not isinstance(exc, BaseException):
            raise TypeError(f"expected an exception, not {type(exc).__name__}")
        self._check_completable()
        self._finish(None, exc)

    cdef int _check_completable(self) except -1:
        # completing a request by hand would finish its record while the request
        # still runs later and writes; a derived future would complete twice
        if self._kind == K_REQUEST and _controller_of(<RecordContext>self._ctx) is not None:
            raise RuntimeError(
                f"cannot complete the future of an async state request ({_rq_op(self)!r}) by hand: "
                "its batch completes it"
            )
        if self._kind != K_SOURCE and self._kind != K_REQUEST:
            raise RuntimeError("cannot complete a future made by then_* by hand: its step completes it")
        return 0

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
if _hide:
    _pooled = cm_untracked_install(StateFuture, 0) + cm_untracked_install(RecordContext, 1) == 2


cdef extern from *:
    """
    /* chain steps nested in C on this thread (see _run_callback) */
    static _Thread_local int cm_chain_depth = 0;
    """
    int _chain_depth "cm_chain_depth"


cdef inline int _run_callback(cb, StateFuture src) except -1:
    """Run a callback of ``src``, which has just completed."""
    cdef int r
    if type(cb) is StateFuture:
        # a derived future's step completes it and runs its callbacks in turn:
        # a long chain recurses in C, so count it against the interpreter's
        # recursion limit (RecursionError, not a C stack overflow). Since 3.12
        # Py_EnterRecursiveCall counts against a separate, much higher C limit
        # (10,000 on 3.13) that a chain's frames overflow an 8 MiB stack before
        # reaching: the chain's own depth is held to the recursion limit too.
        global _chain_depth
        if _chain_depth >= Py_GetRecursionLimit():
            raise RecursionError("maximum recursion depth exceeded while completing a StateFuture chain")
        if Py_EnterRecursiveCall(" while completing a StateFuture chain"):
            return -1
        _chain_depth += 1
        try:
            r = (<StateFuture>cb)._step(src)
        finally:
            _chain_depth -= 1
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
            return (<ControllerBase>aec)._step_in_record(f, src)
    return f._step(src)


cdef RecordContext _new_context():
    """``RecordContext.__new__`` without the Python call (so untracked: the type's
    own tp_new function, not the slot, which tracks what Python makes)."""
    cdef RecordContext ctx = RecordContext.__new__(RecordContext)
    _born(ctx)
    return ctx


cdef StateFuture _new_future(mailbox, ctx):
    """``StateFuture(mailbox, ctx)`` without the Python call, untracked."""
    cdef StateFuture f = StateFuture.__new__(StateFuture)
    _born(f)
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


cdef bint _runs_user_code(StateFuture f):
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


cdef int _callable(fn, str what) except -1:
    if not callable(fn):
        raise TypeError(f"{what} must be callable, not {type(fn).__name__}")
    return 0


cdef StateFuture _is_future(f, str what):
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


