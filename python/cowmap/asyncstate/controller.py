"""``AsyncExecutionController``: key-ordered, batched execution of async state requests.

Flink 2.x's AEC (FLIP-425) over cowmap's keyed state, single task thread:

- ``process(key, fn, record)`` makes a :class:`RecordContext` and runs ``fn(record)``
  at once; the async state calls it makes become requests of that record.
- At most one record per key is in flight: the first request of a record takes
  the key; requests of a record whose key another record holds wait, FIFO per
  key, in the blocking buffer until that record is done (its context's
  reference count drops to 0).
- Runnable requests collect in the active buffer and run as one batch when it
  reaches ``batch_size``, when ``buffer_timeout_ms`` passes, or on ``drain``.
- ``max_in_flight_records`` bounds the records in flight: ``process`` runs
  batches (back pressure) until there is room.
- ``process_non_record`` (watermarks, timers) runs its actions after the records
  before it, as Flink's epochs do.

A batch hands the requests of one state and type to that state in one call:
ValueState reads and writes go to the core as one multi-map call
(``multi_get`` / ``multi_put``); other requests still run one by one through
the synchronous methods, with exactly their semantics.
"""

from __future__ import annotations

import collections
import enum
import threading
from typing import Any, Callable

from cowmap._async import RecordContext, StateFuture
from cowmap._async import Request as _Request
from cowmap.asyncstate.mailbox import Mailbox

__all__ = ["AsyncExecutionController", "EpochMode", "RecordContext"]


class EpochMode(enum.Enum):
    """How non-record actions (watermarks, timers) order against records."""

    #: the trigger action waits for every earlier record (Flink's default)
    SERIAL_BETWEEN_EPOCH = 0
    #: the trigger action runs at once; the final action after the earlier records
    PARALLEL_BETWEEN_EPOCH = 1


class _Epoch:
    __slots__ = ("records", "closed", "actions")

    def __init__(self) -> None:
        self.records = 0
        self.closed = False
        self.actions: list[Callable[[], Any]] = []


_SYNC_POINT = "sync_point"


class AsyncExecutionController:
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

    def __init__(
        self,
        backend: Any,
        batch_size: int = 1000,
        buffer_timeout_ms: int = 1000,
        max_in_flight_records: int = 6000,
        epoch_mode: EpochMode = EpochMode.SERIAL_BETWEEN_EPOCH,
        mailbox: Mailbox | None = None,
    ) -> None:
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
        self.mailbox = mailbox if mailbox is not None else Mailbox()
        self._current: RecordContext | None = None
        self._active: list[_Request] = []
        self._blocking: dict[Any, collections.deque[_Request]] = {}
        self._holders: dict[Any, RecordContext] = {}  # key -> the record in flight for it
        self._in_flight = 0
        self._epoch = _Epoch()
        self._epochs: collections.deque[_Epoch] = collections.deque([self._epoch])
        self._buffer_seq = 0  # bumped per batch run: stale timeouts are skipped
        #: gauges
        self.batches_run = 0
        self.requests_run = 0
        #: calls made into the state layer to run requests (a vectorised group counts once)
        self.core_calls = 0
        backend._aec = self

    # ------------------------------------------------------------ gauges

    @property
    def in_flight_records(self) -> int:
        return self._in_flight

    @property
    def active_size(self) -> int:
        return len(self._active)

    @property
    def blocking_size(self) -> int:
        return sum(len(q) for q in self._blocking.values())

    @property
    def blocked_keys(self) -> int:
        return len(self._blocking)

    @property
    def occupied_keys(self) -> int:
        return len(self._holders)

    @property
    def current_context(self) -> RecordContext | None:
        return self._current

    # ------------------------------------------------------------ records

    def process(self, key: Any, fn: Callable[[Any], Any], record: Any = None, priority: int = 0) -> None:
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

    def handle_request(self, state: Any, op: str, *args: Any) -> StateFuture[Any]:
        """Queue a request of the current record; a future of its result."""
        ctx = self._current
        if ctx is None:
            raise RuntimeError("async state calls must be made inside AsyncExecutionController.process")
        fut: StateFuture[Any] = StateFuture(self.mailbox, ctx)
        req = _Request(state, op, args, None if state is None else state._ns, fut, ctx)
        if ctx.holds_key or self._try_occupy(ctx):
            self._insert_active(req)
        else:
            self._blocking.setdefault(ctx.key, collections.deque()).append(req)
        return fut

    def sync_point(self, callback: Callable[[], Any]) -> StateFuture[None]:
        """Run ``callback`` once the current record holds its key (at once if it does)."""
        return self.handle_request(None, _SYNC_POINT).then_accept(lambda _: callback())

    def _try_occupy(self, ctx: RecordContext) -> bool:
        holder = self._holders.get(ctx.key)
        if holder is None:
            self._holders[ctx.key] = ctx
            ctx.holds_key = True
            return True
        return holder is ctx

    def _insert_active(self, req: _Request) -> None:
        if req.op == _SYNC_POINT:  # needs nothing from the state: done as soon as runnable
            self._complete(req, None, None)
            return
        active = self._active
        active.append(req)
        if len(active) == 1 and self.buffer_timeout_ms > 0:
            self._arm_timeout()

    def _dispose(self, ctx: RecordContext) -> None:
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

    def trigger(self) -> int:
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
            wave: dict[tuple[int, str], list[_Request]] = {}
            rest: list[_Request] = []
            touched: set[tuple[int, Any]] = set()
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

    def _run_group(self, reqs: list[_Request]) -> None:
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

    def _complete(self, req: _Request, value: Any, exc: BaseException | None) -> None:
        """Complete a request's future with its record current, so the callbacks'
        own async calls belong to that record."""
        previous = self._current
        self._current = req.ctx
        try:
            req.future._finish_here(value, exc)  # on the task thread already
        finally:
            self._current = previous

    def _arm_timeout(self) -> None:
        seq = self._buffer_seq
        mailbox = self.mailbox

        def fire() -> None:
            mailbox.post(lambda: self._on_timeout(seq))

        timer = threading.Timer(self.buffer_timeout_ms / 1000.0, fire)
        timer.daemon = True
        timer.start()

    def _on_timeout(self, seq: int) -> None:
        if seq == self._buffer_seq and self._active:  # else that batch already ran
            self.trigger()

    def _make_progress(self) -> bool:
        """Run a batch or pending mails; False when there was nothing to do."""
        if self.trigger():
            return True
        return self.mailbox.run_available() > 0

    def drain(self, timeout: float | None = None) -> None:
        """Run batches and mails until no record is in flight (before a snapshot)."""
        self._check_thread()
        while self._in_flight:
            if not self._make_progress():
                if not self.mailbox.run_until(lambda: len(self.mailbox) > 0 or not self._in_flight, timeout):
                    raise TimeoutError(f"{self._in_flight} records still in flight after {timeout} s")

    # ------------------------------------------------------------ epochs

    def process_non_record(
        self,
        trigger_action: Callable[[], Any] | None = None,
        final_action: Callable[[], Any] | None = None,
        mode: EpochMode | None = None,
    ) -> None:
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

    def _finish_epochs(self) -> None:
        epochs = self._epochs
        while epochs and epochs[0].closed and epochs[0].records == 0:
            for action in epochs.popleft().actions:
                action()

    def _check_thread(self) -> None:
        if not self.mailbox.is_task_thread():
            raise RuntimeError("the AsyncExecutionController must be used from its task thread")
