"""A Spark task's state handling without Spark (no TaskContext: partition 0):
warm backends kept by a worker, caught up by increments when a micro-batch
ran elsewhere, restored when they cannot be."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from unittest import mock

import numpy as np
import pandas as pd
from processors import CountPerKey

from cowmap._keygroups import spark_key_groups, spark_type_codes
from cowmap.spark import task
from cowmap.spark.layout import Location
from cowmap.spark.task import KG_BITS, ROUTE_COLUMN, Plan, run_partition


def _batch(seed: int, n: int = 200) -> pd.DataFrame:
    keys = np.random.default_rng(seed).integers(0, 40, n)
    kgs = spark_key_groups([keys], spark_type_codes(["bigint"]), 64).astype(np.int32)
    return pd.DataFrame({"k": keys, "v": keys, ROUTE_COLUMN: ((1_000 + seed) << KG_BITS) + kgs.astype(np.int64)})


def test_a_worker_a_batch_behind_catches_up_by_the_increment(tmp_path: Path) -> None:
    task._WARM.clear()
    loc = Location(str(tmp_path), "op")
    layout = loc.use(1, 64, "spark-murmur3-42:bigint")

    def plan(worker: str, batch_id: int) -> Plan:  # two Python workers: two entries of the warm cache
        return Plan(loc, layout, ["k"], ["bigint"], CountPerKey, ["k", "n"], False, batch_id, warm_key=(worker,))

    batches = [_batch(i) for i in range(4)]
    loads = mock.patch.object(task, "_load", side_effect=task._load)
    got: Counter = Counter()
    with loads as load:
        for b, worker in enumerate(["a", "b", "a", "a"]):  # batch 1 runs on worker b; a is then a batch behind
            for out in run_partition(plan(worker, b), iter([batches[b]])):
                got += Counter(zip(out["k"].tolist(), out["n"].tolist()))
    assert load.call_count == 2  # the first batch of each worker; worker a caught up, then was warm
    want: Counter = Counter()
    total: Counter = Counter()
    for b in batches:
        for k, n in b.groupby("k").size().items():
            total[k] += n
            want[(k, total[k])] += 1
    assert got == want
    task._WARM.clear()
