"""Keyed timers: Flink's ``InternalTimerService`` over the backend's key groups.

    >>> from cowmap import KeyedStateBackend, TimeDomain
    >>> backend = KeyedStateBackend()
    >>> fired = []
    >>> timers = backend.get_timer_service("sessions", lambda ts, key, ns, domain: fired.append((ts, key)))
    >>> backend.set_current_key("alice")
    >>> timers.register_event_time_timer(1_000)
    >>> timers.register_event_time_timer(1_000)  # one timer per key, namespace and time
    >>> backend.set_current_key("bob")
    >>> timers.register_event_time_timer(500)
    >>> timers.advance_watermark(1_000)
    2
    >>> fired
    [(500, 'bob'), (1000, 'alice')]

A service keeps one heap of timers per key group per time domain (compiled,
with a position index: register and delete are O(log n)), and a heap of those
heaps to find the earliest timer of all. Timers are part of
``backend.snapshot()`` and of checkpoints, and are restored by key group, so they
rescale with the state; the watermark is not restored (as in Flink).
"""

from __future__ import annotations

import enum

from cowmap._timers import NO_WATERMARK, TimerService, TimerSnapshot

__all__ = ["NO_WATERMARK", "TimeDomain", "TimerService", "TimerSnapshot"]


class TimeDomain(enum.IntEnum):
    """Which clock a timer follows (PyFlink's ``TimeDomain``)."""

    #: fires from ``advance_watermark``
    EVENT_TIME = 0
    #: fires from ``advance_processing_time`` (or the async controller's mailbox)
    PROCESSING_TIME = 1
