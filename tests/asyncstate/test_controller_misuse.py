"""The controller under hostile use: batches and nested records must not move the user's
key or namespace, one bad request must fail alone, misuse that would hang raises, a hot
key is handed over in order, and the buffer timeout costs no thread per batch."""

from __future__ import annotations

import math
import threading
import time
from typing import Any

import pytest

from cowmap.asyncstate import AsyncExecutionController, EpochMode
from cowmap.state import (
    KeyedStateBackend,
    ListStateDescriptor,
    MapStateDescriptor,
    ReducingStateDescriptor,
    ValueStateDescriptor,
)


def _backend() -> KeyedStateBackend:
    return KeyedStateBackend(max_parallelism=16)


# ------------------------------------------------------------ the user's view is left alone


@pytest.mark.parametrize("kind", ["list", "reducing", "value", "map"])
def test_a_batch_never_moves_the_users_view_to_another_namespace(kind: str) -> None:
    b = _backend()
    if kind == "list":
        st = b.get_list_state(ListStateDescriptor("s"))
        write, read = (lambda: st.async_add(1)), (lambda: st.get())
        sync_write = lambda: st.add(99)  # noqa: E731
    elif kind == "reducing":
        st = b.get_reducing_state(ReducingStateDescriptor("s", lambda a, c: a + c))
        write, read = (lambda: st.async_add(1)), (lambda: st.get())
        sync_write = lambda: st.add(99)  # noqa: E731
    elif kind == "value":
        st = b.get_state(ValueStateDescriptor("s"))
        # update(None) is clear(): the group cannot go to the core in one call
        write, read = (lambda: st.async_update(None)), (lambda: st.value())
        sync_write = lambda: st.update(99)  # noqa: E731
    else:
        st = b.get_map_state(MapStateDescriptor("s"))
        write, read = (lambda: st.async_put(None, 1)), (lambda: st.get("u"))  # a None user key fails alone
        sync_write = lambda: st.put("u", 99)  # noqa: E731
    aec = AsyncExecutionController(b, buffer_timeout_ms=0)

    def fn(_: Any) -> None:
        st.set_current_namespace("w1")
        write()
        st.set_current_namespace("w2")

    aec.process("k", fn)
    aec.drain()
    assert st.get_current_namespace() == "w2"
    b.set_current_key("k")
    sync_write()
    st.set_current_namespace("w1")
    in_w1, in_w2 = {"list": ([1], [99]), "reducing": (1, 99), "value": (None, 99), "map": (None, 99)}[kind]
    assert read() == in_w1  # the synchronous write did not land in w1
    st.set_current_namespace("w2")
    assert read() == in_w2


def test_a_nested_process_leaves_the_callbacks_own_key_current() -> None:
    b = _backend()
    c = b.get_state(ValueStateDescriptor("c", default_value=0))
    aec = AsyncExecutionController(b, buffer_timeout_ms=0)

    def cb(n: int) -> None:
        aec.process("other", lambda r: None)
        assert b.get_current_key() == "mine"
        c.update(n + 1)

    aec.process("mine", lambda _: c.async_value().then_accept(cb))
    aec.drain()
    b.set_current_key("mine")
    assert c.value() == 1
    b.set_current_key("other")
    assert c.value() == 0


def test_a_nested_process_that_runs_a_batch_keeps_the_outer_records_key() -> None:
    b = _backend()
    c = b.get_state(ValueStateDescriptor("c", default_value=0))
    aec = AsyncExecutionController(b, batch_size=1, buffer_timeout_ms=0)
    seen: list[Any] = []

    def fn(_: Any) -> None:
        # batch_size 1: the nested record's request runs a batch inside this record
        aec.process("other", lambda r: c.async_update(5))
        seen.append(b.get_current_key())

    aec.process("mine", fn)
    aec.drain()
    assert seen == ["mine"]


def test_drain_restores_the_key_set_before_it() -> None:
    b = _backend()
    c = b.get_state(ValueStateDescriptor("c", default_value=0))
    aec = AsyncExecutionController(b, buffer_timeout_ms=0)
    for k in ("a", "b", "c"):
        aec.process(k, lambda _: c.async_value().then_compose(lambda n: c.async_update(n + 1)))
    b.set_current_key("z")
    aec.drain()
    assert b.get_current_key() == "z"
    c.update(41)
    b.set_current_key("c")
    assert c.value() == 1


# ------------------------------------------------------------ one bad request fails alone


def test_one_unhashable_user_key_fails_only_its_own_request() -> None:
    b = _backend()
    m = b.get_map_state(MapStateDescriptor("m"))
    aec = AsyncExecutionController(b, buffer_timeout_ms=0)
    futs: dict[str, Any] = {}
    for key, ukey in (("A", "a"), ("B", ["unhashable"]), ("C", "c")):
        aec.process(key, lambda _, key=key, ukey=ukey: futs.__setitem__(key, m.async_put(ukey, key)))
    aec.drain()
    assert futs["A"].get() is None and futs["C"].get() is None
    with pytest.raises(TypeError):
        futs["B"].get()
    b.set_current_key("A")
    assert m.items() == [("a", "A")]
    b.set_current_key("C")
    assert m.items() == [("c", "C")]
    b.set_current_key("B")
    assert m.items() == []


def test_one_unhashable_user_key_in_a_read_batch_fails_alone() -> None:
    b = _backend()
    m = b.get_map_state(MapStateDescriptor("m"))
    for k in "AC":
        b.set_current_key(k)
        m.put("u", k)
    aec = AsyncExecutionController(b, buffer_timeout_ms=0)
    futs: dict[str, Any] = {}
    for key, ukey in (("A", "u"), ("B", {}), ("C", "u")):
        aec.process(key, lambda _, key=key, ukey=ukey: futs.__setitem__(key, m.async_get(ukey)))
    aec.drain()
    assert futs["A"].get() == "A" and futs["C"].get() == "C"
    with pytest.raises(TypeError):
        futs["B"].get()


# ------------------------------------------------------------ misuse that would hang


@pytest.mark.parametrize("where", ["callback", "process"])
def test_drain_inside_a_record_raises_instead_of_hanging(where: str) -> None:
    b = _backend()
    c = b.get_state(ValueStateDescriptor("c", default_value=0))
    aec = AsyncExecutionController(b, buffer_timeout_ms=0)
    errors: list[BaseException] = []

    def misuse(*_: Any) -> None:
        try:
            aec.drain()
        except RuntimeError as exc:
            errors.append(exc)

    if where == "callback":
        aec.process("k", lambda _: c.async_value().then_accept(misuse))
    else:
        aec.process("k", misuse)
    aec.drain()
    assert len(errors) == 1 and "drain" in str(errors[0])
    assert aec.in_flight_records == 0


def test_a_serial_non_record_action_inside_a_callback_raises() -> None:
    b = _backend()
    c = b.get_state(ValueStateDescriptor("c", default_value=0))
    aec = AsyncExecutionController(b, buffer_timeout_ms=0, epoch_mode=EpochMode.SERIAL_BETWEEN_EPOCH)
    errors: list[BaseException] = []
    fired: list[str] = []

    def misuse(_: Any) -> None:
        try:
            aec.process_non_record(lambda: fired.append("wm"))
        except RuntimeError as exc:
            errors.append(exc)

    aec.process("k", lambda _: c.async_value().then_accept(misuse))
    aec.drain()
    assert len(errors) == 1 and "process_non_record" in str(errors[0])
    # the refused call changed nothing: a later watermark still runs once, after the record
    aec.process_non_record(lambda: fired.append("wm2"))
    assert fired == ["wm2"]


# ------------------------------------------------------------ a hot key


def test_a_hot_key_is_handed_over_in_arrival_order_with_priorities_first() -> None:
    b = _backend()
    log = b.get_list_state(ListStateDescriptor("log"))
    aec = AsyncExecutionController(b, batch_size=7, max_in_flight_records=10_000, buffer_timeout_ms=0)
    order: list[int] = []
    n = 3_000
    prios = {i: (2 if i % 97 == 5 else 1 if i % 31 == 3 else 0) for i in range(1, n)}
    aec.process("hot", lambda _: log.async_add(0))  # takes the key: every later record waits
    for i in range(1, n):
        aec.process("hot", lambda _, i=i: log.async_add(i).then_accept(lambda _: order.append(i)),
                    priority=prios[i])
    aec.drain()
    expected = sorted(range(1, n), key=lambda i: (-prios[i], i))
    assert order == expected
    b.set_current_key("hot")
    assert log.get() == [0, *expected]
    assert aec.blocking_size == 0 and aec.blocked_keys == 0


def test_a_waiting_record_with_requests_made_later_keeps_them_in_order() -> None:
    """A blocked record whose requests come in two bursts (a sync point's callback runs only
    when it holds the key) still runs them in its own order, after the records before it."""
    b = _backend()
    log = b.get_list_state(ListStateDescriptor("log"))
    aec = AsyncExecutionController(b, buffer_timeout_ms=0)
    aec.process("k", lambda _: log.async_add("first"))
    aec.process("k", lambda _: (log.async_add("second-a"), aec.sync_point(lambda: log.async_add("second-b"))))
    aec.process("k", lambda _: log.async_add("third"))
    aec.drain()
    b.set_current_key("k")
    assert log.get() == ["first", "second-a", "second-b", "third"]


# ------------------------------------------------------------ the buffer timeout


def test_the_buffer_timeout_uses_no_thread_per_batch() -> None:
    b = _backend()
    c = b.get_state(ValueStateDescriptor("c", default_value=0))
    aec = AsyncExecutionController(b, batch_size=1, buffer_timeout_ms=60_000)
    before = threading.active_count()
    for i in range(300):  # one batch per record: 300 batches armed
        aec.process(i, lambda _: c.async_value().then_compose(lambda n: c.async_update(n + 1)))
    aec.drain()
    assert threading.active_count() <= before + 1


def test_the_buffer_timeout_still_runs_a_partial_batch() -> None:
    b = _backend()
    c = b.get_state(ValueStateDescriptor("c", default_value=0))
    aec = AsyncExecutionController(b, batch_size=100, buffer_timeout_ms=20)
    aec.process("a", lambda _: c.async_update(3))
    t0 = time.monotonic()
    assert aec.mailbox.run_until(lambda: aec.batches_run >= 1, timeout=5)
    assert time.monotonic() - t0 >= 0.015
    assert aec.in_flight_records == 0


@pytest.mark.parametrize("bad", [math.inf, 1e300, math.nan, -1, 10**30])
def test_absurd_buffer_timeouts_are_refused(bad: Any) -> None:
    with pytest.raises(ValueError, match="buffer_timeout_ms"):
        AsyncExecutionController(_backend(), buffer_timeout_ms=bad)
    aec = AsyncExecutionController(_backend(), buffer_timeout_ms=0)
    with pytest.raises(ValueError, match="buffer_timeout_ms"):
        aec.buffer_timeout_ms = bad
    assert aec.buffer_timeout_ms == 0


@pytest.mark.parametrize("bad", [True, "10", None])
def test_a_buffer_timeout_that_is_no_number_is_a_type_error(bad: Any) -> None:
    with pytest.raises(TypeError, match="buffer_timeout_ms"):
        AsyncExecutionController(_backend(), buffer_timeout_ms=bad)


@pytest.mark.parametrize("name", ["batch_size", "max_in_flight_records"])
@pytest.mark.parametrize("bad", [0, -3])
def test_sizes_set_after_construction_are_checked(name: str, bad: int) -> None:
    aec = AsyncExecutionController(_backend(), buffer_timeout_ms=0)
    with pytest.raises(ValueError, match=name):
        setattr(aec, name, bad)


# ------------------------------------------------------------ futures the controller owns


@pytest.mark.parametrize("how", ["complete", "complete_exceptionally"])
@pytest.mark.parametrize("which", ["request", "derived"])
def test_futures_of_async_state_calls_cannot_be_completed_by_hand(how: str, which: str) -> None:
    b = _backend()
    c = b.get_state(ValueStateDescriptor("c", default_value=0))
    aec = AsyncExecutionController(b, buffer_timeout_ms=0)
    held: list[Any] = []

    def fn(_: Any) -> None:
        f = c.async_update(7)
        held.append(f if which == "request" else f.then_apply(lambda v: v))

    aec.process("k", fn)
    (f,) = held
    with pytest.raises(RuntimeError, match="complete"):
        if how == "complete":
            f.complete(1)
        else:
            f.complete_exceptionally(ValueError("x"))
    aec.drain()  # the request still runs, once, and nothing is "already complete"
    assert f.is_done() and f.get() is None
    b.set_current_key("k")
    assert c.value() == 7
    aec.process("k2", lambda _: c.async_value())
    aec.drain()


def test_a_batch_started_from_a_callback_cannot_overtake_a_records_older_request() -> None:
    """R queues a read then a write (the write waits for a later wave); the read's
    callback queues a second write. Another record's callback in the same wave fills
    the buffer by processing new records: no batch may start inside the running one,
    or R's newer write would run before its older one."""
    b = _backend()
    s = b.get_state(ValueStateDescriptor("s", default_value=0))
    o = b.get_state(ValueStateDescriptor("o", default_value=0))
    aec = AsyncExecutionController(b, batch_size=3, max_in_flight_records=2, buffer_timeout_ms=0)

    def r(_: Any) -> None:
        s.async_value().then_accept(lambda _: s.async_update(2))
        s.async_update(1)

    def other(_: Any) -> None:
        def cb(_: Any) -> None:
            for i in range(5):
                aec.process(("n", i), lambda _: o.async_value())
            assert aec.trigger() == 0

        o.async_value().then_accept(cb)

    aec.process("R", r)
    aec.process("other", other)
    aec.drain()
    b.set_current_key("R")
    assert s.value() == 2


def test_a_mailbox_without_delayed_mails_is_refused() -> None:
    class Plain:
        _task_thread = threading.get_ident()

        def post(self, mail: Any) -> None: ...

    with pytest.raises(TypeError, match="post_delayed"):
        AsyncExecutionController(_backend(), mailbox=Plain())


def test_a_timeout_mail_outliving_its_controller_or_its_timeout_does_nothing() -> None:
    b = _backend()
    c = b.get_state(ValueStateDescriptor("c", default_value=0))
    aec = AsyncExecutionController(b, batch_size=100, buffer_timeout_ms=5)
    mailbox = aec.mailbox
    aec.process("a", lambda _: c.async_update(1))
    assert mailbox.delayed == 1
    aec.buffer_timeout_ms = 0  # switched off while armed: the mail finds nothing to do
    time.sleep(0.01)
    mailbox.run_available()
    assert aec.batches_run == 0 and aec.active_size == 1
    aec.buffer_timeout_ms = 5
    aec.drain()
    aec.process("b", lambda _: c.async_update(2))  # arms a mail, then the controller goes
    del aec
    time.sleep(0.01)
    assert mailbox.run_available() >= 1  # ran, and did nothing
    assert mailbox.delayed == 0


def test_one_pending_timeout_mail_serves_every_batch() -> None:
    b = _backend()
    c = b.get_state(ValueStateDescriptor("c", default_value=0))
    aec = AsyncExecutionController(b, batch_size=1, buffer_timeout_ms=60_000)
    for i in range(50):
        aec.process(i, lambda _: c.async_value())
    assert aec.mailbox.delayed <= 1
    aec.drain()


def test_process_from_a_record_at_the_in_flight_limit_names_that_cause() -> None:
    """With the caller itself filling the in-flight limit, a process() from its own code can never
    start: the error says so, not only that a request may never complete."""
    b = _backend()
    c = b.get_state(ValueStateDescriptor("c", default_value=0))
    aec = AsyncExecutionController(b, batch_size=1, max_in_flight_records=1)

    def outer(r: int) -> None:
        aec.process("other", lambda r2: c.async_update(r2), r + 1)

    with pytest.raises(RuntimeError, match=r"limit \(1 records\) reached .* process\(\) called from a record's own"):
        aec.process("k", outer, 1)
