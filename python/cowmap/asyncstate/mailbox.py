"""The task thread's mailbox (Flink's ``MailboxProcessor`` model, single consumer).

Callbacks and state changes run only on the task thread, the thread that made
the mailbox. Any thread may ``post`` a mail (a callable); the task thread runs
mails in posting order from ``run_available`` / ``run_until``. Posting is a
deque append (atomic under the GIL): no lock on the hot path. The task thread
may also post a mail to run after a delay (``post_delayed``: the controller's
buffer timeout); it runs when the task thread next runs its mailbox after the
delay, and ``run_until`` wakes up for it. No thread is started for it.
"""

from __future__ import annotations

import collections
import heapq
import itertools
import math
import threading
import time
from collections.abc import Callable

__all__ = ["Mailbox"]


class Mailbox:
    """A FIFO of mails run by the task thread.

    An exception raised by a mail propagates out of ``run_available`` /
    ``run_until`` on the task thread (it fails the processing, as in Flink);
    the mails after it stay queued.
    """

    __slots__ = ("_mails", "_timed", "_timed_seq", "_wakeup", "_task_thread", "mails_run")

    def __init__(self) -> None:
        self._mails: collections.deque[Callable[[], object]] = collections.deque()
        # delayed mails: a heap of (due time on time.monotonic, sequence, mail)
        self._timed: list[tuple[float, int, Callable[[], object]]] = []
        self._timed_seq = itertools.count()
        self._wakeup = threading.Event()
        self._task_thread = threading.get_ident()
        #: how many mails have run (a gauge)
        self.mails_run = 0

    def is_task_thread(self) -> bool:
        return threading.get_ident() == self._task_thread

    def _check_task_thread(self, what: str) -> None:
        if threading.get_ident() != self._task_thread:
            raise RuntimeError(f"{what} must be called from the task thread that made the mailbox")

    def post(self, mail: Callable[[], object]) -> None:
        """Queue ``mail`` to run on the task thread. Safe from any thread."""
        if not callable(mail):
            raise TypeError(f"a mail must be callable, not {type(mail).__name__}")
        self._mails.append(mail)
        self._wakeup.set()

    def post_delayed(self, delay: float, mail: Callable[[], object]) -> None:
        """Queue ``mail`` to run once ``delay`` seconds have passed, the next time
        the task thread runs its mailbox after that. Task thread only."""
        self._check_task_thread("post_delayed")
        if not callable(mail):
            raise TypeError(f"a mail must be callable, not {type(mail).__name__}")
        if type(delay) is bool or not isinstance(delay, (int, float)):
            raise TypeError(f"delay must be a number of seconds, not {type(delay).__name__}")
        if not (0 <= delay < math.inf):
            raise ValueError(f"delay must be finite and >= 0, got {delay!r}")
        heapq.heappush(self._timed, (time.monotonic() + delay, next(self._timed_seq), mail))

    def __len__(self) -> int:
        """The mails ready to run (delayed ones count once due)."""
        return len(self._mails)

    @property
    def delayed(self) -> int:
        """The delayed mails not run yet."""
        return len(self._timed)

    def _next_due(self) -> float | None:
        return self._timed[0][0] if self._timed else None

    def run_available(self) -> int:
        """Run the mails queued now (and those they post) and the delayed mails
        that are due; returns how many ran."""
        self._check_task_thread("run_available")
        mails = self._mails
        timed = self._timed
        n = 0
        while True:
            while mails:
                mail = mails.popleft()
                n += 1
                self.mails_run += 1
                mail()
            if not timed or timed[0][0] > time.monotonic():
                break
            mail = heapq.heappop(timed)[2]
            n += 1
            self.mails_run += 1
            mail()
        self._wakeup.clear()
        if mails:  # posted between the last popleft and clear()
            self._wakeup.set()
        return n

    def run_until(self, done: Callable[[], bool], timeout: float | None = None) -> bool:
        """Run mails, waiting for more, until ``done()``; False on timeout (seconds)."""
        self._check_task_thread("run_until")
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            self.run_available()
            if done():
                return True
            now = time.monotonic()
            wait = None if deadline is None else deadline - now
            if wait is not None and wait <= 0:
                return False
            due = self._next_due()
            if due is not None:  # wake up for the next delayed mail
                wait = due - now if wait is None else min(wait, due - now)
            self._wakeup.wait(max(wait, 0.0) if wait is not None else None)
