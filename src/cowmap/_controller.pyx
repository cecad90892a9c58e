# cython: language_level=3
"""The ``AsyncExecutionController``, compiled: record contexts per key, the active
and blocking buffers, batches run in waves of vectorised state calls, epochs, the
buffer timeout and back pressure.

The Python API lives in ``cowmap.asyncstate`` (controller.py), which re-exports it.
Its futures and record contexts are in ``_future.pyx``; the async twins of the
state methods, which queue requests here, in ``_requests.pyx``.
"""

cimport cython
from cpython.pythread cimport PyThread_get_thread_ident
from cpython.ref cimport Py_REFCNT, PyObject

cdef extern from "Python.h":
    PyObject *PyDict_SetDefault(object d, object key, object default) except NULL  # borrowed

from cowmap._future cimport (
    K_COND_FORWARD,
    K_FORWARD,
    K_REQUEST,
    ControllerBase,
    RecordContext,
    StateFuture,
    _as_request,
    _callable,
    _new_context,
    _new_future,
    _release_record,
    _rq_ns,
    _rq_op,
    _rq_state,
    _runs_user_code,
    _track,
    _track_tree,
)
from cowmap._context cimport KeyContext, StateView

import collections
import enum
import weakref
from time import monotonic



cdef inline int _switch_key(AsyncExecutionController aec, RecordContext ctx) except -1:
    """Make ``ctx``'s key current on the backend before a record's callbacks run
    (Flink switches the key with the record context): ``set_current_key`` minus
    what process() already did for this key (its key group, the range check)."""
    cdef KeyContext kc = aec._kc
    if kc.key is not ctx.key:
        kc.switch(ctx.key, ctx.key_group)
    return 0



_SYNC_POINT = "sync_point"
#: the longest buffer timeout taken (about 24.8 days, Java's int milliseconds):
#: anything longer is a mistake, and would overflow the wait of the task thread
_MAX_TIMEOUT_MS = 2**31 - 1
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


def _seq_of(ctx):
    return (<RecordContext>ctx).seq


@cython.no_gc_clear  # its buffers must outlive a GC clear: __dealloc__ walks them
cdef class AsyncExecutionController(ControllerBase):
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
    cdef KeyContext _kc  # the backend's key context
    cdef Py_ssize_t _batch_size
    cdef object _buffer_timeout_ms
    cdef double _timeout_s  # buffer_timeout_ms in seconds; 0: no timeout
    cdef Py_ssize_t _max_in_flight
    cdef public object epoch_mode
    cdef public object mailbox
    cdef public Py_ssize_t batches_run
    cdef public Py_ssize_t requests_run
    cdef public Py_ssize_t core_calls
    cdef RecordContext _current
    cdef list _active
    cdef dict _blocking  # key -> deque of the records waiting for it, in hand-over order
    cdef dict _holders
    cdef Py_ssize_t _in_flight
    cdef _Epoch _epoch
    cdef object _epochs
    cdef Py_ssize_t _buffer_seq
    cdef Py_ssize_t _wave_seq
    cdef unsigned long _task_thread
    cdef object _self_ref  # weakref.ref(self): what contexts and the backend hold
    # the buffer timeout: at most one timed mail pending (_timer_armed), which
    # runs the active buffer if it is older than its deadline, else waits again
    cdef bint _timer_armed
    cdef bint _running  # a batch is running (trigger): no other starts inside it
    # an unaligned checkpoint is being taken: a key freed by its record is not handed
    # on to the records waiting for it (they are written with the checkpoint)
    cdef bint _barrier
    cdef Py_ssize_t _seq  # records made so far (RecordContext.seq)
    cdef double _batch_deadline
    cdef object __weakref__
    # the first exception a user callback raised in the batch being run (it is
    # raised once the whole batch ran) and the first the controller ever saw
    # come out of a batch or a mail (drain raises it rather than wait for ever)
    cdef object _batch_error
    cdef object _failure


    def __init__(self, backend, batch_size=1000, buffer_timeout_ms=1000, max_in_flight_records=6000, epoch_mode=EpochMode.SERIAL_BETWEEN_EPOCH, mailbox=None):
        if not isinstance(epoch_mode, EpochMode):
            raise TypeError(f"epoch_mode must be an EpochMode, not {type(epoch_mode).__name__}")
        kc = getattr(backend, "_kc", None)
        if not isinstance(kc, KeyContext):
            raise TypeError(f"backend must be a KeyedStateBackend, not {type(backend).__name__}")
        self.batch_size = batch_size
        self.max_in_flight_records = max_in_flight_records
        self.buffer_timeout_ms = buffer_timeout_ms
        if mailbox is None:
            from cowmap.asyncstate.mailbox import Mailbox

            mailbox = Mailbox()
        elif not callable(getattr(mailbox, "post_delayed", None)):
            raise TypeError(f"mailbox must be a Mailbox (with post_delayed), not {type(mailbox).__name__}")
        self.backend = backend
        self._kc = <KeyContext>kc
        self.epoch_mode = epoch_mode
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
        self._kc.aec = self._self_ref  # weak (see "GC visibility")

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
                for ctx in q:
                    _track(ctx)
                    for r in (<RecordContext>ctx)._waiting:
                        _track_tree(<StateFuture>r)
        if self._holders is not None:
            for ctx in self._holders.values():
                _track(ctx)
        if self._current is not None:
            _track(self._current)
        return 0

    # ------------------------------------------------------------ settings

    @property
    def batch_size(self):
        """Requests per batch: a full active buffer runs at once."""
        return self._batch_size

    @batch_size.setter
    def batch_size(self, v):
        _positive_int("batch_size", v)
        self._batch_size = v

    @property
    def max_in_flight_records(self):
        """Back pressure: ``process`` runs batches while this many records are in flight."""
        return self._max_in_flight

    @max_in_flight_records.setter
    def max_in_flight_records(self, v):
        _positive_int("max_in_flight_records", v)
        self._max_in_flight = v

    @property
    def buffer_timeout_ms(self):
        """A non-full batch runs this long after its first request, when the task
        thread next runs its mailbox (0: only when full or drained)."""
        return self._buffer_timeout_ms

    @buffer_timeout_ms.setter
    def buffer_timeout_ms(self, v):
        if type(v) is bool or not isinstance(v, (int, float)):
            raise TypeError(f"buffer_timeout_ms must be a number of milliseconds, not {type(v).__name__}")
        if not (0 <= v <= _MAX_TIMEOUT_MS):  # (False for nan)
            raise ValueError(f"buffer_timeout_ms must be within 0..{_MAX_TIMEOUT_MS} (0: no timeout), got {v!r}")
        self._buffer_timeout_ms = v
        self._timeout_s = v / 1000.0

    # ------------------------------------------------------------ gauges

    @property
    def in_flight_records(self):
        return self._in_flight

    @property
    def active_size(self):
        return len(self._active)

    @property
    def blocking_size(self):
        """Requests waiting for their key."""
        return sum(len((<RecordContext>ctx)._waiting) for q in self._blocking.values() for ctx in q)

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
        # back pressure, except inside a running batch (a callback's records): that
        # batch is the progress, and none can start inside it (see trigger)
        while self._in_flight >= self._max_in_flight and not self._running:
            if not self._make_progress():
                raise RuntimeError(
                    f"in-flight limit ({self._max_in_flight} records) reached and nothing can run: a request that "
                    "never completes, or process() called from a record's own code while the records in flight "
                    "(the caller among them) fill the limit"
                )
        cdef KeyContext kc = self._kc
        kg = kc.key_group_of(key)  # validates the key
        kc.switch(key, kg)  # (backend.set_current_key, without the Python call)
        ctx = _new_context()
        ctx.record = record
        ctx.key = key
        ctx.key_group = kg
        ctx.epoch = self._epoch
        ctx.priority = priority
        ctx.seq = self._seq
        self._seq += 1
        ctx.refs = 1  # held while fn runs
        ctx._aec_ref = self._self_ref  # (untracked: see "GC visibility")
        self._epoch.records += 1
        self._in_flight += 1
        previous = self._current
        self._current = ctx
        try:
            try:
                fn(record)
            except BaseException:
                self._track_in_flight()  # the record's processing fails (see trigger)
                raise
            finally:
                self._current = previous
                _release_record(ctx)
            if len(self._active) >= self._batch_size:
                self.trigger()
        finally:
            if previous is not None:  # nested in another record's code: its key again
                _restore_key(self, previous)

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
            ns = _view(state, "async state requests")._ns
        req = _new_future(self.mailbox, ctx)  # (untracked: see "GC visibility")
        req._kind = K_REQUEST
        req._fn = state
        req._fn2 = op
        req._fn3 = args
        req._aux = ns
        req._one_arg = one_arg
        if ctx.holds_key or (
            not (self._barrier and ctx.key in self._blocking) and self._try_occupy(ctx)
        ):
            self._insert_active(req)
        elif ctx._waiting is not None:  # queued for the key already
            ctx._waiting.append(req)
        else:
            ctx._waiting = [req]
            q = self._blocking.get(ctx.key)
            if q is None:
                q = self._blocking[ctx.key] = collections.deque()
            _enqueue(q, ctx)
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
        if len(active) == 1 and self._timeout_s > 0:
            self._arm_timeout()
        return 0

    cdef int _dispose(self, RecordContext ctx) except -1:
        cdef _Epoch ep
        cdef object error = None
        _track(ctx)  # out of flight (see "GC visibility")
        self._in_flight -= 1
        if ctx.holds_key:
            ctx.holds_key = False
            q = self._blocking.get(ctx.key) if ctx._waited_for else None
            del self._holders[ctx.key]
            if q and not self._barrier:
                error = self._hand_over(ctx.key, q)
        ep = <_Epoch?>ctx.epoch
        ep.records -= 1
        if ep.records == 0 and ep.closed:
            self._finish_epochs()
        if error is not None:
            raise error
        return 0

    cdef object _hand_over(self, key, q):
        """Give free ``key`` to the first record of its queue ``q``, with all its
        waiting requests: O(1) but for those requests. Returns the first error a
        sync point's callback raised there (the other requests are still queued), or None."""
        cdef object error = None
        nxt = <RecordContext>q.popleft()
        if not q:
            del self._blocking[key]
        self._holders[key] = nxt
        nxt.holds_key = True
        nxt._waited_for = bool(q)
        mine = nxt._waiting
        nxt._waiting = None
        for r in mine:
            # a sync point runs here: if its callback raises, the record's
            # other requests and this one's epoch are still seen to
            try:
                self._insert_active(<StateFuture>r)
            except BaseException as exc:
                if error is None:
                    error = exc
        return error

    # ------------------------------------------------------------ unaligned checkpoints

    def begin_unaligned_checkpoint(self, timeout=None):
        """Finish the records that hold a key (they touch state) but start none of
        those waiting for a busy key; returns the waiting ones as ``(key, record)``
        pairs in arrival order. State is then consistent with those records not
        processed: snapshot it, then call :meth:`end_unaligned_checkpoint`, which
        lets them go on. Until then, new records of a key with waiting records
        queue behind them. Not inside a record's processing (RuntimeError); an
        error (or ``TimeoutError`` after ``timeout`` s) ends the barrier first.
        O(records in flight)."""
        self._check_thread()
        self._check_not_in_record("begin_unaligned_checkpoint()")
        if self._barrier:
            raise RuntimeError("an unaligned checkpoint is already being taken")
        cdef KeyContext kc = self._kc
        key = kc.key
        kg = kc.key_group
        self._barrier = True
        try:
            self._run_until(
                lambda: not self._holders, timeout, lambda: f"the records holding {len(self._holders)} keys"
            )
        except BaseException:
            self.end_unaligned_checkpoint()
            raise
        finally:
            kc.restore(key, kg)
        waiting = sorted((ctx for q in self._blocking.values() for ctx in q), key=_seq_of)
        return [((<RecordContext>ctx).key, (<RecordContext>ctx).record) for ctx in waiting]

    def end_unaligned_checkpoint(self):
        """Let the records held back by :meth:`begin_unaligned_checkpoint` go on
        (idempotent). O(keys with waiting records)."""
        self._check_thread()
        if not self._barrier:
            return
        self._barrier = False
        cdef object error = None
        for key in list(self._blocking):
            if key not in self._holders:
                e = self._hand_over(key, self._blocking[key])
                if error is None:
                    error = e
        if error is not None:
            raise error

    # ------------------------------------------------------------ batches

    def trigger(self):
        """Run the active buffer as one batch now; returns how many requests ran.

        A batch runs in waves so each (state table, key) sees its requests in order;
        within a wave the requests of one state and type go to the state in one
        vectorised call where it has one (``_batch_<op>``), else one by one.
        Called from a callback of the batch running, it runs nothing (returns 0):
        the requests wait for the next batch, so a record's requests run in the
        order it made them.

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
        if not batch or self._running:
            # (called from a callback of the batch running: a batch started here
            # could run a record's new request before its older one, still queued
            # in a later wave of the running batch; the next batch runs it)
            return 0
        self._active = []
        self._buffer_seq += 1
        self.batches_run += 1
        n = len(batch)
        self.requests_run += n
        self._batch_error = None
        cdef KeyContext kc = self._kc
        key = kc.key  # what the caller's state views point at, put back after
        kg = kc.key_group
        self._running = True
        try:
            while batch:
                batch = self._run_wave(batch)
        except BaseException:
            # requests of the batch not completed are in none of the buffers now
            for r in batch:
                _track_tree(<StateFuture>r)
            raise
        finally:
            self._running = False
            kc.restore(key, kg)
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
        cdef RecordContext ctx
        cdef Py_ssize_t i, n
        cdef object error = None
        if type(reqs) is not list or not reqs:
            raise TypeError("_run_group needs a non-empty list of requests")
        n = len(<list>reqs)
        for i in range(n):
            _as_request((<list>reqs)[i])
        first = <StateFuture>(<list>reqs)[0]
        state = _rq_state(first)
        # a single request runs as one by one: its batch form would cost more
        # (a hot key's records run one at a time, in batches of one request)
        vector = getattr(state, _batch_name(_rq_op(first)), None) if state is not None and n > 1 else None
        if vector is not None:
            failed = None
            try:
                results = vector(reqs)
            except Exception:
                # one bad request (an unhashable user key, say) must not fail the
                # others: run them one by one, each with its own outcome. (A batch
                # form writes only what its requests write one by one, so running
                # a request again after a partial batch gives the same state.)
                results = None
            if results is not None:
                if type(results) is not list:
                    results = list(results)
                if len(<list>results) != n:  # a broken batch method: it fails the task too
                    failed = error = RuntimeError(
                        f"{type(state).__name__}.{_batch_name(_rq_op(first))} returned {len(<list>results)} results "
                        f"for {n} requests"
                    )
            if results is not None:
                self.core_calls += 1
                for i in range(n):
                    error = self._complete_noting(
                        <StateFuture>(<list>reqs)[i], None if failed is not None else (<list>results)[i], failed, error)
                if error is not None:
                    raise error
                return
        cdef KeyContext kc = self._kc
        for i in range(n):
            req = <StateFuture>(<list>reqs)[i]
            self.core_calls += 1
            failed = None
            ctx = <RecordContext?>req._ctx
            try:
                kc.switch(ctx.key, ctx.key_group)  # (validated by process)
                value = _call_in_namespace(state, req)
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
            if previous is not None:  # (completed inside another record's code)
                _restore_key(self, <RecordContext>previous)
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
            if previous is not None:
                _restore_key(self, <RecordContext>previous)
        return 0

    cdef int _arm_timeout(self) except -1:
        """A batch starts: it runs ``buffer_timeout_ms`` from now. One timed mail
        serves every batch: if one is pending, it finds this deadline when it fires."""
        self._batch_deadline = monotonic() + self._timeout_s
        if not self._timer_armed:
            self._post_timeout(self._timeout_s)
        return 0

    cdef int _post_timeout(self, double delay) except -1:
        ref = self._self_ref  # a pending mail does not keep the controller alive
        self.mailbox.post_delayed(delay, lambda: _on_timeout(ref))
        self._timer_armed = True
        return 0

    def _on_timeout(self):
        """The timed mail: run the active buffer if its deadline has passed, else wait for it."""
        self._timer_armed = False
        if not self._active or self._timeout_s <= 0:
            return
        left = self._batch_deadline - monotonic()
        if left > 0:  # a later batch than the one that armed the mail
            self._post_timeout(left)
        else:
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
        rather than wait for ever (the task has failed, as in Flink).

        Not from inside a record's processing or a future's callback
        (RuntimeError): that record is in flight until its code returns, so
        drain would wait for ever. The current key is put back after."""
        self._check_thread()
        self._check_not_in_record("drain()")
        cdef KeyContext kc = self._kc
        key = kc.key
        kg = kc.key_group
        try:
            self._drain(timeout)
        finally:
            kc.restore(key, kg)

    cdef int _check_not_in_record(self, str what) except -1:
        if self._current is not None:
            raise RuntimeError(
                f"{what} called inside the processing or a callback of the record of key "
                f"{self._current.key!r}: it would wait for that record, which cannot finish "
                "before the call returns"
            )
        return 0

    def _drain(self, timeout):
        self._run_until(lambda: not self._in_flight, timeout, lambda: f"{self._in_flight} records")

    def _run_until(self, done, timeout, what):
        """Run batches and mails until ``done()``; ``what()`` names the records
        waited for, in the errors: a RuntimeError once a callback failed and
        nothing else can run, a TimeoutError after ``timeout`` s without progress."""
        while not done():
            try:
                progressed = self._make_progress()
            except BaseException as exc:
                if self._failure is None:
                    self._failure = exc
                raise
            if not progressed:
                if self._failure is not None:
                    raise RuntimeError(
                        f"{what()} can never finish: a callback failed earlier ({self._failure!r})"
                    ) from self._failure
                if not self.mailbox.run_until(lambda: len(self.mailbox) > 0 or done(), timeout):
                    raise TimeoutError(f"{what()} still in flight after {timeout} s")

    # ------------------------------------------------------------ epochs

    def process_non_record(self, trigger_action=None, final_action=None, mode=None):
        """Close the current epoch: in serial mode ``trigger_action`` and then
        ``final_action`` run once every earlier record is done (and later records
        wait for that); in parallel mode ``trigger_action`` runs now and
        ``final_action`` after the earlier records. ``mode`` overrides the
        controller's ``epoch_mode`` for this call. A serial one waits, so it cannot
        be called inside a record's processing or callback (RuntimeError)."""
        self._check_thread()
        mode = self.epoch_mode if mode is None else mode
        if not isinstance(mode, EpochMode):
            raise TypeError(f"mode must be an EpochMode, not {type(mode).__name__}")
        if mode is EpochMode.SERIAL_BETWEEN_EPOCH:
            self._check_not_in_record("process_non_record() in serial mode")
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


cdef int _positive_int(str name, v) except -1:
    if type(v) is bool or not isinstance(v, int):
        raise TypeError(f"{name} must be an int, not {type(v).__name__}")
    if v <= 0:
        raise ValueError(f"{name} must be a positive int, got {v!r}")
    return 0


cdef inline int _restore_key(AsyncExecutionController aec, RecordContext ctx) except -1:
    """Make ``ctx``'s key current again after code that ran other records' (a nested
    record, a batch): code of a record always sees its own key."""
    cdef KeyContext kc = aec._kc
    if kc.key is not ctx.key:
        kc.restore(ctx.key, ctx.key_group)
    return 0


cdef int _enqueue(object q, RecordContext ctx) except -1:
    """Queue ``ctx`` for its key after every waiting record of the same or a higher
    priority: O(1) when priorities are equal (from the tail otherwise)."""
    cdef Py_ssize_t i = len(q)
    if i == 0 or (<RecordContext>q[i - 1]).priority >= ctx.priority:
        q.append(ctx)
        return 0
    while i > 0 and (<RecordContext>q[i - 1]).priority < ctx.priority:
        i -= 1
    q.insert(i, ctx)
    return 0


cdef object _call_in_namespace(state, StateFuture req):
    """Run request ``req``'s method on the view ``state`` in the request's namespace;
    the view's own namespace (the user's choice) is put back before any callback runs."""
    ns = _rq_ns(req)
    own = (<StateView?>state)._ns
    method = getattr(state, _rq_op(req))
    if own is ns:
        return method(req._fn3) if req._one_arg else method(*req._fn3)
    state.set_current_namespace(ns)
    try:
        return method(req._fn3) if req._one_arg else method(*req._fn3)
    finally:
        state.set_current_namespace(own)


def _on_timeout(ref):
    aec = ref()
    if aec is not None:  # (else the controller is gone, and its batch with it)
        aec._on_timeout()


cdef inline StateView _view(state, str what):
    """``state`` as a state view; TypeError "``what`` need a state" if it is none."""
    if not isinstance(state, StateView):
        raise TypeError(f"{what} need a state, not {type(state).__name__}")
    return <StateView>state


cdef inline object _table_of(state):
    """The table a request's state view is over (None for a sync point). A request's
    state was checked to be a view when it was made (see _request)."""
    if state is None:
        return None
    return (<StateView>state)._t


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

