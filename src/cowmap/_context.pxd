# The key context of a KeyedStateBackend and the compiled base of its state views:
# what the compiled layers (_controller.pyx, _requests.pyx) read and write, by field.

cdef public class KeyContext [object cm_KeyContext, type cm_KeyContextType]:
    cdef object key              # the current key; None until one is set
    cdef object key_group        # its key group (an int); None until a key is set
    cdef object clock            # the time provider: a callable returning int milliseconds
    cdef list record_cleanups    # the TTL tables that run a cleanup step on every record
    cdef object aec              # a weak reference to the backend's AsyncExecutionController, or None
    cdef readonly long max_parallelism
    cdef readonly long lo        # the key-group range owned, inclusive
    cdef readonly long hi
    cdef readonly tuple spark_codes  # Spark's key groups over these key-column types, or None: Flink's

    cdef object key_group_of(self, object key)
    cdef int switch(self, object key, object key_group) except -1
    cdef int restore(self, object key, object key_group) except -1


cdef public class StateView [object cm_StateView, type cm_StateViewType]:
    cdef object _t               # the state's table (its maps and settings)
    cdef KeyContext _kc          # the backend's key context
    cdef object _ns              # the view's current namespace
    cdef object _default         # what a read of no value gives (the descriptor's default_value)
    cdef object _c               # MapState: the core namespace of the current key's entries, cached...
    cdef object _c_key           # ... for this key object (None: nothing cached; no key is None)

    cdef int _set_namespace(self, namespace) except -1


cdef public class TableCore [object cm_TableCore, type cm_TableCoreType]:
    # The compiled base of the state tables: the fields every state access reads.
    cdef object maps             # a list: the map of each key group, None until written
    cdef object ttl              # int ms; 0: no TTL
    cdef object update_on_read   # bool: a TTL read refreshes the entry's timestamp
    cdef object return_expired   # bool: an expired value not yet cleaned up is still returned
    cdef object cleanup_size     # int: incremental cleanup's entries per access; 0: none
    cdef object ticks            # int: accesses until the next cleanup sweep
