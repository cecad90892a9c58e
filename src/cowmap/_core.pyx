# cython: language_level=3, boundscheck=False, wraparound=False, embedsignature=True
"""The compiled core of cowmap: :class:`CopyOnWriteStateMap` and its snapshots.

The data structure lives in ``cowmap_core.h`` (C); this module is a thin
Python surface over it.
"""

cimport cython
from cpython.object cimport PyObject
from cpython.ref cimport Py_INCREF, Py_XDECREF
from libc.string cimport memset
from cpython.mem cimport PyMem_RawCalloc, PyMem_RawFree
from libc.stdint cimport int64_t, uint8_t, uint32_t, uint64_t
from cpython.number cimport PyIndex_Check, PyNumber_Index
from posix.time cimport CLOCK_REALTIME, clock_gettime, timespec




NO_TIMESTAMP = CM_NO_TS

# True in a build made with the CMake option COWMAP_PLAIN_BATCH=ON, whose batches
# (get_many, put_many, ..., multi_get, ...) all take the plain path: the keys one
# after another, no pipeline, no prefetch hints. Same results either way.
PLAIN_BATCH = bool(COWMAP_PLAIN_BATCH)

# False in a build made with the CMake option COWMAP_PUBLIC_API_ONLY=ON (or on an
# interpreter where they cannot be trusted), whose fast paths through CPython's own
# structures all take their public-API fallbacks (cpython_internals.h). Same results.
CPYTHON_INTERNALS = bool(CM_CPYTHON_INTERNALS)


class _Expired:
    """The marker ``get_unexpired`` returns for an expired entry."""

    __slots__ = ()

    def __repr__(self):
        return "EXPIRED"

    def __reduce__(self):
        return "EXPIRED"


EXPIRED = _Expired()


def block_stats():
    """The core's block allocator (entry chunks and bucket pages of every map):
    ``mapped``: bytes of the regions blocks are cut from; ``blocks``: blocks in
    use; ``spare``: bytes of a region faulted in ahead by the prefault thread
    and not used yet (0 or 32 MiB); ``prefaulted``: regions taken from that
    thread so far; ``huge_pages``: the policy from ``COWMAP_HUGE_PAGES``,
    ``"background"`` (default: huge pages only for regions faulted in by the
    prefault thread), ``"always"`` or ``"off"``. The kernel grants huge pages
    when THP is ``madvise`` or ``always``."""
    return {"mapped": cm_ha_mapped(), "blocks": cm_ha.live, "spare": cm_ha_spare(),
            "prefaulted": cm_ha.prefaulted, "huge_pages": _HUGE_POLICY[cm_ha_huge_pages()]}


_HUGE_POLICY = ("off", "background", "always")


cdef inline int64_t _wall_ms() noexcept nogil:
    cdef timespec t
    clock_gettime(CLOCK_REALTIME, &t)
    return <int64_t>t.tv_sec * 1000 + t.tv_nsec // 1000000


def wall_clock_ms():
    """Milliseconds since the Unix epoch: the default ``time_provider`` of a
    ``KeyedStateBackend``. TTL reads and writes read it once per access (as Flink
    does); passed to the map as the time itself (see ``_as_time``), it is read
    in C without a Python call."""
    return _wall_ms()


cdef object _WALL_CLOCK = wall_clock_ms


@cython.final
cdef class ManualClock:
    """A time provider whose owner sets the time: ``clock.ms = t``; calling it
    returns ``ms``. The maps read it in C, without the Python call another
    provider costs on every TTL access (a Spark task's micro-batch time)."""
    cdef public int64_t ms

    def __init__(self, int64_t ms=0):
        self.ms = ms

    def __call__(self):
        return self.ms

    def __reduce__(self):
        return (ManualClock, (self.ms,))

    def __repr__(self):
        return f"ManualClock({self.ms})"

cdef uint32_t _MAX_CAPACITY = 1 << 30
cdef int64_t _EMPTY_INT64 = 0


cdef inline int64_t _as_ts(object ts, str what="ts") except? -1:
    """An int64 timestamp; floats and other non-integers are rejected."""
    if type(ts) is not int:
        if isinstance(ts, (float, str, bytes)) or not hasattr(ts, "__index__"):
            raise TypeError(f"{what} must be an int (milliseconds), not {type(ts).__name__}")
        ts = ts.__index__()
    return ts


cdef inline int64_t _as_time(object t, str what="ts") except? -1:
    """A timestamp argument: an int (ms), or a time provider -- a callable
    returning int ms (a numpy integer too), called once here (``wall_clock_ms``
    is read in C). ``ValueError`` for a time beyond int64."""
    if type(t) is int:
        return _int64_ms(t, what)
    if t is _WALL_CLOCK:
        return _wall_ms()
    if type(t) is ManualClock:
        return (<ManualClock>t).ms
    if callable(t) and not PyIndex_Check(t):  # (the type's __index__ slot: no lookup that may raise)
        now = t()
        if type(now) is not int:
            if type(now) is bool or not PyIndex_Check(now):
                raise TypeError(f"time_provider must return int milliseconds, got {now!r}")
            now = PyNumber_Index(now)
        return _int64_ms(now, "time_provider's time")
    return _as_ts(t, what)


cdef inline int64_t _int64_ms(object v, str what) except? -1:
    try:
        return v
    except OverflowError:
        raise ValueError(f"{what} {v} is beyond int64 milliseconds") from None


cdef int _sweep_args(object max_entries, object removed, Py_ssize_t *n, PyObject **sink) except -1:
    """``sweep_expired``'s bound (-1: a full pass) and sink (NULL: none), checked."""
    n[0] = -1
    sink[0] = NULL
    if max_entries is not None:
        n[0] = max_entries
        if n[0] < 0:
            raise ValueError(f"max_entries must be >= 0 or None, got {max_entries}")
    if removed is not None:
        if type(removed) is not list:
            raise TypeError(f"removed must be a list or None, not {type(removed).__name__}")
        sink[0] = <PyObject *>removed
    return 0


cdef uint32_t _visit_budget(object max_empty_buckets) except 0:
    """An incremental visitor's bound on empty buckets per call, checked."""
    n = max_empty_buckets
    if type(n) is not int:
        if not PyIndex_Check(n):
            raise TypeError(f"max_empty_buckets must be an int, not {type(n).__name__}")
        n = PyNumber_Index(n)
    if not 1 <= n <= 0xFFFFFFFF:
        raise ValueError(f"max_empty_buckets must be in [1, 2**32 - 1], got {n}")
    return n


cdef int _check_copier(object copier) except -1:
    if copier is not None and not callable(copier):
        raise TypeError(f"copier must be callable or None, not {type(copier).__name__}")
    return 0


cdef inline bint _provider_hint(object key, object ns, object t, uint32_t *h) noexcept:
    """Whether a single-key call with time argument ``t`` (not an int) should
    start its key's miss before calling it: ``t`` is a time provider other than
    the C wall clock, and ``*h``, the key's composite hash, came without Python code."""
    return t is not _WALL_CLOCK and type(t) is not ManualClock and cm_hint_composite(<PyObject *>key, <PyObject *>ns, h)


cdef inline int64_t _as_time_for(cm_map *m, object key, object ns, object t, str what="ts") except? -1:
    """``_as_time`` for a single-key call on ``m``: before a time provider is
    called (a Python call), the miss on the key's head entry is started, so
    that the two overlap. Reading the bucket slot for it costs a miss of its
    own unless the caller ran ``prefetch`` for the key a little earlier (the
    keyed states do); without that it is the miss the lookup would pay anyway."""
    cdef uint32_t h
    if type(t) is int:
        return _int64_ms(t, what)
    if _provider_hint(key, ns, t, &h):
        cm_hint_at(m, h, 1)
    return _as_time(t, what)


cdef object _batch_seq(object items, str what):
    """A list (read live by the C loop, bounds-checked) or a tuple; other iterables are copied."""
    if type(items) is list or type(items) is tuple:
        return items
    try:
        return tuple(items)
    except TypeError:
        raise TypeError(f"{what} must be a sequence or an int64 array, not {type(items).__name__}") from None


cdef class _Keys:
    """Holds a batch of keys as C data: an int64 buffer or a fast sequence."""
    cdef cm_keys ks
    cdef object holder
    cdef const int64_t[::1] arr

    def __cinit__(self, keys):
        import numpy as np  # here, not at module level: `import cowmap` alone does not load numpy
        dtype = getattr(keys, "dtype", None)
        if dtype is not None and getattr(keys, "ndim", 0) == 1 and (
                dtype.kind == "i" or (dtype.kind == "u" and dtype.itemsize < 8)):
            self.arr = np.ascontiguousarray(keys, dtype=np.int64)
            self.ks.n = self.arr.shape[0]
            self.ks.seq = NULL
            # an empty int batch still needs a non-NULL pointer: it marks the int path
            self.ks.ints = &self.arr[0] if self.ks.n else &_EMPTY_INT64
        else:
            if dtype is not None:
                keys = keys.tolist()
            elif isinstance(keys, (str, bytes)):
                raise TypeError("keys must be a sequence of keys or an int64 array, not a string")
            self.holder = _batch_seq(keys, "keys")
            self.ks.n = len(self.holder)
            self.ks.seq = <PyObject *>self.holder
            self.ks.ints = NULL


@cython.final
@cython.no_gc_clear
cdef class CopyOnWriteStateMap:
    """A hash map keyed by ``(key, namespace)`` with O(1)-ish copy-on-write snapshots.

    Modelled on Apache Flink's ``CopyOnWriteStateMap``: chained hashing with
    incremental rehash (every operation moves at least 4 entries while a
    rehash runs, so no operation pays for the whole table), versioned entries
    and copy-on-write so that any number of :meth:`snapshot` views stay exactly
    as they were taken while the map keeps changing, and a timestamp per entry
    for TTL sweeps done in C.

    Keys and namespaces are hashable Python objects (not None). States are any
    objects, None included. If ``copier`` is given (Flink's
    ``serializer.copy``), a state shared with a live snapshot is copied before
    it is handed out for change (``get``, ``transform``, ``*_and_get_old``);
    without it states are treated as immutable.

    Complexity: single-key operations O(1) amortised (plus one rehash step of
    >= 4 entries while rehashing); ``snapshot()`` O(capacity / 4096).

    Threading: single writer. Every method (``get`` included: it may run a
    rehash step or copy a shared state) must be called from one thread at a
    time; a snapshot may be read from another thread while the owner writes.
    A call back into the map from a key's ``__eq__``/``__hash__``, a copier or
    a transform function raises ``RuntimeError``; allowed then are only calls
    that read counters (``len()``, the properties, :meth:`memory_stats`),
    :meth:`prefetch` (skipped), making an iterator or a visitor (whose steps
    raise), and reading or releasing a snapshot (the release takes effect
    when the running call ends).

    Timestamps (``ts``, ``now``) are int milliseconds, or a time provider (a
    callable returning them) that the map calls once per call;
    :func:`wall_clock_ms` is read in C.

    The garbage collector does not look inside the map: a state that refers
    back to the map forms a cycle that is never collected (a copier that does
    is fine).

    >>> m = CopyOnWriteStateMap()
    >>> m.put("user-1", "window-0", 3)  # True: the key was not mapped before
    True
    >>> m.get("user-1", "window-0")
    3
    >>> with m.snapshot() as s:
    ...     m.put("user-1", "window-0", 4)
    ...     sorted(s)
    False
    [('user-1', 'window-0', 3)]
    >>> m.get("user-1", "window-0")
    4
    """
    cdef cm_map m
    cdef object _copier
    cdef bint _ready

    def __cinit__(self, capacity=128, copier=None):
        self._ready = False
        if not isinstance(capacity, int):
            raise TypeError(f"capacity must be an int, not {type(capacity).__name__}")
        if capacity < 0:
            raise ValueError(f"capacity must be >= 0, got {capacity}")
        _check_copier(copier)
        cm_init(&self.m, <uint32_t>min(capacity, _MAX_CAPACITY))
        self._ready = True
        # The C struct borrows the copier from _copier, which the garbage collector
        # sees (a copier that refers back to the map, e.g. a bound method of an
        # owner, is a collectable cycle); no_gc_clear keeps it set until __dealloc__.
        self._copier = copier
        if copier is not None:
            self.m.copier = <PyObject *>copier

    def __dealloc__(self):
        self.m.copier = NULL  # borrowed: _copier is dropped after __dealloc__
        if self._ready:
            cm_dealloc(&self.m)

    # ---------------------------------------------------------- single keys

    def put(self, key, namespace, state, ts=NO_TIMESTAMP):
        """Map ``(key, namespace)`` to ``state`` with timestamp ``ts`` (ms); True
        when the key was not mapped before. O(1) amortised."""
        return cm_put(&self.m, key, namespace, state, _as_time_for(&self.m, key, namespace, ts)) == 1

    def get(self, key, namespace):
        """The state of ``(key, namespace)`` or None. A state shared with a
        snapshot is copied first when a copier is set. O(1) amortised."""
        return cm_get(&self.m, key, namespace)

    def get_with_timestamp(self, key, namespace):
        """``(state, ts)`` of ``(key, namespace)``, or None when absent."""
        return cm_get_with_ts(&self.m, key, namespace)

    def get_unexpired(self, key, namespace, now, ttl, refresh=False):
        """TTL read in one lookup: the state of ``(key, namespace)`` if it is
        live at ``now`` (not ``ts + ttl <= now``), with its timestamp set to
        ``now`` when ``refresh``; None when absent; :data:`EXPIRED` when
        expired, the entry left untouched. ``ttl`` (ms) must be > 0
        (``ValueError``)."""
        return cm_get_unexpired(&self.m, key, namespace, _as_time_for(&self.m, key, namespace, now, "now"),
                                _as_ts(ttl, "ttl"),
                                1 if refresh else 0, EXPIRED)

    def replace(self, key, namespace, state, ts=NO_TIMESTAMP):
        """Overwrite the state (and timestamp) of ``(key, namespace)`` if it is
        mapped; True if it was, False (and nothing added) if not."""
        return cm_replace(&self.m, key, namespace, state, _as_time_for(&self.m, key, namespace, ts)) == 1

    def get_touch(self, key, namespace, ts):
        """Like ``get`` (the state, copied if a snapshot shares it, or None when
        absent), also setting the entry's timestamp to ``ts``: one lookup for
        changing a state in place and refreshing its time."""
        return cm_get_touch(&self.m, key, namespace, _as_time_for(&self.m, key, namespace, ts))

    def timestamp(self, key, namespace):
        """The timestamp of ``(key, namespace)``, or None when absent."""
        return cm_timestamp(&self.m, key, namespace)

    def set_timestamp(self, key, namespace, ts):
        """Set the timestamp of an existing entry; False when absent."""
        return cm_set_timestamp(&self.m, key, namespace, _as_time(ts)) == 1

    def prefetch(self, key, namespace):
        """A hint for an access to ``(key, namespace)`` that follows soon: the
        bucket of the key starts loading now, so that its cache miss (in a map
        bigger than the CPU caches) overlaps the caller's work in between.
        Changes nothing and raises nothing; keys whose hash would run Python code
        (a ``__hash__`` of their own, an uncached str hash) are skipped."""
        cdef uint32_t h
        if cm_hint_composite(<PyObject *>key, <PyObject *>namespace, &h):
            cm_hint_at(&self.m, h, 0)

    def contains_key(self, key, namespace):
        """True if ``(key, namespace)`` is mapped (also when its state is None)."""
        return cm_contains(&self.m, key, namespace) == 1

    def __contains__(self, item):
        key, namespace = item
        return cm_contains(&self.m, key, namespace) == 1

    def remove(self, key, namespace):
        """Remove ``(key, namespace)`` if present."""
        cm_remove(&self.m, key, namespace)

    def put_and_get_old(self, key, namespace, state, ts=NO_TIMESTAMP):
        """Put and return the previous state (a copy if shared with a snapshot), or None."""
        return cm_put_and_get_old(&self.m, key, namespace, state, _as_time_for(&self.m, key, namespace, ts))

    def remove_and_get_old(self, key, namespace):
        """Remove and return the previous state (a copy if shared with a snapshot), or None."""
        return cm_remove_and_get_old(&self.m, key, namespace)

    def transform(self, key, namespace, value, fn, ts=NO_TIMESTAMP):
        """Set the state to ``fn(old_state_or_None, value)``.

        A shared state is copied before ``fn`` sees it. ``fn`` must not use
        this map. If ``fn`` raises, the map is unchanged.
        """
        if not callable(fn):
            raise TypeError(f"fn must be callable, not {type(fn).__name__}")
        cm_transform(&self.m, key, namespace, value, fn, _as_time(ts))

    # ---------------------------------------------------------------- batch

    def get_many(self, keys, namespace):
        """States of ``keys`` in ``namespace`` (None where absent), as a list.

        ``keys`` is a sequence or an integer numpy array (fast path). One call
        into C for the whole batch. O(len(keys)).
        """
        cdef _Keys k = _Keys(keys)
        return cm_get_many(&self.m, &k.ks, namespace)

    def put_many(self, keys, namespace, states, ts=NO_TIMESTAMP):
        """Put ``states[i]`` at ``(keys[i], namespace)`` for every i. O(len(keys)).

        Not atomic: if a key is rejected (e.g. None), the keys before it are written.
        """
        cdef _Keys k = _Keys(keys)
        seq = _batch_seq(states, "states")
        if len(seq) != k.ks.n:
            raise ValueError(f"keys and states differ in length ({k.ks.n} != {len(seq)})")
        cm_put_many(&self.m, &k.ks, namespace, <PyObject *>seq, _as_time(ts))

    def contains_many(self, keys, namespace):
        """A numpy bool array: which ``keys`` are mapped in ``namespace``."""
        import numpy as np
        cdef _Keys k = _Keys(keys)
        out = np.zeros(k.ks.n, dtype=np.bool_)
        cdef uint8_t[::1] view = out.view(np.uint8)
        cdef uint8_t dummy = 0
        cm_contains_many(&self.m, &k.ks, namespace, &view[0] if k.ks.n else &dummy)
        return out

    def remove_many(self, keys, namespace):
        """Remove ``keys`` from ``namespace``; returns how many were present."""
        cdef _Keys k = _Keys(keys)
        return cm_remove_many(&self.m, &k.ks, namespace)

    # ------------------------------------------------------------------ TTL

    def sweep_expired(self, now, ttl, max_entries=5, removed=None):
        """Remove entries with ``ts + ttl <= now`` (the sum saturating at 2**63 - 1,
        as in Flink), incrementally.

        Each call examines about ``max_entries`` entries (whole bucket chains)
        from where the previous call stopped, wrapping around, like Flink's
        incremental TTL cleanup; ``max_entries=None`` makes one full pass.
        The expiry check runs in C; ``ttl`` (ms) must be > 0 (``ValueError``).
        Returns the number of entries removed;
        if ``removed`` is a list, each removed entry is appended to it as
        ``(key, namespace, state)``.
        """
        cdef Py_ssize_t n
        cdef PyObject *sink
        _sweep_args(max_entries, removed, &n, &sink)
        return cm_sweep(&self.m, _as_time(now, "now"), _as_ts(ttl, "ttl"), n, sink)

    @property
    def expiry_floor(self):
        """A bound no live entry's timestamp is below (``NO_TIMESTAMP`` when
        none has one): while it has not expired, no entry has, and
        ``sweep_expired`` returns 0 at once. Lowered by every write of a
        timestamp, raised by each full round of the incremental sweep."""
        return self.m.ts_floor

    # ------------------------------------------------------------ whole map

    def __len__(self):
        return self.m.size

    def __iter__(self):
        """Iterate ``(key, namespace, state)``; each entry once, reads allowed.

        Adding or removing entries during iteration raises RuntimeError.
        """
        return _MapIterator(self)

    def snapshot(self, cut=False):
        """A consistent :class:`StateMapSnapshot` of this moment. O(capacity / 4096).

        With ``cut``, a checkpoint's cut too: the snapshot takes over what
        changed since the previous cut (``snapshot_changes`` reads it; its
        ``changes`` says whether the map was tracking), and the map
        tracks changes from now on (every later write and read of a mutable
        state marks its entry, every removal is logged: a store per
        operation, and a bit per entry of memory). O(entries / 64) more."""
        cdef StateMapSnapshot s = StateMapSnapshot.__new__(StateMapSnapshot)
        cm_snapshot(&self.m, &s.s)
        s._map = self
        s._released = False
        if cut:
            try:
                cm_cut(&self.m, &s.ch)
            except BaseException:
                s.release()
                raise
            s._cut = True
        return s

    def incremental_visitor(self, max_empty_buckets=128):
        """A :class:`StateIncrementalVisitor` scanning at most ``max_empty_buckets``
        empty buckets per call (1 to 2**32 - 1)."""
        return StateIncrementalVisitor(self, max_empty_buckets)

    @property
    def capacity(self):
        """Capacity of the primary table (the old one while rehashing)."""
        return self.m.primary.capacity

    @property
    def is_rehashing(self):
        return self.m.rehash.capacity != 0

    @property
    def version(self):
        """The map version; each snapshot increments it."""
        return self.m.version

    @property
    def highest_required_snapshot_version(self):
        return self.m.required

    @property
    def snapshot_versions(self):
        """Versions of the live snapshots, ascending."""
        return cm_snapshot_versions(&self.m)

    @property
    def copier(self):
        return self._copier

    def reclaim(self, max_items=None):
        """Free memory that released snapshots kept alive, now.

        A release frees up to 4,096 retired entries/pages at once and queues
        the rest, which later operations reclaim a few at a time (32 per call,
        2 per key of a batch), so no single call pays for a large snapshot.
        Call this at a convenient moment (e.g. after a checkpoint completes)
        to reclaim everything, or ``max_items`` of it. Returns how many items
        are still queued.
        """
        return cm_reclaim(&self.m, -1 if max_items is None else max_items)

    def memory_stats(self):
        """Entry and page counts and the bytes the core holds (excluding Python objects)."""
        total = self.m.next_unused - 1 - cm_nfree(&self.m)
        return {
            "live_entries": self.m.size,
            "total_entries": total,
            "retained_entries": total - self.m.size,
            "free_entries": cm_nfree(&self.m),
            "pages": self.m.npages_live,
            "snapshots": self.m.nsnaps,
            "reclaim_pending": self.m.rq_items,
            "bytes": cm_bytes(&self.m),
        }

    def __repr__(self):
        return (f"<CopyOnWriteStateMap len={self.m.size} capacity={self.m.primary.capacity}"
                f" rehashing={self.m.rehash.capacity != 0} snapshots={self.m.nsnaps}>")


@cython.final
@cython.no_gc_clear
cdef class StateMapSnapshot:
    """A consistent, read-only view of a :class:`CopyOnWriteStateMap`.

    Iterating yields ``(key, namespace, state)`` as they were when
    ``snapshot()`` was called, whatever the map does afterwards. Release it
    (or use it as a context manager) so the map stops copying on write;
    ``release()`` is idempotent. May be read from another thread.
    """
    cdef CopyOnWriteStateMap _map
    cdef cm_snap s
    cdef bint _released
    cdef bint _cut        # taken with cut=True: ch holds the changes since the previous cut
    cdef cm_changes ch
    # readers without the GIL (a checkpoint's read-out): a release meanwhile is
    # done when the last of them is through, so their entries stay put
    cdef int _readers
    cdef bint _release_pending

    def __cinit__(self):
        self._released = True

    def __dealloc__(self):
        if not self._released and self._map is not None:
            self._released = True
            cm_release(&self._map.m, &self.s)
        cm_changes_free(&self.ch)

    cdef void _pin(self) noexcept:
        self._readers += 1

    cdef void _unpin(self) noexcept:
        self._readers -= 1
        if self._readers == 0 and self._release_pending:
            self._release_pending = False
            cm_release(&self._map.m, &self.s)
            cm_changes_free(&self.ch)

    @property
    def changes(self):
        """For a cut's snapshot, what is known of the changes since the
        previous cut: ``"known"`` (all of them: ``snapshot_changes`` reads
        them), ``"untracked"`` (the map was not tracking: made since, or no
        cut before) or ``"lost"`` (out of memory while logging); else None."""
        return _changes_status(self._cut, self.ch.bits != NULL, self.ch.gone.lost)

    cdef int _check(self) except -1:
        if self._released:
            raise RuntimeError(f"snapshot version {self.s.version} has been released")
        return 0

    @property
    def version(self):
        return self.s.version

    @property
    def released(self):
        return self._released

    def __len__(self):
        self._check()
        return self.s.size

    def __iter__(self):
        self._check()
        return _SnapshotIterator(self, False)

    def iter_with_timestamps(self):
        """Iterate ``(key, namespace, state, ts)``."""
        self._check()
        return _SnapshotIterator(self, True)

    def release(self):
        """Release this snapshot (idempotent). While another thread reads it
        out without the GIL, the map lets go of it when that read is through."""
        if self._readers:
            self._release_pending = not self._released or self._release_pending
            self._released = True
            return
        if not self._released:
            self._released = True
            cm_release(&self._map.m, &self.s)
        cm_changes_free(&self.ch)

    def __enter__(self):
        self._check()
        return self

    def __exit__(self, *exc):
        self.release()

    def __repr__(self):
        state = "released" if self._released else f"len={self.s.size}"
        return f"<StateMapSnapshot version={self.s.version} {state}>"


@cython.final
cdef class _SnapshotIterator:
    cdef StateMapSnapshot snap
    cdef cm_snapit it
    cdef int with_ts

    def __cinit__(self, StateMapSnapshot snap not None, bint with_ts):
        self.snap = snap
        self.with_ts = with_ts
        cm_snapit_init(&snap.s, &self.it)

    def __iter__(self):
        return self

    def __next__(self):
        self.snap._check()
        cdef uint32_t i = cm_snapit_next(&self.snap._map.m, &self.snap.s, &self.it)
        if i == 0:
            raise StopIteration
        return cm_entry_tuple(cm_E(&self.snap._map.m, i), self.with_ts)


@cython.final
cdef class _MapIterator:
    """Walks logical buckets (hash mod the capacity at start), which entries
    never leave when the table grows: each entry is seen exactly once even if
    reads inside the loop run rehash steps."""
    cdef CopyOnWriteStateMap _map
    cdef uint32_t base_cap, j
    cdef uint64_t mod_count
    cdef list buf
    cdef Py_ssize_t bi

    def __cinit__(self, CopyOnWriteStateMap m not None):
        self._map = m
        self.base_cap = m.m.primary.capacity
        self.j = 0
        self.mod_count = m.m.mod_count
        self.buf = []
        self.bi = 0

    def __iter__(self):
        return self

    def __next__(self):
        cdef cm_map *m = &self._map.m
        if m.mod_count != self.mod_count:
            raise RuntimeError("CopyOnWriteStateMap changed size during iteration")
        while self.bi >= len(self.buf):
            if self.j >= self.base_cap:
                raise StopIteration
            self.buf = []
            self.bi = 0
            cm_enter(m)
            try:
                cm_collect_logical(m, self.base_cap, self.j, self.buf)
            finally:
                cm_leave(m)
            self.j += 1
        item = self.buf[self.bi]
        self.bi += 1
        return item


@cython.final
cdef class StateIncrementalVisitor:
    """Flink's ``StateIncrementalVisitor``: a few bucket chains per call.

    ``next_entries()`` returns the ``(key, namespace, state)`` of one position
    (one whole chain; two while a rehash runs: the new bucket and the old one
    not yet migrated), an empty list after ``max_empty_buckets`` empty buckets, or None
    when the visit is done. Tolerates changes and rehash: every entry present
    for the whole visit is returned at least once (around a rehash, some may
    be returned twice).

    ``StateIncrementalVisitor(m, max_empty_buckets)`` is
    ``m.incremental_visitor(max_empty_buckets)``.
    """
    cdef CopyOnWriteStateMap _map
    cdef cm_cursor cur
    cdef uint32_t max_empty

    def __cinit__(self, CopyOnWriteStateMap m not None, max_empty_buckets):
        self._map = m
        self.max_empty = _visit_budget(max_empty_buckets)
        cm_cursor_reset(&m.m, &self.cur)

    def has_next(self):
        return self.cur.phase < 2 and self._map.m.size > 0

    def next_entries(self):
        cdef cm_map *m = &self._map.m
        cdef cm_vpos vp
        if not self.has_next():
            return None
        cm_enter(m)
        try:
            r = cm_visit_next(m, &self.cur, self.max_empty, &vp)
            if r < 0:
                return None
            if r == 0:
                return []
            return cm_chain_list(m, &vp)
        finally:
            cm_leave(m)

    def remove(self, key, namespace):
        self._map.remove(key, namespace)

    def update(self, key, namespace, state):
        self._map.put(key, namespace, state)


# ------------------------------------------------------------ the flat map

include "_flat.pxi"


# ------------------------------------------------------------ calls over many maps

include "_multi.pxi"

# ------------------------------------------------------------ columns, user links, read-outs

include "_columns.pxi"
include "_userlink.pxi"
include "_export.pxi"

# ------------------------------------------------------------ the per-key accesses of ValueState and MapState

include "_state_access.pxi"
