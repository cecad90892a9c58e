"""Run by test_local_cluster.py in a process of its own (one SparkContext per
process): counts per key over three batch runs at 2, 3 and 2 partitions on a
``local-cluster`` (executors in JVMs of their own, each with its Python
workers), printed as JSON lines ``[key, count]``."""

from __future__ import annotations

import json
import os
import sys

import pandas as pd
import pyspark

os.environ.setdefault("SPARK_HOME", os.path.dirname(pyspark.__file__))  # the pip install's bin/ and jars/
os.environ.pop("LD_PRELOAD", None)  # (a sanitizer build's is for the test's Python, not for the JVMs)

from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from cowmap import ValueStateDescriptor
from cowmap.spark import apply_with_state


class Count:
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


def main(state_dir: str) -> None:
    spark = (
        SparkSession.builder.master("local-cluster[2,1,1024]")
        .config("spark.ui.enabled", "false")
        .config("spark.executor.memory", "512m")
        .getOrCreate()
    )
    try:
        df = spark.range(3_000).withColumn("k", (F.col("id") * 7919) % 101)
        for parts in (2, 3, 2):
            out = apply_with_state(
                df, "k", Count, "k long, n long", checkpoint_location=state_dir, num_partitions=parts
            )
            for row in out.collect():
                print(json.dumps([row.k, row.n]))
    finally:
        spark.stop()


if __name__ == "__main__":
    main(sys.argv[1])
