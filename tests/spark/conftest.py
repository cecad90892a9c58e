"""One local SparkSession for the Spark tests: ``local[2,4]``, so a failed task is retried."""

from __future__ import annotations

import os

import pytest


@pytest.fixture(scope="session")
def spark():
    pytest.importorskip("pyspark", reason="pyspark is in the test extra: pip install '.[test]'")
    import processors
    from pyspark import cloudpickle
    from pyspark.sql import SparkSession

    # the processors travel to the Python workers by value, as a notebook's or a script's would
    cloudpickle.register_pickle_by_value(processors)
    # a sanitizer build's LD_PRELOAD (docs/architecture.md) is for this Python, not for Spark's JVM
    preload = os.environ.pop("LD_PRELOAD", None)
    try:
        s = (
            SparkSession.builder.master("local[2,4]")
            .appName("cowmap-tests")
            .config("spark.ui.enabled", "false")
            .config("spark.sql.shuffle.partitions", "2")
            .config("spark.sql.streaming.noDataMicroBatches.enabled", "false")
            .getOrCreate()
        )
    finally:
        if preload is not None:
            os.environ["LD_PRELOAD"] = preload
    s.sparkContext.setLogLevel("ERROR")
    yield s
    s.stop()
