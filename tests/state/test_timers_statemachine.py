"""Hypothesis state machine: timer services against ``timer_model`` (Flink's semantics).

Rules register and delete timers of both domains for random keys and namespaces,
advance the watermark and processing time (``on_timer`` registers and deletes
timers too, some due in the same advance), and take, check, restore and release
snapshots, at the same parallelism and split over 2-3 backends then merged back.
Firing sequences must equal the model's, each run of equal timestamps compared as
a set (their order is left open; ``on_timer``'s reactions below touch only later
timestamps of the firing timer's own key and namespace, so that order cannot
change what fires).
"""

from __future__ import annotations

import copy
from typing import Any

import hypothesis.strategies as st
from hypothesis import settings
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule
from timer_model import TimerQueueModel, normalise_ties

from cowmap import (
    VOID_NAMESPACE,
    KeyedStateBackend,
    KeyGroupRange,
    TimeDomain,
    key_group_for,
    key_group_range_for_operator,
)

MAXP = 8
KEYS = st.integers(0, 9) | st.sampled_from(["a", "b", ("t", 1)])
NAMESPACES = st.sampled_from([VOID_NAMESPACE, "w1", 3])
TS = st.integers(-3, 25)
DOMAINS = st.sampled_from(list(TimeDomain))


def _code(key: Any) -> int:
    return key if isinstance(key, int) else len(str(key))


class TimerMachine(RuleBasedStateMachine):
    @initialize()
    def setup(self) -> None:
        self.backend, self.svc = self._new_backend(KeyGroupRange(0, MAXP - 1))
        self.models = {d: TimerQueueModel() for d in TimeDomain}
        self.key: Any = None
        self.snapshots: list[tuple[Any, dict[TimeDomain, TimerQueueModel]]] = []
        self.fired: list[tuple[Any, ...]] = []
        self.wm: int | None = None

    def _new_backend(self, kgr: KeyGroupRange) -> tuple[KeyedStateBackend, Any]:
        b = KeyedStateBackend(max_parallelism=MAXP, key_group_range=kgr)
        return b, b.get_timer_service("t", self._on_timer)

    # what on_timer does, on the service and the model alike: a function of the timer
    def _reactions(self, ts: int, key: Any, ns: Any, domain: TimeDomain) -> list[tuple[str, int]]:
        c = _code(key) + ts
        out = []
        if c % 3 == 0:
            out.append(("register", ts + 1 + c % 4))  # often due already: fires in this advance
        if c % 5 == 0:
            out.append(("delete", ts + 1))
        return out

    def _on_timer(self, ts: int, key: Any, ns: Any, domain: TimeDomain) -> None:
        assert self.backend.get_current_key() == key
        assert self.backend.get_current_key_group() == key_group_for(key, MAXP)
        self.fired.append((domain, ts, key, ns))
        for what, t in self._reactions(ts, key, ns, domain):
            if what == "register":
                if domain is TimeDomain.EVENT_TIME:
                    self.svc.register_event_time_timer(t, namespace=ns)
                else:
                    self.svc.register_processing_time_timer(t, namespace=ns)
            elif domain is TimeDomain.EVENT_TIME:
                self.svc.delete_event_time_timer(t, namespace=ns)
            else:
                self.svc.delete_processing_time_timer(t, namespace=ns)

    def _model_fire(self, domain: TimeDomain, upto: int) -> list[tuple[Any, ...]]:
        m = self.models[domain]
        out = []
        while (head := m.peek()) is not None and head[0] <= upto:
            ts, key, ns = m.poll()
            out.append((domain, ts, key, ns))
            for what, t in self._reactions(ts, key, ns, domain):
                (m.add if what == "register" else m.remove)((t, key, ns))
        return out

    # ------------------------------------------------------------ rules

    @rule(key=KEYS)
    def set_key(self, key: Any) -> None:
        self.backend.set_current_key(key)
        self.key = key

    @precondition(lambda self: self.key is not None)
    @rule(domain=DOMAINS, ts=TS, ns=NAMESPACES)
    def register(self, domain: TimeDomain, ts: int, ns: Any) -> None:
        if domain is TimeDomain.EVENT_TIME:
            self.svc.register_event_time_timer(ts, namespace=ns)
        else:
            self.svc.register_processing_time_timer(ts, namespace=ns)
        self.models[domain].add((ts, self.key, ns))

    @rule(domain=DOMAINS, timers=st.lists(st.tuples(KEYS, st.integers(0, 3)), max_size=16))
    def register_ties(self, domain: TimeDomain, timers: list[tuple[Any, int]]) -> None:
        """Many timers of few timestamps."""
        for key, ts in timers:
            self.set_key(key)
            self.register(domain, ts, VOID_NAMESPACE)

    @rule(domain=DOMAINS, timers=st.lists(st.tuples(KEYS, TS, NAMESPACES), min_size=40, max_size=150))
    def register_many(self, domain: TimeDomain, timers: list[tuple[Any, int, Any]]) -> None:
        """Enough timers for an advance to take a key group's due ones out in one go."""
        for key, ts, ns in timers:
            self.set_key(key)
            self.register(domain, ts, ns)

    @precondition(lambda self: self.key is not None)
    @rule(domain=DOMAINS, ts=TS, ns=NAMESPACES)
    def delete(self, domain: TimeDomain, ts: int, ns: Any) -> None:
        if domain is TimeDomain.EVENT_TIME:
            self.svc.delete_event_time_timer(ts, namespace=ns)
        else:
            self.svc.delete_processing_time_timer(ts, namespace=ns)
        self.models[domain].remove((ts, self.key, ns))

    @rule(wm=TS)
    def advance_watermark(self, wm: int) -> None:
        self.fired = []
        n = self.svc.advance_watermark(wm)
        if self.wm is not None and wm <= self.wm:
            assert n == 0 and self.fired == []
        else:
            self.wm = wm
            expected = self._model_fire(TimeDomain.EVENT_TIME, wm)
            assert normalise_ties(self.fired) == normalise_ties(expected)
            assert n == len(expected)
        assert self.svc.current_watermark() == self.wm if self.wm is not None else True
        assert self.backend.get_current_key() == self.key  # the caller's key again

    @rule(now=TS)
    def advance_processing_time(self, now: int) -> None:
        self.fired = []
        n = self.svc.advance_processing_time(now)
        expected = self._model_fire(TimeDomain.PROCESSING_TIME, now)
        assert normalise_ties(self.fired) == normalise_ties(expected)
        assert n == len(expected)
        assert self.backend.get_current_key() == self.key

    @rule()
    def take_snapshot(self) -> None:
        self.snapshots.append((self.backend.snapshot(), copy.deepcopy(self.models)))

    def _check_snapshot(self, snap: Any, models: dict[TimeDomain, TimerQueueModel]) -> None:
        got = {d: set() for d in TimeDomain}
        for domain, ts, key, ns in snap.timers("t"):
            got[domain].add((ts, key, ns))
        for d in TimeDomain:
            assert got[d] == models[d].all()

    @staticmethod
    def _restored_model(parts: list[tuple[KeyGroupRange, dict[TimeDomain, TimerQueueModel]]]) -> dict:
        """The model after restoring ``parts`` into a full-range backend: their
        timers of the key groups each part owns."""
        out = {d: TimerQueueModel() for d in TimeDomain}
        for kgr, models in parts:
            for d in TimeDomain:
                for t in models[d].all():
                    if key_group_for(t[1], MAXP) in kgr:
                        out[d].add(t)
        return out

    @precondition(lambda self: self.snapshots)
    @rule(i=st.integers(0, 5))
    def restore_snapshot(self, i: int) -> None:
        snap, models = self.snapshots[i % len(self.snapshots)]
        self._check_snapshot(snap, models)
        self.backend, self.svc = self._new_backend(KeyGroupRange(0, MAXP - 1))
        self.backend.restore(snap)
        self.models = self._restored_model([(KeyGroupRange(0, MAXP - 1), models)])
        self.key, self.wm = None, None  # the watermark is not restored

    @rule(parallelism=st.integers(2, 3))
    def rescale_and_merge(self, parallelism: int) -> None:
        snap = self.backend.snapshot()
        parts = []
        for i in range(parallelism):
            kgr = key_group_range_for_operator(MAXP, parallelism, i)
            b = KeyedStateBackend(max_parallelism=MAXP, key_group_range=kgr)
            b.restore(snap)
            svc = b.get_timer_service("t")
            for d in TimeDomain:
                want = {t for t in self.models[d].all() if key_group_for(t[1], MAXP) in kgr}
                assert set(svc.timers(d)) == want
            parts.append((kgr, b.snapshot()))
        snap.release()
        self.backend, self.svc = self._new_backend(KeyGroupRange(0, MAXP - 1))
        for _, s in parts:
            self.backend.restore(s)
            s.release()
        self.models = self._restored_model([(kgr, self.models) for kgr, _ in parts])
        self.key, self.wm = None, None

    @precondition(lambda self: self.snapshots)
    @rule(i=st.integers(0, 5))
    def release_snapshot(self, i: int) -> None:
        snap, models = self.snapshots.pop(i % len(self.snapshots))
        self._check_snapshot(snap, models)
        snap.release()

    @invariant()
    def same_timers(self) -> None:
        if not hasattr(self, "svc"):
            return
        for d in TimeDomain:
            assert set(self.svc.timers(d)) == self.models[d].all()
        assert self.svc.num_event_time_timers() == len(self.models[TimeDomain.EVENT_TIME])
        assert self.svc.num_processing_time_timers() == len(self.models[TimeDomain.PROCESSING_TIME])

    def teardown(self) -> None:
        for snap, _ in getattr(self, "snapshots", []):
            snap.release()


TimerMachine.TestCase.settings = settings(max_examples=300, stateful_step_count=60, deadline=None)
test_timer_machine = TimerMachine.TestCase
