"""``StateFuture``: the result of an async state request (Flink 2.x's ``StateFuture``).

Callbacks registered with ``then_*`` run on the task thread: inline when the
future is already complete, else when it completes — right away if it is
completed on the task thread, otherwise through a mail posted to the task
thread's mailbox. An exception raised by a callback completes the derived
future exceptionally and is re-raised where the task thread runs that
callback, so it fails the processing instead of being swallowed.

Each future may belong to a record context (``retain()`` / ``release()``): as
in Flink's ``ContextStateFutureImpl`` it holds one reference until it
completes and one per registered callback until that callback has run, so the
context lives exactly as long as work of its record is pending.

Both classes are compiled (``src/cowmap/_future.pyx``): they are on the hot
path of every async request.
"""

from __future__ import annotations

from typing import Protocol

from cowmap._future import StateFuture, StateFutureUtils

__all__ = ["RecordContextLike", "StateFuture", "StateFutureUtils"]



class RecordContextLike(Protocol):
    def retain(self) -> None: ...
    def release(self) -> None: ...
