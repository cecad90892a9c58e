"""Flink 2.x's async state API over cowmap's keyed state (DESIGN.md §4).

So far: ``StateFuture`` with ``StateFutureUtils`` and the task thread's
``Mailbox``; the key-ordered ``AsyncExecutionController`` and the async twins
of the state methods come next.
"""

from cowmap.asyncstate.future import StateFuture, StateFutureUtils
from cowmap.asyncstate.mailbox import Mailbox

__all__ = ["Mailbox", "StateFuture", "StateFutureUtils"]
