# cython: language_level=3
"""The hot parts of the async state layer, compiled: ``StateFuture`` and the
record context / request objects of the ``AsyncExecutionController``.

The Python API lives in ``cowmap.asyncstate`` (future.py, controller.py), which
re-exports these; see there for the semantics.
"""

cimport cython

cdef class StateFuture
cdef class RecordContext

_PENDING = object()


cdef inline void _retain(object ctx) except *:
    if type(ctx) is RecordContext:
        (<RecordContext>ctx).refs += 1
    else:
        ctx.retain()


cdef inline void _release(object ctx) except *:
    cdef RecordContext rc
    if type(ctx) is RecordContext:
        rc = <RecordContext>ctx
        rc.refs -= 1
        if rc.refs == 0:
            rc._aec._dispose(rc)
        elif rc.refs < 0:
            raise RuntimeError("record context released more often than retained")
    else:
        ctx.release()


cdef class RecordContext:
    """One input record in flight: its key, key group, epoch and reference count."""

    cdef public object record
    cdef public object key
    cdef public object key_group
    cdef public object epoch
    cdef public object priority
    cdef public Py_ssize_t refs
    cdef public bint holds_key
    cdef public object _aec

    def __init__(self, aec, record, key, key_group, epoch, priority=0):
        self.record = record
        self.key = key
        self.key_group = key_group
        self.epoch = epoch
        self.priority = priority
        self.refs = 0
        self.holds_key = False
        self._aec = aec

    def retain(self):
        self.refs += 1

    def release(self):
        _release(self)

    def __repr__(self):
        return f"<RecordContext key={self.key!r} refs={self.refs}>"


@cython.final
cdef class Request:
    """One queued state request of a record."""

    cdef public object state
    cdef public str op
    cdef public tuple args
    cdef public object ns
    cdef public StateFuture future
    cdef public RecordContext ctx

    def __init__(self, state, str op, tuple args, ns, StateFuture future, RecordContext ctx):
        self.state = state
        self.op = op
        self.args = args
        self.ns = ns
        self.future = future
        self.ctx = ctx


cdef class StateFuture:
    """A value that a state request will produce, with Flink's ``then_*`` chaining."""

    cdef readonly object _result
    cdef readonly object _exc
    cdef public list _callbacks
    cdef readonly object _mailbox
    cdef readonly object _ctx

    def __class_getitem__(cls, item):
        return cls

    def __init__(self, mailbox=None, context=None):
        self._result = _PENDING
        self._exc = None
        self._callbacks = []
        self._mailbox = mailbox
        self._ctx = context
        if context is not None:
            _retain(context)

    # ------------------------------------------------------------ completion

    def is_done(self):
        return self._callbacks is None

    def get(self):
        """The result of a completed future (raises its exception; RuntimeError if pending)."""
        if self._callbacks is not None:
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
            self._finish_here(value, exc)

    cpdef _finish_here(self, value, exc):
        callbacks = self._callbacks
        if callbacks is None:
            raise RuntimeError("the future is already complete")
        self._result = value
        self._exc = exc
        self._callbacks = None
        ctx = self._ctx
        if ctx is None:
            for cb in callbacks:
                cb()
            return
        try:
            for i, cb in enumerate(callbacks):
                try:
                    cb()
                finally:
                    _release(ctx)  # the reference the callback held
        except BaseException:
            for _ in range(len(callbacks) - i - 1):  # callbacks that will not run now
                _release(ctx)
            raise
        finally:
            _release(ctx)  # the reference the pending future held

    # ------------------------------------------------------------ chaining

    cpdef StateFuture _derived(self):
        return StateFuture(self._mailbox, self._ctx)

    cpdef _on_done(self, cb):
        """Run ``cb`` when complete (now if already); counts as a registered callback."""
        callbacks = self._callbacks
        if callbacks is None:
            cb()
            return
        if self._ctx is not None:
            _retain(self._ctx)  # released by _finish_here once cb has run
        callbacks.append(cb)

    def _chain(self, step):
        """A derived future completed by ``step(derived, result)``; errors propagate."""
        out = self._derived()

        def cb():
            if self._exc is not None:
                out._finish_here(None, self._exc)
                return
            try:
                step(out, self._result)
            except BaseException as exc:  # user code failed: fail the chain, surface it
                if not out.is_done():
                    out._finish_here(None, exc)
                raise

        self._on_done(cb)
        return out

    def then_apply(self, fn):
        """A future of ``fn(result)``."""
        _callable(fn, "fn")
        return self._chain(lambda out, r: out._finish_here(fn(r), None))

    def then_accept(self, action):
        """A future of None, completed after ``action(result)`` ran."""
        _callable(action, "action")

        def step(out, r):
            action(r)
            out._finish_here(None, None)

        return self._chain(step)

    def then_compose(self, fn):
        """A future of the result of the future ``fn(result)`` returns."""
        _callable(fn, "fn")

        def step(out, r):
            inner = _as_future(fn(r), "then_compose's function")
            inner._on_done(lambda: out._finish_here(inner._result, inner._exc))

        return self._chain(step)

    def then_combine(self, other, fn):
        """A future of ``fn(result, other's result)``, once both are complete."""
        _as_future(other, "other")
        _callable(fn, "fn")

        def step(out, r):
            def both():
                if other._exc is not None:
                    out._finish_here(None, other._exc)
                    return
                try:
                    value = fn(r, other._result)
                except BaseException as exc:
                    out._finish_here(None, exc)
                    raise
                out._finish_here(value, None)

            other._on_done(both)

        return self._chain(step)

    def then_conditionally_apply(
        self, condition, if_true, if_false = None
    ):
        """A future of ``(condition(result), the applied branch's result or None)``."""
        _callable(condition, "condition")
        _callable(if_true, "if_true")

        def step(out, r):
            if condition(r):
                out._finish_here((True, if_true(r)), None)
            else:
                out._finish_here((False, if_false(r) if if_false is not None else None), None)

        return self._chain(step)

    def then_conditionally_accept(
        self, condition, if_true, if_false = None
    ):
        """A future of ``condition(result)``, completed after the chosen action ran."""
        _callable(condition, "condition")
        _callable(if_true, "if_true")

        def step(out, r):
            ok = bool(condition(r))
            if ok:
                if_true(r)
            elif if_false is not None:
                if_false(r)
            out._finish_here(ok, None)

        return self._chain(step)

    def then_conditionally_compose(
        self,
        condition,
        if_true,
        if_false = None):
        """A future of ``(condition(result), the chosen branch future's result or None)``."""
        _callable(condition, "condition")
        _callable(if_true, "if_true")

        def step(out, r):
            ok = bool(condition(r))
            branch = if_true if ok else if_false
            if branch is None:
                out._finish_here((False, None), None)
                return
            inner = _as_future(branch(r), "then_conditionally_compose's function")
            inner._on_done(
                lambda: out._finish_here(None, inner._exc)
                if inner._exc is not None
                else out._finish_here((ok, inner._result), None)
            )

        return self._chain(step)

    def __repr__(self):
        if self._callbacks is not None:
            return "<StateFuture pending>"
        if self._exc is not None:
            return f"<StateFuture failed: {self._exc!r}>"
        return f"<StateFuture done: {self._result!r}>"


def _callable(fn, what):
    if not callable(fn):
        raise TypeError(f"{what} must be callable, not {type(fn).__name__}")


def _as_future(f, what):
    if not isinstance(f, StateFuture):
        raise TypeError(f"{what} must return a StateFuture, not {type(f).__name__}")
    return f


class StateFutureUtils:
    """Helpers with Flink's names."""

    @staticmethod
    def completed_future(value):
        f = StateFuture()
        f._finish_here(value, None)
        return f

    @staticmethod
    def completed_void_future():
        return StateFutureUtils.completed_future(None)

    @staticmethod
    def combine_all(futures):
        """A future of every result, in input order, once the last one completes."""
        fs = [_as_future(f, "combine_all's input") for f in futures]
        if not fs:
            return StateFutureUtils.completed_future([])
        out = fs[0]._derived()
        left = [len(fs)]

        def one_done():
            left[0] -= 1
            if left[0] == 0 and not out.is_done():
                failed = next((f._exc for f in fs if f._exc is not None), None)
                out._finish_here(None if failed else [f._result for f in fs], failed)

        for f in fs:
            f._on_done(one_done)
        return out

    @staticmethod
    def to_iterable(future):
        """A future of a list of what the iterable result of ``future`` yields."""
        _as_future(future, "to_iterable's input")
        return future._chain(lambda out, it: out._finish_here([] if it is None else list(it), None))

