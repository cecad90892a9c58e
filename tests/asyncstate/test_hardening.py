"""Misuse from Python must raise, never crash: re-initialised requests, foreign slot
descriptors, chains deeper than the C stack, and None where the core's multi-map calls
take lists."""

from __future__ import annotations

import gc
import weakref
from typing import Any

import pytest

from cowmap._core import multi_get, multi_put, multi_replace
from cowmap._future import StateFuture, StateFutureUtils, gc_hiding
from cowmap._requests import async_value
from cowmap.asyncstate import AsyncExecutionController
from cowmap.state import KeyedStateBackend, State, ValueStateDescriptor

#: whether in-flight objects are hidden from the GC in this process (the default;
#: tests/asyncstate also runs with the hiding off, see test_gc_hiding_switch.py)
HIDDEN = gc_hiding()


def _setup() -> tuple[KeyedStateBackend, AsyncExecutionController, Any]:
    backend = KeyedStateBackend()
    aec = AsyncExecutionController(backend, buffer_timeout_ms=0)
    return backend, aec, backend.get_state(ValueStateDescriptor("v"))


def test_init_runs_once_per_future() -> None:
    f = StateFuture()
    with pytest.raises(RuntimeError, match="initialised"):
        f.__init__()
    f.complete(1)
    assert f.get() == 1


@pytest.mark.parametrize("which", [0, 1])  # the active request, or one blocked behind it
def test_a_queued_request_cannot_be_reinitialised(which: int) -> None:
    backend, aec, st = _setup()
    held: list[Any] = []
    for _ in range(3):
        aec.process("k", lambda _: held.append(st.async_value()))
    with pytest.raises(RuntimeError, match="initialised"):
        held[which].__init__()
    aec.drain()
    assert [f.get() for f in held] == [None, None, None]
    assert aec.in_flight_records == 0


def test_a_view_field_copied_onto_another_class_is_refused() -> None:
    class Fake:
        __slots__ = ()
        _kc = State._kc  # the views' compiled field on an unrelated type

    fake = Fake()
    with pytest.raises(TypeError):
        fake._kc  # noqa: B018  (the descriptor checks the type)
    with pytest.raises(TypeError, match="need a state"):
        async_value(fake)


@pytest.mark.parametrize("mode", ["apply", "compose"])
def test_a_chain_deeper_than_the_recursion_limit_raises(mode: str) -> None:
    n = 30_000
    if mode == "apply":
        src = StateFuture()
        f = src
        for _ in range(n):
            f = f.then_apply(lambda v: v + 1)
        with pytest.raises(RecursionError):
            src.complete(0)
    else:
        futs = [StateFuture() for _ in range(n)]
        outer: list[Any] = [None] * n
        for i in range(n):
            # level i forwards level i + 1's future; the last completes them all, in one C recursion
            outer[i] = futs[i].then_compose(
                lambda v, i=i: outer[i + 1] if i + 1 < n else StateFutureUtils.completed_future(v))
        with pytest.raises(RecursionError):
            for fut in futs:
                fut.complete(0)


def test_a_chain_within_the_recursion_limit_completes() -> None:
    src = StateFuture()
    f = src
    for _ in range(200):
        f = f.then_apply(lambda v: v + 1)
    src.complete(0)
    assert f.get() == 200


@pytest.mark.parametrize("call", [
    lambda maps, lst: multi_get(maps, lst, lst, lst),
    lambda maps, lst: multi_put(maps, lst, lst, lst, lst),
    lambda maps, lst: multi_replace(maps, lst, lst, lst, lst),
    lambda maps, lst: multi_put([], lst, lst, lst, maps),
])
def test_multi_map_calls_reject_none(call: Any) -> None:
    with pytest.raises(TypeError):
        call(None, [])


def test_a_context_without_retain_and_release_is_a_type_error() -> None:
    with pytest.raises(TypeError, match="retain"):
        StateFuture(context=5)

    class Counting:
        def __init__(self) -> None:
            self.refs = 0

        def retain(self) -> None:
            self.refs += 1

        def release(self) -> None:
            self.refs -= 1

    ctx = Counting()
    f = StateFuture(context=ctx)
    assert ctx.refs == 1
    f.complete(None)
    assert ctx.refs == 0


class _PropertyKeyBackend(KeyedStateBackend):
    """A subclass with a ``_key`` property of its own: the current key lives in the
    compiled key context, so nothing a subclass defines can move it."""

    @property  # type: ignore[override]
    def _key(self) -> Any:
        return self.__dict__.get("k")

    @_key.setter
    def _key(self, key: Any) -> None:
        self.__dict__["k"] = key


@pytest.mark.parametrize("cls", [KeyedStateBackend, _PropertyKeyBackend])
def test_controllers_over_backend_subclasses_count_per_key(cls: type[KeyedStateBackend]) -> None:
    runs = []
    for b in (cls(), KeyedStateBackend(), _PropertyKeyBackend()):  # interleaved layouts
        s = b.get_state(ValueStateDescriptor("c", default_value=0))
        runs.append((b, s, AsyncExecutionController(b, batch_size=7, buffer_timeout_ms=0)))
    keys = [k % 13 for k in range(200)]
    for k in keys:
        for b, s, aec in runs:
            aec.process(k, lambda _, s=s, b=b, k=k: s.async_value().then_compose(
                lambda n: (b.get_current_key() == k or pytest.fail("wrong key current")) and s.async_update(n + 1)))
    for b, s, aec in runs:
        aec.drain()
        for k in range(13):
            b.set_current_key(k)
            assert s.value() == keys.count(k)


# ---------------------------------------------------------------- GC visibility
# In-flight futures and contexts are untracked by the cyclic GC (see _future.pyx,
# "GC visibility"); these check that nothing is freed early and nothing leaks.


class _Payload:
    """A weakly referenceable marker for what a record's callbacks hold."""


def _cyclic_records(aec: AsyncExecutionController, s: Any, n: int, payloads: list[Any]) -> None:
    """Records whose futures sit in reference cycles with their callbacks."""

    def fn(_: Any) -> None:
        p = _Payload()
        payloads.append(weakref.ref(p))
        f = s.async_value()
        p.f = f  # payload -> future -> derived -> callback -> payload
        f.then_accept(lambda v, p=p: p)
        f.then_compose(lambda v, p=p: s.async_update((v or 0) + 1))

    for k in range(n):
        aec.process(k % 7, fn)


@pytest.mark.parametrize("end", ["drained", "undrained", "failed"])
def test_a_dropped_controller_and_its_cycles_are_collected(end: str) -> None:
    b = KeyedStateBackend()
    s = b.get_state(ValueStateDescriptor("c"))
    aec = AsyncExecutionController(b, batch_size=10, buffer_timeout_ms=0)
    payloads: list[Any] = []
    _cyclic_records(aec, s, 100, payloads)
    assert aec.in_flight_records > 0
    if end == "drained":
        aec.drain()
    elif end == "failed":
        aec.process(99, lambda _: s.async_value().then_accept(lambda v: 1 / 0))
        with pytest.raises(ZeroDivisionError):
            aec.drain()
    gone = [weakref.ref(aec), weakref.ref(b)]
    del aec, b, s
    gc.collect()
    assert [r() for r in gone] == [None, None]
    assert all(p() is None for p in payloads)


def test_collections_during_processing_free_nothing_in_flight() -> None:
    # The heap the suite built up so far, frozen, is left out of the 300 collections below; they
    # still walk everything this test makes. (Walking all of it took some 70 ms a collection.)
    gc.freeze()
    try:
        b = KeyedStateBackend()
        s = b.get_state(ValueStateDescriptor("c", default_value=0))
        aec = AsyncExecutionController(b, batch_size=16, buffer_timeout_ms=0)
        seen: list[int] = []

        def fn(_: Any) -> None:
            marker = [_Payload()]  # only the chain's callbacks hold it

            def after(v: int) -> Any:
                gc.collect()
                assert isinstance(marker[0], _Payload)
                return s.async_update(v + 1).then_accept(lambda _: seen.append(v))

            s.async_value().then_compose(after)

        keys = [k % 5 for k in range(300)]
        for i, k in enumerate(keys):
            aec.process(k, fn)
            if i % 37 == 0:
                gc.collect()
        aec.drain()
        assert len(seen) == len(keys) and aec.in_flight_records == 0
        for k in range(5):
            b.set_current_key(k)
            assert s.value() == keys.count(k)
    finally:
        gc.unfreeze()


def test_a_future_kept_after_its_controller_is_gone_stays_usable() -> None:
    b = KeyedStateBackend()
    s = b.get_state(ValueStateDescriptor("c"))
    aec = AsyncExecutionController(b, buffer_timeout_ms=0)
    kept: list[Any] = []
    aec.process("k", lambda _: kept.append(s.async_value()))
    ctx = kept[0]._ctx
    assert ctx._aec is aec
    del aec
    gc.collect()
    (f,) = kept
    assert not f.is_done() and ctx._aec is None
    derived = f.then_apply(lambda v: v)
    f.complete(5)  # completing it now runs its callbacks, with no controller to report to
    assert derived.get() == 5
    with pytest.raises(RuntimeError, match="need an AsyncExecutionController"):
        s.async_value()


def test_request_futures_kept_by_the_user_are_tracked_once_complete() -> None:
    """A batch leaves the requests only its own lists hold untracked (they are freed
    with them); one the user keeps must be visible to the GC once complete."""
    b = KeyedStateBackend()
    s = b.get_state(ValueStateDescriptor("c", default_value=0))
    aec = AsyncExecutionController(b, batch_size=16, buffer_timeout_ms=0)
    kept: list[Any] = []

    def fn(_: Any) -> None:
        f = s.async_value()
        kept.append(f)
        f.then_compose(lambda n: s.async_update(n + 1))

    for k in range(100):
        aec.process(k % 9, fn)
    aec.drain()
    assert kept and all(f.is_done() and gc.is_tracked(f) for f in kept)


@pytest.mark.parametrize("failing", ["record", "callback"])
def test_a_failed_controller_whose_callbacks_refer_to_it_is_collected(failing: str) -> None:
    b = KeyedStateBackend()
    s = b.get_state(ValueStateDescriptor("c"))
    aec = AsyncExecutionController(b, batch_size=8, buffer_timeout_ms=0)
    payloads: list[Any] = []

    def fn(_: Any) -> None:
        p = _Payload()
        payloads.append(weakref.ref(p))
        # the callback holds the controller (and the payload) while in flight
        s.async_value().then_accept(lambda v, p=p, aec=aec: aec.sync_point(lambda: p))

    for k in range(40):
        aec.process(k % 5, fn)

    def boom(_: Any) -> None:
        raise KeyError("boom")

    with pytest.raises(KeyError):
        if failing == "record":
            aec.process(99, boom)  # the record's own code fails: the task fails
        else:
            aec.process(99, lambda _: s.async_value().then_accept(boom))
            aec.trigger()  # a callback fails: so does the batch
    gone = weakref.ref(aec)
    del aec, b, s
    gc.collect()
    assert gone() is None
    assert all(p() is None for p in payloads)


def test_callback_functions_are_hidden_while_in_flight_and_shown_after() -> None:
    """A then_* function held by an in-flight chain (a lambda made per record) is
    untracked with its closure until its step runs; one still held afterwards (here by
    ``fns``, or shared by every record) is tracked again."""
    b = KeyedStateBackend()
    s = b.get_state(ValueStateDescriptor("c", default_value=0))
    aec = AsyncExecutionController(b, batch_size=1000, buffer_timeout_ms=0)
    fns: list[Any] = []
    shared = lambda v: None  # noqa: E731

    def fn(_: Any) -> None:
        inc = lambda n: s.async_update(n + 1)  # noqa: E731
        fns.append(inc)
        f = s.async_value()
        f.then_compose(inc)
        f.then_accept(shared)

    for k in range(50):
        aec.process(k, fn)
    assert aec.active_size == 50  # nothing ran yet: every chain is in flight
    assert all(gc.is_tracked(f) == gc.is_tracked(f.__closure__) == (not HIDDEN) for f in fns)
    gc.collect()  # a collection while they are hidden frees nothing
    aec.drain()
    assert all(gc.is_tracked(f) and gc.is_tracked(f.__closure__) for f in fns)
    assert gc.is_tracked(shared)
    for k in range(50):
        b.set_current_key(k)
        assert s.value() == 1


@pytest.mark.parametrize("end", ["drained", "dropped", "failed"])
def test_a_hidden_function_in_a_cycle_is_collected(end: str) -> None:
    """A hidden function that survives its future (a cycle through its closure) is
    handed back to the GC: after its step, when its controller is dropped with the
    record in flight, and when the chain fails before the step."""
    b = KeyedStateBackend()
    s = b.get_state(ValueStateDescriptor("c"))
    aec = AsyncExecutionController(b, batch_size=100, buffer_timeout_ms=0)
    payloads: list[Any] = []

    def fn(_: Any) -> None:
        box: list[Any] = [_Payload()]
        payloads.append(weakref.ref(box[0]))
        step = lambda v: box and None  # noqa: E731  # step -> closure -> cell -> box -> step
        box.append(step)
        if end == "failed":
            s.async_value().then_apply(lambda v: 1 / 0).then_accept(step)
        else:
            s.async_value().then_accept(step)

    for k in range(20):
        aec.process(k, fn)
    if end == "drained":
        aec.drain()
    elif end == "failed":
        with pytest.raises(ZeroDivisionError):
            aec.drain()
    del fn
    gone = weakref.ref(aec)
    del aec, b, s
    gc.collect()
    assert gone() is None
    assert payloads and all(p() is None for p in payloads)


def test_a_derived_future_refused_by_hand_keeps_its_function_hidden_until_its_step() -> None:
    """A derived future cannot be completed by hand (its step does it): the refused
    attempt leaves the function it hid hidden, and the step shows it."""
    b = KeyedStateBackend()
    s = b.get_state(ValueStateDescriptor("c", default_value=7))
    aec = AsyncExecutionController(b, buffer_timeout_ms=0)
    held: list[Any] = []
    fn = lambda v: v  # noqa: E731
    aec.process("k", lambda _: held.append(s.async_value().then_apply(fn)))
    (derived,) = held
    assert gc.is_tracked(fn) == (not HIDDEN)
    with pytest.raises(RuntimeError, match="then_"):
        derived.complete(7)
    assert gc.is_tracked(fn) == (not HIDDEN) and not derived.is_done()
    aec.drain()
    assert derived.get() == 7 and gc.is_tracked(fn) and gc.is_tracked(derived)


def test_futures_and_contexts_made_from_python_are_tracked() -> None:
    """The controller's own futures and contexts are born untracked (untracked.h);
    made from Python, they are tracked, recycled ones come out clean, and a Python
    subclass gets CPython's own allocation."""
    from cowmap._future import RecordContext

    b, aec, s = _setup()
    inflight: list[Any] = []
    for k in range(300):  # fills the pools once these complete and go
        aec.process(k, lambda _: inflight.append(s.async_value()))
    assert all(gc.is_tracked(f) == gc.is_tracked(f._ctx) == (not HIDDEN) for f in inflight)
    del inflight
    aec.drain()

    class Sub(StateFuture):
        pass

    made = [StateFuture(), Sub(), StateFuture(context=RecordContext(None, "r", "k", 0, None))]
    assert all(gc.is_tracked(f) for f in made) and gc.is_tracked(made[2]._ctx)
    assert all(not f.is_done() and repr(f) == "<StateFuture pending>" for f in made)
    assert made[2]._ctx.refs == 1 and made[0]._ctx is None and made[0]._op is None
    for i, f in enumerate(made):
        f.complete(i)
    assert [f.get() for f in made] == [0, 1, 2] and made[2]._ctx.refs == 0


def test_futures_made_with_new_are_tracked_and_cannot_be_copied() -> None:
    import copy
    import pickle

    from cowmap._future import RecordContext

    assert gc.is_tracked(StateFuture.__new__(StateFuture))
    assert gc.is_tracked(RecordContext.__new__(RecordContext))
    f = StateFuture()
    f.then_apply(lambda v: v)
    with pytest.raises(TypeError):
        copy.copy(f)
    with pytest.raises(TypeError):
        pickle.dumps(f)


def test_callbacks_skipped_by_a_failing_one_are_visible_to_the_gc() -> None:
    """A callback that raises stops the later ones of its future: their derived
    futures stay pending, and the GC must see them (and the functions they hold)."""
    b, aec, s = _setup()
    kept: list[Any] = []

    def boom(_: Any) -> None:
        raise KeyError("boom")

    def fn(_: Any) -> None:
        f = s.async_value()
        f.then_accept(boom)
        kept.append(f.then_apply(lambda v: v))

    aec.process("k", fn)
    with pytest.raises(KeyError):
        aec.drain()
    (g,) = kept
    assert not g.is_done() and gc.is_tracked(g)
