"""A Spark task's state handling without Spark (no TaskContext: partition 0):
warm backends kept by a worker, caught up by increments when a micro-batch
ran elsewhere, restored when they cannot be."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any
from unittest import mock

import numpy as np
import pandas as pd
import pytest
from processors import CountPerKey, Reminders
from reference import running_counts

from cowmap._keygroups import spark_key_groups, spark_type_codes
from cowmap.spark import task
from cowmap.spark.layout import Location
from cowmap.spark.task import KG_BITS, ROUTE_COLUMN, Plan, run_partition


def _batch(seed: int, n: int = 200) -> pd.DataFrame:
    keys = np.random.default_rng(seed).integers(0, 40, n)
    kgs = spark_key_groups([keys], spark_type_codes(["bigint"]), 64).astype(np.int32)
    return pd.DataFrame({"k": keys, "v": keys, ROUTE_COLUMN: ((1_000 + seed) << KG_BITS) + kgs.astype(np.int64)})


def test_a_worker_a_batch_behind_catches_up_by_the_increment(tmp_path: Path) -> None:
    task._WARM.clear()
    loc = Location(str(tmp_path), "op")
    layout = loc.use(1, 64, "spark-murmur3-42:bigint")

    def plan(worker: str, batch_id: int) -> Plan:  # two Python workers: two entries of the warm cache
        return Plan(loc, layout, ["k"], ["bigint"], CountPerKey, ["k", "n"], False, batch_id, warm_key=(worker,))

    batches = [_batch(i) for i in range(4)]
    loads = mock.patch.object(task, "_load", side_effect=task._load)
    got: Counter = Counter()
    with loads as load:
        for b, worker in enumerate(["a", "b", "a", "a"]):  # batch 1 runs on worker b; a is then a batch behind
            for out in run_partition(plan(worker, b), iter([batches[b]])):
                got += Counter(zip(out["k"].tolist(), out["n"].tolist()))
    assert load.call_count == 2  # the first batch of each worker; worker a caught up, then was warm
    assert got == running_counts(batches)
    task._WARM.clear()


class _SeeTime:
    """Emits the batch's time as the task saw it, and the batch's columns."""

    def process(self, batch, ctx):
        return pd.DataFrame({"k": [ctx.batch_timestamp_ms], "n": [len(batch.columns)]})


def test_the_route_column_gives_the_batch_time_and_is_dropped(tmp_path: Path) -> None:
    task._WARM.clear()
    loc = Location(str(tmp_path), "op")
    layout = loc.use(1, 64, "spark-murmur3-42:bigint")
    plan = Plan(loc, layout, ["k"], ["bigint"], _SeeTime, ["k", "n"], False, 0, warm_key=("t",))
    batch = _batch(5)
    ts = 1_764_000_000_123  # a realistic epoch-ms time: it fills the column's upper bits
    batch[ROUTE_COLUMN] = (ts << KG_BITS) + (batch[ROUTE_COLUMN] & ((1 << KG_BITS) - 1))
    out = pd.concat(list(run_partition(plan, iter([batch]))))
    assert out["k"].tolist() == [ts] and out["n"].tolist() == [2]  # k and v: the route column dropped
    task._WARM.clear()


def test_a_row_of_another_partitions_key_group_is_refused(tmp_path: Path) -> None:
    """Partition 0 of 2 owns key groups 0..31: a row routed there with key group 40 fails the task
    before anything is committed."""
    task._WARM.clear()
    loc = Location(str(tmp_path), "op")
    layout = loc.use(2, 64, "spark-murmur3-42:bigint")
    plan = Plan(loc, layout, ["k"], ["bigint"], CountPerKey, ["k", "n"], False, 0, warm_key=("r",))
    batch = _batch(6)
    mine = batch[(batch[ROUTE_COLUMN] & ((1 << KG_BITS) - 1)) < 32]
    stray = mine.iloc[:1].copy()
    stray[ROUTE_COLUMN] = ((1_000 << KG_BITS) + 40)
    with pytest.raises(RuntimeError, match=r"key groups 0\.\.31\) got rows of key groups .*\.\.40: the rows were not"):
        list(run_partition(plan, iter([pd.concat([mine, stray], ignore_index=True)])))
    assert loc.storage(layout, layout.range_of(0)).checkpoints() == []
    task._WARM.clear()


@pytest.mark.parametrize("processor", [CountPerKey, Reminders])
def test_a_backend_dropped_from_the_warm_cache_is_freed_at_once(tmp_path: Path, processor: type) -> None:
    """No reference cycle keeps a task's backend alive after the worker drops it (the context and
    the timer callback refer to each other): it goes by reference counting, not at the next full
    collection of the worker's heap."""
    import gc
    import weakref

    task._WARM.clear()
    loc = Location(str(tmp_path), "op")
    layout = loc.use(1, 64, "spark-murmur3-42:bigint")
    gc.collect()
    gc.disable()
    try:
        for b in range(2):
            plan = Plan(loc, layout, ["k"], ["bigint"], processor, ["k", "n"], False, b, warm_key=("g",))
            list(run_partition(plan, iter([_batch(b)])))
        (warm,) = task._WARM.values()
        ref = weakref.ref(warm.backend)
        del warm
        task._WARM.clear()
        assert ref() is None
    finally:
        gc.enable()


class _Task:
    """A streaming task's TaskContext: partition 0 of micro-batch ``batch`` of query ``query``
    (the batch's SQL execution ``execution``), attempt ``attempt``."""

    def __init__(
        self, query: str, batch: int, execution: str | None = None, attempt: int = 0, run: str | None = None
    ) -> None:
        self.props = {
            "sql.streaming.queryId": query,
            "streaming.sql.batchId": str(batch),
            "spark.sql.execution.query.id": execution or f"{query}-{batch}",
            "spark.jobGroup.id": run or f"{query}-run",
        }
        self.attempt = attempt

    def partitionId(self) -> int:
        return 0

    def taskAttemptId(self) -> int:
        return self.attempt

    def getLocalProperty(self, key: str) -> str | None:
        return self.props.get(key)


def _stream_batch(plan: Plan, query: str, batch_id: int, worker_batch: pd.DataFrame, **task_kw: Any) -> Counter:
    """Micro-batch ``batch_id`` of streaming query ``query`` through ``plan``: its (key, count) rows."""
    got: Counter = Counter()
    with mock.patch("pyspark.TaskContext.get", return_value=_Task(query, batch_id, **task_kw)):
        for out in run_partition(plan, iter([worker_batch])):
            got += Counter(zip(out["k"].tolist(), out["n"].tolist()))
    return got


def _streaming_plan(loc: Location, worker: str, token: str = "op") -> Plan:
    """Streaming operator ``token``'s plan as Python worker ``worker`` holds it (one operator
    definition a run of a query: its plan is made once)."""
    layout = loc.use(1, 64, "spark-murmur3-42:bigint")
    return Plan(loc, layout, ["k"], ["bigint"], CountPerKey, ["k", "n"], True, 0, warm_key=(worker,), token=token)


def test_a_new_query_on_another_querys_state_is_refused_and_leaves_it_intact(tmp_path: Path) -> None:
    """A query run with a new Spark checkpoint (a new query id) on a location holding another
    query's versions would start from the empty state, overwrite the other's versions and let
    retention delete its own: its first micro-batch fails naming both queries, and the first
    query then goes on from its state."""
    task._WARM.clear()
    loc = Location(str(tmp_path), "op")
    batches = [_batch(i) for i in range(4)]
    got: Counter = Counter()
    for b in range(2):
        got += _stream_batch(_streaming_plan(loc, "w"), "query-a", b, batches[b])
    storage = loc.storage(loc.layouts[0], loc.layouts[0].range_of(0))
    before = {v: storage.manifest(v) for v in storage.checkpoints()}
    for worker in ("w", "x"):  # with the first query's backend warm in the worker, and without
        with pytest.raises(RuntimeError, match=r"written by streaming query query-a, not by this one \(streaming query"
                           r" query-b\)\. A query run with a new Spark checkpoint is a new query"):
            _stream_batch(_streaming_plan(loc, worker), "query-b", 0, batches[2])
    assert {v: storage.manifest(v) for v in storage.checkpoints()} == before
    task._WARM.clear()  # (a restarted query's workers are new)
    for b in range(2, 4):
        got += _stream_batch(_streaming_plan(loc, "y"), "query-a", b, batches[b])
    assert got == running_counts(batches)
    task._WARM.clear()


def test_a_version_of_another_query_is_refused_on_restore_and_on_catch_up(tmp_path: Path) -> None:
    task._WARM.clear()
    loc = Location(str(tmp_path), "op")
    batches = [_batch(i) for i in range(3)]
    _stream_batch(_streaming_plan(loc, "w"), "query-a", 0, batches[0])
    _stream_batch(_streaming_plan(loc, "x"), "query-a", 1, batches[1])  # w is now a version behind
    with pytest.raises(RuntimeError, match=r"\(version 2\) was written by streaming query query-a, not by this one"):
        _stream_batch(_streaming_plan(loc, "z"), "query-b", 2, batches[2])  # a restore
    # a warm backend of query-b a version behind, caught up by query-a's increment
    _, warm = task._WARM.popitem(last=False)
    task._WARM[("w", "query-b", "op", 1, 0, 63)] = warm
    with pytest.raises(RuntimeError, match=r"\(version 2\) was written by streaming query query-a"):
        _stream_batch(_streaming_plan(loc, "w"), "query-b", 2, batches[2])
    task._WARM.clear()


def test_a_batch_query_on_a_streaming_querys_state_is_refused(tmp_path: Path) -> None:
    """A batch query goes on from the newest version: of a streaming query's state it would fork it
    (the stream, restarted, overwrites what the batch query committed)."""
    task._WARM.clear()
    loc = Location(str(tmp_path), "op")
    _stream_batch(_streaming_plan(loc, "w"), "query-a", 0, _batch(0))
    layout = loc.use(1, 64, "spark-murmur3-42:bigint")
    plan = Plan(loc, layout, ["k"], ["bigint"], CountPerKey, ["k", "n"], False, loc.latest_version(), warm_key=("w",))
    with pytest.raises(RuntimeError, match=r"written by streaming query query-a, not by this one \(a batch query\)"):
        list(run_partition(plan, iter([_batch(1)])))
    task._WARM.clear()


def test_the_warm_backend_of_another_query_is_not_reused(tmp_path: Path) -> None:
    """The state directory deleted to start over, a new query's micro-batch 1 lands on a worker
    still holding the old query's version 1: it restores the new query's own version instead."""
    import shutil

    task._WARM.clear()
    batches = [_batch(i) for i in range(4)]
    loc = Location(str(tmp_path / "state"), "op")
    _stream_batch(_streaming_plan(loc, "w"), "query-a", 0, batches[0])  # worker w: query-a's version 1
    shutil.rmtree(tmp_path / "state")
    loc = Location(str(tmp_path / "state"), "op")
    got = _stream_batch(_streaming_plan(loc, "x"), "query-b", 0, batches[2])
    got += _stream_batch(_streaming_plan(loc, "w"), "query-b", 1, batches[3])
    assert got == running_counts(batches[2:])
    task._WARM.clear()


def test_versions_saved_before_the_query_was_recorded_are_trusted(tmp_path: Path) -> None:
    """State committed by a version of cowmap.spark that did not record the query (no ``query``
    in a version's metadata) goes on under any query."""
    task._WARM.clear()
    loc = Location(str(tmp_path), "op")
    batches = [_batch(i) for i in range(2)]
    real_save = task.CheckpointStorage.save

    def save_unrecorded(self, backend, **kw):
        kw["metadata"] = {k: v for k, v in kw["metadata"].items() if k != "query"}
        return real_save(self, backend, **kw)

    with mock.patch.object(task.CheckpointStorage, "save", save_unrecorded):
        got = _stream_batch(_streaming_plan(loc, "w"), "query-a", 0, batches[0])
    task._WARM.clear()
    got += _stream_batch(_streaming_plan(loc, "x"), "query-b", 1, batches[1])
    assert got == running_counts(batches)
    task._WARM.clear()


def test_a_version_written_in_this_execution_is_overwritten_only_by_another_attempt_of_its_operator(
    tmp_path: Path,
) -> None:
    """Within one micro-batch's execution, version b + 1 is written again by a retried or
    speculative attempt of the same operator (another task attempt), and refused to a second
    operator sharing the state's name and to a second partition handed to the same attempt."""
    task._WARM.clear()
    loc = Location(str(tmp_path), "op")
    plan = _streaming_plan(loc, "w")
    batches = [_batch(i) for i in range(2)]
    _stream_batch(plan, "q", 0, batches[0], execution="e0", attempt=1)
    task._WARM.clear()
    got = _stream_batch(plan, "q", 0, batches[0], execution="e0", attempt=2)  # a retry: overwrites
    assert got == running_counts(batches[:1])
    task._WARM.clear()
    with pytest.raises(RuntimeError, match=r"one task was handed two partitions with one index\. The output of apply"):
        _stream_batch(plan, "q", 0, batches[0], execution="e0", attempt=2)
    task._WARM.clear()
    twin = _streaming_plan(loc, "w", token="twin")  # another apply_with_state with the same location and name
    with pytest.raises(RuntimeError, match=r"two operators of this query write the state 'op' under .*: give each"):
        _stream_batch(twin, "q", 0, batches[0], execution="e0", attempt=3)
    task._WARM.clear()
    with pytest.raises(RuntimeError, match=r"two operators of this query write the state 'op'"):  # and on reading
        _stream_batch(twin, "q", 1, batches[1], execution="e1", attempt=4)
    task._WARM.clear()
    # the query restarted (a new run, its operator defined again): the versions of its last run are its own
    got += _stream_batch(twin, "q", 1, batches[1], execution="e2", attempt=5, run="q-run-2")
    assert got == running_counts(batches)
    task._WARM.clear()


def test_a_partition_index_beyond_the_layout_is_refused(tmp_path: Path) -> None:
    task._WARM.clear()
    loc = Location(str(tmp_path), "op")
    plan = _streaming_plan(loc, "w")
    ctx = _Task("q", 0)
    ctx.partitionId = lambda: 1  # type: ignore[method-assign]  # (a union's second input: 1 of a 1-partition layout)
    with mock.patch("pyspark.TaskContext.get", return_value=ctx), pytest.raises(
        RuntimeError, match=r"a task of partition 1 of 1\. The output of apply_with_state shares its Spark stage"
    ):
        list(run_partition(plan, iter([_batch(0)])))
    task._WARM.clear()


@pytest.mark.parametrize(
    ("name", "offset_ms"),
    [
        ("UTC", 0), ("Z", 0), ("GMT", 0), ("+05:30", 19_800_000), ("-08", -28_800_000), ("GMT+01:00", 3_600_000),
        ("UTC-0930", -34_200_000), ("Asia/Kolkata", 19_800_000),
    ],
)
def test_a_session_time_zone_places_wall_clock_times(name: str, offset_ms: int) -> None:
    from cowmap.spark.event_time import event_time_ms, session_zone

    wall = pd.Series(pd.to_datetime([1_700_000_000_000, 1_700_000_500_000], unit="ms"))
    assert event_time_ms(wall, session_zone(name)) == 1_700_000_500_000 - offset_ms


def test_event_times_across_a_change_of_clock_and_with_nulls() -> None:
    from cowmap.spark.event_time import event_time_ms, session_zone
    from cowmap.state import NO_WATERMARK

    ny = session_zone("America/New_York")
    # 01:30 on 2023-11-05 happens twice in New York: the earlier instant (summer time, UTC-4) is taken
    assert event_time_ms(pd.Series(pd.to_datetime(["2023-11-05 01:30"])), ny) == 1_699_162_200_000
    # 02:30 on 2023-03-12 does not happen there: moved to the next time that does (03:00, UTC-4)
    assert event_time_ms(pd.Series(pd.to_datetime(["2023-03-12 02:30"])), ny) == 1_678_604_400_000
    aware = pd.Series(pd.to_datetime([1_700_000_000_000], unit="ms", utc=True))
    assert event_time_ms(aware, ny) == 1_700_000_000_000  # (a zone of its own: kept)
    assert event_time_ms(pd.Series(pd.to_datetime([None, None])), ny) == NO_WATERMARK
    assert event_time_ms(pd.Series([None, None], dtype="float64"), ny) == NO_WATERMARK
    assert event_time_ms(pd.Series([5.0, None, 7.0]), ny) == 7
    assert event_time_ms(pd.Series([5, None, 7], dtype="Int64"), ny) == 7


def test_an_unknown_session_time_zone_is_named() -> None:
    from cowmap.spark.event_time import session_zone

    with pytest.raises(ValueError, match="the session time zone 'Mars/Olympus' is not one pandas knows"):
        session_zone("Mars/Olympus")


def test_a_new_query_is_refused_on_another_querys_state_under_another_number_of_partitions(tmp_path: Path) -> None:
    """The new query's layout (another number of partitions) has no versions yet, but the
    layout before it holds the other query's: its first micro-batch is refused all the same."""
    task._WARM.clear()
    loc = Location(str(tmp_path), "op")
    _stream_batch(_streaming_plan(loc, "w"), "query-a", 0, _batch(0))
    wider = loc.use(2, 64, "spark-murmur3-42:bigint")
    plan = Plan(loc, wider, ["k"], ["bigint"], CountPerKey, ["k", "n"], True, 0, warm_key=("x",))
    mine = _batch(1)
    mine = mine[(mine[ROUTE_COLUMN] & ((1 << KG_BITS) - 1)) < 32]  # partition 0 of 2's rows
    with pytest.raises(RuntimeError, match=r"written by streaming query query-a, not by this one"):
        _stream_batch(plan, "query-b", 0, mine)
    task._WARM.clear()


def test_a_commit_over_another_querys_version_is_refused(tmp_path: Path) -> None:
    """Two queries that both passed their first load before either committed (started at once,
    each then warm): the second to commit a version is refused instead of overwriting it."""
    task._WARM.clear()
    loc = Location(str(tmp_path), "op")
    plan = _streaming_plan(loc, "w")
    kg_range = plan.layout.range_of(0)
    early, _ = task._load(plan, kg_range, 0, "query-b")  # query-b's first load, before query-a commits
    _stream_batch(plan, "query-a", 0, _batch(0))
    task._WARM.clear()
    task._WARM[("w", "query-b", "op", plan.layout.id, kg_range.start, kg_range.end)] = early
    storage = loc.storage(plan.layout, kg_range)
    before = storage.manifest(1)
    with pytest.raises(RuntimeError, match=r"\(version 1\) was written by streaming query query-a, not by this one"):
        _stream_batch(plan, "query-b", 0, _batch(1))
    assert storage.manifest(1) == before
    task._WARM.clear()


def test_a_batch_query_in_foreach_batch_belongs_to_its_streaming_query(tmp_path: Path) -> None:
    """Inside foreachBatch a batch DataFrame's tasks carry the streaming query's id: its versions
    are that query's, and a new query (a new Spark checkpoint) starting over them is refused."""
    task._WARM.clear()
    loc = Location(str(tmp_path), "op")
    layout = loc.use(1, 64, "spark-murmur3-42:bigint")

    def plan(batch_id: int, worker: str) -> Plan:
        return Plan(loc, layout, ["k"], ["bigint"], CountPerKey, ["k", "n"], False, batch_id, warm_key=(worker,))

    got = _stream_batch(plan(0, "w"), "query-a", 0, _batch(0))
    got += _stream_batch(plan(1, "w"), "query-a", 1, _batch(1))
    assert got == running_counts([_batch(0), _batch(1)])
    assert loc.storage(layout, layout.range_of(0)).manifest(2)["metadata"]["query"] == "query-a"
    task._WARM.clear()
    with pytest.raises(RuntimeError, match=r"written by streaming query query-a, not by this one \(streaming query"):
        _stream_batch(plan(0, "x"), "query-b", 0, _batch(2))
    task._WARM.clear()


def test_a_version_that_no_run_committed_is_named(tmp_path: Path) -> None:
    """A batch query given batch_id=2 whose run of batch_id=1 never happened, or a stream whose
    state directory was deleted under it, fails naming the version and the likely cause."""
    task._WARM.clear()
    loc = Location(str(tmp_path), "op")
    layout = loc.use(1, 64, "spark-murmur3-42:bigint")
    plan = Plan(loc, layout, ["k"], ["bigint"], CountPerKey, ["k", "n"], False, 2, warm_key=("w",), pinned=True)
    with pytest.raises(FileNotFoundError, match=r"no state of version 2 for key groups 0\.\.63 .*given batch_id=2, "
                       r"did the run of batch_id=1 not happen .*or is it older than the retain_versions kept\?"):
        list(run_partition(plan, iter([_batch(0)])))
    with pytest.raises(FileNotFoundError, match=r"no state of version 2 .*\(the query's checkpoint is ahead of its "
                       r"state: was the state directory deleted or replaced\?\)$"):
        _stream_batch(_streaming_plan(loc, "w"), "query-a", 2, _batch(0))
    task._WARM.clear()


def test_two_operators_that_raced_past_the_commit_check_are_caught_at_the_next_batch(tmp_path: Path) -> None:
    """Two operators sharing a name that commit at the same moment both pass the pre-commit check.
    At the next micro-batch neither takes over the other's warm backend (its worker may hold
    either), and a restore finds the version written by the other operator of this run."""
    task._WARM.clear()
    loc = Location(str(tmp_path), "op")
    a, b = _streaming_plan(loc, "w", token="a"), _streaming_plan(loc, "x", token="b")
    kg_range = a.layout.range_of(0)
    # the race: b loads its empty state and a commits, then b commits past its check
    early, _ = task._load(b, kg_range, 0, task.Writer("q", "q-run", "e0", 2, "b"))
    _stream_batch(a, "q", 0, _batch(0), execution="e0", attempt=1)
    task._WARM[("x", "q", "b", a.layout.id, kg_range.start, kg_range.end)] = early
    with mock.patch.object(task, "check_write"):
        _stream_batch(b, "q", 0, _batch(0), execution="e0", attempt=2)
    a_on_x = _streaming_plan(loc, "x", token="a")  # a's next task lands on the worker holding b's backend
    with pytest.raises(RuntimeError, match=r"two operators of this query write the state 'op' under"):
        _stream_batch(a_on_x, "q", 1, _batch(1), execution="e1", attempt=3)
    task._WARM.clear()


class _Json:
    """A serializer of the user's own (not pickle)."""

    name = "json-v1"

    def dumps(self, v: Any) -> bytes:
        import json

        return json.dumps(v).encode()

    def loads(self, b: bytes) -> Any:
        import json

        return json.loads(b)


class _CountInJson:
    """CountPerKey with its state written by its own serializer."""

    def open(self, ctx):
        from cowmap import ValueStateDescriptor

        self.count = ctx.get_state(ValueStateDescriptor("count", serializer=_Json()))

    def process(self, batch, ctx):
        out = []
        for k, rows in ctx.groups(batch):
            n = (self.count.value() or {"n": 0})["n"] + len(rows)
            self.count.update({"n": n})
            out.append((k, n))
        return pd.DataFrame(out, columns=["k", "n"])


def test_a_state_with_its_own_serializer_is_restored_cold_and_rescaled(tmp_path: Path) -> None:
    """A restore in a worker without the backend decodes the values with the serializer the
    processor's open registers (the restore waits for it), also when a rescale merges ranges."""
    task._WARM.clear()
    loc = Location(str(tmp_path), "op")
    batches = [_batch(i) for i in range(4)]
    got: Counter = Counter()
    for b in range(2):
        layout = loc.use(2, 64, "spark-murmur3-42:bigint")
        for p in range(2):
            mine = batches[b][(batches[b][ROUTE_COLUMN] & 0xFFFF) // 32 == p]
            plan = Plan(loc, layout, ["k"], ["bigint"], _CountInJson, ["k", "n"], False, b, warm_key=("j",))
            with mock.patch("pyspark.TaskContext.get", return_value=_Partition(p)):
                for out in run_partition(plan, iter([mine])):
                    got += Counter(zip(out["k"].tolist(), out["n"].tolist()))
        task._WARM.clear()  # every batch on a fresh worker: a restore each time
    layout = loc.use(1, 64, "spark-murmur3-42:bigint")  # both ranges into one partition
    for b in range(2, 4):
        plan = Plan(loc, layout, ["k"], ["bigint"], _CountInJson, ["k", "n"], False, b, warm_key=("j",))
        for out in run_partition(plan, iter([batches[b]])):
            got += Counter(zip(out["k"].tolist(), out["n"].tolist()))
        task._WARM.clear()
    assert got == running_counts(batches)


class _Partition:
    """A batch query's TaskContext of partition ``p``."""

    def __init__(self, p: int) -> None:
        self.p = p

    def partitionId(self) -> int:
        return self.p

    def taskAttemptId(self) -> int:
        return self.p

    def getLocalProperty(self, key: str) -> str | None:
        return None


class _ChangesItsBatch:
    """Emits the watermark it starts from, then changes the batch in place."""

    def process(self, batch, ctx):
        out = pd.DataFrame({"k": [ctx.watermark_ms], "n": [0]})
        batch["t"] = 10**15
        del batch["t"]
        return out


def test_the_watermark_is_the_batchs_own_whatever_process_does_to_it(tmp_path: Path) -> None:
    task._WARM.clear()
    loc = Location(str(tmp_path), "op")
    layout = loc.use(1, 64, "spark-murmur3-42:bigint")
    seen = []
    for b in range(3):
        batch = _batch(b)
        batch["t"] = np.arange(len(batch)) + 100 * b
        plan = Plan(loc, layout, ["k"], ["bigint"], _ChangesItsBatch, ["k", "n"], False, b, event_time="t",
                    watermark_delay_ms=10, warm_key=("e",))
        seen += [int(x) for out in run_partition(plan, iter([batch])) for x in out["k"]]
    assert seen[1:] == [len(_batch(0)) - 1 - 10, len(_batch(1)) - 1 + 100 - 10]
    task._WARM.clear()


def test_a_failure_to_delete_old_versions_after_the_commit_does_not_fail_the_task(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Deleting old versions follows the commit: its failure (a damaged old manifest, an object
    store refusing a delete) must not fail a task whose version is committed, which a batch query
    run again by hand would then count twice. It is logged and tried again at the next commit."""
    from cowmap.checkpoint import CheckpointStorage

    task._WARM.clear()
    loc = Location(str(tmp_path), "op")
    layout = loc.use(1, 64, "spark-murmur3-42:bigint")
    batches = [_batch(i) for i in range(3)]
    got: Counter = Counter()
    for b in range(3):
        plan = Plan(loc, layout, ["k"], ["bigint"], CountPerKey, ["k", "n"], False, b, retain_versions=2,
                    warm_key=("d",))
        broken = mock.patch.object(CheckpointStorage, "retain", side_effect=OSError("delete refused"))
        with broken if b == 1 else mock.patch.object(task, "_WARM", task._WARM):
            for out in run_partition(plan, iter([batches[b]])):
                got += Counter(zip(out["k"].tolist(), out["n"].tolist()))
    assert got == running_counts(batches)
    assert "version 2 of" in caplog.text and "delete refused" in caplog.text
    assert loc.storage(layout, layout.range_of(0)).checkpoints() == [2, 3]  # the next commit caught up
    task._WARM.clear()


def test_a_batch_dataframe_made_before_another_run_committed_is_refused(tmp_path: Path) -> None:
    """A batch DataFrame of apply_with_state is one run of its state, from the version that was
    the newest when it was made. Run again (another action) it redoes that run; once another
    DataFrame's run committed after it, running it would drop that run's changes or take the state
    back (its commit drops later versions): refused, the state left as it was."""
    task._WARM.clear()
    loc = Location(str(tmp_path), "op")
    layout = loc.use(1, 64, "spark-murmur3-42:bigint")
    storage = loc.storage(layout, layout.range_of(0))
    batches = [_batch(i) for i in range(3)]

    def made(token: str) -> Plan:  # apply_with_state's plan: from the newest version, as query.py makes it
        return Plan(loc, layout, ["k"], ["bigint"], CountPerKey, ["k", "n"], False, loc.latest_version(),
                    warm_key=(token,), token=token)

    def run(plan: Plan, batch: pd.DataFrame) -> Counter:
        return Counter(zip(*(x for out in run_partition(plan, iter([batch])) for x in (out["k"].tolist(),
                                                                                         out["n"].tolist()))))

    a, b = made("a"), made("b")  # both made at version 0
    first = run(a, batches[0])
    assert run(a, batches[0]) == first  # another action on the same DataFrame: its run again
    before = storage.manifest(1)
    with pytest.raises(RuntimeError, match=r"made to commit version 1 .* another run has since taken to version 1"):
        run(b, batches[1])
    assert storage.manifest(1) == before
    c = made("c")
    run(c, batches[1])
    with pytest.raises(RuntimeError, match=r"made to commit version 1 .* taken to version 2"):
        run(a, batches[0])
    assert storage.checkpoints() == [1, 2]
    pinned = Plan(loc, layout, ["k"], ["bigint"], CountPerKey, ["k", "n"], False, 1, warm_key=("p",), pinned=True)
    run(pinned, batches[1])  # batch_id=1 again (foreachBatch after a failure): it redoes version 2
    assert storage.checkpoints() == [1, 2]
    task._WARM.clear()


class _KeepsItsStateInTheClass:
    """Registers its state once per Python worker, in a class attribute."""

    count = None

    def open(self, ctx):
        from cowmap import ValueStateDescriptor

        if _KeepsItsStateInTheClass.count is None:
            _KeepsItsStateInTheClass.count = ctx.get_state(ValueStateDescriptor("count", default_value=0))
        self.mine = _KeepsItsStateInTheClass.count

    def process(self, batch, ctx):
        return None


def test_a_state_view_of_another_task_kept_by_the_processor_is_refused(tmp_path: Path) -> None:
    """A view kept from an earlier task would read and write the state of that task's backend (of
    whatever key it last had), silently: the task fails naming the attribute."""
    task._WARM.clear()
    loc = Location(str(tmp_path), "op")
    layout = loc.use(2, 64, "spark-murmur3-42:bigint")
    try:
        for p in range(2):  # two tasks in one worker: two backends
            mine = _batch(0)[(_batch(0)[ROUTE_COLUMN] & 0xFFFF) // 32 == p]
            plan = Plan(loc, layout, ["k"], ["bigint"], _KeepsItsStateInTheClass, ["k", "n"], False, 0,
                        warm_key=("v",))
            with mock.patch("pyspark.TaskContext.get", return_value=_Partition(p)):
                if p == 0:
                    list(run_partition(plan, iter([mine])))
                else:
                    with pytest.raises(RuntimeError, match=r"keeps state 'count' of another task in self\.mine"):
                        list(run_partition(plan, iter([mine])))
        # the class attribute itself, with no copy on self
        with mock.patch.object(_KeepsItsStateInTheClass, "open", lambda self, ctx: None), \
                mock.patch("pyspark.TaskContext.get", return_value=_Partition(1)), \
                pytest.raises(RuntimeError, match=r"_KeepsItsStateInTheClass\.count"):
            list(run_partition(plan, iter([mine])))
    finally:
        _KeepsItsStateInTheClass.count = None
        task._WARM.clear()


def test_what_process_and_on_timer_return_is_checked_with_a_clear_message() -> None:
    from cowmap.state import TimeDomain

    def outs(result: Any) -> list[pd.DataFrame]:
        return list(task._outputs(result, ["k", "n"], "process"))

    frame = pd.DataFrame({"n": [1], "k": [2], "extra": [3]})
    assert [f.columns.tolist() for f in outs(frame)] == [["k", "n"]]
    assert outs(pd.DataFrame()) == [] and outs([pd.DataFrame(), frame.iloc[:0]])[0].empty  # nothing to emit
    for bad, name in (({"k": 1}, "dict"), (pd.Series([1]), "Series"), ("kn", "str"), (3, "int")):
        with pytest.raises(TypeError, match=f"process must return a DataFrame or an iterator of them, not {name}$"):
            outs(bad)
    with pytest.raises(TypeError, match="process returned a list holding a tuple: it must return a DataFrame or an"):
        outs([(1, 2)])
    with pytest.raises(ValueError, match=r"returned columns \['k', 'k', 'n'\], some of them twice"):
        outs(pd.DataFrame([[1, 2, 3]], columns=["k", "k", "n"]))

    class Timers:
        def __init__(self, out: Any) -> None:
            self.out = out

        def on_timer(self, key, timestamp, ctx):
            return self.out

    for out, said in (("kn", "a str"), ((1, 2), "a tuple holding a int"), ([{"k": 1, "n": 1}, 3], "a list holding")):
        fire = task._TimerOutput(Timers(out), ["k", "n"])
        fire.ctx = mock.Mock()
        with pytest.raises(TypeError, match=f"on_timer must return a dict, a DataFrame, a list of dicts or None, "
                           f"got {said}"):
            fire(5, 1, None, TimeDomain.EVENT_TIME)
    fire = task._TimerOutput(Timers([{"k": 1, "n": 2}, {"n": 3, "k": 4}]), ["k", "n"])
    fire.ctx = mock.Mock()
    fire(5, 1, None, TimeDomain.EVENT_TIME)
    assert [f.values.tolist() for f in fire.drain()] == [[[1, 2], [4, 3]]]


class _EventTimeTimerWithoutEventTime:
    def open(self, ctx):
        self.timers = ctx.get_timer_service()

    def process(self, batch, ctx):
        for _key, _rows in ctx.groups(batch):
            self.timers.register_event_time_timer(10)


def test_event_time_timers_without_an_event_time_column_fail_instead_of_never_firing(tmp_path: Path) -> None:
    task._WARM.clear()
    loc = Location(str(tmp_path), "op")
    layout = loc.use(1, 64, "spark-murmur3-42:bigint")
    plan = Plan(loc, layout, ["k"], ["bigint"], _EventTimeTimerWithoutEventTime, ["k", "n"], False, 0, warm_key=("t",))
    with pytest.raises(RuntimeError, match="registered event-time timers .service 'timers'.* no event_time= column"):
        list(run_partition(plan, iter([_batch(0)])))
    assert loc.storage(layout, layout.range_of(0)).checkpoints() == []
    task._WARM.clear()


def _partition_run(loc: Location, layout: Any, token: str, p: int, batch_id: int, processor: Any = CountPerKey) -> None:
    """Partition ``p`` of batch DataFrame ``token`` (made at ``batch_id``) over ``_batch(0)``."""
    b0 = _batch(0)
    mine = b0[(b0[ROUTE_COLUMN] & 0xFFFF) * layout.num_partitions // 64 == p]
    plan = Plan(loc, layout, ["k"], ["bigint"], processor, ["k", "n"], False, batch_id, warm_key=(token,),
                token=token)
    with mock.patch("pyspark.TaskContext.get", return_value=_Partition(p)):
        list(run_partition(plan, iter([mine])))


def test_a_run_redoing_one_that_failed_part_way_commits_whatever_order_its_tasks_run_in(tmp_path: Path) -> None:
    """DataFrame a ran partition 0 only (a show(), or a job that failed in partition 1). The next
    DataFrame redoes version 1: its partition 1 committing first makes version 1 whole, partly
    its own, which must not make its partition 0 look stale."""
    task._WARM.clear()
    loc = Location(str(tmp_path), "op")
    layout = loc.use(2, 64, "spark-murmur3-42:bigint")
    _partition_run(loc, layout, "a", 0, loc.latest_version())
    task._WARM.clear()
    redo = loc.latest_version()
    assert redo == 0
    _partition_run(loc, layout, "b", 1, redo)
    _partition_run(loc, layout, "b", 0, redo)
    assert {loc.storage(layout, r).manifest(1)["metadata"]["plan"] for r in layout.ranges()} == {"b"}
    with pytest.raises(RuntimeError, match="made to commit version 1"):  # a, after b's whole run
        _partition_run(loc, layout, "a", 1, 0)
    task._WARM.clear()


def test_a_batch_dataframe_run_again_after_a_rescaled_run_is_refused(tmp_path: Path) -> None:
    """The plan's copy of the location knows the layouts of its making: a run under another
    number of partitions after it is read from the location at the commit."""
    task._WARM.clear()
    loc = Location(str(tmp_path), "op")
    two = loc.use(2, 64, "spark-murmur3-42:bigint")
    old = Location(str(tmp_path), "op")  # what DataFrame a's plan holds
    for p in range(2):
        _partition_run(old, two, "a", p, 0)
    three = loc.use(3, 64, "spark-murmur3-42:bigint")
    for p in range(3):
        _partition_run(loc, three, "b", p, 1)
    with pytest.raises(RuntimeError, match="made to commit version 1 .* taken to version 2"):
        _partition_run(old, two, "a", 0, 0)
    task._WARM.clear()


class _CachesLazily:
    """No open(): registers its state in process, once per Python worker, in a class attribute."""

    count = None

    def process(self, batch, ctx):
        from cowmap import ValueStateDescriptor

        if _CachesLazily.count is None:
            _CachesLazily.count = ctx.get_state(ValueStateDescriptor("count", default_value=0))
        for _key, rows in ctx.groups(batch):
            _CachesLazily.count.update(_CachesLazily.count.value() + len(rows))


class _KeyInOpen:
    def open(self, ctx):
        from cowmap import ValueStateDescriptor

        self.count = ctx.get_state(ValueStateDescriptor("count", default_value=0))
        ctx.set_current_key(1)

    def process(self, batch, ctx):
        return None


def test_a_view_cached_by_process_and_a_key_set_in_open_are_refused(tmp_path: Path) -> None:
    task._WARM.clear()
    loc = Location(str(tmp_path), "op")
    layout = loc.use(2, 64, "spark-murmur3-42:bigint")
    try:
        _partition_run(loc, layout, "c", 0, 0, _CachesLazily)
        with pytest.raises(RuntimeError, match=r"keeps state 'count' of another task in _CachesLazily\.count"):
            _partition_run(loc, layout, "c", 1, 0, _CachesLazily)  # checked before process writes anything
    finally:
        _CachesLazily.count = None
    with pytest.raises(RuntimeError, match="open.. set a current key: it registers states and timer services"):
        _partition_run(loc, layout, "k", 0, 0, _KeyInOpen)
    assert loc.storage(layout, layout.range_of(1)).checkpoints() == []
    task._WARM.clear()
