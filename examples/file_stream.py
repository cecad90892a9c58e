"""What the examples share: input files to stream, and a run of a stateful query over them.

Not an example itself: it stands in for the source and sink a real pipeline
has (Kafka, a table), so that each example runs anywhere in a few seconds.
"""

from __future__ import annotations

import os
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import pandas as pd
from pyspark.sql import DataFrame, SparkSession


def write_files(directory: Path, frames: list[pd.DataFrame], name: str) -> list[pd.DataFrame]:
    """One parquet file per frame, to be read one per micro-batch in this order."""
    directory.mkdir(parents=True, exist_ok=True)
    start = time.time()
    for i, frame in enumerate(frames):
        path = directory / f"{name}-{i:03d}.parquet"
        frame.to_parquet(path, index=False)
        os.utime(path, (start + i, start + i))  # a file stream reads files in the order of their times
    return frames


def run_stream(
    spark: SparkSession, workdir: Path, source: str, schema: str, query: Callable[[DataFrame, str], DataFrame]
) -> pd.DataFrame:
    """Stream ``workdir/source``'s files (one per micro-batch) through
    ``query(stream, state_dir)`` into a parquet sink; the sink's rows."""
    stream = spark.readStream.schema(schema).option("maxFilesPerTrigger", 1).parquet(str(workdir / source))
    out = query(stream, str(workdir / "state"))
    running = (
        out.writeStream.format("parquet")
        .option("path", str(workdir / "out"))
        .option("checkpointLocation", str(workdir / "spark-checkpoint"))
        .trigger(availableNow=True)
        .start()
    )
    running.awaitTermination()
    return spark.read.parquet(str(workdir / "out")).toPandas()


def main(run: Callable[[SparkSession, Path], pd.DataFrame], show: Callable[[pd.DataFrame], None]) -> None:
    """Run an example on a local SparkSession in a temporary directory and show its output."""
    spark = SparkSession.builder.master("local[2]").config("spark.sql.shuffle.partitions", "2").getOrCreate()
    try:
        with tempfile.TemporaryDirectory() as tmp:
            show(run(spark, Path(tmp)))
    finally:
        spark.stop()
