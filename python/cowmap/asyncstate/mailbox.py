"""The task thread's mailbox (Flink's ``MailboxProcessor`` model, single consumer).

Callbacks and state changes run only on the task thread, the thread that made
the mailbox. Any thread may ``post`` a mail (a callable); the task thread runs
mails in posting order from ``run_available`` / ``run_until``. Posting is a
deque append (atomic under the GIL): no lock on the hot path.
"""

from __future__ import annotations

import collections
import threading
import time
from typing import Callable

__all__ = ["Mailbox"]


class Mailbox:
    """A FIFO of mails run by the task thread.

    An exception raised by a mail propagates out of ``run_available`` /
    ``run_until`` on the task thread (it fails the processing, as in Flink);
    the mails after it stay queued.
    """

    __slots__ = ("_mails", "_wakeup", "_task_thread", "mails_run")

    def __init__(self) -> None:
        self._mails: collections.deque[Callable[[], object]] = collections.deque()
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

    def __len__(self) -> int:
        return len(self._mails)

    def run_available(self) -> int:
        """Run the mails queued now (and those they post); returns how many ran."""
        self._check_task_thread("run_available")
        mails = self._mails
        n = 0
        while mails:
            mail = mails.popleft()
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
            wait = None if deadline is None else deadline - time.monotonic()
            if wait is not None and wait <= 0:
                return False
            self._wakeup.wait(wait)
