"""Streaming dedup with TTL: each user's first click within an hour, over a stream of files.

    python examples/streaming_dedup.py

The state is one flag per user that expires an hour (of micro-batch time) after
it was set; the whole batch is checked and marked in two columnar calls.
"""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import pandas as pd
from file_stream import main, run_stream, write_files
from pyspark.sql import DataFrame, SparkSession

from cowmap import StateTtlConfig, ValueStateDescriptor
from cowmap.spark import apply_with_state


class FirstClickPerHour:
    def open(self, ctx):
        seen = ValueStateDescriptor("seen")
        seen.enable_time_to_live(StateTtlConfig.new_builder(timedelta(hours=1)).build())
        self.seen = ctx.get_state(seen)

    def process(self, batch: pd.DataFrame, ctx) -> pd.DataFrame:
        first = batch.drop_duplicates("user")
        new = first[[v is None for v in self.seen.get_many(first["user"])]]
        self.seen.update_many(new["user"], [True] * len(new))
        return new


def first_clicks(clicks: DataFrame, state_dir: str) -> DataFrame:
    return apply_with_state(clicks, "user", FirstClickPerHour, clicks.schema, checkpoint_location=state_dir)


def write_clicks(directory: Path, batches: int = 3, per_batch: int = 1_000) -> list[pd.DataFrame]:
    """Files of clicks (user, url), one per micro-batch."""
    frames = [
        pd.DataFrame(
            {
                "user": [f"user-{(i * 7919 + j * 104729) % 2_000}" for j in range(per_batch)],
                "url": [f"/page/{j % 17}" for j in range(per_batch)],
            }
        )
        for i in range(batches)
    ]
    return write_files(directory, frames, "clicks")


def run(spark: SparkSession, workdir: Path) -> pd.DataFrame:
    """Stream the files through the dedup into a parquet sink; the sink's rows."""
    write_clicks(workdir / "clicks")
    return run_stream(spark, workdir, "clicks", "user string, url string", first_clicks)


def show(result: pd.DataFrame) -> None:
    print(f"{len(result)} first clicks of {result['user'].nunique()} users")
    print(result.head())


if __name__ == "__main__":
    main(run, show)
