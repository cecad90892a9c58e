# cython: language_level=3
"""Keyed timers (Flink's ``InternalTimerService``), compiled.

A ``TimerService`` keeps the event-time and the processing-time timers of one
named service of a backend, each domain in a ``timerqueue.h`` queue: a heap per
key group and a heap of those heaps. Timers are set for the backend's current
key; firing makes each timer's key current and calls ``on_timer``.
"""

cimport cython
from cpython.object cimport PyObject, PyObject_Hash
from cpython.ref cimport Py_DECREF
from libc.stdint cimport INT64_MAX, INT64_MIN, int64_t, uint32_t

from cowmap._context cimport KeyContext

import array
import operator

cdef extern from "timerqueue.h":
    ctypedef struct cm_trec:
        PyObject *key
        PyObject *ns
        int64_t ts
    ctypedef struct cm_tblock:
        Py_ssize_t refs
        uint32_t live
        uint32_t nrec
    cm_trec *CM_REC(cm_tblock *b)
    ctypedef struct cm_kgq:
        cm_tblock *b
    ctypedef struct cm_tqueue:
        cm_kgq *kg
        uint32_t nkg
        Py_ssize_t count
    uint32_t cm_timer_hash(Py_hash_t hk, Py_hash_t hn, int64_t ts)
    void cm_block_decref(cm_tblock *b)
    int cm_tq_init(cm_tqueue *q, uint32_t nkg) except -1
    void cm_tq_free(cm_tqueue *q)
    # -1: an exception; -2: Python code run by a key comparison changed the queue
    int cm_tq_add(cm_tqueue *q, uint32_t g, int64_t ts, object key, object ns, uint32_t h) except -1
    int cm_tq_remove(cm_tqueue *q, uint32_t g, int64_t ts, object key, object ns, uint32_t h) except -1
    bint cm_tq_head(cm_tqueue *q, int64_t *ts)
    int cm_tq_poll(cm_tqueue *q, int64_t *ts, PyObject **key, PyObject **ns, uint32_t *g) except -1
    void cm_tq_begin_fire(cm_tqueue *q, int64_t upto)
    int cm_tq_end_fire(cm_tqueue *q) except -1
    cm_tblock *cm_tq_share(cm_tqueue *q, uint32_t g)
    void cm_tq_clear(cm_tqueue *q, uint32_t g)

cdef extern from "Python.h":
    void *PyMem_RawCalloc(size_t n, size_t size)
    void PyMem_RawFree(void *p)

cdef enum:
    EVENT = 0
    PROCESSING = 1

#: the watermark before the first one (Flink's Long.MIN_VALUE)
NO_WATERMARK = INT64_MIN


cdef int64_t _as_ts(object ts, str what) except? -1:
    """``ts`` as int64 milliseconds: TypeError for anything but an int (bools and
    floats included), ValueError outside int64."""
    if type(ts) is not int:
        if isinstance(ts, bool) or isinstance(ts, float):
            raise TypeError(f"{what} must be an int (milliseconds), not {type(ts).__name__}")
        try:
            ts = operator.index(ts)
        except TypeError:
            raise TypeError(f"{what} must be an int (milliseconds), not {type(ts).__name__}") from None
    try:
        return <int64_t>ts
    except OverflowError:
        raise ValueError(f"{what} {ts} is outside the int64 range of millisecond timestamps") from None


@cython.final
@cython.auto_pickle(False)
cdef class TimerService:
    """The timers of one named service of a backend (Flink's ``InternalTimerService``).

    ``register_*`` / ``delete_*`` act on a timer of the backend's current key,
    in the void namespace or ``namespace=``; there is at most one timer per
    (key, namespace, timestamp) in each time domain, so registering it again
    does nothing. ``advance_watermark(wm)`` fires every event-time timer with a
    timestamp ``<= wm`` in timestamp order (those an ``on_timer`` registers at
    or below ``wm`` too; registering the very timer it fires is a RuntimeError,
    as that would fire for ever), each with its key current, calling ``on_timer(ts, key,
    namespace, domain)``; ``advance_processing_time(now)`` does the same for
    processing-time timers. The caller's current key is current again after an
    advance (Flink leaves the last timer's key current). Timers of equal
    timestamps fire in an order of the queue's making. Register costs O(log n)
    in the timers of the key's key group; delete O(1) (the timer's heap entry is
    dropped when it surfaces); a firing O(log n + log key groups), and an
    advance that fires much of a key group sorts those timers out in one go.

    Not thread-safe: use it from the backend's thread. Keys' and namespaces'
    ``__eq__`` / ``__hash__`` must not use the service (RuntimeError).
    """

    cdef cm_tqueue _q[2]
    cdef KeyContext _kc
    cdef readonly str name
    cdef object _on_timer
    cdef int64_t _watermark
    cdef object _void
    cdef tuple _domains       # the TimeDomain members, by domain index
    cdef list _kg_ints        # the key group numbers, as Python ints, by index
    cdef bint _busy           # inside a queue operation that may run Python (__eq__)
    cdef bint _firing[2]
    # the timer on_timer runs for, per domain (its timestamp, key and namespace) while firing
    cdef int64_t _fts[2]
    cdef object _fkey0, _fns0, _fkey1, _fns1
    cdef int64_t _scheduled   # the processing time of the pending mail, INT64_MAX: none
    cdef bytearray _changed   # per domain and key group: 1 if its timers changed since the last cut
    cdef Py_ssize_t _mail_seq  # bumped per mail posted: only the newest one fires
    cdef object __weakref__

    def __cinit__(self):
        self._q[0].kg = NULL
        self._q[1].kg = NULL
        self._scheduled = INT64_MAX

    def __init__(self, str name not None, KeyContext kc not None, on_timer, void_namespace, domains):
        if self._kc is not None:
            raise RuntimeError("TimerService is initialised once")
        cdef uint32_t nkg = <uint32_t>(kc.hi - kc.lo + 1)
        cm_tq_init(&self._q[EVENT], nkg)
        cm_tq_init(&self._q[PROCESSING], nkg)
        self._kc = kc
        self.name = name
        self.on_timer = on_timer
        self._watermark = INT64_MIN
        self._void = void_namespace
        self._domains = tuple(domains)
        self._kg_ints = list(range(kc.lo, kc.hi + 1))
        self._changed = bytearray(2 * nkg)

    def __dealloc__(self):
        cm_tq_free(&self._q[EVENT])
        cm_tq_free(&self._q[PROCESSING])

    @property
    def on_timer(self):
        """The callable that timers fire: ``on_timer(ts, key, namespace, domain)``."""
        return self._on_timer

    @on_timer.setter
    def on_timer(self, fn):
        if fn is not None and not callable(fn):
            raise TypeError(f"on_timer must be callable, not {type(fn).__name__}")
        self._on_timer = fn

    # ------------------------------------------------------------ register / delete

    cdef int _check(self) except -1:
        if self._kc is None:
            raise RuntimeError("this TimerService was not initialised (get one from backend.get_timer_service)")
        if self._busy:
            raise RuntimeError(
                f"timer service {self.name!r} used from a key's or namespace's __eq__ while it compared them"
            )
        return 0

    cdef int _change(self, int d, bint add, object ts_obj, object namespace, str what) except -1:
        cdef int64_t ts = _as_ts(ts_obj, "timestamp")
        cdef int r
        self._check()
        cdef KeyContext kc = self._kc
        key = kc.key
        if key is None:
            raise RuntimeError(f"{what} needs a current key: call set_current_key first")
        if namespace is None:
            namespace = self._void
        elif isinstance(namespace, float) and namespace != namespace:
            raise ValueError("a timer's namespace must not be NaN: a NaN equals no other NaN in Python")
        if add and self._firing[d] and ts == self._fts[d] and self._is_firing(d, key, namespace):
            raise RuntimeError(
                f"on_timer registered the {'event' if d == EVENT else 'processing'}-time timer it is firing "
                f"({ts}, the same key and namespace) "
                "again: it would fire again at once, for ever; register it for a later time"
            )
        r = self._apply(d, add, <uint32_t>(<long>kc.key_group - kc.lo), ts, key, namespace)
        if r == 1 and add and d == PROCESSING and ts < self._scheduled:
            self._schedule()
        return r

    cdef bint _is_firing(self, int d, object key, object ns) except -1:
        if d == EVENT:
            return self._fkey0 is not None and key == self._fkey0 and ns == self._fns0
        return self._fkey1 is not None and key == self._fkey1 and ns == self._fns1

    cdef int _set_firing(self, int d, int64_t ts, object key, object ns) except -1:
        self._fts[d] = ts
        if d == EVENT:
            self._fkey0, self._fns0 = key, ns
        else:
            self._fkey1, self._fns1 = key, ns
        return 0

    cdef int _apply(self, int d, bint add, uint32_t g, int64_t ts, object key, object ns) except -1:
        """Add (or remove) timer (ts, key, ns) of key group index ``g``: 1 if the
        queue changed (the key group is marked changed), 0 if not."""
        cdef int r
        cdef uint32_t h = cm_timer_hash(PyObject_Hash(key), PyObject_Hash(ns), ts)
        self._busy = True  # (hashing ran first: only comparisons run inside)
        try:
            if add:
                r = cm_tq_add(&self._q[d], g, ts, key, ns, h)
            else:
                r = cm_tq_remove(&self._q[d], g, ts, key, ns, h)
        finally:
            self._busy = False
        if r == -2:
            raise RuntimeError("a key's or namespace's __eq__ changed the timers it was compared with")
        if r == 1:
            self._changed[d * self._q[d].nkg + g] = 1
        return r

    def register_event_time_timer(self, ts, namespace=None):
        """Fire ``on_timer`` for the current key once the watermark reaches ``ts``.
        ``namespace``: the void namespace by default. A timer already there: no-op."""
        self._change(EVENT, True, ts, namespace, "register_event_time_timer")

    def register_processing_time_timer(self, ts, namespace=None):
        """Fire ``on_timer`` for the current key once processing time reaches ``ts``
        (from :meth:`advance_processing_time`, or as a mail of the backend's async
        controller's mailbox when it has one)."""
        self._change(PROCESSING, True, ts, namespace, "register_processing_time_timer")

    def delete_event_time_timer(self, ts, namespace=None):
        """Remove the current key's event-time timer at ``ts`` (no-op if there is none)."""
        self._change(EVENT, False, ts, namespace, "delete_event_time_timer")

    def delete_processing_time_timer(self, ts, namespace=None):
        """Remove the current key's processing-time timer at ``ts`` (no-op if there is none)."""
        self._change(PROCESSING, False, ts, namespace, "delete_processing_time_timer")

    # ------------------------------------------------------------ time

    def current_watermark(self):
        """The last watermark advanced to (``NO_WATERMARK``, int64's minimum, before any)."""
        return self._watermark

    def current_processing_time(self):
        """The backend's clock (its ``time_provider``), in milliseconds."""
        self._check()
        return self._kc.now()

    def advance_watermark(self, watermark):
        """Fire every event-time timer at or before ``watermark``, in timestamp order;
        the number fired. A watermark not past the current one changes nothing
        (returns 0). If ``on_timer`` raises, firing stops there: the timers not
        fired yet stay (they fire at the next advance past this watermark),
        the one that raised is gone (as in Flink)."""
        cdef int64_t wm = _as_ts(watermark, "watermark")
        self._check()
        if self._firing[EVENT]:
            raise RuntimeError("advance_watermark called from on_timer: the running advance fires what is due")
        if wm <= self._watermark:
            return 0
        self._watermark = wm
        return self._fire(EVENT, wm)

    def advance_processing_time(self, now):
        """Fire every processing-time timer at or before ``now``, in timestamp
        order; the number fired."""
        cdef int64_t t = _as_ts(now, "processing time")
        self._check()
        if self._firing[PROCESSING]:
            raise RuntimeError("advance_processing_time called from on_timer")
        return self._fire(PROCESSING, t)

    cdef Py_ssize_t _fire(self, int d, int64_t upto) except -1:
        cdef int64_t ts
        cdef PyObject *kp
        cdef PyObject *nsp
        cdef uint32_t g
        cdef Py_ssize_t n = 0
        cdef KeyContext kc = self._kc
        cdef cm_tqueue *q = &self._q[d]
        on_timer = self._on_timer
        if not cm_tq_head(q, &ts) or ts > upto:
            return 0
        if on_timer is None:
            raise RuntimeError(f"timer service {self.name!r} has no on_timer to fire timers with")
        aec = kc.aec() if kc.aec is not None else None
        domain = self._domains[d]
        prev_key, prev_kg = kc.key, kc.key_group
        self._firing[d] = True
        cm_tq_begin_fire(q, upto)
        try:
            while cm_tq_head(q, &ts) and ts <= upto:
                cm_tq_poll(q, &ts, &kp, &nsp, &g)
                self._changed[d * q.nkg + g] = 1
                key = <object>kp
                ns = <object>nsp
                Py_DECREF(key)  # the queue's references: ours are key and ns now
                Py_DECREF(ns)
                n += 1
                self._set_firing(d, ts, key, ns)
                if aec is not None:
                    aec.process(key, _TimerFiring(on_timer, ts, key, ns, domain, aec))
                else:
                    kc.switch(key, self._kg_ints[g])
                    on_timer(ts, key, ns, domain)
        finally:
            self._firing[d] = False
            self._set_firing(d, 0, None, None)
            kc.restore(prev_key, prev_kg)
            cm_tq_end_fire(q)
        return n

    # ------------------------------------------------------------ processing time as mails

    cdef int _schedule(self) except -1:
        """Post a mail for the earliest processing-time timer when the backend's
        async controller has a mailbox (else timers wait for advance_processing_time)."""
        cdef int64_t head
        kc = self._kc
        aec = kc.aec() if kc.aec is not None else None
        if not cm_tq_head(&self._q[PROCESSING], &head) or aec is None or aec.mailbox is None:
            self._scheduled = INT64_MAX
            return 0
        self._scheduled = head
        self._mail_seq += 1
        delay = max(0, head - kc.now()) / 1000.0
        aec.mailbox.post_delayed(delay, _ProcessingMail(self, self._mail_seq))
        return 0

    def _on_processing_mail(self, Py_ssize_t seq):
        if seq != self._mail_seq or self._kc is None:
            return  # an earlier timer was registered since: its mail is the one
        self._scheduled = INT64_MAX
        self.advance_processing_time(self._kc.now())
        self._schedule()

    # ------------------------------------------------------------ inspection, snapshots

    def num_event_time_timers(self):
        """Event-time timers registered and not fired or deleted. O(1)."""
        return self._q[EVENT].count

    def num_processing_time_timers(self):
        """Processing-time timers registered and not fired or deleted. O(1)."""
        return self._q[PROCESSING].count

    def timers(self, domain):
        """The timers of ``domain`` as (ts, key, namespace) tuples, in no particular order. O(n)."""
        cdef int d = _domain_index(domain)
        cdef cm_tblock *b
        cdef cm_trec *r
        cdef uint32_t i, k
        out = []
        for k in range(self._q[d].nkg):
            b = self._q[d].kg[k].b
            if b != NULL:
                r = CM_REC(b)
                for i in range(b.nrec):
                    if r[i].key != NULL:
                        out.append((r[i].ts, <object>r[i].key, <object>r[i].ns))
        return out

    def snapshot(self, cut=False):
        """The timers as they are now, copy-on-write per key group: O(key groups).

        ``cut``: a checkpoint's cut: the snapshot also says which key groups'
        timers changed since the previous cut (:meth:`TimerSnapshot.changed`),
        and tracking starts over."""
        self._check()
        snap = TimerSnapshot._take(self)
        if cut:
            snap._changed = bytes(self._changed)
            self._changed[:] = bytes(len(self._changed))
        return snap

    def restore(self, TimerSnapshot snapshot not None, key_groups=None):
        """Add the timers of ``snapshot`` in the key groups this service owns (or
        only those in ``key_groups``); timers already here are kept (one per
        key, namespace and timestamp). O(timers added x log)."""
        cdef int d
        cdef KeyContext kc = self._kc
        self._check()
        for kg in snapshot.key_groups():
            if not kc.lo <= kg <= kc.hi or (key_groups is not None and kg not in key_groups):
                continue
            for d in range(2):
                ts, keys, nss = snapshot.columns(kg, self._domains[d])
                self.add_columns(kg, self._domains[d], ts, keys, nss)

    cdef object _columns(self, long kg, ts, keys, namespaces):
        """``ts`` as an int64 buffer, once key group ``kg`` (owned: else
        ValueError) and the columns' lengths (equal: else ValueError) are checked."""
        cdef KeyContext kc = self._kc
        cdef int64_t[:] tsv
        self._check()
        try:
            tsv = ts
        except (TypeError, ValueError):  # not an int64 buffer: a sequence of ints
            ts = array.array("q", ts)
        if not kc.lo <= kg <= kc.hi:
            raise ValueError(f"key group {kg} is outside this backend's range KeyGroupRange({kc.lo}, {kc.hi})")
        n = len(ts)
        if len(keys) != n or len(namespaces) != n:
            raise ValueError(f"timer columns differ in length: {n} timestamps, {len(keys)} keys, {len(namespaces)} namespaces")
        return ts

    def add_columns(self, long kg, domain, ts, keys, namespaces):
        """Add timers of key group ``kg`` given as columns (the restore path of
        snapshots and checkpoints). ValueError for a key group not owned."""
        cdef int d = _domain_index(domain)
        cdef int64_t[:] tsv = self._columns(kg, ts, keys, namespaces)
        cdef Py_ssize_t i
        cdef uint32_t g = <uint32_t>(kg - self._kc.lo)
        cdef bint processing_added = False
        for i in range(tsv.shape[0]):
            key = keys[i]
            ns = namespaces[i]
            if key is None or ns is None:
                raise TypeError("a timer's key and namespace must not be None")
            if self._apply(d, True, g, tsv[i], key, ns) == 1 and d == PROCESSING and tsv[i] < self._scheduled:
                processing_added = True
        if processing_added:
            self._schedule()

    def replace_columns(self, long kg, domain, ts, keys, namespaces):
        """Make key group ``kg``'s timers of ``domain`` exactly those given as
        columns (none for empty ones): a checkpoint increment's timers, which
        replace the key group's. The columns are checked before anything
        changes; ValueError for a key group not owned, RuntimeError while that
        domain fires."""
        cdef int d = _domain_index(domain)
        cdef uint32_t g
        ts = self._columns(kg, ts, keys, namespaces)
        if self._firing[d]:
            raise RuntimeError("replace_columns called while the domain's timers fire")
        if any(k is None for k in keys) or any(ns is None for ns in namespaces):
            raise TypeError("a timer's key and namespace must not be None")
        g = <uint32_t>(kg - self._kc.lo)
        cm_tq_clear(&self._q[d], g)
        self._changed[d * self._q[d].nkg + g] = 1
        self.add_columns(kg, domain, ts, keys, namespaces)
        if d == PROCESSING:
            self._schedule()

    def __repr__(self):
        return (f"<TimerService {self.name!r} event_time_timers={self._q[EVENT].count} "
                f"processing_time_timers={self._q[PROCESSING].count} watermark={self._watermark}>")


cdef int _domain_index(domain) except -1:
    if domain == 0 or domain == 1:
        return <int>domain
    raise ValueError(f"domain must be TimeDomain.EVENT_TIME or TimeDomain.PROCESSING_TIME, not {domain!r}")


@cython.final
@cython.auto_pickle(False)
cdef class _TimerFiring:
    """A firing timer as the processing of a record of its key under the async
    controller: ``on_timer`` runs once the key is free (a sync point), so after
    the key's earlier records and before its later ones."""
    cdef object on_timer, key, ns, domain, aec
    cdef int64_t ts

    def __cinit__(self, on_timer, int64_t ts, key, ns, domain, aec):
        self.on_timer = on_timer
        self.ts = ts
        self.key = key
        self.ns = ns
        self.domain = domain
        self.aec = aec

    def __call__(self, record):
        self.aec.sync_point(self._run)

    def _run(self):
        self.on_timer(self.ts, self.key, self.ns, self.domain)


@cython.final
@cython.auto_pickle(False)
cdef class _ProcessingMail:
    """A mail that fires a service's due processing-time timers (weakly held:
    a dropped backend's mail does nothing)."""
    cdef object ref
    cdef Py_ssize_t seq

    def __cinit__(self, TimerService svc, Py_ssize_t seq):
        import weakref
        self.ref = weakref.ref(svc)
        self.seq = seq

    def __call__(self):
        svc = self.ref()
        if svc is not None:
            svc._on_processing_mail(self.seq)


@cython.final
@cython.auto_pickle(False)
cdef class TimerSnapshot:
    """The timers of one service at a moment: per key group and domain, a block
    shared copy-on-write with the live service. Read with :meth:`columns`;
    :meth:`release` (or dropping it) lets the service stop copying for it."""

    cdef cm_tblock **_blocks  # [2 * nkg], NULL where a key group has none
    cdef uint32_t _nkg
    cdef readonly long lo
    cdef readonly str name
    cdef bint _released
    cdef bytes _changed  # a cut's: per domain and key group, 1 if changed since the previous cut

    def __cinit__(self):
        self._blocks = NULL

    @staticmethod
    cdef TimerSnapshot _take(TimerService svc):
        cdef TimerSnapshot s = TimerSnapshot.__new__(TimerSnapshot)
        cdef uint32_t nkg = svc._q[EVENT].nkg, k
        cdef int d
        s._blocks = <cm_tblock **>PyMem_RawCalloc(2 * nkg if nkg else 1, sizeof(cm_tblock *))
        if s._blocks == NULL:
            raise MemoryError()
        s._nkg = nkg
        s.lo = svc._kc.lo
        s.name = svc.name
        for d in range(2):
            for k in range(nkg):
                s._blocks[d * nkg + k] = cm_tq_share(&svc._q[d], k)
        return s

    def key_groups(self):
        """The key groups with timers in the snapshot, ascending."""
        cdef uint32_t k
        self._check()
        return [self.lo + k for k in range(self._nkg)
                if self._blocks[k] != NULL or self._blocks[self._nkg + k] != NULL]

    def changed(self, domain):
        """The key groups whose timers of ``domain`` changed since the previous cut,
        ascending; None if this snapshot is not a cut (every key group may have)."""
        cdef int d = _domain_index(domain)
        cdef uint32_t k
        self._check()
        if self._changed is None:
            return None
        return [self.lo + k for k in range(self._nkg) if self._changed[d * self._nkg + k]]

    def count(self):
        """Timers in the snapshot (both domains)."""
        cdef uint32_t k
        cdef Py_ssize_t n = 0
        self._check()
        for k in range(2 * self._nkg):
            if self._blocks[k] != NULL:
                n += self._blocks[k].live
        return n

    def columns(self, long kg, domain):
        """(timestamps as an ``array.array("q")``, keys, namespaces) of key group
        ``kg``'s timers of ``domain``, in no particular order."""
        cdef int d = _domain_index(domain)
        cdef cm_tblock *b
        cdef cm_trec *r
        cdef uint32_t i, j = 0
        cdef int64_t[:] tv
        self._check()
        if not self.lo <= kg < self.lo + self._nkg:
            return array.array("q"), [], []
        b = self._blocks[d * self._nkg + (kg - self.lo)]
        if b == NULL:
            return array.array("q"), [], []
        ts = array.array("q", bytes(8 * b.live))
        tv = ts
        keys = [None] * b.live
        nss = [None] * b.live
        r = CM_REC(b)
        for i in range(b.nrec):
            if r[i].key != NULL:
                tv[j] = r[i].ts
                keys[j] = <object>r[i].key
                nss[j] = <object>r[i].ns
                j += 1
        return ts, keys, nss

    cdef int _check(self) except -1:
        if self._released:
            raise RuntimeError("this timer snapshot has been released")
        return 0

    def release(self):
        """Drop the snapshot's blocks (idempotent)."""
        cdef uint32_t k
        if self._blocks != NULL:
            for k in range(2 * self._nkg):
                cm_block_decref(self._blocks[k])
                self._blocks[k] = NULL
        self._released = True

    @property
    def released(self):
        return self._released

    def __dealloc__(self):
        cdef uint32_t k
        if self._blocks != NULL:
            for k in range(2 * self._nkg):
                cm_block_decref(self._blocks[k])
            PyMem_RawFree(self._blocks)
