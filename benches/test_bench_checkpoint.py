"""Figures 20-24: durable checkpoints of a backend, against pickle of a plain dict.

A backend of int keys and int values in a ValueState (``N_BIG``: 2M by default, 10M with
``COWMAP_BENCH_FULL=1``) plus a MapState of a tenth as many user entries, checkpointed to a
fresh local directory; the same keys and values as a plain ``{int: int}`` dict (inserted in
the same random order) go through ``pickle.dump``/``pickle.load`` to the same disk in the same
round. Entries/s count the ValueState's entries on both sides. The setup is
``cowmap.bench.checkpoint``'s, which ``python -m cowmap.bench checkpoint`` runs at full size.

20. Full save vs ``pickle.dump`` of the dict.
21. Restore into a fresh backend vs ``pickle.load`` of that file.
22. ``save_async``: records/s of a read-modify-write loop while the checkpoint is written,
    against the same loop with no checkpoint, and the longest gap between 1,000-record slices.
23. An unaligned-style checkpoint's start with 10,000 records queued behind one key.
24. An incremental save after 1% of the ValueState's keys and of the MapState's user entries
    changed (a tenth of those keys removed), against the full save before it: time and bytes.
"""

from __future__ import annotations

import os
import pickle
import shutil
import time

import pytest

from cowmap.bench import checkpoint
from cowmap.checkpoint import CheckpointStorage
from cowmap.state import KeyedStateBackend, ValueStateDescriptor

from benchlib import N_BIG

ROUNDS = 3


@pytest.fixture(scope="module")
def big_backend():
    b, keys, values = checkpoint.build(N_BIG, N_BIG // 10)
    yield b, keys, dict(zip(keys.tolist(), values.tolist()))
    del b


def _pickle_round(plain: dict, path: str) -> tuple[float, float]:
    t = time.perf_counter()
    with open(path, "wb") as f:
        pickle.dump(plain, f, protocol=5)
    dump = time.perf_counter() - t
    t = time.perf_counter()
    with open(path, "rb") as f:
        pickle.load(f)
    return dump, time.perf_counter() - t


@pytest.mark.benchmark(group="checkpoint")
def test_save_and_restore(benchmark, figures, big_backend, tmp_path):
    b, _, plain = big_backend
    dumps, loads, restores = [], [], []
    dirs = iter(range(1_000))

    def save():
        d = tmp_path / f"ck{next(dirs)}"
        CheckpointStorage(d).save(b)
        return d

    def setup():
        # the dict's round alternates with ours, so drifting load hits both
        dump, load = _pickle_round(plain, str(tmp_path / "plain.pkl"))
        dumps.append(dump)
        loads.append(load)
        return (), {}

    benchmark.pedantic(save, setup=setup, rounds=ROUNDS, warmup_rounds=0, iterations=1)
    figures.record_median("checkpoint.save", benchmark, N_BIG)
    figures.record("checkpoint.pickle_dump", sorted(dumps)[len(dumps) // 2] * 1e9 / N_BIG)
    figures.record("checkpoint.pickle_load", sorted(loads)[len(loads) // 2] * 1e9 / N_BIG)
    d = tmp_path / "ck0"
    for _ in range(ROUNDS):
        fresh = KeyedStateBackend()
        t = time.perf_counter()
        CheckpointStorage(d).restore(fresh)
        restores.append(time.perf_counter() - t)
        assert fresh.num_entries() == b.num_entries()
        del fresh
    figures.record("checkpoint.restore", sorted(restores)[len(restores) // 2] * 1e9 / N_BIG)
    for p in tmp_path.iterdir():
        shutil.rmtree(p) if p.is_dir() else os.remove(p)


@pytest.mark.benchmark(group="checkpoint")
def test_save_async_keeps_records_flowing(benchmark, figures, big_backend, tmp_path):
    b, keys, _ = big_backend
    loop_keys = keys[: min(len(keys), 2_000_000)].tolist()
    base, rates, stalls = [], [], []
    dirs = iter(range(1_000))

    def run():
        base.append(checkpoint._async_run(b, None, loop_keys[:200_000])[0])
        rate, stall, _ = checkpoint._async_run(b, CheckpointStorage(tmp_path / f"a{next(dirs)}"), loop_keys)
        rates.append(rate)
        stalls.append(stall)

    benchmark.pedantic(run, rounds=ROUNDS, warmup_rounds=0, iterations=1)
    med = sorted(rates)[len(rates) // 2]
    figures.record("checkpoint.async_rate", 1e9 / med)
    figures.record("checkpoint.base_rate", 1e9 / sorted(base)[len(base) // 2])
    figures.record("checkpoint.async_stall", max(stalls))
    figures.record("checkpoint.stall_limit", 20.0)


@pytest.mark.benchmark(group="checkpoint")
def test_incremental_save_after_one_percent(benchmark, figures, big_backend, tmp_path):
    b, keys, _ = big_backend
    fulls: list[float] = []
    full_mb: list[float] = []
    incs: list[dict] = []
    rounds = iter(range(1_000))

    def setup():
        r = next(rounds)
        storage = CheckpointStorage(tmp_path / f"i{r}")
        t = time.perf_counter()
        cid = storage.save(b)
        fulls.append(time.perf_counter() - t)
        full_mb.append(sum(f["size"] for f in storage.manifest(cid)["files"]) / 1e6)  # data files' names are unique
        removed = checkpoint.change_one_percent(b, keys, N_BIG // 10, seed=r)
        return (storage, removed), {}

    def incremental(storage, removed):
        cid = storage.save(b)
        incs.append(storage.manifest(cid))
        b.get_state(ValueStateDescriptor("value")).update_many(removed, removed)  # every key again

    benchmark.pedantic(incremental, setup=setup, rounds=ROUNDS, warmup_rounds=0, iterations=1)
    assert all(m["type"] == "incremental" for m in incs)
    inc_mb = [m["files"][-1]["size"] / 1e6 for m in incs]
    figures.record_median("checkpoint.incremental", benchmark, 1, scale=1e3)
    figures.record("checkpoint.incremental_full", sorted(fulls)[len(fulls) // 2] * 1e3)
    figures.record("checkpoint.incremental_mb", sorted(inc_mb)[len(inc_mb) // 2])
    figures.record("checkpoint.incremental_full_mb", sorted(full_mb)[len(full_mb) // 2])
    for p in tmp_path.iterdir():
        shutil.rmtree(p)


@pytest.mark.benchmark(group="checkpoint")
def test_unaligned_checkpoint_start(benchmark, figures):
    """23. With 10,000 records of one key queued in an AsyncExecutionController, the time
    until an unaligned-style ``save_async`` has its snapshot, against draining first."""
    res = benchmark.pedantic(checkpoint.unaligned_start, args=(10_000, ROUNDS), rounds=1, iterations=1)
    figures.record("checkpoint.unaligned", res["unaligned_ms"])
    figures.record("checkpoint.drain_first", res["drain_first_ms"])
