"""``apply_with_state``: the driver's side — validate, route by key group, plan the UDF."""

from __future__ import annotations

import functools
import inspect
import re
from collections.abc import Sequence
from datetime import timezone, tzinfo
from typing import Any

from pyspark.sql import DataFrame
from pyspark.sql import functions as F
from pyspark.sql.types import DataType, StructType

from cowmap.spark.event_time import session_zone
from cowmap.spark.layout import Location
from cowmap.spark.task import KG_BITS, KG_MASK, ROUTE_COLUMN, Plan, run_partition
from cowmap.state.keygroups import _check_parallelism, spark_key_hash

__all__ = ["apply_with_state"]

_OPERATOR_NAME = re.compile(r"^[A-Za-z0-9_.-]{1,200}$")
#: the key columns' types, as Spark names them
_KEY_TYPES = ("tinyint", "smallint", "int", "bigint", "float", "double", "string", "binary", "boolean")
_TIMES = ("date", "timestamp", "timestamp_ntz")
_EVENT_TIME_TYPES = ("timestamp", "timestamp_ntz", "tinyint", "smallint", "int", "bigint")


def apply_with_state(
    df: DataFrame,
    keys: str | Sequence[str],
    processor: Any,
    schema: StructType | str,
    *,
    checkpoint_location: str,
    num_partitions: int | None = None,
    max_parallelism: int = 4096,
    name: str | None = None,
    event_time: str | None = None,
    watermark_delay_ms: int = 0,
    retain_versions: int = 5,
    batch_id: int | None = None,
) -> DataFrame:
    """Run ``processor`` over ``df`` (batch or streaming) with Flink-style keyed
    state kept between micro-batches under ``checkpoint_location``.

    Rows are routed by key group: Spark computes ``pmod(hash(keys),
    max_parallelism)`` and ``repartitionById`` sends each row to the partition
    owning that key group's range (no Python pass before the shuffle). In each
    task, ``processor()`` is made, ``open(ctx)`` registers its states (a
    :class:`~cowmap.spark.StateContext`), ``process(batch, ctx)`` gets every row
    of the partition in the micro-batch as one pandas DataFrame and returns a
    DataFrame with ``schema``'s columns (or an iterator of them, or None); then
    due timers call ``on_timer(key, timestamp, ctx)`` (returning a dict, a list
    of them, a DataFrame or None), ``close()`` runs, and the state is committed.
    A partition learns the batch's time from its rows: one without rows in a
    micro-batch keeps its time and watermark (its timers fire at its next
    batch with rows), and ``process`` is not called for it.

    State versions follow Spark's micro-batches: batch ``b`` loads version ``b``
    of its key-group range and commits ``b + 1`` after its output is produced,
    so a retried or restarted batch starts from the same state and leaves no
    double counts. TTL and processing-time timers use the micro-batch's time
    (``current_timestamp()``), so a retry rebuilds the same state. A batch
    (not streaming) query goes on from the newest version in the location. The
    state belongs to the query that wrote it (a streaming query's id, which a new
    Spark checkpoint changes): another query's task fails on it, naming both.

    Args:
        keys: the key column(s); a key is a scalar for one column, a tuple for several.
        processor: a class (or any callable) making the per-task processor.
        schema: the output schema (a ``StructType`` or a DDL string).
        checkpoint_location: a directory (local path or a URI of a filesystem
            pyarrow knows) for this operator's state; not Spark's own checkpoint.
        num_partitions: the number of tasks (the session's
            ``spark.sql.shuffle.partitions`` by default). It may change between
            runs: the state is rescaled by key-group range.
        max_parallelism: the number of key groups, fixed for the query's life.
        name: the operator's name in ``checkpoint_location`` (the processor's
            class name by default); two operators of one query need two names.
        event_time: a timestamp (or epoch-ms integer) column; with it each
            partition keeps an event-time watermark, the latest event time seen
            (in epoch ms: a timestamp is read in the session's time zone, as
            PySpark hands it over) minus ``watermark_delay_ms``, which fires
            event-time timers after a batch.
        retain_versions: committed versions kept per key-group range (at least 2:
            a restart may go back one batch).
        batch_id: for a batch (not streaming) ``df``, the run's number: it loads
            version ``batch_id`` and commits ``batch_id + 1``, so running a
            number again (``foreachBatch`` after a failure) replaces what its
            earlier attempt committed instead of counting it twice. By default
            a batch query goes on from the newest version. A streaming query
            takes its micro-batch's id from Spark.

    Returns the output DataFrame (streaming if ``df`` is).
    """
    if not isinstance(df, DataFrame):
        raise TypeError(f"df must be a pyspark DataFrame, not {type(df).__name__}")
    key_list = [keys] if isinstance(keys, str) else list(keys)
    if not key_list or not all(isinstance(k, str) for k in key_list):
        raise TypeError(f"keys must be a column name or a non-empty list of them, got {keys!r}")
    fields = {f.name: f for f in df.schema.fields}
    for k in key_list:
        if k not in fields:
            raise ValueError(f"unknown key column {k!r}; the DataFrame has {list(fields)}")
    key_types = [fields[k].dataType.simpleString() for k in key_list]
    for k, t in zip(key_list, key_types, strict=True):
        if t not in _KEY_TYPES:
            # (a date or timestamp: pandas hands them over as datetime objects, not the days or
            # microseconds Spark hashes)
            hint = f"; key by its number instead (e.g. unix_micros({k}) or unix_date({k}))" if t in _TIMES else ""
            raise ValueError(f"key column {k!r} has type {t}: cowmap.spark keys by {', '.join(_KEY_TYPES)}{hint}")
    if not callable(processor):
        raise TypeError(f"processor must be a class (or callable) making the processor, not {type(processor).__name__}")
    if not callable(getattr(processor, "process", None)) and isinstance(processor, type):
        raise TypeError(f"processor {processor.__name__} has no process(batch, ctx) method")
    try:
        inspect.signature(processor).bind()
    except TypeError as e:  # (found here, not as each task's error)
        raise TypeError(
            f"processor {getattr(processor, '__qualname__', processor)!r} must be callable with no arguments "
            f"(each task makes its own): {e}; bind them with functools.partial"
        ) from None
    except ValueError:
        pass  # (a callable without a signature to read)
    out_schema = _schema(schema)
    _check_parallelism("max_parallelism", max_parallelism)
    if num_partitions is None:
        num_partitions = int(df.sparkSession.conf.get("spark.sql.shuffle.partitions") or 200)
    _check_parallelism("num_partitions", num_partitions)
    if num_partitions > max_parallelism:
        raise ValueError(f"num_partitions {num_partitions} exceeds max_parallelism {max_parallelism}")
    if event_time is not None and event_time not in fields:
        raise ValueError(f"unknown event_time column {event_time!r}; the DataFrame has {list(fields)}")
    if event_time is not None and (t := fields[event_time].dataType.simpleString()) not in _EVENT_TIME_TYPES:
        raise ValueError(
            f"event_time column {event_time!r} has type {t}: it must be a timestamp or epoch milliseconds in an "
            f"integer column ({', '.join(_EVENT_TIME_TYPES)})"
        )
    zone: tzinfo | str = timezone.utc  # (a timestamp_ntz's wall-clock times are in no zone: taken as UTC's)
    if event_time is not None and fields[event_time].dataType.simpleString() == "timestamp":
        zone = session_zone(df.sparkSession.conf.get("spark.sql.session.timeZone") or "UTC")
    if not isinstance(watermark_delay_ms, int) or isinstance(watermark_delay_ms, bool) or watermark_delay_ms < 0:
        raise ValueError(f"watermark_delay_ms must be an int >= 0, got {watermark_delay_ms!r}")
    if batch_id is not None:
        if df.isStreaming:
            raise ValueError("batch_id is for a batch DataFrame: a streaming query takes its micro-batch id from Spark")
        if not isinstance(batch_id, int) or isinstance(batch_id, bool) or batch_id < 0:
            raise ValueError(f"batch_id must be an int >= 0, got {batch_id!r}")
    if not isinstance(retain_versions, int) or retain_versions < 2:
        raise ValueError(f"retain_versions must be an int >= 2, got {retain_versions!r}")
    if ROUTE_COLUMN in fields:
        raise ValueError(f"the DataFrame has a column named {ROUTE_COLUMN!r}, which cowmap.spark uses itself")
    if name is None:  # the processor's name, made a directory name ("f.<locals>.P" -> "f._locals_.P")
        qualname = getattr(processor, "__qualname__", None) or type(processor).__name__
        operator = re.sub(r"[^A-Za-z0-9_.-]", "_", qualname)[:200]
    else:
        operator = name
    if not isinstance(operator, str) or not _OPERATOR_NAME.match(operator) or not operator.strip("."):
        raise ValueError(f"name must be 1-200 letters, digits, '_', '.', '-' (not only dots), got {operator!r}")

    location = Location(checkpoint_location, operator)
    layout = location.use(num_partitions, max_parallelism, spark_key_hash(key_types))
    location.prune()
    plan = Plan(
        location=location,
        layout=layout,
        keys=key_list,
        key_types=key_types,
        processor=processor,
        out_columns=out_schema.fieldNames(),
        streaming=df.isStreaming,
        batch_id=0 if df.isStreaming else location.latest_version() if batch_id is None else batch_id,
        event_time=event_time,
        time_zone=zone,
        watermark_delay_ms=watermark_delay_ms,
        retain_versions=retain_versions,
        warm_key=(location.uri, operator),
        pinned=batch_id is not None,
    )

    null_key = functools.reduce(lambda a, b: a | b, [F.col(k).isNull() for k in key_list])
    null_error = F.raise_error(F.lit(f"cowmap.spark: a null key in column(s) {key_list}: keys must not be null"))
    kg = F.when(null_key, null_error)
    kg = kg.otherwise(F.pmod(F.hash(*[F.col(k) for k in key_list]), F.lit(max_parallelism)))
    # the batch time and the key group in one column, before the shuffle: a projection of its own
    # after it cost more (measured: ~40 ms of a 500,000-row micro-batch's 0.65 s, against ~15)
    route = F.unix_millis(F.current_timestamp()) * (1 << KG_BITS) + kg.cast("long")
    routed = df.withColumn(ROUTE_COLUMN, route)
    partition = F.expr(f"cast(((`{ROUTE_COLUMN}` & {KG_MASK}) * {num_partitions}) div {max_parallelism} as int)")
    routed = routed.repartitionById(num_partitions, partition)
    return routed.mapInPandas(functools.partial(run_partition, plan), out_schema)


def _schema(schema: StructType | str) -> StructType:
    if isinstance(schema, StructType):
        return schema
    if isinstance(schema, str):
        parsed = DataType.fromDDL(schema)
        if isinstance(parsed, StructType):
            return parsed
    raise TypeError(f"schema must be a StructType or a DDL string of columns, not {schema!r}")
