"""Sessionization: a user's clicks closer than 30 minutes apart (event time) form a
session, emitted once the watermark has passed its end.

    python examples/sessionization.py

A MapState counts the session's pages, a ValueState holds its start and last
click, and one event-time timer per user sits at the session's end.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
from file_stream import main, run_stream, write_files
from pyspark.sql import DataFrame, SparkSession

from cowmap import MapStateDescriptor, ValueStateDescriptor
from cowmap.spark import apply_with_state

GAP_MS = 30 * 60_000


class Sessions:
    def open(self, ctx):
        self.pages = ctx.get_map_state(MapStateDescriptor("pages"))  # page -> clicks in the session
        self.span = ctx.get_state(ValueStateDescriptor("span"))  # (first click, last click)
        self.timers = ctx.get_timer_service()

    def process(self, batch: pd.DataFrame, ctx) -> pd.DataFrame:
        closed = []
        for user, rows in ctx.groups(batch):
            before = span = self.span.value()
            order = np.argsort(rows["ts"], kind="stable")
            for ts, page in zip(rows["ts"][order].tolist(), rows["page"][order].tolist()):
                if span is not None and ts > span[1] + GAP_MS:  # a gap: the session before it is over
                    closed.append(self.end_session(user))
                    span = None
                span = (span[0], max(span[1], ts)) if span is not None else (ts, ts)
                self.span.update(span)
                self.pages.put(page, (self.pages.get(page) or 0) + 1)
            if before is not None and before[1] != span[1]:
                self.timers.delete_event_time_timer(before[1] + GAP_MS)
            self.timers.register_event_time_timer(span[1] + GAP_MS)
        return pd.DataFrame(closed, columns=SCHEMA_COLUMNS)

    def on_timer(self, user, timestamp, ctx) -> dict:
        return self.end_session(user)

    def end_session(self, user) -> dict:
        start, last = self.span.value()
        row = {
            "user": user,
            "start": start,
            "end": last,
            "clicks": sum(self.pages.values()),
            "pages": len(self.pages.keys()),
        }
        self.span.clear()
        self.pages.clear()
        return row


SCHEMA = "user string, start long, end long, clicks long, pages long"
SCHEMA_COLUMNS = ["user", "start", "end", "clicks", "pages"]


def sessions(clicks: DataFrame, state_dir: str) -> DataFrame:
    return apply_with_state(
        clicks, "user", Sessions, SCHEMA, checkpoint_location=state_dir, event_time="ts", watermark_delay_ms=60_000
    )


def write_clicks(directory: Path, batches: int = 4, per_batch: int = 400, seed: int = 1) -> list[pd.DataFrame]:
    """Files of clicks (user, page, ts in epoch ms), an hour of event time each."""
    rng = np.random.default_rng(seed)
    frames = [
        pd.DataFrame(
            {
                "user": rng.choice([f"user-{u}" for u in range(150)], per_batch),
                "page": rng.choice([f"/p/{p}" for p in range(10)], per_batch),
                "ts": i * 3_600_000 + np.sort(rng.integers(0, 3_600_000, per_batch)),
            }
        )
        for i in range(batches)
    ]
    return write_files(directory, frames, "clicks")


def run(spark: SparkSession, workdir: Path) -> pd.DataFrame:
    write_clicks(workdir / "clicks")
    return run_stream(spark, workdir, "clicks", "user string, page string, ts long", sessions)


def show(result: pd.DataFrame) -> None:
    print(f"{len(result)} sessions closed")
    print(result.sort_values(["user", "start"]).head(10))


if __name__ == "__main__":
    main(run, show)
