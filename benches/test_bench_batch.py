"""Figure 2: batch ``get_many`` / ``put_many`` of int64 keys against pandas' khash.

Setup, at 1M entries and at the "10M" size (2M unless COWMAP_BENCH_FULL=1): the map built
from the keys (rehash finished); a ``pandas._libs.hashtable.Int64HashTable`` with
``map_locations(keys)``; and ``pd.Index(keys)`` with its hash engine already built.

Timed, one round = one call over all keys as an int64 numpy array in random order:

- ``m.get_many(arr, 0)`` (returns a list of the states) vs ``table.lookup(arr)`` and
  ``index.get_indexer(arr)`` (both return an int64 array of positions);
- ``m.put_many(arr, 0, states)`` on existing keys (``states`` a pre-built list) vs
  ``table.map_locations(arr)``, khash's own batch insert-or-overwrite of existing keys.

ns/key = median round time / number of keys. Targets: <= 40 ns/key at 1M, <= 100 ns/key at
10M, and no slower than khash in the same run (ratio <= 1). khash does less work than
cowmap here (no Python objects in or out), so the ratio is a demanding comparison.
"""

from __future__ import annotations

import pandas as pd
import pytest
from pandas._libs.hashtable import Int64HashTable

from benchlib import NS, build_cowmap


class BatchEnv:
    def __init__(self, ds):
        self.ds = ds
        self.m = build_cowmap(ds)
        self.table = Int64HashTable(ds.n)
        self.table.map_locations(ds.keys)
        self.index = pd.Index(ds.keys)
        self.index.get_indexer(ds.probe[:1000])  # builds the index's hash engine
        assert self.m.get_many(ds.probe[:1000], NS) == ds.probe_list[:1000]
        self.rounds = 10 if ds.n <= 2_000_000 else 5


@pytest.fixture(scope="module", params=["small", "big"])
def env(request):
    """Built once per size; pytest runs all tests of one size before building the next."""
    e = BatchEnv(request.getfixturevalue(request.param))
    yield e
    del e


def _measure(benchmark, figures, env, op, key, fn):
    benchmark.group = f"2. {op} int64 batch @{env.ds.label} (per round = all {env.ds.n:,} keys)"
    benchmark.pedantic(fn, rounds=env.rounds, warmup_rounds=1, iterations=1)
    figures.record_median(f"{key}@{env.ds.tag}", benchmark, env.ds.n)


def test_get_many_cowmap(benchmark, figures, env):
    _measure(benchmark, figures, env, "get", "get_many.cowmap",
             lambda m=env.m, arr=env.ds.probe: m.get_many(arr, NS))


def test_get_khash_lookup(benchmark, figures, env):
    _measure(benchmark, figures, env, "get", "get_many.khash",
             lambda t=env.table, arr=env.ds.probe: t.lookup(arr))


def test_get_pandas_index_get_indexer(benchmark, figures, env):
    _measure(benchmark, figures, env, "get", "get_many.index",
             lambda i=env.index, arr=env.ds.probe: i.get_indexer(arr))


def test_put_many_cowmap(benchmark, figures, env):
    _measure(benchmark, figures, env, "put", "put_many.cowmap",
             lambda m=env.m, arr=env.ds.probe, states=env.ds.probe_list: m.put_many(arr, NS, states))
    assert len(env.m) == env.ds.n


def test_put_khash_map_locations(benchmark, figures, env):
    _measure(benchmark, figures, env, "put", "put_many.khash",
             lambda t=env.table, arr=env.ds.probe: t.map_locations(arr))
    assert len(env.table) == env.ds.n
