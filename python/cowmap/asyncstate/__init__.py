"""Flink 2.x's async state API over cowmap's keyed state (see docs/architecture.md#the-async-layer).

``AsyncExecutionController`` runs records' async state requests in key order and
in batches; ``StateFuture`` chains the results; the ``Mailbox`` is the task
thread's queue. The async twins (``async_value``, ``async_get``, ...) are
methods of the state objects.

    >>> from cowmap.state import KeyedStateBackend, ValueStateDescriptor
    >>> backend = KeyedStateBackend()
    >>> count = backend.get_state(ValueStateDescriptor("count", default_value=0))
    >>> aec = AsyncExecutionController(backend)
    >>> for word in "a b a c a".split():
    ...     aec.process(word, lambda _: count.async_value().then_compose(lambda n: count.async_update(n + 1)))
    >>> aec.drain()
    >>> backend.set_current_key("a"); count.value()
    3
"""

from cowmap.asyncstate.controller import AsyncExecutionController, EpochMode, RecordContext
from cowmap.asyncstate.future import StateFuture, StateFutureUtils
from cowmap.asyncstate.iterator import StateIterator
from cowmap.asyncstate.mailbox import Mailbox

__all__ = [
    "AsyncExecutionController",
    "EpochMode",
    "Mailbox",
    "RecordContext",
    "StateFuture",
    "StateFutureUtils",
    "StateIterator",
]
