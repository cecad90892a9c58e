"""Whose a version of a state is: the writer each commit records, and the checks
that keep a query, an operator and a task attempt to their own versions.

A state belongs to one query: a streaming query's id (Spark keeps it across the
query's restarts, and its ``foreachBatch`` runs carry it) or None for another
batch query. Within it, each ``apply_with_state`` call is one operator
definition (``plan``), and each micro-batch one SQL execution. Versions saved
before a field was recorded lack it and are trusted.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from cowmap.checkpoint import CheckpointStorage, CorruptCheckpointError
from cowmap.spark.layout import Layout, Location

__all__ = ["MERGED", "Writer", "check_current", "check_read", "check_write"]

#: why a task can be handed rows or a partition index that are not its own
MERGED = (
    "The output of apply_with_state shares its Spark stage with other partitions (a union or coalesce "
    "right after it?), so a task cannot tell which key groups it holds: write the output as it is, or "
    "repartition it first"
)


@dataclass(frozen=True)
class Writer:
    """The task writing (or reading) a state, as each commit records it."""

    query: str | None  # the streaming query's id; None for a batch query outside a foreachBatch
    run: str | None  # a streaming query's run (each restart is a new one); None for a batch query
    execution: str | None  # the micro-batch's (or batch query's) SQL execution
    task: int | None  # the task attempt
    plan: str  # the operator's definition: one per apply_with_state call

    @classmethod
    def of(cls, tc: Any, plan: str, streaming: bool) -> Writer:
        if tc is None:
            return cls(None, None, None, None, plan)
        prop = tc.getLocalProperty
        # (a streaming query's job group is its run id; a foreachBatch calls apply_with_state each
        # batch, one definition a batch, so only a stream's own operator keeps one for its run)
        run = prop("spark.jobGroup.id") if streaming else None
        return cls(prop("sql.streaming.queryId"), run, prop("spark.sql.execution.query.id"), tc.taskAttemptId(), plan)

    def record(self) -> dict[str, Any]:
        return asdict(self)


def check_read(storage: CheckpointStorage, version: int, meta: dict[str, Any], me: Writer, operator: str) -> None:
    """``RuntimeError`` when another query wrote the version ``meta`` is of, or
    another operator of this very run of the query (two sharing ``operator``)."""
    _check_query(storage, version, meta, me.query)
    if me.run is not None and meta.get("run") == me.run and meta.get("plan") != me.plan:
        raise _shared(operator, storage)


def check_write(storage: CheckpointStorage, version: int, me: Writer, operator: str) -> None:
    """Refuse to overwrite ``version`` when another query wrote it (two running
    on one state), or this micro-batch's execution did already from another
    operator (two sharing a name) or from this very task attempt (a coalesce
    handing it several partitions under one index). A retried or speculative
    attempt (another task, the same operator) and a restarted query (another
    execution) overwrite it, as they must."""
    try:  # (one read, no listing: absent on the way on, present only for a retry or a conflict)
        meta = storage.manifest(version).get("metadata") or {}
    except (FileNotFoundError, CorruptCheckpointError):
        return  # (nothing readable to keep: written over)
    _check_query(storage, version, meta, me.query)
    if me.execution is None or meta.get("execution") != me.execution:
        return
    if meta.get("plan") != me.plan:
        raise _shared(operator, storage)
    if meta.get("task") == me.task:
        raise RuntimeError(f"cowmap.spark: one task was handed two partitions with one index. {MERGED}")


def check_current(location: Location, layout: Layout, storage: CheckpointStorage, version: int, me: Writer) -> None:
    """Refuse a batch DataFrame's commit of ``version`` once another run
    committed it whole or a later one: the DataFrame, made when ``version - 1``
    was the newest, would take the state back (its commit drops the later
    versions) or drop that run's changes. Running the DataFrame again (another
    action) redoes its own run while no other followed it, and a run that
    failed part way (``version`` held by some ranges only, or by this run's
    own tasks in some) is redone. Reads a manifest per range only when
    ``version`` is there already under another operator definition."""
    newest = max(storage.checkpoints(), default=0)
    later = [v for v in _newer_layouts_versions(location, layout) if v >= version]
    if newest > version or later:
        _stale(storage, version, max([newest, *later]))
    if newest == version and _plan_of(storage, version) not in (None, me.plan):
        plans = [_plan_of(location.storage(layout, r), version) for r in layout.ranges()]
        if all(p is not None and p != me.plan for p in plans):
            _stale(storage, version, newest)


def _plan_of(storage: CheckpointStorage, version: int) -> str | None:
    """The operator definition that wrote ``version`` here (None: absent, unreadable or unrecorded)."""
    try:
        return (storage.manifest(version).get("metadata") or {}).get("plan")
    except (FileNotFoundError, CorruptCheckpointError):
        return None


def _newer_layouts_versions(location: Location, layout: Layout) -> list[int]:
    """The versions held under layouts recorded after ``layout`` (a later run with another number
    of partitions), read from the location now: the plan's copy knows the layouts of its making."""
    now = Location(location.uri, location.operator)
    return [v for later in now.layouts if later.id > layout.id for r in later.ranges()
            for v in now.storage(later, r).checkpoints()]


def _stale(storage: CheckpointStorage, version: int, newest: int) -> None:
    raise RuntimeError(
        f"cowmap.spark: this DataFrame was made to commit version {version} of the state in {storage.uri!r}, "
        f"which another run has since taken to version {newest}: a batch DataFrame of apply_with_state is one run "
        "of its state. Call apply_with_state again for the next run (or pass batch_id= to choose the version)"
    )


def _check_query(storage: CheckpointStorage, version: int, meta: dict[str, Any], query: str | None) -> None:
    if "query" in meta and meta["query"] != query:
        raise RuntimeError(
            f"cowmap.spark: the state in {storage.uri!r} (version {version}) was written by "
            f"{_query_name(meta['query'])}, not by this one ({_query_name(query)}). A query run with a new Spark "
            "checkpoint is a new query, and two queries must not share a state: give this one its own "
            "checkpoint_location or name, or delete the old state to start over"
        )


def _shared(operator: str, storage: CheckpointStorage) -> RuntimeError:
    return RuntimeError(
        f"cowmap.spark: two operators of this query write the state {operator!r} under {storage.uri!r}: give "
        "each its own name= (it defaults to the processor's class name)"
    )


def _query_name(query: str | None) -> str:
    return "a batch query" if query is None else f"streaming query {query}"
