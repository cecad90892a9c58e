"""Timer services: Flink's timer semantics, snapshots, the async controller, misuse and leaks."""

from __future__ import annotations

import gc
import sys
import time
import tracemalloc
from typing import Any

import hypothesis.strategies as st
import numpy as np
import pytest
from hypothesis import given, settings

from cowmap import (
    NO_WATERMARK,
    VOID_NAMESPACE,
    AsyncExecutionController,
    KeyedStateBackend,
    KeyGroupRange,
    TimeDomain,
    ValueStateDescriptor,
    key_group_for,
    key_group_range_for_operator,
)


def make(**kw: Any) -> tuple[KeyedStateBackend, Any, list[tuple[Any, ...]]]:
    b = KeyedStateBackend(**kw)
    fired: list[tuple[Any, ...]] = []
    svc = b.get_timer_service("t", lambda ts, key, ns, domain: fired.append((ts, key, ns, domain)))
    return b, svc, fired


def at(b: KeyedStateBackend, key: Any) -> KeyedStateBackend:
    b.set_current_key(key)
    return b


# ------------------------------------------------------------ semantics


def test_fires_in_timestamp_order_with_key_current_and_once_per_key_namespace_time() -> None:
    b, svc, fired = make()
    seen_keys = []
    svc.on_timer = lambda ts, key, ns, d: (fired.append((ts, key, ns, d)), seen_keys.append(b.get_current_key()))
    for key, ts in [("a", 30), ("b", 10), ("a", 10), ("c", 20), ("b", 10), ("a", 30)]:
        at(b, key)
        svc.register_event_time_timer(ts)
    at(b, "a").get_timer_service("t").register_event_time_timer(10, namespace="w")
    assert svc.num_event_time_timers() == 5  # duplicates were no-ops
    assert svc.advance_watermark(20) == 4
    assert [f[0] for f in fired] == [10, 10, 10, 20]
    assert {(f[1], f[2]) for f in fired[:3]} == {("b", VOID_NAMESPACE), ("a", VOID_NAMESPACE), ("a", "w")}
    assert all(f[3] is TimeDomain.EVENT_TIME for f in fired)
    assert seen_keys == [f[1] for f in fired]
    assert b.get_current_key() == "a"  # the caller's key again
    assert svc.current_watermark() == 20
    assert svc.num_event_time_timers() == 1


def test_watermark_going_back_is_ignored_and_starts_at_no_watermark() -> None:
    b, svc, fired = make()
    assert svc.current_watermark() == NO_WATERMARK == -(1 << 63)
    at(b, 1)
    svc.register_event_time_timer(5)
    assert svc.advance_watermark(10) == 1
    svc.register_event_time_timer(3)  # behind the watermark: fires at the next advance
    assert svc.advance_watermark(9) == 0 and svc.current_watermark() == 10
    assert svc.advance_watermark(10) == 0
    assert svc.advance_watermark(11) == 1
    assert [f[0] for f in fired] == [5, 3]


def test_delete_and_domains_are_separate() -> None:
    b, svc, fired = make()
    at(b, "k")
    svc.register_event_time_timer(5)
    svc.register_processing_time_timer(5)
    svc.delete_event_time_timer(5)
    svc.delete_event_time_timer(6)  # none: no-op
    svc.delete_processing_time_timer(5, namespace="other")  # another namespace: no-op
    assert svc.advance_watermark(100) == 0
    assert svc.advance_processing_time(5) == 1
    assert fired == [(5, "k", VOID_NAMESPACE, TimeDomain.PROCESSING_TIME)]


def test_timers_registered_in_on_timer_fire_in_the_same_advance_when_due() -> None:
    b = KeyedStateBackend()
    fired = []

    def on_timer(ts: int, key: Any, ns: Any, d: Any) -> None:
        fired.append((ts, key))
        if ts < 5:
            svc.register_event_time_timer(ts + 1)  # for the current key: this timer's
        if ts == 3:
            at(b, "other")
            svc.register_event_time_timer(100)  # not due
            svc.delete_event_time_timer(4)  # not registered for "other": no-op

    svc = b.get_timer_service("t", on_timer)
    at(b, "k")
    svc.register_event_time_timer(1)
    assert svc.advance_watermark(4) == 4
    assert fired == [(1, "k"), (2, "k"), (3, "k"), (4, "k")]
    assert svc.num_event_time_timers() == 2  # (5, k) and (100, other)


@pytest.mark.parametrize("domain", ["event", "processing"])
def test_on_timer_registering_the_timer_it_fires_is_an_error_not_an_endless_loop(domain: str) -> None:
    """The timer firing, registered again from its own on_timer, would be due at once and fire
    for ever (Flink's heap backend loops): a RuntimeError instead, which stops the advance (as any
    error of on_timer does). What it registered before that, the same time for another key or
    namespace and an earlier time, fires at the next advance."""
    b = KeyedStateBackend()
    fired = []

    def on_timer(ts: int, key: Any, ns: Any, d: Any) -> None:
        fired.append((ts, key, ns))
        register = getattr(svc, f"register_{domain}_time_timer")
        if key == "k" and ns is VOID_NAMESPACE:
            register(ts, namespace="other")  # another namespace, and another key
            at(b, "j")
            register(ts)
            register(ts - 1)
            at(b, "k")
            register(ts)

    svc = b.get_timer_service("t", on_timer)
    at(b, "k")
    getattr(svc, f"register_{domain}_time_timer")(5)
    advance = svc.advance_watermark if domain == "event" else svc.advance_processing_time
    with pytest.raises(RuntimeError, match=f"registered the {domain}-time timer it is firing .5, the same key and "
                       "namespace. again: it would fire again at once, for ever"):
        advance(10)
    assert fired == [(5, "k", VOID_NAMESPACE)]
    assert b.get_current_key() == "k"
    fired.clear()
    advance(11)
    assert sorted(fired, key=str) == sorted([(4, "j", VOID_NAMESPACE), (5, "j", VOID_NAMESPACE), (5, "k", "other")],
                                            key=str)


def test_on_timer_raising_stops_firing_and_keeps_the_rest() -> None:
    b = KeyedStateBackend()
    fired = []

    def on_timer(ts: int, key: Any, ns: Any, d: Any) -> None:
        fired.append(ts)
        if ts == 2:
            raise ValueError("boom")

    svc = b.get_timer_service("t", on_timer)
    at(b, "k")
    for ts in (1, 2, 3):
        svc.register_event_time_timer(ts)
    at(b, "z")
    with pytest.raises(ValueError, match="boom"):
        svc.advance_watermark(10)
    assert fired == [1, 2] and svc.num_event_time_timers() == 1
    assert b.get_current_key() == "z"
    assert svc.advance_watermark(11) == 1  # not stuck "firing"
    assert fired == [1, 2, 3]


def test_timestamps_take_ints_only() -> None:
    b, svc, _ = make()
    at(b, 1)
    svc.register_event_time_timer(np.int64(7))
    for bad in (1.5, "3", None, True, 2.0):
        with pytest.raises(TypeError, match="must be an int"):
            svc.register_event_time_timer(bad)
    for big in (1 << 63, -(1 << 63) - 1):
        with pytest.raises(ValueError, match="int64"):
            svc.register_processing_time_timer(big)
    with pytest.raises(TypeError, match="watermark must be an int"):
        svc.advance_watermark(3.0)
    svc.register_event_time_timer((1 << 63) - 1)
    svc.register_event_time_timer(-(1 << 63))
    assert svc.num_event_time_timers() == 3


def test_misuse_is_a_clear_error() -> None:
    b = KeyedStateBackend()
    svc = b.get_timer_service("t")
    with pytest.raises(RuntimeError, match="current key"):
        svc.register_event_time_timer(1)
    at(b, "k")
    svc.register_event_time_timer(1)
    with pytest.raises(RuntimeError, match="no on_timer"):
        svc.advance_watermark(5)
    with pytest.raises(TypeError, match="callable"):
        b.get_timer_service("t", 42)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="name must be a str"):
        b.get_timer_service(3)  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        svc.register_event_time_timer(1, namespace=[1])  # unhashable
    with pytest.raises(ValueError, match="domain"):
        svc.timers(7)


def test_an_uninitialised_service_or_snapshot_is_an_error_not_a_crash() -> None:
    from cowmap import TimerService, TimerSnapshot

    svc = TimerService.__new__(TimerService)
    for call in (lambda: svc.register_event_time_timer(1), lambda: svc.advance_watermark(1),
                 svc.current_processing_time, svc.snapshot, lambda: svc.advance_processing_time(3)):
        with pytest.raises(RuntimeError, match="not initialised"):
            call()
    assert svc.num_event_time_timers() == 0 and svc.timers(TimeDomain.EVENT_TIME) == []
    snap = TimerSnapshot.__new__(TimerSnapshot)
    assert snap.key_groups() == [] and snap.count() == 0
    assert len(snap.columns(0, TimeDomain.EVENT_TIME)[1]) == 0
    snap.release()


def test_nested_advance_is_refused() -> None:
    b = KeyedStateBackend()
    errors = []

    def on_timer(ts: int, key: Any, ns: Any, d: Any) -> None:
        try:
            svc.advance_watermark(ts + 100)
        except RuntimeError as e:
            errors.append(str(e))

    svc = b.get_timer_service("t", on_timer)
    at(b, 1)
    svc.register_event_time_timer(1)
    svc.register_event_time_timer(200)
    assert svc.advance_watermark(1) == 1
    assert errors and "from on_timer" in errors[0]
    assert svc.num_event_time_timers() == 1


class _Sneaky:
    """A namespace whose __eq__ uses the timer service it is compared in."""

    svc: Any = None

    def __hash__(self) -> int:
        return 7

    def __eq__(self, other: object) -> bool:
        if _Sneaky.svc is not None:
            _Sneaky.svc.register_event_time_timer(99)
        return self is other


def test_re_entry_from_eq_is_refused_not_corrupting() -> None:
    b, svc, _ = make()
    at(b, "k")
    a, c = _Sneaky(), _Sneaky()
    svc.register_event_time_timer(1, namespace=a)
    _Sneaky.svc = svc
    try:
        with pytest.raises(RuntimeError, match="__eq__"):
            svc.register_event_time_timer(1, namespace=c)  # same hash and time: compared with a
    finally:
        _Sneaky.svc = None
    svc.register_event_time_timer(1, namespace=c)
    assert svc.num_event_time_timers() == 2
    assert svc.advance_watermark(1) == 2


def test_eq_raising_propagates() -> None:
    class Bad:
        def __hash__(self) -> int:
            return 1

        def __eq__(self, other: object) -> bool:
            raise KeyError("eq")

    b, svc, _ = make()
    at(b, "k")
    svc.register_event_time_timer(1, namespace=Bad())
    with pytest.raises(KeyError, match="eq"):
        svc.register_event_time_timer(1, namespace=Bad())
    assert svc.num_event_time_timers() == 1


def test_get_timer_service_returns_the_same_service_and_rebinds_on_timer() -> None:
    b = KeyedStateBackend()
    first = b.get_timer_service("t", print)
    assert b.get_timer_service("t") is first and first.on_timer is print
    assert b.get_timer_service("t", repr) is first and first.on_timer is repr
    assert b.timer_service_names() == ["t"]


# ------------------------------------------------------------ snapshots and rescaling


def test_snapshot_is_isolated_from_later_changes_and_released() -> None:
    b, svc, fired = make(max_parallelism=4)
    for k in range(20):
        at(b, k)
        svc.register_event_time_timer(k)
        svc.register_processing_time_timer(100 + k)
    snap = b.snapshot()
    before = sorted(snap.timers("t"), key=repr)
    for k in range(0, 20, 2):
        at(b, k)
        svc.delete_event_time_timer(k)
        svc.register_event_time_timer(1000 + k)
    svc.advance_watermark(15)
    assert sorted(snap.timers("t"), key=repr) == before
    fresh = KeyedStateBackend(max_parallelism=4)
    fresh.restore(snap)
    t2 = fresh.get_timer_service("t")
    assert t2.num_event_time_timers() == 20 and t2.num_processing_time_timers() == 20
    assert t2.current_watermark() == NO_WATERMARK  # not restored
    snap.release()
    with pytest.raises(RuntimeError, match="released"):
        list(snap.timers("t"))


def test_restore_at_other_parallelism_takes_its_key_groups() -> None:
    b, svc, _ = make(max_parallelism=16)
    for k in range(200):
        at(b, k)
        svc.register_event_time_timer(k % 7, namespace=k % 3)
    parts = [b]
    for par_to in (3, 2):  # 1 -> 3 -> 2
        snaps = [s.snapshot() for s in parts]
        parts = []
        for i in range(par_to):
            kgr = key_group_range_for_operator(16, par_to, i)
            p = KeyedStateBackend(max_parallelism=16, key_group_range=kgr)
            for s in snaps:
                p.restore(s)
            t = p.get_timer_service("t")
            keys = {key for _, key, _ in t.timers(TimeDomain.EVENT_TIME)}
            assert keys == {k for k in range(200) if key_group_for(k, 16) in kgr}
            parts.append(p)
        for s in snaps:
            s.release()
    total = sum(p.get_timer_service("t").num_event_time_timers() for p in parts)
    assert total == 200


def test_restore_merges_without_duplicates_and_checks_key_groups() -> None:
    b, svc, _ = make(max_parallelism=8)
    at(b, "k")
    svc.register_event_time_timer(1)
    snap = b.snapshot()
    b.restore(snap)  # the same timer again: still one
    assert svc.num_event_time_timers() == 1
    with pytest.raises(ValueError, match="outside"):
        KeyedStateBackend(max_parallelism=8, key_group_range=KeyGroupRange(0, 0)).get_timer_service(
            "t"
        ).add_columns(5, TimeDomain.EVENT_TIME, [1], ["k"], [VOID_NAMESPACE])
    with pytest.raises(ValueError, match="differ in length"):
        svc.add_columns(key_group_for("k", 8), TimeDomain.EVENT_TIME, [1, 2], ["k"], [VOID_NAMESPACE])
    snap.release()


# ------------------------------------------------------------ the async controller and the mailbox


def test_timer_fires_in_its_keys_order_under_the_controller() -> None:
    b = KeyedStateBackend()
    aec = AsyncExecutionController(b, batch_size=1000, buffer_timeout_ms=0)
    v = b.get_state(ValueStateDescriptor("v", default_value=0))
    log: list[tuple[Any, ...]] = []

    def on_timer(ts: int, key: Any, ns: Any, d: Any) -> None:
        log.append(("timer", key, b.get_current_key()))
        v.async_value().then_accept(lambda x: log.append(("timer saw", key, x)))

    svc = b.get_timer_service("t", on_timer)

    def record(r: tuple[str, int]) -> None:
        v.async_update(r[1]).then_accept(lambda _: log.append(("record done", *r)))

    aec.process("a", record, ("a", 1))  # in flight: holds key a
    for k in ("a", "b"):
        at(b, k)
        svc.register_event_time_timer(5)
    assert svc.advance_watermark(5) == 2
    aec.process("a", record, ("a", 2))  # after the timer, in key a's order
    aec.drain()
    a_events = [e for e in log if e[1] == "a"]
    assert a_events == [("record done", "a", 1), ("timer", "a", "a"), ("timer saw", "a", 1), ("record done", "a", 2)]
    assert ("timer", "b", "b") in log  # key b was free: at once


OPS = st.lists(
    st.one_of(
        st.tuples(st.just("rec"), st.integers(0, 4), st.integers(0, 3)),  # key, async steps
        st.tuples(st.just("wm"), st.integers(1, 6)),  # watermark step
        st.tuples(st.just("run"), st.just(0)),  # let the controller run what is queued
    ),
    max_size=40,
)


@settings(max_examples=150, deadline=None)
@given(ops=OPS, batch=st.integers(1, 6))
def test_timers_keep_key_order_under_the_controller_whatever_completes_when(ops: list, batch: int) -> None:
    """Records of a key with chains of 0-3 async steps, batches of 1-6 requests, advances at
    random points: a timer runs after every record of its key processed before the advance
    that fired it has finished, and before any record of its key processed after it finishes."""
    b = KeyedStateBackend()
    aec = AsyncExecutionController(b, batch_size=batch, buffer_timeout_ms=0)
    v = b.get_state(ValueStateDescriptor("v", default_value=0))
    log: list[tuple[Any, ...]] = []

    def on_timer(ts: int, key: Any, ns: Any, d: Any) -> None:
        assert b.get_current_key() == key
        log.append(("fire", key, ts))
        v.async_value().then_accept(lambda x: log.append(("fire saw", key, ts, x)))

    svc = b.get_timer_service("t", on_timer)
    for k in range(5):
        at(b, k)
        for ts in range(1, 200, 2):
            svc.register_event_time_timer(ts)
    seq, wm = 0, 0
    for op in ops:
        if op[0] == "rec":
            _, key, steps = op
            seq += 1
            log.append(("proc", key, seq))

            def fn(_: Any, s: int = seq, key: int = key, steps: int = steps) -> None:
                f = v.async_value()
                for _ in range(steps):
                    f = f.then_compose(lambda x: v.async_update(x + 1).then_apply(lambda _, y=x + 1: y))
                f.then_accept(lambda _: log.append(("done", key, s)))

            aec.process(key, fn)
        elif op[0] == "wm":
            wm += op[1]
            log.append(("adv", wm))
            svc.advance_watermark(wm)
        else:
            aec.trigger()
    aec.drain()
    advs = [(i, e[1]) for i, e in enumerate(log) if e[0] == "adv"]
    done = {e[2]: i for i, e in enumerate(log) if e[0] == "done"}
    procs = [(i, e[1], e[2]) for i, e in enumerate(log) if e[0] == "proc"]
    assert len(done) == len(procs)  # every record finished
    for i, e in enumerate(log):
        if e[0] != "fire":
            continue
        _, key, ts = e
        fired_by = next(j for j, w in advs if w >= ts)  # the first advance past ts
        for p, k, s in procs:
            if k == key:
                assert (done[s] < i) == (p < fired_by), (e, s, log)


def test_processing_time_timers_fire_as_mails_of_the_controllers_mailbox() -> None:
    b = KeyedStateBackend()  # wall-clock time
    aec = AsyncExecutionController(b, buffer_timeout_ms=0)
    fired: list[tuple[int, Any]] = []
    svc = b.get_timer_service("t", lambda ts, key, ns, d: fired.append((ts, key)))
    now = b.now()
    at(b, "late")
    svc.register_processing_time_timer(now + 60)
    at(b, "early")
    svc.register_processing_time_timer(now + 20)  # earlier: its own mail
    assert aec.mailbox.run_until(lambda: len(fired) == 2, timeout=5)
    assert [k for _, k in fired] == ["early", "late"]
    assert b.now() >= now + 60


# ------------------------------------------------------------ references and memory


def test_no_leaks_of_keys_namespaces_or_memory() -> None:
    key, ns = ("key", 1), ("ns", 2)
    rk, rn = sys.getrefcount(key), sys.getrefcount(ns)
    b, svc, fired = make()
    for base in (0, 1000):
        at(b, key)
        for ts in range(base, base + 100):
            svc.register_event_time_timer(ts, namespace=ns)
        snap = b.snapshot()
        for ts in range(base, base + 100, 3):
            svc.delete_event_time_timer(ts, namespace=ns)  # copies the shared block
        svc.advance_watermark(base + 50)
        snap.release()
        svc.advance_watermark(base + 200)
    assert svc.num_event_time_timers() == 0
    fired.clear()
    at(b, 0)
    assert sys.getrefcount(key) == rk and sys.getrefcount(ns) == rn
    svc.on_timer = lambda ts, key, ns, d: None
    gc.collect()
    tracemalloc.start()
    growth = []
    for _ in range(4):
        m0 = tracemalloc.get_traced_memory()[0]
        for k in range(2000):
            at(b, k)
            svc.register_event_time_timer(k)
        s = b.snapshot()
        svc.advance_watermark(svc.current_watermark() + 10_000)  # copies every shared block
        s.release()
        growth.append(tracemalloc.get_traced_memory()[0] - m0)
    tracemalloc.stop()
    # the first round sizes the blocks and tables; later rounds reuse them
    assert max(growth[1:]) < 10_000 < growth[0], growth
    assert svc.num_event_time_timers() == 0


def test_a_dropped_backend_frees_its_timers() -> None:
    key = ("k",)
    r0 = sys.getrefcount(key)
    b, svc, _ = make()
    at(b, key)
    svc.register_event_time_timer(1)
    snap = b.snapshot()
    del b, svc
    gc.collect()
    assert sys.getrefcount(key) > r0  # the snapshot still holds it
    snap.release()
    at(KeyedStateBackend(), 0)  # the backend's own reference to its current key goes with it
    gc.collect()
    assert sys.getrefcount(key) == r0


def test_processing_mail_of_a_dropped_service_does_nothing() -> None:
    b = KeyedStateBackend()
    aec = AsyncExecutionController(b, buffer_timeout_ms=0)
    svc = b.get_timer_service("t", lambda *a: pytest.fail("fired"))
    at(b, 1)
    svc.register_processing_time_timer(b.now() + 5)
    mailbox = aec.mailbox
    del svc, b, aec  # the controller holds the backend
    gc.collect()
    deadline = time.monotonic() + 0.05
    mailbox.run_until(lambda: time.monotonic() > deadline, timeout=1)
