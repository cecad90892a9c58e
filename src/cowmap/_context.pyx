# cython: language_level=3
"""The key context of a keyed-state backend and the compiled base of its state views.

A ``KeyContext`` holds what every state access reads: the current key and its key
group, the clock, the key-group range the backend owns, the TTL tables that clean up
on every record and the backend's async controller (Flink's ``InternalKeyContext``).
The backend owns one and hands it to each state view (``StateView._kc``) and to the
controller; compiled code reads its fields by name, so a rename breaks the build.
Python reads the hot fields through member descriptors (see members.h), as fast as
``__slots__``.
"""

cimport cython

from cowmap._keygroups cimport key_group_of, spark_key_group_of

from cowmap._keygroups import column_key_groups, spark_column_key_groups

cdef extern from "members.h":
    int cm_expose_member(object type, const char *name, Py_ssize_t offset, int writable) except -1

cdef extern from *:
    """
    #define CM_KC_OFF(f) offsetof(struct cm_KeyContext, f)
    #define CM_SV_OFF(f) offsetof(struct cm_StateView, f)
    #define CM_TC_OFF(f) offsetof(struct cm_TableCore, f)
    """
    Py_ssize_t KC_KEY "CM_KC_OFF(key)"
    Py_ssize_t KC_KEY_GROUP "CM_KC_OFF(key_group)"
    Py_ssize_t KC_CLOCK "CM_KC_OFF(clock)"
    Py_ssize_t KC_CLEANUPS "CM_KC_OFF(record_cleanups)"
    Py_ssize_t KC_AEC "CM_KC_OFF(aec)"
    Py_ssize_t SV_T "CM_SV_OFF(_t)"
    Py_ssize_t SV_KC "CM_SV_OFF(_kc)"
    Py_ssize_t SV_NS "CM_SV_OFF(_ns)"
    Py_ssize_t SV_DEFAULT "CM_SV_OFF(_default)"
    Py_ssize_t SV_C "CM_SV_OFF(_c)"
    Py_ssize_t SV_C_KEY "CM_SV_OFF(_c_key)"
    Py_ssize_t TC_MAPS "CM_TC_OFF(maps)"
    Py_ssize_t TC_TTL "CM_TC_OFF(ttl)"
    Py_ssize_t TC_UPDATE_ON_READ "CM_TC_OFF(update_on_read)"
    Py_ssize_t TC_RETURN_EXPIRED "CM_TC_OFF(return_expired)"
    Py_ssize_t TC_CLEANUP_SIZE "CM_TC_OFF(cleanup_size)"
    Py_ssize_t TC_TICKS "CM_TC_OFF(ticks)"


@cython.auto_pickle(False)
@cython.final
cdef public class KeyContext [object cm_KeyContext, type cm_KeyContextType]:
    """The current key of a backend and what goes with it.

    Read-only from Python (``key``, ``key_group``, ``clock``, ``record_cleanups``,
    ``aec``, ``max_parallelism``, ``lo``, ``hi``): the key changes only through
    :meth:`set_current_key`, which checks it. Single-threaded, as the backend is.
    """

    def __init__(self, long max_parallelism, long lo, long hi, clock, spark_codes=None):
        if max_parallelism < 1 or max_parallelism > 32768:
            raise ValueError(f"max_parallelism must be within 1..32768, got {max_parallelism}")
        if not 0 <= lo <= hi < max_parallelism:
            raise ValueError(f"key-group range {lo}..{hi} is not within 0..{max_parallelism - 1}")
        if not callable(clock):
            raise TypeError(f"clock must be callable, not {type(clock).__name__}")
        self.max_parallelism = max_parallelism
        self.lo = lo
        self.hi = hi
        self.clock = clock
        self.key = None
        self.key_group = None
        self.record_cleanups = []
        self.aec = None
        self.spark_codes = None if spark_codes is None else tuple(spark_codes)

    def set_current_key(self, key):
        """Make ``key`` the key that state accesses read and write. O(len(key)).

        ``TypeError`` for None / unhashable keys, ``ValueError`` for a key outside
        the backend's key-group range."""
        self.switch(key, self.key_group_of(key))

    def enter_row(self, key, key_group):
        """Make ``key`` current as a record of its own starts (the tables that
        clean up on every record take a step), ``key_group`` being its key group
        as the caller computed and checked it. For the columnar calls' row
        loops; everything else goes through :meth:`set_current_key`."""
        self.switch(key, key_group)

    def restore_key(self, key, key_group):
        """Make ``key`` (of ``key_group``) current again after a row loop: no
        record starts, so nothing is cleaned up."""
        self.restore(key, key_group)

    def now(self):
        """The clock's time in milliseconds (``TypeError`` if it returns no int,
        ``ValueError`` for one beyond int64)."""
        now = self.clock()
        if type(now) is not int:
            if type(now) is bool or not hasattr(type(now), "__index__"):
                raise TypeError(f"time_provider must return int milliseconds, got {now!r}")
            now = now.__index__()  # (numpy integers)
        if not -(2**63) <= now < 2**63:
            raise ValueError(f"time_provider's time {now} is beyond int64 milliseconds")
        return now

    def column_key_groups(self, keys):
        """The key groups of a column (an int64 array or a tuple of keys) by this
        context's function, each checked to be within ``lo..hi``
        (``_keygroups.column_key_groups`` says how)."""
        if self.spark_codes is None:
            return column_key_groups(keys, self.max_parallelism, self.lo, self.hi)
        return spark_column_key_groups(keys, self.spark_codes, self.max_parallelism, self.lo, self.hi)

    def key_group_for(self, key):
        """The key group of ``key`` by this context's function (Flink's, or
        Spark's with ``spark_codes``), owned or not."""
        if self.spark_codes is not None:
            return spark_key_group_of(key, self.spark_codes, self.max_parallelism)
        return key_group_of(key, self.max_parallelism)

    cdef object key_group_of(self, object key):
        """The key group of ``key``; ValueError if this backend does not own it."""
        cdef long kg
        if self.spark_codes is None:
            kg = key_group_of(key, self.max_parallelism)
        else:
            kg = spark_key_group_of(key, self.spark_codes, self.max_parallelism)
        if not self.lo <= kg <= self.hi:
            raise ValueError(
                f"key {key!r} is in key group {kg}, outside this backend's range "
                f"KeyGroupRange({self.lo}, {self.hi})"
            )
        return kg

    cdef int switch(self, object key, object key_group) except -1:
        """Make ``key`` (already checked, of ``key_group``) current: a record starts,
        so the tables that clean up on every record take a step."""
        self.key = key
        self.key_group = key_group
        cleanups = self.record_cleanups
        if cleanups:
            for t in cleanups:
                t.cleanup_step()
        return 0

    cdef int restore(self, object key, object key_group) except -1:
        """Make ``key`` current again after code that switched keys (a batch, a
        nested record): no record starts, so no cleanup step runs."""
        self.key = key
        self.key_group = key_group
        return 0

    def __repr__(self):
        return f"<KeyContext key={self.key!r} key_group={self.key_group!r}>"


@cython.auto_pickle(False)
cdef public class StateView [object cm_StateView, type cm_StateViewType]:
    """The compiled base of the state views: their table, the backend's key context
    and their current namespace (``_t``, ``_kc``, ``_ns``, read-only from Python);
    for the compiled accesses, what a read of no value gives (``_default``) and
    MapState's core namespace of the current key (``_c`` for the key ``_c_key``)."""

    def __init__(self, table, KeyContext kc not None, namespace):
        self._t = table
        self._kc = kc
        self._set_namespace(namespace)

    def set_current_namespace(self, namespace):
        """Scope later calls to ``namespace`` (e.g. a window). ``TypeError`` for None
        or an unhashable namespace."""
        self._set_namespace(namespace)

    cdef int _set_namespace(self, namespace) except -1:
        if namespace is None:
            raise TypeError("namespace must not be None (use VOID_NAMESPACE for no namespace)")
        hash(namespace)  # unhashable -> TypeError now, not at the first access
        if isinstance(namespace, float) and namespace != namespace:
            raise ValueError("namespace must not be NaN: a NaN equals no other NaN in Python, so its state "
                             "could never be found again")
        self._ns = namespace
        return 0

    def get_current_namespace(self):
        return self._ns


for _name, _off in ((b"key", KC_KEY), (b"key_group", KC_KEY_GROUP), (b"clock", KC_CLOCK),
                    (b"record_cleanups", KC_CLEANUPS), (b"aec", KC_AEC)):
    cm_expose_member(KeyContext, _name, _off, 0)
for _name, _off in ((b"_t", SV_T), (b"_kc", SV_KC), (b"_ns", SV_NS)):
    cm_expose_member(StateView, _name, _off, 0)
for _name, _off in ((b"_default", SV_DEFAULT), (b"_c", SV_C), (b"_c_key", SV_C_KEY)):
    cm_expose_member(StateView, _name, _off, 1)


@cython.auto_pickle(False)
cdef public class TableCore [object cm_TableCore, type cm_TableCoreType]:
    """The compiled base of the state tables: the fields a state access reads
    (``maps``, ``ttl``, ``update_on_read``, ``return_expired``, ``cleanup_size``,
    ``ticks``), so that compiled accesses (``ValueState.value``/``update``) read
    them by field. Python reads and writes them as it would ``__slots__``; the
    table's code sets them (``StateTable.configure``)."""


for _name, _off in ((b"maps", TC_MAPS), (b"ttl", TC_TTL), (b"update_on_read", TC_UPDATE_ON_READ),
                    (b"return_expired", TC_RETURN_EXPIRED), (b"cleanup_size", TC_CLEANUP_SIZE),
                    (b"ticks", TC_TICKS)):
    cm_expose_member(TableCore, _name, _off, 1)
del _name, _off


from cpython.weakref cimport PyWeakref_NewRef


cdef extern from "weakref_compat.h":
    object cm_weakref_get(object ref)  # the referent, None once dead


@cython.auto_pickle(False)
@cython.final
cdef class TableCopier:
    """A state table's ``copy_state`` for its core maps, through a weak reference:
    the maps (which the table holds) then do not hold the table, so a dropped
    backend is freed at once by reference counting, not by a later full
    collection, which would pause for as long as freeing every entry takes.
    Calls ``type(table).copy_state(table, state)``: no bound method made per
    copy. A map used after its state is gone raises ``RuntimeError`` when it
    has to copy."""

    cdef object _ref
    cdef object _fn

    def __cinit__(self, table):
        self._ref = PyWeakref_NewRef(table, None)
        self._fn = type(table).copy_state

    def __call__(self, state):
        table = cm_weakref_get(self._ref)
        if table is None:
            raise RuntimeError("the state this map belongs to is gone: nothing to copy its values with")
        return self._fn(table, state)
