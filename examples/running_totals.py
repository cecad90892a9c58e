"""Per-user running aggregates with the columnar API: each micro-batch's purchases
update every user's count and total in four calls, however many users it has.

    python examples/running_totals.py
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
from file_stream import main, run_stream, write_files
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
    rng = np.random.default_rng(seed)
    frames = [
        pd.DataFrame({"user": rng.integers(0, 1_000, per_batch), "amount": rng.integers(1, 10_000, per_batch) / 100})
        for _ in range(batches)
    ]
    return write_files(directory, frames, "purchases")


def run(spark: SparkSession, workdir: Path) -> pd.DataFrame:
    write_purchases(workdir / "purchases")
    return run_stream(spark, workdir, "purchases", "user long, amount double", running_totals)


def show(result: pd.DataFrame) -> None:
    latest = result.sort_values("purchases").groupby("user").tail(1)
    print(f"{len(latest)} users; the biggest spenders:")
    print(latest.sort_values("total", ascending=False).head())


if __name__ == "__main__":
    main(run, show)
