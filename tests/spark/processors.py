"""Processors the Spark tests run (shipped to the Python workers by value)."""

from __future__ import annotations

import os
from datetime import timedelta

import numpy as np
import pandas as pd

from cowmap import MapStateDescriptor, StateTtlConfig, ValueStateDescriptor


class CountPerKey:
    """Per-key style: the running count of each key, emitted for the keys of the batch."""

    def open(self, ctx):
        self.count = ctx.get_state(ValueStateDescriptor("count"))

    def process(self, batch, ctx):
        keys, counts = [], []
        for key, rows in ctx.groups(batch):
            n = (self.count.value() or 0) + len(rows)
            self.count.update(n)
            keys.append(key)
            counts.append(n)
        return pd.DataFrame({"k": keys, "n": counts})


class CountColumnar:
    """Columnar style: the same counts in a few calls per batch."""

    def open(self, ctx):
        self.count = ctx.get_state(ValueStateDescriptor("count"))

    def process(self, batch, ctx):
        per_key = batch.groupby("k", sort=False).size()
        keys = per_key.index.to_numpy()
        before = self.count.get_many(keys, dtype=np.int64, default=0)
        after = before + per_key.to_numpy()
        self.count.update_many(keys, after)
        return pd.DataFrame({"k": keys, "n": after})


class CountPairs:
    """Two key columns: the key is a (user, region) tuple."""

    def open(self, ctx):
        self.count = ctx.get_state(ValueStateDescriptor("count"))

    def process(self, batch, ctx):
        out = []
        for (user, region), rows in ctx.groups(batch):
            assert ctx.current_key == (user, region)
            n = (self.count.value() or 0) + len(rows)
            self.count.update(n)
            out.append((user, region, n))
        return pd.DataFrame(out, columns=["user", "region", "n"])


class Dedup:
    """Emit a row the first time its key is seen within ``ttl_ms`` (batch time)."""

    def __init__(self, ttl_ms: int = 3_600_000) -> None:
        self.ttl_ms = ttl_ms

    def open(self, ctx):
        desc = ValueStateDescriptor("seen")
        desc.enable_time_to_live(StateTtlConfig.new_builder(timedelta(milliseconds=self.ttl_ms)).build())
        self.seen = ctx.get_state(desc)

    def process(self, batch, ctx):
        first = []
        for _key, rows in ctx.groups(batch):
            if self.seen.value() is None:
                self.seen.update(True)
                first.append(rows.index[0])
        return batch.iloc[first]


class FailOnce(CountPerKey):
    """Counts, but the first attempt of every partition fails after its output, before the commit."""

    def __init__(self, marker_dir: str) -> None:
        self.marker_dir = marker_dir

    def process(self, batch, ctx):
        yield super().process(batch, ctx)
        marker = os.path.join(self.marker_dir, f"failed-{ctx.batch_id}-{ctx.partition_id}")
        if not os.path.exists(marker):
            open(marker, "w").close()
            raise RuntimeError("injected failure before the commit")


class Raising(CountPerKey):
    def process(self, batch, ctx):
        super().process(batch, ctx)
        raise ValueError("the processor failed on purpose")


class WrongColumns(CountPerKey):
    def process(self, batch, ctx):
        return super().process(batch, ctx).rename(columns={"n": "count"})


class Sessions:
    """Sessionization: events of a user closer than ``gap_ms`` form a session,
    emitted when the event-time watermark passes its end."""

    gap_ms = 1_000

    def open(self, ctx):
        self.events = ctx.get_map_state(MapStateDescriptor("events"))
        self.end = ctx.get_state(ValueStateDescriptor("end"))
        self.timers = ctx.get_timer_service()

    def process(self, batch, ctx):
        for _user, rows in ctx.groups(batch):
            for ts in rows["t"].tolist():
                self.events.put(ts, (self.events.get(ts) or 0) + 1)
            end = self.end.value()
            new_end = max(rows["t"].max().item() + self.gap_ms, end or 0)
            if end != new_end:
                if end is not None:
                    self.timers.delete_event_time_timer(end)
                self.timers.register_event_time_timer(new_end)
                self.end.update(new_end)

    def on_timer(self, key, timestamp, ctx):
        times = sorted(self.events.keys())
        count = sum(self.events.values())
        self.events.clear()
        self.end.clear()
        return {"user": key, "start": times[0], "end": timestamp, "events": count}


def fail_once_downstream(marker_dir: str, frames):
    """A mapInPandas function failing the first attempt of each task (after the state's commit)."""
    from pyspark import TaskContext

    rows = list(frames)
    tc = TaskContext.get()
    marker = os.path.join(marker_dir, f"{tc.stageId()}-{tc.partitionId()}")
    if not os.path.exists(marker):
        open(marker, "w").close()
        raise RuntimeError("injected failure after the commit")
    yield from rows


class Reminders:
    """A processing-time timer a millisecond after each key's batch: it fires at
    the end of the next micro-batch (whose time is later), with the key current."""

    def open(self, ctx):
        self.seen = ctx.get_state(ValueStateDescriptor("seen"))
        self.timers = ctx.get_timer_service("reminders")

    def process(self, batch, ctx):
        for _key, _rows in ctx.groups(batch):
            self.seen.update(ctx.batch_id)
            self.timers.register_processing_time_timer(ctx.batch_timestamp_ms + 1)

    def on_timer(self, key, timestamp, ctx):
        assert ctx.current_key == key and ctx.timer_domain.name == "PROCESSING_TIME"
        return {"k": key, "n": self.seen.value()}


class AsyncCount:
    """The per-key count through the async state API: one record per row, each
    key's in order, the state requests batched."""

    def open(self, ctx):
        from cowmap.asyncstate import AsyncExecutionController

        self.count = ctx.get_state(ValueStateDescriptor("count", default_value=0))
        self.aec = AsyncExecutionController(ctx.backend, batch_size=64)
        self.out = {}

    def process(self, batch, ctx):
        def on_row(key):
            def bump(n):
                self.out[key] = n + 1
                return self.count.async_update(n + 1)

            self.count.async_value().then_compose(bump)

        for key in batch["k"].tolist():
            self.aec.process(key, on_row, key)
        self.aec.drain()
        return pd.DataFrame({"k": list(self.out), "n": list(self.out.values())})


class ReturnsRows(CountPerKey):
    def process(self, batch, ctx):
        return [tuple(r) for r in super().process(batch, ctx).itertuples(index=False)]


class SeeWatermark:
    """Emits, per batch, the watermark the batch began with."""

    def process(self, batch, ctx):
        return pd.DataFrame({"batch": [ctx.batch_id], "watermark": [ctx.watermark_ms]})
