"""``AsyncExecutionController``: the behaviours of Flink's AsyncExecutionControllerTest,
EpochManagerTest and KeyAccountingUnitTest, over cowmap's keyed state."""

from __future__ import annotations

import random
import time
from collections import defaultdict
from typing import Any

import pytest

from cowmap.asyncstate import AsyncExecutionController, EpochMode
from cowmap.state import KeyedStateBackend, ListStateDescriptor, MapStateDescriptor, ValueStateDescriptor


def make(**kw: Any) -> tuple[KeyedStateBackend, Any, AsyncExecutionController]:
    backend = KeyedStateBackend(max_parallelism=16)
    count = backend.get_state(ValueStateDescriptor("count", default_value=0))
    kw.setdefault("buffer_timeout_ms", 0)
    return backend, count, AsyncExecutionController(backend, **kw)


def increment(count: Any, out: list | None = None, tag: Any = None) -> Any:
    """A record's processing: read, then write the count + 1 (and log what was read)."""

    def fn(_: Any) -> None:
        def write(n: int) -> Any:
            if out is not None:
                out.append((tag, n))
            return count.async_update(n + 1)

        count.async_value().then_compose(write)

    return fn


def assert_quiet(aec: AsyncExecutionController) -> None:
    assert aec.in_flight_records == 0
    assert aec.active_size == 0
    assert aec.blocking_size == 0
    assert aec.occupied_keys == 0


def test_step_by_step_sizes_and_reference_counts() -> None:
    backend, count, aec = make(batch_size=100)
    out: list = []
    aec.process("k1", increment(count, out, "r1"))
    assert (aec.in_flight_records, aec.active_size, aec.blocking_size, aec.occupied_keys) == (1, 1, 0, 1)
    aec.process("k2", increment(count, out, "r2"))
    assert (aec.in_flight_records, aec.active_size, aec.blocking_size, aec.occupied_keys) == (2, 2, 0, 2)
    aec.process("k1", increment(count, out, "r3"))  # k1 is held by r1: r3 waits
    assert (aec.in_flight_records, aec.active_size, aec.blocking_size, aec.blocked_keys) == (3, 2, 1, 1)
    assert aec.trigger() == 2  # r1's and r2's reads; their writes are queued
    assert out == [("r1", 0), ("r2", 0)]
    assert (aec.in_flight_records, aec.active_size, aec.blocking_size) == (3, 2, 1)
    assert aec.trigger() == 2  # the writes: r1 and r2 are done, r3 gets k1
    assert (aec.in_flight_records, aec.active_size, aec.blocking_size, aec.occupied_keys) == (1, 1, 0, 1)
    aec.drain()
    assert out == [("r1", 0), ("r2", 0), ("r3", 1)]
    assert_quiet(aec)
    backend.set_current_key("k1")
    assert count.value() == 2


def test_a_later_record_of_a_key_waits_for_the_earlier_one_to_finish() -> None:
    backend, count, aec = make(batch_size=1)  # every request is its own batch
    out: list = []
    aec.process("k1", increment(count, out, "r1"))
    aec.process("k2", increment(count, out, "r2"))
    aec.process("k1", increment(count, out, "r3"))
    aec.drain()
    assert sorted(out) == [("r1", 0), ("r2", 0), ("r3", 1)]  # r3 saw r1's write
    assert out.index(("r3", 1)) > out.index(("r1", 0))
    assert_quiet(aec)


def test_in_flight_control_with_distinct_keys_and_with_one_key() -> None:
    backend, count, aec = make(batch_size=5, max_in_flight_records=10)
    for i in range(10):
        aec.process(f"k{i}", increment(count))
        assert aec.in_flight_records <= 10
    assert aec.batches_run >= 1  # full batches ran on the way
    aec.drain()
    assert_quiet(aec)

    backend, count, aec = make(batch_size=5, max_in_flight_records=10)
    for _ in range(10):
        aec.process("same", increment(count))
    assert (aec.in_flight_records, aec.active_size, aec.blocking_size) == (10, 1, 9)
    aec.process("same", increment(count))  # the limit: back pressure runs batches first
    assert aec.in_flight_records <= 10
    aec.drain()
    backend.set_current_key("same")
    assert count.value() == 11
    assert_quiet(aec)


def test_sync_point_on_a_free_and_on_an_occupied_key() -> None:
    backend, count, aec = make(batch_size=100)
    seen: list[str] = []
    aec.process("free", lambda _: aec.sync_point(lambda: seen.append("free")))
    assert seen == ["free"]  # the key was free: ran at once
    assert aec.in_flight_records == 0
    aec.process("busy", increment(count))
    aec.process("busy", lambda _: aec.sync_point(lambda: seen.append("busy")))
    assert seen == ["free"] and aec.blocking_size == 1
    aec.drain()
    assert seen == ["free", "busy"]
    assert_quiet(aec)


def test_buffer_timeout_runs_a_partial_batch_and_stale_timeouts_are_skipped() -> None:
    backend, count, aec = make(batch_size=100, buffer_timeout_ms=20)
    aec.process("a", increment(count))
    assert aec.active_size == 1
    assert aec.mailbox.run_until(lambda: aec.batches_run >= 1, timeout=5)
    runs = aec.batches_run
    aec.trigger()  # runs the write queued by the read's callback
    time.sleep(0.05)  # the write's timeout fires for a batch that already ran
    aec.mailbox.run_available()
    assert aec.batches_run == runs + 1
    aec.drain()
    assert_quiet(aec)


def test_an_exception_in_user_code_surfaces() -> None:
    backend, count, aec = make(batch_size=100)

    def bad(_: Any) -> None:
        count.async_value().then_accept(lambda n: 1 // n)

    aec.process("k", bad)
    with pytest.raises(ZeroDivisionError):
        aec.drain()


def test_a_failing_request_fails_its_future() -> None:
    backend = KeyedStateBackend()
    lst = backend.get_list_state(ListStateDescriptor("l"))
    aec = AsyncExecutionController(backend, buffer_timeout_ms=0)
    futures: list = []
    aec.process("k", lambda _: futures.append(lst.async_add(None)))
    aec.drain()
    with pytest.raises(ValueError, match="None"):
        futures[0].get()
    assert_quiet(aec)


def test_async_calls_outside_process_raise() -> None:
    backend, count, aec = make()
    with pytest.raises(RuntimeError, match="inside"):
        count.async_value()
    other = KeyedStateBackend().get_state(ValueStateDescriptor("v"))
    with pytest.raises(RuntimeError, match="AsyncExecutionController"):
        other.async_value()


@pytest.mark.parametrize("mode", list(EpochMode))
def test_epochs_run_their_actions_after_exactly_the_earlier_records(mode: EpochMode) -> None:
    backend, count, aec = make(batch_size=100, epoch_mode=mode)
    log: list[str] = []

    def rec(tag: str) -> Any:
        def fn(_: Any) -> None:
            count.async_value().then_compose(lambda n: count.async_update(n + 1)).then_accept(lambda _: log.append(tag))

        return fn

    aec.process("a", rec("a"))
    aec.process("b", rec("b"))
    aec.process_non_record(lambda: log.append("trigger"), lambda: log.append("final"))
    aec.process("c", rec("c"))
    aec.drain()
    if mode is EpochMode.SERIAL_BETWEEN_EPOCH:
        assert log == ["a", "b", "trigger", "final", "c"]  # c waited for the epoch
    else:
        assert log == ["trigger", "a", "b", "final", "c"]  # trigger at once, final after a and b
    assert_quiet(aec)


def test_async_twins_of_every_state_kind() -> None:
    backend = KeyedStateBackend()
    lst = backend.get_list_state(ListStateDescriptor("l"))
    mp = backend.get_map_state(MapStateDescriptor("m"))
    aec = AsyncExecutionController(backend, buffer_timeout_ms=0)
    got: dict[str, Any] = {}

    def fn(_: Any) -> None:
        lst.async_add_all([1, 2]).then_compose(lambda _: lst.async_get()).then_compose(
            lambda it: it.on_next(lambda x: x * 10)
        ).then_accept(lambda r: got.__setitem__("list", r))
        mp.async_put_all({"a": 1, "b": 2}).then_compose(lambda _: mp.async_entries()).then_accept(
            lambda it: got.__setitem__("map", sorted(it))
        )
        mp.async_contains("zz").then_accept(lambda c: got.__setitem__("contains", c))

    aec.process("k", fn)
    aec.drain()
    assert got == {"list": [10, 20], "map": [("a", 1), ("b", 2)], "contains": False}
    assert_quiet(aec)


@pytest.mark.parametrize("seed", range(5))
def test_randomized_records_match_a_sequential_run(seed: int) -> None:
    """Many records over few keys with random async chains: per key, the results
    equal a sequential run, and nothing is left in flight."""
    rnd = random.Random(seed)
    backend = KeyedStateBackend(max_parallelism=8)
    hist = backend.get_list_state(ListStateDescriptor("hist"))
    total = backend.get_state(ValueStateDescriptor("total", default_value=0))
    aec = AsyncExecutionController(
        backend, batch_size=rnd.choice([1, 3, 16]), max_in_flight_records=rnd.choice([2, 8, 50]), buffer_timeout_ms=0
    )
    expected: dict[str, list[int]] = defaultdict(list)
    seen_totals: dict[str, list[int]] = defaultdict(list)
    records = [(rnd.choice("abcde"), rnd.randrange(100)) for _ in range(300)]

    for key, v in records:
        expected[key].append(v)

        def fn(v: int, key: str = key) -> None:
            def after_total(t: int) -> Any:
                seen_totals[key].append(t)
                return total.async_update(t + v).then_compose(lambda _: hist.async_add(v))

            total.async_value().then_compose(after_total)

        aec.process(key, fn, v)
        if rnd.random() < 0.05:
            aec.process_non_record(None, None)
    aec.drain()
    assert_quiet(aec)
    for key, vs in expected.items():
        backend.set_current_key(key)
        assert hist.get() == vs  # the records of a key ran in arrival order
        assert total.value() == sum(vs)
        sums = [sum(vs[:i]) for i in range(len(vs))]
        assert seen_totals[key] == sums


@pytest.mark.parametrize("on_read", [False, True])
@pytest.mark.parametrize("batch_size", [1, 7, 1000])
def test_vectorised_value_batches_equal_the_sync_path_with_ttl(on_read: bool, batch_size: int) -> None:
    """Reads and writes run as multi-map core calls: same results as the sync
    methods, expiry and refresh included."""
    from datetime import timedelta

    from cowmap.state import StateTtlConfig, UpdateType

    def backend_and_state() -> tuple[KeyedStateBackend, Any, list[int]]:
        clock = [0]
        b = KeyedStateBackend(max_parallelism=32, time_provider=lambda: clock[0])
        d = ValueStateDescriptor("v", default_value=-1)
        cfg = StateTtlConfig.new_builder(timedelta(milliseconds=50))
        if on_read:
            cfg.set_update_type(UpdateType.OnReadAndWrite)
        d.enable_time_to_live(cfg.disable_cleanup_in_background().build())
        return b, b.get_state(d), clock

    rnd = random.Random(batch_size * 2 + on_read)
    records = [(rnd.randrange(40), rnd.randrange(1, 9)) for _ in range(600)]
    sb, ss, sclock = backend_and_state()
    ab, asv, aclock = backend_and_state()
    aec = AsyncExecutionController(ab, batch_size=batch_size, buffer_timeout_ms=0)
    sync_seen: list[tuple[int, int]] = []
    async_seen: list[tuple[int, int]] = []
    for i, (key, dt) in enumerate(records):
        if i % 50 == 0:  # a time step: drain first, so both sides read at the same times
            aec.drain()
            sclock[0] += dt * 10
            aclock[0] = sclock[0]
        sb.set_current_key(key)
        v = ss.value()
        sync_seen.append((key, v))
        ss.update(v + 1)

        def fn(_: Any, key: int = key) -> None:
            def write(got: int) -> Any:
                async_seen.append((key, got))
                return asv.async_update(got + 1)

            asv.async_value().then_compose(write)

        aec.process(key, fn)
    aec.drain()
    assert sorted(async_seen) == sorted(sync_seen)
    per_key_sync: dict[int, list[int]] = defaultdict(list)
    per_key_async: dict[int, list[int]] = defaultdict(list)
    for k, v in sync_seen:
        per_key_sync[k].append(v)
    for k, v in async_seen:
        per_key_async[k].append(v)
    assert per_key_async == per_key_sync
    if batch_size == 1000:
        assert aec.core_calls <= 2 * aec.batches_run  # one call per state and type per batch


def test_core_calls_per_thousand_records() -> None:
    backend, count, aec = make(batch_size=1000)
    for i in range(3000):
        aec.process(i, increment(count))
    aec.drain()
    assert aec.core_calls <= 10 * 3  # the sync path would make 2 calls per record
    backend.set_current_key(1234)
    assert count.value() == 1


def test_mixed_parallel_and_serial_epochs() -> None:
    backend, count, aec = make(batch_size=100, epoch_mode=EpochMode.PARALLEL_BETWEEN_EPOCH)
    log: list[str] = []

    def rec(tag: str) -> Any:
        def fn(_: Any) -> None:
            count.async_value().then_compose(lambda n: count.async_update(n + 1)).then_accept(lambda _: log.append(tag))

        return fn

    aec.process("a", rec("a"))
    aec.process_non_record(lambda: log.append("t1"), lambda: log.append("f1"))  # parallel
    aec.process("b", rec("b"))
    aec.process_non_record(lambda: log.append("t2"), lambda: log.append("f2"), mode=EpochMode.SERIAL_BETWEEN_EPOCH)
    assert log == ["t1", "a", "f1", "b", "t2", "f2"]  # serial t2 waited for a and b
    aec.process("c", rec("c"))
    aec.process_non_record(lambda: log.append("t3"), lambda: log.append("f3"))
    assert log[-1] == "t3"
    aec.drain()
    assert log[-2:] == ["c", "f3"]
    assert_quiet(aec)


def test_higher_priority_records_take_a_busy_key_first() -> None:
    backend, count, aec = make(batch_size=100)
    out: list = []
    aec.process("k", increment(count, out, "first"))
    aec.process("k", increment(count, out, "normal"))
    aec.process("k", increment(count, out, "timer"), priority=1)
    aec.drain()
    assert [t for t, _ in out] == ["first", "timer", "normal"]
    assert [n for _, n in out] == [0, 1, 2]
    assert_quiet(aec)


@pytest.mark.parametrize("ttl", [False, True])
@pytest.mark.parametrize("batch_size", [1, 9, 1000])
def test_vectorised_map_batches_equal_the_sync_path(ttl: bool, batch_size: int) -> None:
    from datetime import timedelta

    from cowmap.state import StateTtlConfig

    def setup() -> tuple[KeyedStateBackend, Any, list[int]]:
        clock = [0]
        b = KeyedStateBackend(max_parallelism=16, time_provider=lambda: clock[0])
        d = MapStateDescriptor("m")
        if ttl:
            d.enable_time_to_live(StateTtlConfig.new_builder(timedelta(milliseconds=40)).disable_cleanup_in_background().build())
        return b, b.get_map_state(d), clock

    rnd = random.Random(batch_size + ttl)
    records = [(rnd.randrange(15), rnd.randrange(6)) for _ in range(500)]
    sb, sm, sclock = setup()
    ab, am, aclock = setup()
    aec = AsyncExecutionController(ab, batch_size=batch_size, buffer_timeout_ms=0)
    seen_sync: dict[int, list] = defaultdict(list)
    seen_async: dict[int, list] = defaultdict(list)
    for i, (key, uk) in enumerate(records):
        if i % 40 == 0:
            aec.drain()
            sclock[0] += 15
            aclock[0] = sclock[0]
        sb.set_current_key(key)
        v = sm.get(uk)
        seen_sync[key].append(v)
        sm.put(uk, (v or 0) + 1)

        def fn(_: Any, key: int = key, uk: int = uk) -> None:
            def write(got: Any) -> Any:
                seen_async[key].append(got)
                return am.async_put(uk, (got or 0) + 1)

            am.async_get(uk).then_compose(write)

        aec.process(key, fn)
    aec.drain()
    assert seen_async == seen_sync
    for key in {k for k, _ in records}:
        sb.set_current_key(key)
        ab.set_current_key(key)
        assert am.items() == sm.items()  # the same entries, in the same insertion order
    if batch_size == 1000:
        assert aec.core_calls <= 2 * aec.batches_run


# --------------------------------------------------------------------------- compiled hot path


def test_several_requests_of_a_record_to_one_state_run_in_order_within_a_batch() -> None:
    """Requests not chained on each other, same (state, key), one batch: each wave
    takes the first of them, so they run in issue order."""
    backend, count, aec = make(batch_size=1000)
    other = backend.get_state(ValueStateDescriptor("other", default_value=0))
    seen: list[Any] = []

    def fn(_: Any) -> None:
        count.async_update(1)
        other.async_update(10)
        count.async_update(2)
        count.async_value().then_accept(lambda v: seen.append(("count", v)))
        other.async_value().then_accept(lambda v: seen.append(("other", v)))
        other.async_update(11)
        other.async_value().then_accept(lambda v: seen.append(("other", v)))

    aec.process("k", fn)
    aec.process("j", fn)
    assert aec.active_size == 14
    assert aec.trigger() == 14
    # waves: (c:1, o:10), (c:2, o:value), (c:value, o:11), (o:value), for k then j in each group
    assert seen == [("other", 10), ("other", 10), ("count", 2), ("count", 2), ("other", 11), ("other", 11)]
    assert_quiet(aec)


def test_a_batch_with_many_states_groups_by_state_and_type() -> None:
    backend = KeyedStateBackend(max_parallelism=16)
    states = [backend.get_state(ValueStateDescriptor(f"s{i}", default_value=i)) for i in range(20)]
    aec = AsyncExecutionController(backend, batch_size=10_000, buffer_timeout_ms=0)
    got: dict[tuple[int, int], int] = {}
    for key in range(30):

        def fn(_: Any, key: int = key) -> None:
            for i, s in enumerate(states):
                s.async_value().then_compose(lambda v, s=s: s.async_update(v + key)).then_accept(
                    lambda _, i=i, key=key: got.__setitem__((key, i), 1)
                )

        aec.process(key, fn)
    aec.drain()
    assert len(got) == 30 * 20
    assert aec.core_calls == 2 * 20  # one value and one update call per state
    for key in range(30):
        backend.set_current_key(key)
        assert [s.value() for s in states] == [i + key for i in range(20)]
    assert_quiet(aec)


def test_reused_request_and_future_objects_keep_their_results() -> None:
    """Requests, futures and contexts are recycled through free lists: futures kept
    by the user must keep their results while later records reuse the memory."""
    backend, count, aec = make(batch_size=50)
    kept: list[Any] = []
    for _rnd in range(5):
        for i in range(200):
            aec.process(i, lambda _: kept.append(
                count.async_value().then_compose(lambda n: count.async_update(n + 1).then_apply(lambda _: n))))
        aec.drain()
    assert all(f.is_done() for f in kept)
    assert [f.get() for f in kept] == [r for r in range(5) for _ in range(200)]
    assert_quiet(aec)


def test_compiled_twins_and_handle_request_reject_bad_input() -> None:
    backend, count, aec = make()
    with pytest.raises(TypeError, match="op must be a str"):
        aec.process("k", lambda _: aec.handle_request(count, 3))
    aec.drain()
    with pytest.raises(AttributeError):  # the controller lookup is compiled: not Python's to redirect
        backend.key_context.aec = "not a controller"  # type: ignore[misc]
    from cowmap.asyncstate import RecordContext

    with pytest.raises(TypeError, match="AsyncExecutionController"):
        RecordContext("nope", None, "k", 0, None)


def test_handle_request_with_an_op_name_equal_to_a_known_one_groups_with_it() -> None:
    backend, count, aec = make(batch_size=1000)
    op = "".join(["val", "ue"])  # equal to "value", another object
    got: list[Any] = []
    aec.process("a", lambda _: aec.handle_request(count, op).then_accept(got.append))
    aec.process("b", lambda _: count.async_value().then_accept(got.append))
    aec.drain()
    assert got == [0, 0] and aec.core_calls == 1


def test_a_batch_method_returning_the_wrong_number_of_results_is_an_error() -> None:
    backend = KeyedStateBackend(max_parallelism=16)

    from cowmap.state.value_state import ValueState

    class Short(ValueState):
        __slots__ = ()

        def _batch_value(self, reqs: list[Any]) -> list[Any]:
            return [0] * (len(reqs) - 1)

    s = Short(backend.get_state(ValueStateDescriptor("v"))._t)
    aec = AsyncExecutionController(backend, buffer_timeout_ms=0)
    aec.process("a", lambda _: s.async_value())
    aec.process("b", lambda _: s.async_value())
    with pytest.raises(RuntimeError, match="returned 1 results for 2 requests"):
        aec.trigger()


def test_reference_counts_of_values_and_functions_stay_flat() -> None:
    import gc
    import sys

    backend, count, aec = make(batch_size=64)
    val = object()
    store = backend.get_state(ValueStateDescriptor("obj"))

    def fn(_: Any) -> None:
        store.async_update(val).then_compose(lambda _: store.async_value()).then_accept(lambda v: None)
        count.async_value().then_compose(lambda n: count.async_update(n + 1))

    def run() -> None:
        for i in range(500):
            aec.process(i, fn)
        aec.drain()

    run()
    gc.collect()
    before = (sys.getrefcount(val), sys.getrefcount(fn), sys.getrefcount(store), sys.getrefcount(aec))
    for _ in range(3):
        run()
    gc.collect()
    after = (sys.getrefcount(val), sys.getrefcount(fn), sys.getrefcount(store), sys.getrefcount(aec))
    assert after == before
    assert_quiet(aec)


def test_batch_helpers_and_run_group_reject_bad_requests() -> None:
    from cowmap._requests import map_contexts, positions, replace_all, request_args, request_columns
    from cowmap.asyncstate import StateFuture

    backend, count, aec = make(batch_size=100)
    reqs: list[Any] = []
    aec.process("k", lambda _: reqs.append(count.async_update(5)))
    assert request_args(reqs, 0) == [5]
    assert request_columns(reqs) == ([reqs[0]._ctx.key_group], ["k"], [count.get_current_namespace()])
    with pytest.raises(TypeError, match="expected a request"):
        request_columns([object()])
    with pytest.raises(ValueError, match="not a request"):
        request_columns([StateFuture()])
    with pytest.raises(ValueError, match="no argument 1"):
        request_args(reqs, 1)
    with pytest.raises(ValueError, match="same length"):
        map_contexts([1, 2], [None], None, None)
    assert positions([None, 1, None], None) == [0, 2]
    assert replace_all([None, 1], None, 0) == [0, 1]
    with pytest.raises(TypeError, match="non-empty list"):
        aec._run_group([])
    with pytest.raises(TypeError, match="expected a request"):
        aec._run_group([object()])
    with pytest.raises(ValueError, match="not a request"):
        aec._run_group([StateFuture()])
    aec.drain()
    assert reqs[0].get() is None
    assert_quiet(aec)


def test_views_of_subclasses_work_and_uninitialised_views_are_refused() -> None:
    """The twins read a view's namespace and key context from its compiled fields
    (StateView): a subclass view works as its base; a view made without __init__
    (fields never set) is refused, not read at an offset."""
    from cowmap.state.value_state import ValueState

    backend, count, aec = make(batch_size=100)

    class V(ValueState):
        __slots__ = ()

    v = V(count._t)
    v.set_current_namespace("w")
    reqs: list[Any] = []
    aec.process("k", lambda _: reqs.append(v.async_update(2)))
    assert reqs[-1]._ns == "w"
    aec.drain()
    backend.set_current_key("k")
    count.set_current_namespace("w")
    assert count.value() == 2
    empty = ValueState.__new__(ValueState)  # fields never set
    with pytest.raises(RuntimeError, match="not initialised"):
        aec.process("j", lambda _: empty.async_value())


def test_chaining_on_a_future_of_a_finished_record_does_not_dispose_it_again() -> None:
    from cowmap.asyncstate import StateFutureUtils

    backend, count, aec = make()
    held: list = []
    aec.process("a", lambda _: held.append(count.async_value()))
    aec.drain()
    assert_quiet(aec)
    # later chains on the finished record's future run inline and leave the count alone
    assert held[0].then_apply(lambda v: v + 1).get() == 1
    assert StateFutureUtils.combine_all([held[0], held[0]]).get() == [0, 0]
    assert held[0].then_compose(lambda v: held[0]).get() == 0
    assert aec.in_flight_records == 0
    # an epoch's final action still waits for its records
    pending: list = []
    aec.process("b", lambda _: pending.append(count.async_value()))
    ran: list = []
    aec.process_non_record(None, lambda: ran.append(1), mode=EpochMode.PARALLEL_BETWEEN_EPOCH)
    held[0].then_accept(lambda v: None)
    assert ran == [] and aec.in_flight_records == 1 and not pending[0].is_done()
    aec.drain(timeout=5)
    assert ran == [1]
    assert_quiet(aec)


def test_a_raising_callback_does_not_abandon_the_rest_of_the_batch() -> None:
    backend, count, aec = make(batch_size=100)
    futures: list = []

    def boom(_: Any) -> None:
        raise ValueError("user callback failed")

    for k in range(5):
        aec.process(k, lambda _, k=k: futures.append(count.async_value().then_apply(boom if k == 0 else (lambda v: v))))
    aec.process(1, lambda _: futures.append(count.async_update(7)))  # a second record of key 1
    aec.process(9, lambda _: (count.async_update(3), futures.append(count.async_value())))  # two waves
    with pytest.raises(ValueError, match="user callback failed"):
        aec.trigger()  # the first exception surfaces once the whole batch ran
    assert all(f.is_done() for f in futures[:5] + futures[6:])
    with pytest.raises(ValueError):
        futures[0].get()
    assert futures[6].get() == 3
    aec.drain(timeout=5)  # the rest (key 1's second record) still runs
    assert all(f.is_done() for f in futures)
    assert_quiet(aec)
    backend.set_current_key(1)
    assert count.value() == 7


def test_drain_raises_instead_of_hanging_when_a_failed_callback_left_a_record_unfinished() -> None:
    backend, count, aec = make()

    def rec(_: Any) -> None:
        f = count.async_value()
        f.then_accept(lambda v: 1 // 0)
        f.then_accept(lambda v: None)  # skipped: the callback before it raised

    aec.process("k", rec)
    with pytest.raises(ZeroDivisionError):
        aec.drain(timeout=5)
    with pytest.raises(RuntimeError, match="never finish") as info:
        aec.drain(timeout=1)  # (without the stored failure: waits, then TimeoutError)
    assert isinstance(info.value.__cause__, ZeroDivisionError)


@pytest.mark.parametrize("priority", [None, "high", 1.5])
def test_a_priority_that_is_not_an_int_is_rejected(priority: Any) -> None:
    backend, count, aec = make()
    futures: list = []
    aec.process("k", lambda _: futures.append(count.async_value()))
    with pytest.raises(TypeError, match="priority must be an int"):
        aec.process("k", lambda _: futures.append(count.async_value()), priority=priority)
    aec.process("k", lambda _: futures.append(count.async_value()), priority=2)
    aec.drain(timeout=5)
    assert len(futures) == 2 and all(f.is_done() for f in futures)
    assert_quiet(aec)


def test_callbacks_run_with_their_record_s_key_current_on_the_backend() -> None:
    backend, count, aec = make(batch_size=100)
    for k in ("a", "b", "c"):
        aec.process(k, lambda _, k=k: count.async_update(ord(k)))
    aec.drain()
    seen: list = []
    # the vectorised path: each callback reads its own key's value synchronously
    for k in ("a", "b", "c"):
        aec.process(k, lambda _, k=k: count.async_value().then_accept(
            lambda v, k=k: seen.append((k, backend.get_current_key(), v, count.value()))))
    aec.drain()
    assert sorted(seen) == [(k, k, ord(k), ord(k)) for k in ("a", "b", "c")]
    # a sync point released when the key's earlier record finishes
    seen.clear()
    aec.process("a", lambda _: count.async_value())  # holds key a
    aec.process("a", lambda _: aec.sync_point(lambda: seen.append((backend.get_current_key(), count.value()))))
    aec.process("b", lambda _: None)  # the backend's current key is now b
    aec.drain()
    assert seen == [("a", ord("a"))]
    assert_quiet(aec)


def test_two_views_of_one_table_keep_a_record_s_order() -> None:
    backend = KeyedStateBackend(max_parallelism=16)
    s1 = backend.get_state(ValueStateDescriptor("v"))
    s2 = backend.get_state(ValueStateDescriptor("v"))  # another view of the same table
    assert s1._t is s2._t and s1 is not s2
    aec = AsyncExecutionController(backend, buffer_timeout_ms=0)
    out: dict = {}
    aec.process("other", lambda _: s2.async_value())  # the (s2, value) group comes first

    def rec(_: Any) -> None:
        s1.async_update(42)
        s2.async_value().then_accept(lambda v: out.setdefault("read", v))
        s1.async_value().then_accept(lambda v: out.setdefault("read again", v))

    aec.process("k", rec)
    aec.drain()
    assert out == {"read": 42, "read again": 42}
    assert_quiet(aec)


def test_a_record_composing_a_future_completed_on_another_thread_finishes_on_the_task_thread() -> None:
    import threading

    from cowmap.asyncstate import StateFuture

    backend, count, aec = make()
    ext = StateFuture()  # no mailbox
    seen: list = []

    def rec(_: Any) -> None:
        count.async_value().then_compose(lambda v: ext).then_accept(
            lambda v: seen.append((threading.get_ident(), backend.get_current_key(), aec.current_context.key)))

    aec.process("k", rec)
    aec.process("other", lambda _: count.async_value())
    aec.trigger()  # the request ran; the chain waits on ext
    t = threading.Thread(target=ext.complete, args=(1,))
    t.start()
    t.join()
    assert seen == [] and aec.in_flight_records == 1  # nothing ran on the other thread
    aec.drain(timeout=5)
    assert seen == [(threading.get_ident(), "k", "k")]
    assert_quiet(aec)


def test_bad_requests_and_arguments_are_type_errors_naming_the_problem() -> None:
    from cowmap import _requests
    from cowmap.asyncstate import StateFuture, StateFutureUtils

    backend, count, aec = make()
    with pytest.raises(TypeError, match="handle_request needs a state for op 'value', not None"):
        aec.process(1, lambda _: aec.handle_request(None, "value"))
    with pytest.raises(TypeError, match="async state requests need a state, not int"):
        aec.process(1, lambda _: aec.handle_request(5, "value"))
    with pytest.raises(TypeError, match="sync_point's callback must be callable, not int"):
        aec.process(1, lambda _: aec.sync_point(5))
    futures: list = []
    aec.process(2, lambda _: futures.append(count.async_value()))
    aec.drain(timeout=5)  # nothing was left behind by the rejected calls
    assert futures[0].get() == 0
    assert_quiet(aec)
    with pytest.raises(TypeError, match="async state methods need a state, not int"):
        _requests.async_value(5)
    with pytest.raises(TypeError, match="then_combine's other must be a StateFuture, not int"):
        StateFuture().then_combine(5, lambda a, b: a)
    with pytest.raises(TypeError, match="combine_all's input must be a StateFuture, not int"):
        StateFutureUtils.combine_all([1])
    with pytest.raises(TypeError, match="combine_all needs an iterable of StateFutures, not int"):
        StateFutureUtils.combine_all(5)
    with pytest.raises(TypeError, match="to_iterable's input must be a StateFuture, not int"):
        StateFutureUtils.to_iterable(1)
    with pytest.raises(TypeError, match="backend must be a KeyedStateBackend, not NoneType"):
        AsyncExecutionController(None)



def test_a_raising_sync_point_released_by_an_earlier_record_keeps_the_next_record_s_requests() -> None:
    backend, count, aec = make(batch_size=100)
    ran: list = []

    def second(_: Any) -> None:
        aec.sync_point(lambda: 1 // 0)
        count.async_update(5)

    aec.process("k", lambda _: count.async_value())  # holds key k
    aec.process("k", second)  # waits for it
    aec.process_non_record(None, lambda: ran.append("final"), mode=EpochMode.PARALLEL_BETWEEN_EPOCH)
    with pytest.raises(ZeroDivisionError):
        aec.trigger()  # the first record finishes: the sync point runs and raises
    aec.drain(timeout=5)
    assert ran == ["final"]
    assert_quiet(aec)
    backend.set_current_key("k")
    assert count.value() == 5


def test_a_callback_after_a_composed_request_runs_with_its_record_s_key() -> None:
    """The key is switched for a completion only when user code runs: through a
    then_compose's forwarding step that is the callback chained after it."""
    backend = KeyedStateBackend()
    aec = AsyncExecutionController(backend, batch_size=4, buffer_timeout_ms=0)
    st = backend.get_state(ValueStateDescriptor("v", default_value=0))
    seen: list[tuple[Any, Any]] = []

    def fn(key: Any) -> None:
        (st.async_value()
         .then_compose(lambda v: st.async_update(v + 1))
         .then_accept(lambda _: seen.append((key, backend.get_current_key()))))

    keys = ["a", "b", "c", "a", "d", "b", "e", "a"]
    for k in keys:
        aec.process(k, fn, k)
    aec.drain()
    assert sorted(seen) == sorted((k, k) for k in keys)
    backend.set_current_key("a")
    assert st.value() == 3
