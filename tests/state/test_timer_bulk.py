"""Timers in bulk: advances that fire most of a key group's timers at once (the
queue sorts them out of its heap in one go), lazy deletes and what they leave
behind, with ``on_timer`` registering, deleting, snapshotting and raising in
the middle, against a plain model of the semantics."""

from __future__ import annotations

import gc
import random
import tracemalloc
from typing import Any

import hypothesis.strategies as st
import pytest
from hypothesis import given, settings
from timer_model import TimerQueueModel

from cowmap import VOID_NAMESPACE, KeyedStateBackend, TimeDomain

EV = TimeDomain.EVENT_TIME


class Boom(Exception):
    pass


def _actions(seed: int, ts: int, key: Any, ns: Any) -> list[tuple[str, Any, int, Any]]:
    """What on_timer does for a timer: a function of the timer and the seed."""
    r = random.Random(hash((seed, ts, key, ns)) & 0xFFFFFFFF)
    out: list[tuple[str, Any, int, Any]] = []
    for _ in range(r.randrange(3)):
        kind = r.choice(["register_own", "delete_own", "delete_other", "register_other"])
        other = r.randrange(40)
        out.append((kind, key if kind.endswith("own") else other, ts + 1 + r.randrange(60), ns))
    return out


@settings(max_examples=200, deadline=None)
@given(
    seed=st.integers(0, 2**32 - 1),
    n=st.integers(40, 600),
    maxp=st.sampled_from([1, 2, 4]),
    wms=st.lists(st.integers(0, 400), min_size=1, max_size=4),
    raise_at=st.none() | st.integers(1, 300),
)
def test_bulk_firing_matches_the_model(seed: int, n: int, maxp: int, wms: list[int], raise_at: int | None) -> None:
    """Many timers per key group, on_timer changing other pending timers (some in
    the batch being fired) and at times raising. Each firing must be one of the
    model's earliest pending timers, due at the watermark; the model then makes
    the same changes."""
    r = random.Random(seed)
    b = KeyedStateBackend(max_parallelism=maxp)
    model = TimerQueueModel()
    count = [0]
    upto = [0]

    def on_timer(ts: int, key: Any, ns: Any, domain: Any) -> None:
        head = model.peek()
        assert head is not None and ts == head[0] <= upto[0] and (ts, key, ns) in model.all()
        assert b.get_current_key() == key
        model.remove((ts, key, ns))
        count[0] += 1
        if count[0] == raise_at:
            raise Boom
        for kind, k, t, nsx in _actions(seed, ts, key, ns):
            b.set_current_key(k)
            if kind.startswith("register"):
                svc.register_event_time_timer(t, namespace=nsx)
                model.add((t, k, nsx))
            else:
                svc.delete_event_time_timer(t, namespace=nsx)
                model.remove((t, k, nsx))

    svc = b.get_timer_service("t", on_timer)
    for _ in range(n):
        key, ts, ns = r.randrange(40), r.randrange(300), r.choice([VOID_NAMESPACE, "w"])
        b.set_current_key(key)
        svc.register_event_time_timer(ts, namespace=ns)
        model.add((ts, key, ns))
    for _ in range(n // 3):  # lazy deletes: entries left in the heaps
        key, ts, ns = r.randrange(40), r.randrange(300), r.choice([VOID_NAMESPACE, "w"])
        b.set_current_key(key)
        svc.delete_event_time_timer(ts, namespace=ns)
        model.remove((ts, key, ns))

    for wm in sorted(set(wms)):
        upto[0] = wm
        before = count[0]
        try:
            got = svc.advance_watermark(wm)
        except Boom:
            assert count[0] == raise_at
        else:
            assert got == count[0] - before
            head = model.peek()
            assert head is None or head[0] > wm  # everything due fired
        assert set(svc.timers(EV)) == model.all()
        assert svc.num_event_time_timers() == len(model)


def test_snapshot_taken_by_on_timer_holds_the_timers_not_fired_yet() -> None:
    b = KeyedStateBackend(max_parallelism=1)
    snaps: list[tuple[Any, set[Any]]] = []

    def on_timer(ts: int, key: Any, ns: Any, domain: Any) -> None:
        if ts % 97 == 0:
            snaps.append((b.snapshot(), set(svc.timers(EV))))
        if ts % 5 == 0:
            b.set_current_key(key)
            svc.delete_event_time_timer(ts + 3)
            svc.register_event_time_timer(ts + 2000)

    svc = b.get_timer_service("t", on_timer)
    for ts in range(1000):
        b.set_current_key(ts % 17)
        svc.register_event_time_timer(ts)
    svc.advance_watermark(999)
    assert len(snaps) == 11
    for snap, want in snaps:
        assert {(ts, key, ns) for _, ts, key, ns in snap.timers("t")} == want
        restored = KeyedStateBackend(max_parallelism=1)
        restored.restore(snap)
        assert set(restored.get_timer_service("t").timers(EV)) == want
        snap.release()
    assert {t[0] for t in svc.timers(EV)} == {ts + 2000 for ts in range(0, 1000, 5) if (ts - 3) % 5 != 0}


def test_deleting_everything_lazily_then_registering_again_keeps_memory_bounded() -> None:
    b = KeyedStateBackend(max_parallelism=2)
    svc = b.get_timer_service("t", lambda *a: None)

    def churn() -> None:
        for key in range(200):
            b.set_current_key(key)
            for ts in range(20):
                svc.register_event_time_timer(ts * 7 + key)
        for key in range(0, 200, 2):  # half, then the rest: deleted entries left, then none
            b.set_current_key(key)
            for ts in range(20):
                svc.delete_event_time_timer(ts * 7 + key)
        for key in range(1, 200, 2):
            b.set_current_key(key)
            for ts in range(20):
                svc.delete_event_time_timer(ts * 7 + key)
        assert svc.num_event_time_timers() == 0

    churn()
    gc.collect()
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        for _ in range(5):
            churn()
        gc.collect()
        assert tracemalloc.get_traced_memory()[0] - base < 64 * 1024
    finally:
        tracemalloc.stop()
    assert svc.advance_watermark(10**6) == 0


def test_register_delete_churn_of_one_timer_does_not_grow() -> None:
    """The same timer registered and deleted over and over (never fired): each
    delete leaves an entry behind until the heap is rebuilt."""
    b = KeyedStateBackend(max_parallelism=1)
    fired: list[int] = []
    svc = b.get_timer_service("t", lambda ts, *a: fired.append(ts))
    b.set_current_key("k")
    svc.register_event_time_timer(5)  # a head that stays
    tracemalloc.start()
    try:
        for i in range(50_000):
            svc.register_event_time_timer(100 + i % 3)
            svc.delete_event_time_timer(100 + i % 3)
            if i == 1000:
                gc.collect()
                base = tracemalloc.get_traced_memory()[0]
        gc.collect()
        assert tracemalloc.get_traced_memory()[0] - base < 16 * 1024
    finally:
        tracemalloc.stop()
    assert svc.advance_watermark(10**6) == 1 and fired == [5]


@pytest.mark.parametrize("n", [31, 32, 33, 500, 5000])
def test_an_advance_fires_a_big_key_group_in_order(n: int) -> None:
    """Around and above the size at which an advance sorts a key group's due timers out."""
    b = KeyedStateBackend(max_parallelism=1)
    fired: list[int] = []
    svc = b.get_timer_service("t", lambda ts, *a: fired.append(ts))
    times = random.Random(n).sample(range(10 * n), n)
    for i, ts in enumerate(times):
        b.set_current_key(i % 7)
        svc.register_event_time_timer(ts)
    cut = sorted(times)[n // 2]
    assert svc.advance_watermark(cut) == n // 2 + 1
    assert svc.advance_watermark(10 * n) == n - n // 2 - 1
    assert fired == sorted(times)


def test_an_advance_sorts_timestamps_across_the_whole_int64_range() -> None:
    lo, hi = -(2**63), 2**63 - 1
    times = [lo, hi, -1, 0, 1, lo + 1, hi - 1, 2**40, -(2**40)] + list(range(-50, 50, 3))
    b = KeyedStateBackend(max_parallelism=1)
    fired: list[int] = []
    svc = b.get_timer_service("t", lambda ts, *a: fired.append(ts))
    for i, ts in enumerate(times):
        b.set_current_key(i)
        svc.register_event_time_timer(ts)
    assert svc.advance_watermark(hi) == len(times)
    assert fired == sorted(times)
