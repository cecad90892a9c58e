"""A plain-Python model of cowmap's timer queues, for the timer tests.

A timer service keeps the timers of one time domain in a heap per key group (a
heap *set*: one timer per key, namespace and timestamp) and a heap of those
heaps ordered by their heads; timers compare by timestamp only, so the order in
which timers of equal timestamps fire follows from the heap moves. This model
makes those moves with plain lists and dicts (1-based binary heaps, the
textbook sift-up / sift-down, a removed timer's place taken by the last one),
so a test can compare whole firing sequences, ties included. (Flink's semantics
are checked against Flink itself: test_timer_parity.py.)
"""

from __future__ import annotations

from typing import Any

from cowmap import key_group_for

Timer = tuple[int, Any, Any]  # (ts, key, namespace)


class _Heap:
    """A 1-based binary min-heap of items with a position index; ``less`` orders items."""

    def __init__(self, less: Any) -> None:
        self.a: list[Any] = [None]
        self.pos: dict[Any, int] = {}
        self.less = less

    def __len__(self) -> int:
        return len(self.a) - 1

    def peek(self) -> Any:
        return self.a[1] if len(self.a) > 1 else None

    def _put(self, item: Any, i: int) -> None:
        self.a[i] = item
        self.pos[item] = i

    def sift_up(self, i: int) -> None:
        cur = self.a[i]
        parent = i >> 1
        while parent > 0 and self.less(cur, self.a[parent]):
            self._put(self.a[parent], i)
            i, parent = parent, parent >> 1
        self._put(cur, i)

    def sift_down(self, i: int) -> None:
        a, n, cur = self.a, len(self.a) - 1, self.a[i]
        child = i << 1
        if child + 1 <= n and self.less(a[child + 1], a[child]):
            child += 1
        while child <= n and self.less(a[child], cur):
            self._put(a[child], i)
            i = child
            child = i << 1
            if child + 1 <= n and self.less(a[child + 1], a[child]):
                child += 1
        self._put(cur, i)

    def adjust(self, item: Any) -> None:
        i = self.pos[item]
        self.sift_down(i)
        if self.a[i] is item or self.a[i] == item:
            self.sift_up(i)

    def add(self, item: Any) -> bool:
        """Adds ``item``; whether it is the new head."""
        self.a.append(item)
        self.pos[item] = len(self.a) - 1
        self.sift_up(len(self.a) - 1)
        return self.pos[item] == 1

    def remove(self, item: Any) -> bool:
        """Removes ``item``; whether it was the head."""
        i = self.pos.pop(item)
        last = self.a.pop()
        if i != len(self.a):
            self._put(last, i)
            self.adjust(last)
        return i == 1


class TimerQueueModel:
    """One time domain's timers of a service over key groups ``lo..hi``."""

    def __init__(self, max_parallelism: int, lo: int, hi: int) -> None:
        self.max_parallelism = max_parallelism
        self.lo = lo
        self.kgs = [_Heap(lambda x, y: x[0] < y[0]) for _ in range(lo, hi + 1)]
        self.hoh = _Heap(self._kg_less)
        for i in range(len(self.kgs)):  # all empty: they stay in key-group order
            self.hoh.add(i)

    def _kg_less(self, a: int, b: int) -> bool:
        ha, hb = self.kgs[a].peek(), self.kgs[b].peek()
        if ha is None:
            return False
        return hb is None or ha[0] < hb[0]

    def _kg(self, key: Any) -> int:
        return key_group_for(key, self.max_parallelism) - self.lo

    def add(self, t: Timer) -> bool:
        g = self._kg(t[1])
        h = self.kgs[g]
        if t in h.pos:
            return False
        if h.add(t):
            self.hoh.adjust(g)
        return True

    def remove(self, t: Timer) -> bool:
        g = self._kg(t[1])
        h = self.kgs[g]
        if t not in h.pos:
            return False
        if h.remove(t):
            self.hoh.adjust(g)
        return True

    def peek(self) -> Timer | None:
        return self.kgs[self.hoh.peek()].peek() if self.kgs else None

    def poll(self) -> Timer:
        g = self.hoh.peek()
        t = self.kgs[g].peek()
        self.kgs[g].remove(t)
        self.hoh.adjust(g)
        return t

    def __len__(self) -> int:
        return sum(len(h) for h in self.kgs)

    def all(self) -> set[Timer]:
        return {t for h in self.kgs for t in h.a[1:]}

    def heap_order(self, kg: int) -> list[Timer]:
        """Key group ``kg``'s timers in heap-array order (how snapshots hold them)."""
        return list(self.kgs[kg - self.lo].a[1:]) if self.lo <= kg < self.lo + len(self.kgs) else []
