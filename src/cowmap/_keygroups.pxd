# Key-group assignment for the key context (_context.pyx).

cdef long key_group_of(object key, long max_parallelism) except -1
cdef long spark_key_group_of(object key, tuple codes, long max_parallelism) except -1
