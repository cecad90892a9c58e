# FlatStateMap (flatmap.h): included by _core.pyx, so that it shares the core's
# key hashing, entry layout and block allocator.

cdef inline int64_t _flat_time_for(fm_map *m, object key, object ns, object t, str what="ts") except? -1:
    """``_as_time`` for a single-key call on ``m``: the key's slot starts loading
    before a time provider (a Python call) runs, so that the two overlap."""
    cdef uint32_t h
    if type(t) is int:
        return t
    if _provider_hint(key, ns, t, &h):
        fm_prefetch(m, h)
    return _as_time(t, what)


@cython.final
@cython.no_gc_clear  # the struct borrows _copier; a snapshot must still release into its map
cdef class FlatStateMap:
    """A map keyed by ``(key, namespace)`` like :class:`CopyOnWriteStateMap`,
    with its entries inline in an open-addressed table: a lookup in a map far
    bigger than the CPU caches costs one cache miss, not two (slot, then
    entry). Made for MapState's user entries, read one key at a time.

    Snapshots are O(number of segments) to take and copy on write per page of
    256 entries; the map grows a segment at a time (a segment doubles up to
    ``2**max_shift`` slots, then splits in two), so no resize touches more
    than one segment. States, copier, timestamps and TTL sweeps behave as in
    :class:`CopyOnWriteStateMap`; there is no Flink rehash schedule to match.
    Entries remember the order they were added in: a snapshot can be read in
    that order (``iter_with_timestamps(insertion_order=True)``).

    Threading and re-entrancy as for :class:`CopyOnWriteStateMap`: one writer;
    a snapshot may be read from another thread; a call back into the map from
    a key's ``__eq__``/``__hash__`` or a copier raises ``RuntimeError``, except
    ``len()``, the properties, :meth:`prefetch` and reading or releasing a
    snapshot (released at once).

    >>> m = FlatStateMap()
    >>> m.put("user-1", "window-0", 3)
    True
    >>> with m.snapshot() as s:
    ...     m.put("user-1", "window-0", 4)
    ...     sorted(s)
    False
    [('user-1', 'window-0', 3)]
    """
    cdef fm_map m
    cdef object _copier
    cdef bint _ready

    def __cinit__(self, copier=None, max_shift=None):
        self._ready = False
        _check_copier(copier)
        cdef uint32_t shift = FM_MAX_SHIFT_DEFAULT
        if max_shift is not None:
            if type(max_shift) is not int:
                raise TypeError(f"max_shift must be an int, not {type(max_shift).__name__}")
            if not FM_MIN_SHIFT <= max_shift <= 20:
                raise ValueError(f"max_shift must be in [{FM_MIN_SHIFT}, 20], got {max_shift}")
            shift = max_shift
        fm_init(&self.m, shift)
        self._ready = True
        self._copier = copier  # see CopyOnWriteStateMap.__cinit__: the struct borrows it
        if copier is not None:
            self.m.copier = <PyObject *>copier

    def __dealloc__(self):
        self.m.copier = NULL
        if self._ready:
            fm_dealloc(&self.m)

    def __len__(self):
        return self.m.size

    @property
    def version(self):
        """The version the next snapshot will take."""
        return self.m.version

    @property
    def is_rehashing(self):
        """Always False: segments grow whole, one at a time."""
        return False

    @property
    def segments_depth(self):
        """log2 of the directory size (for tests)."""
        return self.m.gdepth

    def put(self, key, namespace, state, ts=NO_TIMESTAMP):
        """Map ``(key, namespace)`` to ``state`` with timestamp ``ts``; True
        when the key was not mapped before."""
        return fm_put(&self.m, key, namespace, state, _flat_time_for(&self.m, key, namespace, ts)) == 1

    def get(self, key, namespace):
        """The state of ``(key, namespace)`` or None (copied first if it is
        shared with a snapshot and a copier is set)."""
        return fm_get(&self.m, key, namespace)

    def get_unexpired(self, key, namespace, now, ttl, refresh=False):
        """As :meth:`CopyOnWriteStateMap.get_unexpired`: the state if live at
        ``now``, with its timestamp set to ``now`` when ``refresh``; None when
        absent; :data:`EXPIRED` when expired (left in place). ``ttl`` (ms)
        must be > 0 (``ValueError``)."""
        cdef int64_t t = _flat_time_for(&self.m, key, namespace, now, "now")
        return fm_get_unexpired(&self.m, key, namespace, t, _as_ts(ttl, "ttl"), 1 if refresh else 0, EXPIRED)

    def contains_key(self, key, namespace):
        """True if ``(key, namespace)`` is mapped (also when its state is None)."""
        return fm_contains(&self.m, key, namespace) == 1

    def timestamp(self, key, namespace):
        """The timestamp of ``(key, namespace)``, or None when absent."""
        cdef int64_t ts
        if fm_timestamp(&self.m, key, namespace, &ts) == 1:
            return ts
        return None

    def remove(self, key, namespace):
        """Remove ``(key, namespace)``; True if it was mapped."""
        return fm_remove(&self.m, key, namespace, NULL) == 1

    def remove_and_get_old(self, key, namespace):
        """Remove ``(key, namespace)`` and return its state (None if absent)."""
        return fm_remove_and_get_old(&self.m, key, namespace)

    def prefetch(self, key, namespace):
        """A hint that ``(key, namespace)`` is accessed soon: its slot starts
        loading. Changes nothing and raises nothing."""
        cdef uint32_t h
        if cm_hint_composite(<PyObject *>key, <PyObject *>namespace, &h):
            fm_prefetch(&self.m, h)

    def sweep_expired(self, now, ttl, max_entries=5, removed=None):
        """Remove entries with ``ts + ttl <= now`` (saturating), examining about
        ``max_entries`` entries from where the last call stopped
        (``None``: one full pass); ``ttl`` (ms) must be > 0 (``ValueError``).
        Returns how many were removed; with a list
        ``removed``, each goes to it as ``(key, namespace, state)``."""
        cdef Py_ssize_t n
        cdef PyObject *sink
        _sweep_args(max_entries, removed, &n, &sink)
        return fm_sweep(&self.m, _as_time(now, "now"), _as_ts(ttl, "ttl"), n, sink)

    @property
    def expiry_floor(self):
        """A bound no entry's timestamp is below (``NO_TIMESTAMP`` when none
        has one): while it has not expired, no entry has, and ``sweep_expired``
        returns 0 at once. Lowered by every write of a timestamp, raised by a
        full sweep (``max_entries=None``)."""
        return self.m.ts_floor

    def snapshot(self, cut=False):
        """A :class:`FlatMapSnapshot` of the map as it is now; with ``cut``, a
        checkpoint's cut too (as :meth:`CopyOnWriteStateMap.snapshot` says;
        here the changes are marked per home slot of each segment)."""
        cdef FlatMapSnapshot s = FlatMapSnapshot.__new__(FlatMapSnapshot)
        fm_snapshot(&self.m, &s.s)
        s._map = self
        s._released = False
        if cut:
            try:
                s.bits = <uint64_t **>PyMem_RawCalloc(s.s.nsegs, sizeof(uint64_t *))
                if s.bits == NULL:
                    raise MemoryError()
                s.nbits = s.s.nsegs
                s._tracked = fm_cut(&self.m, &s.s, s.bits, &s.gone) == 1
            except BaseException:
                s.release()
                raise
            s._cut = True
        return s

    def __iter__(self):
        """``(key, namespace, state)`` of every entry, from a snapshot taken now."""
        with self.snapshot() as s:
            return iter(list(s))

    def __repr__(self):
        return f"<FlatStateMap len={self.m.size}>"


@cython.final
@cython.no_gc_clear  # __dealloc__ releases into _map, so the collector must not clear it first
cdef class FlatMapSnapshot:
    """A consistent, read-only view of a :class:`FlatStateMap`, as
    :class:`StateMapSnapshot` is of a :class:`CopyOnWriteStateMap`."""
    cdef FlatStateMap _map
    cdef fm_snap s
    cdef bint _released
    cdef bint _cut, _tracked  # as StateMapSnapshot's: bits[j] are segs[j]'s dirty bits
    cdef uint64_t **bits
    cdef uint32_t nbits
    cdef cm_gonelog gone

    def __cinit__(self):
        self._released = True

    def __dealloc__(self):
        if not self._released and self._map is not None:
            self._released = True
            fm_release(&self._map.m, &self.s)
        self._free_changes()

    cdef void _free_changes(self):
        cdef uint32_t j
        if self.bits != NULL:
            for j in range(self.nbits):
                PyMem_RawFree(self.bits[j])
            PyMem_RawFree(self.bits)
            self.bits = NULL
        cm_gone_free(&self.gone)

    @property
    def changes(self):
        """As :attr:`StateMapSnapshot.changes`."""
        return _changes_status(self._cut, self._tracked, self.gone.lost)

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
        return _FlatSnapshotIterator(self, False)

    def iter_with_timestamps(self, insertion_order=False):
        """Iterate ``(key, namespace, state, ts)``; with ``insertion_order``, in
        the order the entries were added to the map (an overwrite keeps an
        entry's place, a removal and a new put move it to the end), at the
        cost of sorting the entries' positions first (16 bytes each)."""
        self._check()
        it = _FlatSnapshotIterator(self, True)
        if insertion_order:
            it.order = fm_snap_order(&self.s, &it.n)
        return it

    def release(self):
        """Release this snapshot (idempotent)."""
        if not self._released:
            self._released = True
            fm_release(&self._map.m, &self.s)
        self._free_changes()

    def __enter__(self):
        self._check()
        return self

    def __exit__(self, *exc):
        self.release()

    def __repr__(self):
        state = "released" if self._released else f"len={self.s.size}"
        return f"<FlatMapSnapshot version={self.s.version} {state}>"


@cython.final
cdef class _FlatSnapshotIterator:
    cdef FlatMapSnapshot snap
    cdef uint32_t j, i
    cdef int with_ts
    cdef fm_pos *order  # insertion order: positions, from fm_snap_order
    cdef size_t n, k

    def __cinit__(self, FlatMapSnapshot snap not None, bint with_ts):
        self.snap = snap
        self.with_ts = with_ts

    def __dealloc__(self):
        PyMem_RawFree(self.order)

    def __iter__(self):
        return self

    def __next__(self):
        self.snap._check()
        cdef const cm_entry *e
        if self.order == NULL:
            e = fm_snap_next(&self.snap.s, &self.j, &self.i)
        elif self.k < self.n:
            e = fm_snap_at(&self.snap.s, &self.order[self.k])
            self.k += 1
        else:
            e = NULL
        if e == NULL:
            raise StopIteration
        return cm_entry_tuple(<const void *>e, self.with_ts)


def flat_column_lookup(list maps not None, kgs, keys, namespaces, now=0, ttl=0):
    """Look up ``(keys[i], namespaces[i])`` in ``maps[kgs[i]]`` for every row, reading
    only: ``keys`` and ``namespaces`` int64 arrays (the namespaces stored as int
    objects: a MapState's keys under its user keys), ``kgs`` an int32 array,
    ``maps`` FlatStateMap or None. Returns a uint8 array: 1 live, 0 absent,
    2 expired at ``now`` (``ttl`` > 0; left in place), 3 undecided (an entry of
    the row's hash whose key or namespace is no int, which may equal it: look
    the row up the general way). No Python object is made or called, so the
    rows' answers are those of one moment. O(len(keys)).
    """
    import numpy as np
    cdef const int32_t[::1] kv = kgs
    cdef const int64_t[::1] uv = keys
    cdef const int64_t[::1] nv = namespaces
    cdef Py_ssize_t i, k, n = kv.shape[0], nmaps = len(maps)
    if uv.shape[0] != n or nv.shape[0] != n:
        raise ValueError(f"columns of different lengths: {n} key groups, {uv.shape[0]} keys, {nv.shape[0]} namespaces")
    cdef int64_t c_now = _as_time(now, "now"), c_ttl = _as_ts(ttl, "ttl")
    if c_ttl != 0:
        cm_check_ttl(c_ttl)
    out = np.zeros(n, dtype=np.uint8)
    if n == 0:
        return out
    cdef uint8_t[::1] ov = out
    cdef uint8_t *seen = <uint8_t *>PyMem_Calloc(nmaps if nmaps else 1, 1)
    cdef fm_map **fms = <fm_map **>PyMem_Calloc(nmaps if nmaps else 1, sizeof(fm_map *))
    held = []
    try:
        if seen == NULL or fms == NULL:
            raise MemoryError()
        i = cm_col_seen(&kv[0], n, nmaps, seen)
        if i >= 0:
            raise ValueError(f"key group {kv[i]} of row {i} is not within 0..{nmaps - 1}")
        for k in range(nmaps):
            if not seen[k] or maps[k] is None:
                continue
            if type(maps[k]) is not FlatStateMap:
                raise TypeError(f"maps[{k}] must be a FlatStateMap or None, not {type(maps[k]).__name__}")
            held.append(maps[k])
            fms[k] = &(<FlatStateMap>maps[k]).m  # (read only once every map is entered)
        entered = 0
        try:
            for m in held:  # each map once; a busy one fails the call before anything is read
                fm_enter(&(<FlatStateMap>m).m)
                entered += 1
            fm_col_lookup(fms, &kv[0], &uv[0], &nv[0], n, c_now, c_ttl, &ov[0])
        finally:
            for m in held[:entered]:
                fm_leave(&(<FlatStateMap>m).m)
    finally:
        PyMem_Free(seen)
        PyMem_Free(fms)
    return out
