"""Run by test_local_cluster.py in a process of its own (one SparkContext per
process): counts per key over three batch runs at 2, 3 and 2 partitions on a
``local-cluster`` (executors in JVMs of their own, each with its Python
workers), printed as JSON lines ``[key, count]``."""

from __future__ import annotations

import json
import os
import sys

import pyspark

os.environ.setdefault("SPARK_HOME", os.path.dirname(pyspark.__file__))  # the pip install's bin/ and jars/
os.environ.pop("LD_PRELOAD", None)  # (a sanitizer build's is for the test's Python, not for the JVMs)

import processors
from processors import CountPerKey
from pyspark import cloudpickle
from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from cowmap.spark import apply_with_state

cloudpickle.register_pickle_by_value(processors)  # the executors' workers cannot import it


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
                df, "k", CountPerKey, "k long, n long", checkpoint_location=state_dir, num_partitions=parts
            )
            for row in out.collect():
                print(json.dumps([row.k, row.n]))
    finally:
        spark.stop()


if __name__ == "__main__":
    main(sys.argv[1])
