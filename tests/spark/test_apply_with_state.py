"""``cowmap.spark.apply_with_state`` on a real local SparkSession (``local[2,4]``).

Every query's output is compared with a pure-pandas reference of the same
micro-batches: counts that go on across runs, restarts and changes of the
number of partitions; a task failing before its commit; TTL across batches;
event-time timers; and bad input failing with a clear message while the last
committed state stays as it was.
"""

from __future__ import annotations

import functools
import os
from collections import Counter
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from processors import (
    AsyncCount,
    CountColumnar,
    CountPairs,
    CountPerKey,
    Dedup,
    FailOnce,
    Raising,
    Reminders,
    ReturnsRows,
    SeeWatermark,
    Sessions,
    WrongColumns,
    fail_once_downstream,
)
from reference import running_counts

pytest.importorskip("pyspark", reason="pyspark is in the test extra: pip install '.[test]'")

from cowmap import key_group_range_for_operator
from cowmap._keygroups import spark_key_group, spark_type_codes
from cowmap.spark import apply_with_state

EVENTS = "k long, v long"
COUNTS = "k long, n long"


def _events(seed: int, n: int, keys: int) -> pd.DataFrame:
    r = np.random.default_rng(seed)
    return pd.DataFrame({"k": r.integers(0, keys, n), "v": r.integers(0, 100, n)})


def _rows(df: pd.DataFrame, *cols: str) -> Counter:
    return Counter(
        tuple(int(x) if isinstance(x, np.integer) else x for x in row) for row in df[list(cols)].itertuples(index=False)
    )


class Stream:
    """Micro-batches as parquet files, one per trigger, read by a file stream."""

    def __init__(self, spark, tmp: Path, schema: str) -> None:
        self.spark = spark
        self.schema = schema
        self.src = tmp / "src"
        self.src.mkdir()
        self.spark_checkpoint = str(tmp / "spark-checkpoint")
        self.state = str(tmp / "state")
        self.sink = str(tmp / "sink")
        self.files = 0

    def add(self, batch: pd.DataFrame) -> None:
        path = self.src / f"part-{self.files:04d}.parquet"
        batch.to_parquet(path, index=False)
        os.utime(path, (1_700_000_000 + self.files, 1_700_000_000 + self.files))  # (read in this order)
        self.files += 1

    def run(self, processor, out_schema: str, keys="k", **kw) -> pd.DataFrame:
        """Process the files not processed yet, one micro-batch each, into the
        parquet sink (exactly once across restarts); the sink's whole output."""
        df = self.spark.readStream.schema(self.schema).option("maxFilesPerTrigger", 1).parquet(str(self.src))
        out = apply_with_state(df, keys, processor, out_schema, checkpoint_location=self.state, **kw)
        q = (
            out.writeStream.format("parquet")
            .option("path", self.sink)
            .outputMode("append")
            .option("checkpointLocation", self.spark_checkpoint)
            .trigger(availableNow=True)
            .start()
        )
        try:
            q.awaitTermination()
        finally:
            q.stop()
        return self.spark.read.schema(out_schema).parquet(self.sink).toPandas()


@pytest.mark.parametrize("processor", [CountPerKey, CountColumnar], ids=["per-key", "columnar"])
def test_stream_restarts_and_rescales_keep_every_count(spark, tmp_path, processor) -> None:
    batches = [_events(i, 400, 60) for i in range(6)]
    s = Stream(spark, tmp_path, EVENTS)
    for i, parts in enumerate([2, 3, 2]):  # a restart each time, with another number of partitions
        s.add(batches[2 * i])
        s.add(batches[2 * i + 1])
        out = s.run(processor, COUNTS, num_partitions=parts)
    assert _rows(out, "k", "n") == running_counts(batches)
    # the first (2-partition) layout went when the third run began: the second held two versions whole
    assert sorted(p.name for p in Path(s.state).glob("*/L*")) == ["L000002", "L000003"]


def test_batch_query_goes_on_from_the_last_run(spark, tmp_path) -> None:
    batches = [_events(10 + i, 300, 40) for i in range(3)]
    got: Counter = Counter()
    for b, parts in zip(batches, [2, 4, 1], strict=True):
        df = spark.createDataFrame(b, EVENTS)
        got += _rows(
            apply_with_state(
                df, "k", CountPerKey, COUNTS, checkpoint_location=str(tmp_path), num_partitions=parts
            ).toPandas(),
            "k",
            "n",
        )
    assert got == running_counts(batches)


def test_a_query_with_a_new_spark_checkpoint_cannot_take_over_another_querys_state(spark, tmp_path) -> None:
    """Run with a new Spark checkpoint, a query is a new query (a new id): on the state of the
    first it fails with a message naming both, and the first, restarted, goes on from its state."""
    batches = [_events(60 + i, 300, 40) for i in range(4)]
    first = Stream(spark, tmp_path, EVENTS)
    first.add(batches[0])
    first.add(batches[1])
    first.run(CountPerKey, COUNTS, num_partitions=2)
    (tmp_path / "other").mkdir()
    other = Stream(spark, tmp_path / "other", EVENTS)
    other.state = first.state
    other.add(batches[2])
    with pytest.raises(Exception, match=r"written by streaming query [0-9a-f-]+, not by this one \(streaming query"):
        other.run(CountPerKey, COUNTS, num_partitions=2)
    first.add(batches[2])
    first.add(batches[3])
    out = first.run(CountPerKey, COUNTS, num_partitions=2)
    assert _rows(out, "k", "n") == running_counts(batches)


def test_two_operators_of_one_query_sharing_a_state_name_fail_it(spark, tmp_path) -> None:
    """Two operators of one query with one name (``name=`` left to the same processor class) on
    one location would write each other's versions: the query fails naming the shared name."""
    df = spark.createDataFrame(_events(70, 300, 40), EVENTS)
    loc = str(tmp_path)
    first = apply_with_state(df, "k", CountPerKey, COUNTS, checkpoint_location=loc, num_partitions=2)
    second = apply_with_state(first, "k", CountPerKey, COUNTS, checkpoint_location=loc, num_partitions=2)
    with pytest.raises(Exception, match=r"two operators of this query write the state 'CountPerKey' under .*: give"):
        second.collect()


def test_an_output_merged_with_other_partitions_in_its_stage_fails_clearly(spark, tmp_path) -> None:
    """A coalesce or a union right after apply_with_state runs its partitions in tasks of other
    indexes, where a task cannot tell its key groups (nor can a task of no rows): the query fails
    saying so. The coalesced runs committed no version whole, so a run that puts the output first
    in a union starts from the empty state."""
    r = np.random.default_rng(71)
    keys = r.integers(0, 1000, 400)
    codes = spark_type_codes(["bigint"])
    first_half = [int(k) for k in keys if spark_key_group(int(k), codes, 4096) < 2048]
    only_first = pd.DataFrame({"k": first_half, "v": 1})  # every row in partition 0 of 2: 1 has none
    loc = str(tmp_path)
    merged = r"shares its Spark stage with other partitions \(a union or coalesce right after it\?\)"
    for b in (_events(72, 300, 40), only_first):
        df = spark.createDataFrame(b, EVENTS)
        out = apply_with_state(df, "k", CountPerKey, COUNTS, checkpoint_location=loc, num_partitions=2)
        with pytest.raises(Exception, match=merged):
            out.coalesce(1).collect()
        a, b_ = (
            apply_with_state(df, "k", CountPerKey, COUNTS, checkpoint_location=str(tmp_path / "u"), name=name)
            for name in ("a", "b")
        )
        with pytest.raises(Exception, match=merged):
            a.union(b_).collect()
    b = _events(73, 300, 40)
    df = spark.createDataFrame(b, EVENTS)
    out = apply_with_state(df, "k", CountPerKey, COUNTS, checkpoint_location=loc, num_partitions=2)
    extra = spark.createDataFrame([(-1, 0)], COUNTS)
    got = _rows(out.union(extra).toPandas(), "k", "n")  # (first in a union: its partitions keep their indexes)
    assert got == running_counts([b]) + Counter({(-1, 0): 1})


def test_foreach_batch_with_its_batch_id_runs_a_failed_batch_again_without_double_counts(spark, tmp_path) -> None:
    """foreachBatch runs a micro-batch again after a failure: with ``batch_id`` the second run
    replaces the state its first attempt committed (here the batch function fails after it)."""
    batches = [_events(80 + i, 300, 40) for i in range(3)]
    s = Stream(spark, tmp_path, EVENTS)
    for b in batches:
        s.add(b)
    sink = tmp_path / "by-batch"
    sink.mkdir()
    failed = tmp_path / "failed-once"

    def each(batch_df, batch_id: int) -> None:
        out = apply_with_state(
            batch_df, "k", CountPerKey, COUNTS, checkpoint_location=s.state, num_partitions=2, batch_id=batch_id
        )
        out.toPandas().to_parquet(sink / f"batch-{batch_id}.parquet")  # (a sink that replaces a batch's output)
        if batch_id == 1 and not failed.exists():
            failed.touch()
            raise RuntimeError("the batch function failed after its state was committed")

    df = spark.readStream.schema(EVENTS).option("maxFilesPerTrigger", 1).parquet(str(s.src))
    for attempt in range(2):
        q = df.writeStream.foreachBatch(each).option("checkpointLocation", s.spark_checkpoint)
        q = q.trigger(availableNow=True).start()
        try:
            if attempt == 0:
                with pytest.raises(Exception, match="failed after its state was committed"):
                    q.awaitTermination()
            else:
                q.awaitTermination()
        finally:
            q.stop()
    out = pd.concat([pd.read_parquet(sink / f"batch-{i}.parquet") for i in range(3)])
    assert _rows(out, "k", "n") == running_counts(batches)
    with pytest.raises(ValueError, match="batch_id is for a batch DataFrame"):
        apply_with_state(df, "k", CountPerKey, COUNTS, checkpoint_location=s.state, batch_id=0)
    for bad in (-1, True, 1.0):
        with pytest.raises(ValueError, match="batch_id must be an int >= 0"):
            apply_with_state(spark.createDataFrame(batches[0], EVENTS), "k", CountPerKey, COUNTS,
                             checkpoint_location=s.state, batch_id=bad)


def test_two_key_columns_make_tuple_keys(spark, tmp_path) -> None:
    r = np.random.default_rng(3)
    batches = [
        pd.DataFrame(
            {
                "user": r.choice(["ann", "bob", "čeněk", "日本", ""], 200),
                "region": r.integers(0, 4, 200).astype("int32"),
            }
        )
        for _ in range(2)
    ]
    total: Counter = Counter()
    want: Counter = Counter()
    got: Counter = Counter()
    for b in batches:
        for (u, g), n in b.groupby(["user", "region"]).size().items():
            total[(u, g)] += n
            want[(u, int(g), total[(u, g)])] += 1
        df = spark.createDataFrame(b, "user string, region int")
        out = apply_with_state(
            df,
            ["user", "region"],
            CountPairs,
            "user string, region int, n long",
            checkpoint_location=str(tmp_path),
            num_partitions=3,
        )
        got += _rows(out.toPandas(), "user", "region", "n")
    assert got == want


def test_a_task_failing_before_its_commit_counts_nothing_twice(spark, tmp_path) -> None:
    markers = tmp_path / "markers"
    markers.mkdir()
    batches = [_events(20 + i, 300, 30) for i in range(3)]
    s = Stream(spark, tmp_path, EVENTS)
    for b in batches:
        s.add(b)
    got = _rows(s.run(functools.partial(FailOnce, str(markers)), COUNTS, num_partitions=2, name="counts"), "k", "n")
    assert got == running_counts(batches)
    assert len(os.listdir(markers)) == 6  # every task of every batch failed once and was retried


def test_a_task_failing_after_its_commit_counts_nothing_twice(spark, tmp_path) -> None:
    """A later stage of the task (here a second UDF) fails once per task after
    the state was committed: the retry must start again from the batch's
    version, not from the warm backend that already holds the batch."""
    markers = tmp_path / "markers"
    markers.mkdir()
    batches = [_events(50 + i, 300, 30) for i in range(3)]
    got: Counter = Counter()
    for b in batches:
        df = spark.createDataFrame(b, EVENTS)
        out = apply_with_state(
            df, "k", CountPerKey, COUNTS, checkpoint_location=str(tmp_path / "state"), num_partitions=2
        )
        got += _rows(
            out.mapInPandas(functools.partial(fail_once_downstream, str(markers)), COUNTS).toPandas(), "k", "n"
        )
    assert got == running_counts(batches)
    assert len(os.listdir(markers)) == 6


@pytest.mark.parametrize("ttl_ms", [1, 3_600_000])
def test_ttl_follows_the_batch_time(spark, tmp_path, ttl_ms) -> None:
    batches = [_events(30 + i, 200, 50) for i in range(3)]
    s = Stream(spark, tmp_path, EVENTS)
    for b in batches:
        s.add(b)
    got = s.run(functools.partial(Dedup, ttl_ms), EVENTS, num_partitions=2, name="dedup")
    if ttl_ms == 1:  # every micro-batch is more than 1 ms after the one before: nothing survives
        want = Counter(k for b in batches for k in set(b["k"].tolist()))
    else:
        want = Counter(set(k for b in batches for k in b["k"].tolist()))
    assert Counter(got["k"].tolist()) == want


def _sessions_reference(batches: list[pd.DataFrame], parts: list[int], max_parallelism: int, gap: int) -> Counter:
    """Sessions as the processor makes them: each partition keeps a watermark
    (the latest event time it saw), a partition of a rescaled run starts from
    the slowest of the old partitions it takes key groups from, and timers fire
    at the end of each batch."""
    codes = spark_type_codes(["string"])
    none = -(2**63)
    sessions: dict[str, list[int]] = {}
    marks: list[int] = []
    out: Counter = Counter()
    for b, p in zip(batches, parts, strict=True):
        if len(marks) != p:
            old = [key_group_range_for_operator(max_parallelism, len(marks), j) for j in range(len(marks))]
            new = [key_group_range_for_operator(max_parallelism, p, i) for i in range(p)]
            marks = [min((marks[j] for j, o in enumerate(old) if o.intersection(n)), default=none) for n in new]

        def part(user: str, p: int = p) -> int:
            return spark_key_group(user, codes, max_parallelism) * p // max_parallelism

        for u, t in zip(b["user"], b["t"], strict=True):
            sessions.setdefault(u, []).append(int(t))
            marks[part(u)] = max(marks[part(u)], int(t))
        for u in list(sessions):
            end = max(sessions[u]) + gap
            if end <= marks[part(u)]:
                out[(u, min(sessions[u]), end, len(sessions[u]))] += 1
                del sessions[u]
    return out


def test_event_time_timers_close_sessions(spark, tmp_path) -> None:
    r = np.random.default_rng(7)
    users = [f"u{i}" for i in range(12)]
    batches, t0 = [], 0
    for _ in range(5):
        t = t0 + np.sort(r.integers(0, 3_000, 60))
        batches.append(pd.DataFrame({"user": r.choice(users, 60), "t": t}))
        t0 += 2_500
    s = Stream(spark, tmp_path, "user string, t long")
    parts = [2, 2, 3, 3, 3]
    for i, p in [(0, 2), (2, 3)]:
        for b in batches[i : i + 2 if i == 0 else None]:
            s.add(b)
        out = s.run(
            Sessions,
            "user string, start long, end long, events long",
            keys="user",
            num_partitions=p,
            event_time="t",
            max_parallelism=64,
        )
    got = _rows(out, "user", "start", "end", "events")
    assert got == _sessions_reference(batches, parts, 64, Sessions.gap_ms)
    assert got  # sessions did close


@pytest.mark.parametrize(
    ("zone", "ntz"), [("America/New_York", False), ("+05:30", False), ("UTC", False), ("America/New_York", True)]
)
def test_a_timestamp_event_time_is_read_in_the_session_time_zone(spark, tmp_path, zone, ntz) -> None:
    """PySpark hands a timestamp column to pandas as wall-clock times of the session's time zone:
    the watermark is the epoch ms of the latest instant, whatever the zone. A timestamp_ntz is a
    wall-clock time of no zone: it is taken as UTC's. A zone pandas does not know is refused when
    the query is made, and only when it matters: with a timestamp event_time."""
    from pyspark.sql import functions as F

    times = [np.array([1_700_000_000_000, 1_700_000_300_000]), np.array([1_700_000_600_000])]
    # a timestamp_ntz column: the UTC instants' wall-clock figures, written by pandas as zone-less times
    s = Stream(spark, tmp_path, "k long, ms long" + (", ts timestamp_ntz" if ntz else ""))
    for t in times:
        s.add(pd.DataFrame({"k": 1, "ms": t, **({"ts": pd.to_datetime(t, unit="ms")} if ntz else {})}))
    before = spark.conf.get("spark.sql.session.timeZone")
    spark.conf.set("spark.sql.session.timeZone", zone)
    try:
        df = spark.readStream.schema(s.schema).option("maxFilesPerTrigger", 1).parquet(str(s.src))
        if not ntz:
            df = df.withColumn("ts", F.timestamp_millis("ms"))
        out = apply_with_state(
            df, "k", SeeWatermark, "batch long, watermark long",
            checkpoint_location=s.state, num_partitions=1, event_time="ts",
        )
        table = f"wm_{tmp_path.name}".replace("-", "_")
        q = out.writeStream.format("memory").queryName(table).start()
        q.processAllAvailable()
        got = dict(spark.table(table).toPandas().itertuples(index=False))
        q.stop()
        spark.conf.set("spark.sql.session.timeZone", "PST")  # (Java's short name: Spark takes it, pandas does not)
        apply_with_state(df, "k", SeeWatermark, "batch long, watermark long", checkpoint_location=s.state)
        if not ntz:
            with pytest.raises(ValueError, match="the session time zone 'PST' is not one pandas knows"):
                apply_with_state(
                    df, "k", SeeWatermark, "batch long, watermark long", checkpoint_location=s.state, event_time="ts"
                )
    finally:
        spark.conf.set("spark.sql.session.timeZone", before)
    assert got[1] == times[0].max()


def test_bad_input_fails_clearly_and_keeps_the_committed_state(spark, tmp_path) -> None:
    from pyspark.sql import functions as F

    first, second = _events(40, 200, 20), _events(41, 200, 20)
    df = spark.createDataFrame(first, EVENTS)
    loc = str(tmp_path)
    with pytest.raises(ValueError, match="unknown key column 'user'"):
        apply_with_state(df, "user", CountPerKey, COUNTS, checkpoint_location=loc)
    with pytest.raises(ValueError, match=r"key column 'a' has type array<bigint>: cowmap.spark keys by tinyint, .*, "
                       r"boolean$"):
        apply_with_state(df.withColumn("a", F.array("k")), "a", CountPerKey, COUNTS, checkpoint_location=loc)
    with pytest.raises(ValueError, match=r"key column 't' has type timestamp: .*boolean; key by its number instead"):
        apply_with_state(df.withColumn("t", F.current_timestamp()), "t", CountPerKey, COUNTS, checkpoint_location=loc)
    for bad in ("string", "date", "double", "boolean"):
        with pytest.raises(ValueError, match=rf"event_time column 't' has type {bad}: it must be a timestamp or epoch"):
            apply_with_state(df.withColumn("t", F.lit(None).cast(bad)), "k", CountPerKey, COUNTS,
                             checkpoint_location=loc, event_time="t")
    with pytest.raises(ValueError, match="watermark_delay_ms must be an int >= 0, got True"):
        apply_with_state(df, "k", CountPerKey, COUNTS, checkpoint_location=loc, event_time="v",
                         watermark_delay_ms=True)

    class Local(CountPerKey):  # a processor made in a function: its default name is still a directory name
        pass

    apply_with_state(df, "k", Local, COUNTS, checkpoint_location=str(tmp_path / "local"))
    assert (tmp_path / "local" / "test_bad_input_fails_clearly_and_keeps_the_committed_state._locals_.Local").is_dir()
    for bad in ("../escape", ".."):
        with pytest.raises(ValueError, match="name must be"):
            apply_with_state(df, "k", CountPerKey, COUNTS, checkpoint_location=loc, name=bad)
    with pytest.raises(ValueError, match="retain_versions"):
        apply_with_state(df, "k", CountPerKey, COUNTS, checkpoint_location=loc, retain_versions=1)

    class Needs(CountPerKey):
        def __init__(self, limit: int) -> None:
            self.limit = limit

    with pytest.raises(TypeError, match=r"processor '.*Needs' must be callable with no arguments .*functools.partial"):
        apply_with_state(df, "k", Needs, COUNTS, checkpoint_location=loc)
    apply_with_state(df, "k", functools.partial(Needs, 3), COUNTS, checkpoint_location=loc, name="needs")
    got = _rows(
        apply_with_state(df, "k", CountPerKey, COUNTS, checkpoint_location=loc, num_partitions=2).toPandas(), "k", "n"
    )

    df2 = spark.createDataFrame(second, EVENTS)
    with pytest.raises(Exception, match="missing: \\['n'\\]"):
        apply_with_state(
            df2, "k", WrongColumns, COUNTS, checkpoint_location=loc, num_partitions=2, name="CountPerKey"
        ).collect()
    with pytest.raises(Exception, match="the processor failed on purpose"):
        apply_with_state(
            df2, "k", Raising, COUNTS, checkpoint_location=loc, num_partitions=2, name="CountPerKey"
        ).collect()
    with pytest.raises(Exception, match="process returned a list holding a tuple: it must return a DataFrame or"):
        apply_with_state(
            df2, "k", ReturnsRows, COUNTS, checkpoint_location=loc, num_partitions=2, name="CountPerKey"
        ).collect()
    nulls = spark.createDataFrame([(1, 1), (None, 2)], EVENTS)
    with pytest.raises(Exception, match="null key"):
        apply_with_state(nulls, "k", CountPerKey, COUNTS, checkpoint_location=loc, num_partitions=2).collect()
    # the failed runs committed nothing: the next one goes on from the first
    got += _rows(
        apply_with_state(df2, "k", CountPerKey, COUNTS, checkpoint_location=loc, num_partitions=3).toPandas(), "k", "n"
    )
    assert got == running_counts([first, second])


def test_processing_time_timers_fire_at_a_later_batch(spark, tmp_path) -> None:
    batches = [pd.DataFrame({"k": ks, "v": 0}) for ks in ([1, 2, 3], [3, 4], [5])]
    s = Stream(spark, tmp_path, EVENTS)
    for b in batches:
        s.add(b)
    # one partition: it has rows in every micro-batch (a partition without any keeps its time)
    got = _rows(s.run(Reminders, COUNTS, num_partitions=1), "k", "n")
    # each reminder fires at the end of the next micro-batch, with what its key holds then
    assert got == Counter({(1, 0): 1, (2, 0): 1, (3, 1): 2, (4, 1): 1})


def test_the_async_state_api_inside_a_processor(spark, tmp_path) -> None:
    batches = [_events(60 + i, 300, 25) for i in range(2)]
    s = Stream(spark, tmp_path, EVENTS)
    for b in batches:
        s.add(b)
    assert _rows(s.run(AsyncCount, COUNTS, num_partitions=2), "k", "n") == running_counts(batches)
