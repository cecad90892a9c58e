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

The controller is compiled (``src/cowmap/_controller.pyx``; the futures and
contexts it drives are in ``_future.pyx``). A batch hands the requests of one state and type to that state in one call:
ValueState reads and writes and MapState gets and puts go to the core as one
multi-map call (``multi_get`` / ``multi_put`` / ``multi_replace``); other
requests run one by one through the synchronous methods, with exactly their
semantics (as does a group whose vectorised call fails: each request then gets
its own outcome).
"""

from cowmap._controller import AsyncExecutionController, EpochMode
from cowmap._future import RecordContext

__all__ = ["AsyncExecutionController", "EpochMode", "RecordContext"]
