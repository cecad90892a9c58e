"""The ``checkpoint`` scenario: durable checkpoints of a big backend, against pickle.

A backend holds a ValueState of ``entries`` int keys with int values (written in random key
order) and a MapState of ``map_entries`` user entries (10 per key); the checkpoint directory
is a fresh local one. Side by side in one run, medians of ``repeats``:

- full save (``CheckpointStorage.save``) vs ``pickle.dump`` of a plain ``{int: int}`` dict of
  the ValueState's keys and values (inserted in the same random order), to the same disk; and
  the save of a backend holding the ValueState alone (the dict's data, like for like);
- restore into a fresh backend vs ``pickle.load`` of that file;
- an incremental save after 1% of the ValueState's keys and 1% of the MapState's user
  entries changed (new values; a tenth of those ValueState keys removed), against that
  round's full save: bytes and time;
- ``save_async``: records processed (ValueState read-modify-write per record) while the
  checkpoint is written, against the rate with no checkpoint, and the longest stall (the
  longest gap between two 1,000-record slices);
- an unaligned-style checkpoint's start (until ``save_async`` returns, its snapshot taken) with
  10,000 records of one key queued in an ``AsyncExecutionController``, against draining them
  first (a smaller backend of 100,000 entries).

Entries/s counts the ValueState entries only, for both sides; the MapState comes on top
of ours.
"""

from __future__ import annotations

import gc
import os
import pickle
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable
from functools import partial
from typing import Any

import numpy as np

from cowmap.checkpoint import CheckpointStorage
from cowmap.state import KeyedStateBackend, MapStateDescriptor, ValueStateDescriptor

#: (figure, target) for the report
TARGETS = {
    "save_rate": 3_000_000,
    "restore_rate": 2_000_000,
    "async_rate_ratio": 0.5,
    "async_max_stall_ms": 20.0,
    "incremental_bytes_ratio": 0.03,
    "incremental_time_ratio": 0.05,
}


def build(entries: int, map_entries: int, seed: int = 7) -> tuple[KeyedStateBackend, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    keys = rng.permutation(entries).astype(np.int64)
    values = rng.integers(0, 1 << 40, size=entries, dtype=np.int64)
    b = KeyedStateBackend()
    v = b.get_state(ValueStateDescriptor("value"))
    for i in range(0, entries, 1_000_000):
        v.update_many(keys[i : i + 1_000_000], values[i : i + 1_000_000])
    if map_entries:
        m = b.get_map_state(MapStateDescriptor("map"))
        mk = np.repeat(np.arange(map_entries // 10, dtype=np.int64), 10)
        uk = np.tile(np.arange(10, dtype=np.int64), map_entries // 10)
        for i in range(0, len(mk), 1_000_000):
            m.put_many(mk[i : i + 1_000_000], uk[i : i + 1_000_000], uk[i : i + 1_000_000] * 3)
    return b, keys, values


def change_one_percent(b: KeyedStateBackend, keys: np.ndarray, map_entries: int, seed: int) -> np.ndarray:
    """New values for 1% of the ValueState's keys (a tenth of them removed) and
    for 1% of the MapState's user entries; returns the removed keys."""
    rng = np.random.default_rng(seed)
    v = b.get_state(ValueStateDescriptor("value"))
    changed = rng.choice(keys, len(keys) // 100, replace=False)
    v.update_many(changed, changed * 5)
    removed = changed[: len(changed) // 10]
    for k in removed.tolist():
        b.set_current_key(k)
        v.clear()
    if map_entries:
        m = b.get_map_state(MapStateDescriptor("map"))
        rows = rng.choice(map_entries, map_entries // 100, replace=False)
        m.put_many(rows // 10, rows % 10, -rows)
    return removed


def _timed(fn: Callable[[], Any]) -> float:
    gc.collect()
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def _async_run(
    b: KeyedStateBackend, storage: CheckpointStorage | None, keys: list[int]
) -> tuple[float, float, float]:
    """Records/s of a read-modify-write loop over ``keys`` (with ``save_async``
    running from the start when ``storage``), the longest gap (ms) between
    two slices of 1,000 records, and the loop thread's CPU time (ms) in that
    gap (near the gap: the loop itself was slow; near 0: it waited)."""
    v = b.get_state(ValueStateDescriptor("value"))
    sck, value, update = b.set_current_key, v.value, v.update
    handle = storage.save_async(b) if storage is not None else None
    t0 = last = time.perf_counter()
    last_cpu = time.thread_time()
    stall = stall_cpu = 0.0
    done = 0
    for i in range(0, len(keys), 1000):
        for k in keys[i : i + 1000]:
            sck(k)
            update(value() + 1)
        now, cpu = time.perf_counter(), time.thread_time()
        if now - last > stall:
            stall, stall_cpu = now - last, cpu - last_cpu
        last, last_cpu = now, cpu
        done += len(keys[i : i + 1000])
        if handle is not None and handle.done():
            break
    elapsed = time.perf_counter() - t0
    if handle is not None:
        handle.result()
    return done / elapsed, stall * 1000, stall_cpu * 1000


def _queued_backend(records: int) -> tuple[KeyedStateBackend, Any]:
    """A backend whose controller has ``records`` records of one key in flight:
    the first holds the key, the rest wait behind it."""
    from cowmap.asyncstate import AsyncExecutionController

    b = KeyedStateBackend()
    v = b.get_state(ValueStateDescriptor("value", default_value=0))
    for k in range(100_000):  # some state besides the hot key
        b.set_current_key(k)
        v.update(k)
    aec = AsyncExecutionController(b, batch_size=1000, buffer_timeout_ms=0, max_in_flight_records=records + 1)

    def fn(record: tuple[str, int]) -> None:
        v.async_value().then_accept(lambda n: v.async_update(n + record[1]))

    for i in range(records):
        aec.process("hot", fn, ("hot", i))
    return b, aec


def unaligned_start(records: int = 10_000, repeats: int = 3, directory: str | None = None) -> dict[str, Any]:
    """Time until a checkpoint's snapshot is taken (``save_async`` returns) with
    ``records`` records queued behind one key: unaligned-style (the waiting
    records written with it) against draining first. Medians, ms."""
    root = tempfile.mkdtemp(prefix="cowmap-ckbench-", dir=directory)
    try:
        unaligned, drained = [], []
        for r in range(repeats):
            b, aec = _queued_backend(records)
            storage = CheckpointStorage(os.path.join(root, f"u{r}"))
            t = time.perf_counter()
            handle = storage.save_async(b, controller=aec)
            unaligned.append((time.perf_counter() - t) * 1000)
            handle.result()
            pending = len(storage.restore(KeyedStateBackend()))
            if pending != records - 1:
                raise AssertionError(f"{pending} records written with the checkpoint, expected {records - 1}")
            aec.drain()
            b, aec = _queued_backend(records)
            storage = CheckpointStorage(os.path.join(root, f"d{r}"))
            t = time.perf_counter()
            aec.drain()
            handle = storage.save_async(b)
            drained.append((time.perf_counter() - t) * 1000)
            handle.result()
        return {"records": records, "unaligned_ms": statistics.median(unaligned),
                "drain_first_ms": statistics.median(drained), "raw": {"unaligned": unaligned, "drained": drained}}
    finally:
        shutil.rmtree(root, ignore_errors=True)


def run(entries: int = 10_000_000, map_entries: int = 1_000_000, repeats: int = 3,
        directory: str | None = None, log: Callable[[str], None] = print) -> dict[str, Any]:
    root = tempfile.mkdtemp(prefix="cowmap-ckbench-", dir=directory)
    try:
        log(f"building a backend of {entries:,} ValueState + {map_entries:,} MapState entries ...")
        b, keys, values = build(entries, map_entries)
        # the ValueState alone: the same data as the dict, for a like-for-like figure
        bv = build(entries, 0)[0] if map_entries else b
        plain = dict(zip(keys.tolist(), values.tolist()))
        pk = os.path.join(root, "plain.pkl")
        saves, dumps, restores, loads, sizes, vsaves, vrestores = [], [], [], [], [], [], []
        incs, inc_sizes = [], []
        for r in range(repeats):
            d = os.path.join(root, f"ck{r}")
            storage = CheckpointStorage(d)
            saves.append(_timed(partial(storage.save, b)))
            sizes.append(sum(os.path.getsize(os.path.join(d, f)) for f in os.listdir(d)))
            vstorage = CheckpointStorage(os.path.join(root, f"v{r}"))
            vsaves.append(_timed(partial(vstorage.save, bv)))
            vfresh = KeyedStateBackend()
            vrestores.append(_timed(partial(vstorage.restore, vfresh)))
            del vfresh
            shutil.rmtree(os.path.join(root, f"v{r}"))

            def dump(plain: dict[int, int] = plain) -> None:
                with open(pk, "wb") as f:
                    pickle.dump(plain, f, protocol=5)

            dumps.append(_timed(dump))
            fresh = KeyedStateBackend()
            restores.append(_timed(partial(storage.restore, fresh)))
            if fresh.num_entries() != b.num_entries():
                raise AssertionError(f"restored {fresh.num_entries()} entries of {b.num_entries()}")
            del fresh

            def load() -> None:
                with open(pk, "rb") as f:
                    pickle.load(f)

            loads.append(_timed(load))
            removed = change_one_percent(b, keys, map_entries, seed=r)
            before = set(os.listdir(d))
            incs.append(_timed(partial(storage.save, b)))
            if storage.manifest(storage.checkpoints()[-1])["type"] != "incremental":
                raise AssertionError("the save after a 1% change was not incremental")
            b.get_state(ValueStateDescriptor("value")).update_many(removed, removed)  # every key again
            inc_sizes.append(sum(os.path.getsize(os.path.join(d, f)) for f in set(os.listdir(d)) - before))
            shutil.rmtree(d)
            log(f"  round {r + 1}: save {saves[-1]:.2f}s, ValueState alone {vsaves[-1]:.2f}s (pickle.dump "
                f"{dumps[-1]:.2f}s); restore {restores[-1]:.2f}s, ValueState alone {vrestores[-1]:.2f}s "
                f"(pickle.load {loads[-1]:.2f}s); incremental after 1% changed {incs[-1] * 1000:.0f} ms, "
                f"{inc_sizes[-1]:,} bytes")
        del plain, bv
        loop_keys = keys[: min(entries, 2_000_000)].tolist()
        # whatever garbage the setup left goes now, not in a collection inside the timed loop; and
        # the 2,000,000-key list leaves the young generation, whose next collection (set off by the
        # writer thread's allocations) would otherwise walk it inside the loop: a 44 ms stall of
        # the loop's own making
        gc.collect()
        base_rates, async_rates, stalls, stall_cpus, alone_stalls = [], [], [], [], []
        for r in range(repeats):
            # the loop alone over as many records: its own longest stall (scheduling, the machine's
            # other load) is the floor the stall with a save running is read against
            base_rate, alone_stall, _ = _async_run(b, None, loop_keys)
            base_rates.append(base_rate)
            alone_stalls.append(alone_stall)
            storage = CheckpointStorage(os.path.join(root, f"async{r}"))
            rate, stall, stall_cpu = _async_run(b, storage, loop_keys)
            async_rates.append(rate)
            stalls.append(stall)
            stall_cpus.append(stall_cpu)
            log(f"  async round {r + 1}: {rate:,.0f} rec/s while saving vs {base_rates[-1]:,.0f} without, "
                f"longest stall {stall:.1f} ms (the loop on a CPU {stall_cpu:.1f} ms of it; the loop alone: "
                f"{alone_stall:.1f} ms)")
        log(f"unaligned-style checkpoint start with 10,000 records behind one key, {repeats} rounds ...")
        start = unaligned_start(10_000, repeats, directory)
        med = statistics.median
        res = {
            "unaligned": start,
            "entries": entries,
            "map_entries": map_entries,
            "save_s": med(saves),
            "pickle_dump_s": med(dumps),
            "restore_s": med(restores),
            "pickle_load_s": med(loads),
            "save_rate": entries / med(saves),
            "restore_rate": entries / med(restores),
            "value_save_s": med(vsaves),
            "value_restore_s": med(vrestores),
            "checkpoint_bytes": med(sizes),
            "pickle_bytes": os.path.getsize(pk),
            "async_rate": med(async_rates),
            "base_rate": med(base_rates),
            "async_rate_ratio": med(async_rates) / med(base_rates),
            "async_max_stall_ms": max(stalls),
            "alone_max_stall_ms": max(alone_stalls),
            "incremental_s": med(incs),
            "incremental_bytes": med(inc_sizes),
            # per round, against that round's full save
            "incremental_time_ratio": med(i / s for i, s in zip(incs, saves)),
            "incremental_bytes_ratio": med(i / s for i, s in zip(inc_sizes, sizes)),
            "raw": {"save": saves, "dump": dumps, "restore": restores, "load": loads,
                    "value_save": vsaves, "value_restore": vrestores,
                    "async": async_rates, "base": base_rates, "stalls": stalls, "stall_cpu": stall_cpus,
                    "alone_stalls": alone_stalls,
                    "incremental": incs, "incremental_bytes": inc_sizes},
        }
        return res
    finally:
        shutil.rmtree(root, ignore_errors=True)


def report(res: dict[str, Any]) -> list[str]:
    def met(ok: bool) -> str:
        return "met" if ok else "NOT met"

    lines = [
        f"checkpoint: {res['entries']:,} ValueState entries + {res['map_entries']:,} MapState entries, local disk",
        f"  full save   {res['save_s']:.2f} s = {res['save_rate']:,.0f} entries/s "
        f"(target >= {TARGETS['save_rate']:,}: {met(res['save_rate'] >= TARGETS['save_rate'])}); "
        f"pickle.dump {res['pickle_dump_s']:.2f} s -> {res['pickle_dump_s'] / res['save_s']:.2f}x "
        f"({met(res['save_s'] < res['pickle_dump_s'])})",
        f"  restore     {res['restore_s']:.2f} s = {res['restore_rate']:,.0f} entries/s "
        f"(target >= {TARGETS['restore_rate']:,}: {met(res['restore_rate'] >= TARGETS['restore_rate'])}); "
        f"pickle.load {res['pickle_load_s']:.2f} s -> {res['pickle_load_s'] / res['restore_s']:.2f}x "
        f"({met(res['restore_s'] < res['pickle_load_s'])})",
        f"  ValueState alone (the dict's data): save {res['value_save_s']:.2f} s -> "
        f"{res['pickle_dump_s'] / res['value_save_s']:.2f}x pickle.dump "
        f"({met(res['value_save_s'] < res['pickle_dump_s'])}); restore {res['value_restore_s']:.2f} s -> "
        f"{res['pickle_load_s'] / res['value_restore_s']:.2f}x pickle.load "
        f"({met(res['value_restore_s'] < res['pickle_load_s'])})",
        f"  size        {res['checkpoint_bytes']:,} bytes (pickle of the dict: {res['pickle_bytes']:,})",
        f"  incremental after 1% changed: {res['incremental_s'] * 1000:.0f} ms, {res['incremental_bytes']:,} bytes "
        f"= {res['incremental_time_ratio']:.1%} of the full save's time (target <= 5%: "
        f"{met(res['incremental_time_ratio'] <= TARGETS['incremental_time_ratio'])}), "
        f"{res['incremental_bytes_ratio']:.1%} of its bytes (target <= 3%: "
        f"{met(res['incremental_bytes_ratio'] <= TARGETS['incremental_bytes_ratio'])})",
        f"  unaligned   start {res['unaligned']['unaligned_ms']:.1f} ms with {res['unaligned']['records']:,} records "
        f"behind one key (target <= 10 ms: {met(res['unaligned']['unaligned_ms'] <= 10)}); draining first "
        f"{res['unaligned']['drain_first_ms']:.1f} ms",
        f"  save_async  {res['async_rate']:,.0f} rec/s vs {res['base_rate']:,.0f} without = "
        f"{res['async_rate_ratio']:.2f} ({met(res['async_rate_ratio'] >= TARGETS['async_rate_ratio'])}); "
        f"longest stall {res['async_max_stall_ms']:.1f} ms "
        f"({met(res['async_max_stall_ms'] <= TARGETS['async_max_stall_ms'])}; the loop alone "
        f"{res['alone_max_stall_ms']:.1f} ms)",
    ]
    return lines


def plot(res: dict[str, Any], path: str) -> str | None:
    """Three panels: save and restore against pickle of a dict, the incremental save against the
    full one, and records/s while ``save_async`` writes; None, or why not."""
    from cowmap.bench.report import NO_MATPLOTLIB, pyplot

    plt = pyplot()
    if plt is None:
        return NO_MATPLOTLIB
    fig, axes = plt.subplots(1, 3, figsize=(13, 4), gridspec_kw={"width_ratios": [2, 1, 1]})
    ax = axes[0]
    sides = [("cowmap, whole backend", "save_s", "restore_s", "tab:blue"),
             ("cowmap, ValueState alone", "value_save_s", "value_restore_s", "tab:cyan"),
             ("pickle of a dict (ValueState's data)", "pickle_dump_s", "pickle_load_s", "tab:gray")]
    for j, (label, save, restore, color) in enumerate(sides):
        xs = [j * 0.27 - 0.27, 1 + j * 0.27 - 0.27]
        vals = [res[save], res[restore]]
        ax.bar(xs, vals, width=0.27, label=label, color=color)
        for x, v in zip(xs, vals):
            ax.annotate(f"{v:.2f}", (x, v), xytext=(0, 2), textcoords="offset points", ha="center", fontsize=8)
    ax.set_xticks([0, 1], ["save (pickle: dump)", "restore (pickle: load)"])
    ax.set_ylabel("seconds (median)")
    ax.set_title(f"{res['entries']:,} ValueState + {res['map_entries']:,} MapState entries", fontsize=9)
    ax.legend(fontsize=8)
    ax = axes[1]
    vals = [res["save_s"] * 1000, res["incremental_s"] * 1000]
    ax.bar([0, 1], vals, color=["tab:blue", "tab:green"])
    for x, v in enumerate(vals):
        ax.annotate(f"{v:,.0f} ms", (x, v), xytext=(0, 2), textcoords="offset points", ha="center", fontsize=8)
    ax.set_xticks([0, 1], ["full save", "incremental,\n1% changed"])
    ax.set_ylabel("ms (median)")
    ax.set_title(f"incremental: {res['incremental_time_ratio']:.1%} of the time, "
                 f"{res['incremental_bytes_ratio']:.1%} of the bytes", fontsize=9)
    ax = axes[2]
    vals = [res["base_rate"], res["async_rate"]]
    ax.bar([0, 1], vals, color=["tab:gray", "tab:blue"])
    for x, v in enumerate(vals):
        ax.annotate(f"{v:,.0f}", (x, v), xytext=(0, 2), textcoords="offset points", ha="center", fontsize=8)
    ax.set_xticks([0, 1], ["no checkpoint", "save_async\nwriting"])
    ax.set_ylabel("records/s (read-modify-write)")
    ax.yaxis.set_major_formatter(lambda v, _: f"{v:,.0f}")
    ax.set_title(f"longest stall {res['async_max_stall_ms']:.1f} ms", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return None
