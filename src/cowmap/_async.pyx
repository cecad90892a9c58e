# cython: language_level=3
"""The hot parts of the async state layer, compiled: ``StateFuture`` and the
record context / request objects of the ``AsyncExecutionController``.

The Python API lives in ``cowmap.asyncstate`` (future.py, controller.py), which
re-exports these; see there for the semantics.
"""

cimport cython
from cpython.pythread cimport PyThread_get_thread_ident

import collections
import enum
import threading

cdef class StateFuture
cdef class RecordContext
cdef class AsyncExecutionController

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
            (<AsyncExecutionController>rc._aec)._dispose(rc)
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



# ------------------------------------------------------------ the controller

_SYNC_POINT = "sync_point"


class EpochMode(enum.Enum):
    """How non-record actions (watermarks, timers) order against records."""

    #: the trigger action waits for every earlier record (Flink's default)
    SERIAL_BETWEEN_EPOCH = 0
    #: the trigger action runs at once; the final action after the earlier records
    PARALLEL_BETWEEN_EPOCH = 1


class _Epoch:
    __slots__ = ("records", "closed", "actions")

    def __init__(self):
        self.records = 0
        self.closed = False
        self.actions = []




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
    cdef object _current
    cdef list _active
    cdef dict _blocking
    cdef dict _holders
    cdef Py_ssize_t _in_flight
    cdef object _epoch
    cdef object _epochs
    cdef Py_ssize_t _buffer_seq
    cdef unsigned long _task_thread


    def __init__(self, backend, batch_size=1000, buffer_timeout_ms=1000, max_in_flight_records=6000, epoch_mode=EpochMode.SERIAL_BETWEEN_EPOCH, mailbox=None):
        for name, v in (("batch_size", batch_size), ("max_in_flight_records", max_in_flight_records)):
            if not isinstance(v, int) or isinstance(v, bool) or v <= 0:
                raise ValueError(f"{name} must be a positive int, got {v!r}")
        if not isinstance(buffer_timeout_ms, (int, float)) or buffer_timeout_ms < 0:
            raise ValueError(f"buffer_timeout_ms must be >= 0, got {buffer_timeout_ms!r}")
        if not isinstance(epoch_mode, EpochMode):
            raise TypeError(f"epoch_mode must be an EpochMode, not {type(epoch_mode).__name__}")
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
        #: gauges
        self.batches_run = 0
        self.requests_run = 0
        #: calls made into the state layer to run requests (a vectorised group counts once)
        self.core_calls = 0
        backend._aec = self

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
        self._check_thread()
        while self._in_flight >= self.max_in_flight_records:
            if not self._make_progress():
                raise RuntimeError("in-flight limit reached and nothing can run (a request never completes?)")
        backend = self.backend
        backend.set_current_key(key)  # validates the key and gives its key group
        ctx = RecordContext(self, record, key, backend._kg, self._epoch, priority)
        self._epoch.records += 1
        self._in_flight += 1
        ctx.retain()  # held while fn runs
        previous = self._current
        self._current = ctx
        try:
            fn(record)
        finally:
            self._current = previous
            ctx.release()
        if len(self._active) >= self.batch_size:
            self.trigger()

    def handle_request(self, state, op, *args):
        """Queue a request of the current record; a future of its result."""
        cdef RecordContext ctx
        cdef StateFuture fut
        cdef Request req
        if self._current is None:
            raise RuntimeError("async state calls must be made inside AsyncExecutionController.process")
        ctx = <RecordContext?>self._current
        fut = StateFuture(self.mailbox, ctx)
        req = Request(state, op, args, None if state is None else state._ns, fut, ctx)
        if ctx.holds_key or self._try_occupy(ctx):
            self._insert_active(req)
        else:
            self._blocking.setdefault(ctx.key, collections.deque()).append(req)
        return fut

    def sync_point(self, callback):
        """Run ``callback`` once the current record holds its key (at once if it does)."""
        return self.handle_request(None, _SYNC_POINT).then_accept(lambda _: callback())

    cdef bint _try_occupy(self, RecordContext ctx) except -1:
        holder = self._holders.get(ctx.key)
        if holder is None:
            self._holders[ctx.key] = ctx
            ctx.holds_key = True
            return True
        return holder is ctx

    cdef int _insert_active(self, Request req) except -1:
        if req.op == _SYNC_POINT:  # needs nothing from the state: done as soon as runnable
            self._complete(req, None, None)
            return 0
        active = self._active
        active.append(req)
        if len(active) == 1 and self.buffer_timeout_ms > 0:
            self._arm_timeout()
        return 0

    cpdef _dispose(self, RecordContext ctx):
        self._in_flight -= 1
        if ctx.holds_key:
            ctx.holds_key = False
            del self._holders[ctx.key]
            q = self._blocking.get(ctx.key)
            if q:  # the next record of this key takes it, with all its waiting requests
                nxt = q[0].ctx
                for r in q:  # the first of the highest priority
                    if r.ctx.priority > nxt.priority:
                        nxt = r.ctx
                self._holders[ctx.key] = nxt
                nxt.holds_key = True
                mine = [r for r in q if r.ctx is nxt]
                rest = [r for r in q if r.ctx is not nxt]
                if rest:
                    self._blocking[ctx.key] = collections.deque(rest)
                else:
                    del self._blocking[ctx.key]
                for r in mine:
                    self._insert_active(r)
        ep = ctx.epoch
        ep.records -= 1
        if ep.records == 0 and ep.closed:
            self._finish_epochs()

    # ------------------------------------------------------------ batches

    def trigger(self):
        """Run the active buffer as one batch now; returns how many requests ran.

        A batch runs in waves so each (state, key) sees its requests in order;
        within a wave the requests of one state and type go to the state in one
        vectorised call where it has one (``_batch_<op>``), else one by one.
        """
        self._check_thread()
        batch = self._active
        if not batch:
            return 0
        self._active = []
        self._buffer_seq += 1
        self.batches_run += 1
        self.requests_run += len(batch)
        n = len(batch)
        while batch:
            wave = {}
            rest = []
            touched = set()
            for req in batch:
                tk = (id(req.state), req.ctx.key)
                if tk in touched:
                    rest.append(req)
                else:
                    touched.add(tk)
                    wave.setdefault((id(req.state), req.op), []).append(req)
            for reqs in wave.values():
                self._run_group(reqs)
            batch = rest
        return n

    def _run_group(self, reqs):
        state = reqs[0].state
        vector = getattr(state, "_batch_" + reqs[0].op, None)
        if vector is not None:
            try:
                results = vector(reqs)
            except Exception as exc:  # the whole call failed: fail every request of it
                self.core_calls += 1
                for req in reqs:
                    self._complete(req, None, exc)
                return
            if results is not None:
                self.core_calls += 1
                for req, value in zip(reqs, results):
                    self._complete(req, value, None)
                return
        backend = self.backend
        for req in reqs:
            backend.set_current_key(req.ctx.key)
            if state._ns is not req.ns:
                state.set_current_namespace(req.ns)
            self.core_calls += 1
            try:
                value = getattr(state, req.op)(*req.args)
            except Exception as exc:  # a failing request fails its future (and its chain)
                self._complete(req, None, exc)
            else:
                self._complete(req, value, None)

    cdef int _complete(self, Request req, value, exc) except -1:
        """Complete a request's future with its record current, so the callbacks'
        own async calls belong to that record."""
        previous = self._current
        self._current = req.ctx
        try:
            req.future._finish_here(value, exc)  # on the task thread already
        finally:
            self._current = previous
        return 0

    def _arm_timeout(self):
        seq = self._buffer_seq
        mailbox = self.mailbox

        def fire():
            mailbox.post(lambda: self._on_timeout(seq))

        timer = threading.Timer(self.buffer_timeout_ms / 1000.0, fire)
        timer.daemon = True
        timer.start()

    def _on_timeout(self, seq):
        if seq == self._buffer_seq and self._active:  # else that batch already ran
            self.trigger()

    def _make_progress(self):
        """Run a batch or pending mails; False when there was nothing to do."""
        if self.trigger():
            return True
        return self.mailbox.run_available() > 0

    def drain(self, timeout=None):
        """Run batches and mails until no record is in flight (before a snapshot)."""
        self._check_thread()
        while self._in_flight:
            if not self._make_progress():
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
        while epochs and epochs[0].closed and epochs[0].records == 0:
            for action in epochs.popleft().actions:
                action()

    cdef int _check_thread(self) except -1:
        if PyThread_get_thread_ident() != self._task_thread:
            raise RuntimeError("the AsyncExecutionController must be used from its task thread")
        return 0
