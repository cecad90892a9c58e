"""What runs in a Spark task: load a key-group range's state, process the rows,
fire due timers, commit the next version.

A task of micro-batch ``b`` needs version ``b`` of its range. A Python worker
keeps the backends it committed (:data:`_WARM`, a few, least recently used
first out) and reuses one when it holds exactly that version, or catches one
up by applying the increments committed since it (Spark gives a partition to
whichever worker is idle, so a worker's backend is often a batch behind);
otherwise it restores from the checkpoints (workers move between partitions,
are stopped when idle, and die with failed tasks). Version ``b + 1`` is committed only
after every output row was handed to Spark; any error drops the backend, so a
retried attempt starts again from version ``b``.
"""

from __future__ import annotations

import logging
import uuid
from collections import OrderedDict
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from datetime import timezone, tzinfo
from typing import Any

import pandas as pd

from cowmap._context import StateView
from cowmap._core import ManualClock
from cowmap.checkpoint import CheckpointStorage
from cowmap.spark.context import StateContext
from cowmap.spark.event_time import event_time_ms
from cowmap.spark.layout import Layout, Location
from cowmap.spark.ownership import MERGED, Writer, check_current, check_read, check_write
from cowmap.state import NO_WATERMARK, KeyedStateBackend, KeyGroupRange, TimeDomain

__all__ = ["KG_BITS", "KG_MASK", "ROUTE_COLUMN", "Plan", "run_partition"]

#: the column the query adds before the shuffle: the batch time (ms) shifted left
#: by KG_BITS, plus the row's key group (max_parallelism is at most 2**15). One
#: int64 column instead of two: each column costs its share of the shuffle and of
#: the JVM's Arrow conversion (a second column: ~6% of a 500,000-row micro-batch)
ROUTE_COLUMN = "__cowmap_route"
KG_BITS = 16
KG_MASK = (1 << KG_BITS) - 1

_log = logging.getLogger("cowmap.spark")

#: backends kept warm per Python worker
WARM_BACKENDS = 4


@dataclass
class Plan:
    """Everything a task needs, made on the driver and shipped with the UDF."""

    location: Location
    layout: Layout
    keys: list[str]
    key_types: list[str]
    processor: Any
    out_columns: list[str]
    streaming: bool
    batch_id: int  # a batch query's run (a streaming task reads its micro-batch's id from Spark)
    event_time: str | None = None
    time_zone: tzinfo | str = timezone.utc  # the session's: of the wall-clock times PySpark hands over
    watermark_delay_ms: int = 0
    retain_versions: int = 5
    warm_key: tuple[Any, ...] = field(default=())
    #: a batch query's version chosen by the caller (batch_id=): its runs may take the state back
    pinned: bool = False
    #: this operator's definition: two operators writing one state are told apart by it
    token: str = field(default_factory=lambda: uuid.uuid4().hex)


@dataclass
class _Warm:
    backend: KeyedStateBackend
    clock: ManualClock  # the micro-batch's time, set before each batch
    version: int
    watermark: int
    timestamp: int


_WARM: OrderedDict[tuple[Any, ...], _Warm] = OrderedDict()


def _batch_id(plan: Plan, tc: Any) -> int:
    if not plan.streaming:
        return plan.batch_id
    raw = tc.getLocalProperty("streaming.sql.batchId") if tc is not None else None
    if raw is None:
        raise RuntimeError("cowmap.spark: a streaming task without Spark's micro-batch id (streaming.sql.batchId)")
    return int(raw)


def _load(plan: Plan, kg_range: KeyGroupRange, version: int, me: Writer) -> tuple[_Warm, list[CheckpointStorage]]:
    """An empty backend for ``kg_range`` with the watermark and time of
    ``version``, and the storages to restore ``version`` from once the
    processor's ``open`` has registered its states (their serializers decode
    the values)."""
    clock = ManualClock(0)
    backend = KeyedStateBackend(
        plan.layout.max_parallelism, kg_range, time_provider=clock, spark_key_types=plan.key_types
    )
    warm = _Warm(backend, clock, version, NO_WATERMARK, 0)
    if version == 0:
        # the empty state: refused where another query's versions of these key groups already are
        # (under any number of partitions), which this one's commits would overwrite, or its
        # retention delete, or a restart of the other would be handed
        for storage in plan.location.overlapping(plan.layout, kg_range):
            newest = storage.latest()
            if newest is not None:
                _times_of(plan, storage, newest, me)
        return warm, []
    sources = plan.location.sources(plan.layout, kg_range, version, plan.pinned)
    marks, times = zip(*(_times_of(plan, storage, version, me) for storage in sources), strict=True)
    # a range made of several old ones: the slowest old watermark (as Flink takes
    # the minimum over its inputs), the latest time
    warm.watermark = min(marks)
    warm.timestamp = max(times)
    return warm, sources


def _catch_up(plan: Plan, warm: _Warm, kg_range: KeyGroupRange, version: int, me: Writer) -> bool:
    """Bring a warm backend a version or more behind (its range went to another
    worker meanwhile) to ``version`` by the increments committed since, when
    they are increments of what it holds: O(what changed), not a restore."""
    storage = plan.location.storage(plan.layout, kg_range)
    if warm.version > version or not storage._catch_up(warm.backend, version):
        return False
    warm.version = version
    warm.watermark, warm.timestamp = _times_of(plan, storage, version, me)
    return True


def _times_of(plan: Plan, storage: CheckpointStorage, version: int, me: Writer) -> tuple[int, int]:
    """The watermark and batch time a committed version was saved with;
    ``RuntimeError`` if it is not this query's, or another operator's of its run."""
    meta = storage.manifest(version).get("metadata") or {}
    check_read(storage, version, meta, me, plan.location.operator)
    return int(meta.get("watermark", NO_WATERMARK)), int(meta.get("timestamp", 0))


def _check_output(out: pd.DataFrame, columns: list[str], where: str) -> pd.DataFrame | None:
    """``out`` with the schema's columns in order; None for an empty frame
    without columns (nothing to emit)."""
    if out.shape == (0, 0):
        return None
    if not out.columns.is_unique:
        raise ValueError(f"cowmap.spark: {where} returned columns {list(out.columns)}, some of them twice")
    missing = [c for c in columns if c not in out.columns]
    if missing:
        raise ValueError(
            f"cowmap.spark: {where} returned columns {list(out.columns)}; the schema needs {columns} "
            f"(missing: {missing})"
        )
    return out[columns] if list(out.columns) != columns else out


def _outputs(result: Any, columns: list[str], where: str) -> Iterator[pd.DataFrame]:
    if result is None:
        return
    if isinstance(result, pd.DataFrame):
        frames: Iterable[Any] = [result]
    elif isinstance(result, Iterable) and not isinstance(result, str | bytes | dict | pd.Series):
        frames = result
    else:
        raise TypeError(
            f"cowmap.spark: {where} must return a DataFrame or an iterator of them, not {type(result).__name__}"
        )
    for out in frames:
        if not isinstance(out, pd.DataFrame):
            raise TypeError(
                f"cowmap.spark: {where} returned a {type(result).__name__} holding a {type(out).__name__}: it must "
                "return a DataFrame or an iterator (a list, a generator) of DataFrames"
            )
        checked = _check_output(out, columns, where)
        if checked is not None:
            yield checked


class _TimerOutput:
    """Calls the processor's ``on_timer`` for each firing timer and keeps what it returns."""

    def __init__(self, processor: Any, columns: list[str]) -> None:
        self.fn = getattr(processor, "on_timer", None)
        self.columns = columns
        self.rows: list[dict[str, Any]] = []
        self.frames: list[pd.DataFrame] = []
        self.ctx: StateContext | None = None

    def __call__(self, ts: int, key: Any, namespace: Any, domain: TimeDomain) -> None:
        if self.fn is None:
            raise TypeError("cowmap.spark: a timer fired but the processor has no on_timer(key, timestamp, ctx)")
        ctx = self.ctx
        assert ctx is not None
        ctx.timer_domain, ctx.timer_namespace = TimeDomain(domain), namespace
        try:
            out = self.fn(key, ts, ctx)
        finally:
            ctx.timer_domain = ctx.timer_namespace = None
        if out is None:
            return
        if isinstance(out, dict):
            self.rows.append(out)
        elif isinstance(out, pd.DataFrame):
            self.frames.extend(_outputs(out, self.columns, "on_timer"))
        else:
            rows = list(out) if isinstance(out, Iterable) and not isinstance(out, str | bytes | pd.Series) else [out]
            for row in rows:
                if not isinstance(row, dict):
                    raise TypeError(
                        "cowmap.spark: on_timer must return a dict, a DataFrame, a list of dicts or None, got "
                        + (f"a {type(out).__name__}" if row is out else f"a {type(out).__name__} holding a "
                           f"{type(row).__name__}")
                    )
            self.rows.extend(rows)

    def drain(self) -> Iterator[pd.DataFrame]:
        if self.rows:
            yield from _outputs(pd.DataFrame(self.rows), self.columns, "on_timer")
            self.rows = []
        yield from self.frames
        self.frames = []


def _check_views(processor: Any, backend: KeyedStateBackend) -> None:
    """``RuntimeError`` for a state view of another task's backend kept by the
    processor (in a class attribute, say: the Python worker runs many tasks),
    which would read and write the state of whatever key that backend last had."""
    places = [("", vars(processor) if hasattr(processor, "__dict__") else {})]
    places += [(f"{cls.__name__}.", vars(cls)) for cls in type(processor).__mro__ if cls is not object]
    for where, attrs in places:
        for name, value in list(attrs.items()):
            if isinstance(value, StateView) and value._kc is not backend.key_context:
                raise RuntimeError(
                    f"cowmap.spark: the processor keeps state {getattr(value, 'name', '?')!r} of another task in "
                    f"{where or 'self.'}{name}: each task has its own state (a Python worker runs many), so "
                    "register states in open(ctx) and keep them on self"
                )


def _batch_frame(chunks: list[pd.DataFrame]) -> pd.DataFrame:
    if len(chunks) == 1:
        return chunks[0]
    return pd.concat(chunks, ignore_index=True)


def run_partition(plan: Plan, chunks_in: Iterator[pd.DataFrame]) -> Iterator[pd.DataFrame]:
    """The ``mapInPandas`` function: this partition's rows of one micro-batch in,
    the processor's output out, then the state committed as the next version."""
    from pyspark import TaskContext

    tc = TaskContext.get()
    partition = tc.partitionId() if tc is not None else 0
    batch_id = _batch_id(plan, tc)
    me = Writer.of(tc, plan.token, plan.streaming)
    if not 0 <= partition < plan.layout.num_partitions:
        raise RuntimeError(f"cowmap.spark: a task of partition {partition} of {plan.layout.num_partitions}. {MERGED}")
    kg_range = plan.layout.range_of(partition)
    chunks = [c for c in chunks_in if len(c)]
    batch = _batch_frame(chunks) if chunks else None
    route = None
    if batch is not None:
        route = batch[ROUTE_COLUMN].to_numpy()
        kgs = route & KG_MASK
        if kgs.min() < kg_range.start or kgs.max() > kg_range.end:
            raise RuntimeError(
                f"cowmap.spark: partition {partition} (key groups {kg_range.start}..{kg_range.end}) got rows of key "
                f"groups {int(kgs.min())}..{int(kgs.max())}: the rows were not routed to it. {MERGED}"
            )

    # (a stream's operator's own: a second one sharing its name never takes it over; a batch query
    # is a definition a run, foreachBatch's each batch, so its runs share theirs)
    owner = plan.token if plan.streaming else None
    key = (*plan.warm_key, me.query, owner, plan.layout.id, kg_range.start, kg_range.end)
    warm = _WARM.pop(key, None)
    if warm is not None and warm.version != batch_id and not _catch_up(plan, warm, kg_range, batch_id, me):
        warm = None  # (dropped before the restore: one range's state in memory at a time)
    restore: list[CheckpointStorage] = []
    if warm is None:
        warm, restore = _load(plan, kg_range, batch_id, me)
    backend = warm.backend

    if batch is not None and route is not None:
        warm.timestamp = max(warm.timestamp, int(route[0]) >> KG_BITS)
        batch = batch.drop(columns=[ROUTE_COLUMN])
    warm.clock.ms = warm.timestamp

    processor = plan.processor()
    timers = _TimerOutput(processor, plan.out_columns)
    ctx = StateContext(backend, plan.keys, partition, batch_id, warm.timestamp, warm.watermark, timers)
    timers.ctx = ctx
    try:
        # (no current key in open, as in Flink: the state of a worker without the backend is
        # restored after it, with the serializers it registers)
        backend.key_context.restore_key(None, None)
        opened = getattr(processor, "open", None)
        if opened is not None:
            opened(ctx)
            if backend.get_current_key() is not None:
                raise RuntimeError(
                    "cowmap.spark: open() set a current key: it registers states and timer services, and "
                    "keyed state is read and written in process and on_timer"
                )
        _check_views(processor, backend)
        for storage in restore:
            storage.restore(backend, batch_id)
        for name in backend.timer_service_names():
            backend.get_timer_service(name, timers)  # (restored services fire into this batch's processor)
        if batch is not None:
            # (read before process, which may change the batch in place)
            latest = NO_WATERMARK if plan.event_time is None else event_time_ms(batch[plan.event_time], plan.time_zone)
            yield from _outputs(processor.process(batch, ctx), plan.out_columns, "process")
            if latest != NO_WATERMARK:
                warm.watermark = max(warm.watermark, latest - plan.watermark_delay_ms)
        for name in backend.timer_service_names():
            svc = backend.get_timer_service(name, timers)
            svc.advance_processing_time(warm.timestamp)
            if warm.watermark != NO_WATERMARK:
                svc.advance_watermark(warm.watermark)
            elif plan.event_time is None and svc.num_event_time_timers():
                raise RuntimeError(
                    f"cowmap.spark: the processor registered event-time timers (service {name!r}), which fire "
                    "as the watermark passes them, but apply_with_state was given no event_time= column to "
                    "make one: pass event_time=, or register processing-time timers"
                )
            yield from timers.drain()
        closed = getattr(processor, "close", None)
        if closed is not None:
            closed()
    finally:
        # ctx and the timer callback refer to each other, and the backend's timer services to the
        # callback: unlinked, a backend dropped from the warm cache is freed by reference counting,
        # not by the next full collection (a pause the length of the worker's whole heap)
        timers.ctx = None

    storage = plan.location.storage(plan.layout, kg_range)
    check_write(storage, batch_id + 1, me, plan.location.operator)
    if not plan.streaming and not plan.pinned:
        check_current(plan.location, plan.layout, storage, batch_id + 1, me)
    storage.save(
        backend,
        checkpoint_id=batch_id + 1,
        metadata={"watermark": warm.watermark, "timestamp": warm.timestamp, **me.record()},
        # a stream's next micro-batch starts only once this one is done: a later version can only
        # be the next batch's, which a straggling attempt of this one must not drop
        drop_later=not plan.streaming,
    )
    try:
        storage.retain(plan.retain_versions)
    except Exception as e:  # noqa: BLE001 - the commit took effect: failing the task now would hide that
        # (a retry would find it done, but a batch query that failed is then run again by hand over it)
        _log.warning("cowmap.spark: version %d of %s is committed, but deleting old versions failed "
                     "(tried again at the next commit): %r", batch_id + 1, storage.uri, e)
    warm.version = batch_id + 1
    _WARM[key] = warm
    while len(_WARM) > WARM_BACKENDS:
        _WARM.popitem(last=False)
