"""A plain-Python model of a timer service's queue of one time domain, for the timer tests.

Flink's semantics: at most one timer per (key, namespace, timestamp), and timers
fire in timestamp order. The order among timers of equal timestamps is left open
(Flink's heap backend and its RocksDB backend differ, and so may cowmap), so the
model fires ties in an order of its own and tests compare firing sequences with
each run of equal timestamps sorted (:func:`normalise_ties`). (Flink's semantics
are checked against Flink itself: test_timer_parity.py.)
"""

from __future__ import annotations

import itertools
from typing import Any

Timer = tuple[int, Any, Any]  # (ts, key, namespace)


class TimerQueueModel:
    """One time domain's timers: a set."""

    def __init__(self) -> None:
        self.timers: set[Timer] = set()

    def add(self, t: Timer) -> bool:
        if t in self.timers:
            return False
        self.timers.add(t)
        return True

    def remove(self, t: Timer) -> bool:
        if t not in self.timers:
            return False
        self.timers.remove(t)
        return True

    def peek(self) -> Timer | None:
        return min(self.timers, key=_order) if self.timers else None

    def poll(self) -> Timer:
        t = self.peek()
        assert t is not None
        self.timers.remove(t)
        return t

    def __len__(self) -> int:
        return len(self.timers)

    def all(self) -> set[Timer]:
        return set(self.timers)


def _order(t: Timer) -> tuple[int, str]:
    return t[0], repr(t[1:])


def normalise_ties(fired: list[tuple[Any, ...]]) -> list[tuple[Any, ...]]:
    """``fired`` ((domain, ts, key, namespace) tuples) with each run of consecutive
    firings of one domain and timestamp sorted."""
    out: list[tuple[Any, ...]] = []
    for _, run in itertools.groupby(fired, key=lambda f: (f[0], f[1])):
        out += sorted(run, key=repr)
    return out
