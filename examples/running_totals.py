"""Per-user running aggregates with the columnar API: each micro-batch's purchases
update every user's count and total in four calls, however many users it has.

    python examples/running_totals.py
"""

from __future__ import annotations

import os
import tempfile
import time
from pathlib import Path

import numpy as np
import pandas as pd
from pyspark.sql import DataFrame, SparkSession

from cowmap import ValueStateDescriptor
from cowmap.spark import apply_with_state


class RunningTotals:
    def open(self, ctx):
        self.count = ctx.get_state(ValueStateDescriptor("count"))
        self.total = ctx.get_state(ValueStateDescriptor("total"))

    def process(self, batch: pd.DataFrame, ctx) -> pd.DataFrame:
        per_user = batch.groupby("user", sort=False)["amount"].agg(["size", "sum"])
        users = per_user.index.to_numpy()
        count = self.count.get_many(users, dtype=np.int64, default=0) + per_user["size"].to_numpy()
        total = self.total.get_many(users, dtype=np.float64, default=0.0) + per_user["sum"].to_numpy()
        self.count.update_many(users, count)
        self.total.update_many(users, total)
        return pd.DataFrame({"user": users, "purchases": count, "total": total})


def running_totals(purchases: DataFrame, state_dir: str) -> DataFrame:
    return apply_with_state(
        purchases, "user", RunningTotals, "user long, purchases long, total double", checkpoint_location=state_dir
    )


def write_purchases(directory: Path, batches: int = 3, per_batch: int = 5_000, seed: int = 2) -> list[pd.DataFrame]:
    """Files of purchases (user id, amount), one per micro-batch."""
    directory.mkdir(parents=True, exist_ok=True)
    start = time.time()
    rng = np.random.default_rng(seed)
    frames = []
    for i in range(batches):
        frame = pd.DataFrame(
            {
                "user": rng.integers(0, 1_000, per_batch),
                "amount": rng.integers(1, 10_000, per_batch) / 100,
            }
        )
        path = directory / f"purchases-{i:03d}.parquet"
        frame.to_parquet(path, index=False)
        os.utime(path, (start + i, start + i))  # a file stream reads files in the order of their times
        frames.append(frame)
    return frames


def run(spark: SparkSession, workdir: Path) -> pd.DataFrame:
    write_purchases(workdir / "purchases")
    purchases = spark.readStream.schema("user long, amount double").option("maxFilesPerTrigger", 1)
    out = running_totals(purchases.parquet(str(workdir / "purchases")), str(workdir / "state"))
    query = (
        out.writeStream.format("parquet")
        .option("path", str(workdir / "out"))
        .option("checkpointLocation", str(workdir / "spark-checkpoint"))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination()
    return spark.read.parquet(str(workdir / "out")).toPandas()


if __name__ == "__main__":
    session = SparkSession.builder.master("local[2]").config("spark.sql.shuffle.partitions", "2").getOrCreate()
    with tempfile.TemporaryDirectory() as tmp:
        result = run(session, Path(tmp))
    latest = result.sort_values("purchases").groupby("user").tail(1)
    print(f"{len(latest)} users; the biggest spenders:")
    print(latest.sort_values("total", ascending=False).head())
    session.stop()
