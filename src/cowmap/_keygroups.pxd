# The current-key switch of a KeyedStateBackend, for the async controller (_async.pyx).

cdef int switch_key(object backend, object key, object key_group) except -1
cdef object key_group_in_range(object backend, object key)
cdef int restore_key(object backend, object key, object key_group) except -1
cdef object current_key(object backend)
cdef object current_key_group(object backend)
