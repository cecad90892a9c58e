"""The ``snapshot`` scenario: snapshot start and write time vs state size, with updates running.

One ``KeyedStateBackend`` per size with one TTL ValueState (default cleanup) of ``n`` int keys.
Per size: ``snapshot()`` start (median of 5, each released at once); the snapshot written out
(``entries()`` pickled in chunks into memory) alone, then again from a second thread while the
main thread keeps updating random keys (read-modify-write, as in the ``ttl`` scenario; the two
threads share the GIL, so this is wall time with the updater taking its share); and the
updates' ns/record right after ``snapshot()`` with the snapshot held (first writes copy) vs with
no snapshot live: the price of copy-on-write.
"""

from __future__ import annotations

import io
import pickle
import statistics
import threading
import time
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import numpy as np

from cowmap.state import KeyedStateBackend, KeyedStateSnapshot, StateTtlConfig, ValueStateDescriptor

CHUNK = 1000


def _write(snap: KeyedStateSnapshot, out: io.BytesIO) -> int:
    chunk, n = [], 0
    for rec in snap.entries("v"):
        chunk.append(rec[0::2])  # (key, value)
        if len(chunk) == CHUNK:
            pickle.dump(chunk, out, protocol=pickle.HIGHEST_PROTOCOL)
            n += len(chunk)
            chunk = []
    pickle.dump(chunk, out, protocol=pickle.HIGHEST_PROTOCOL)
    return n + len(chunk)


def run_snapshot(sizes: list[int], seed: int = 42, progress: Callable[[str], Any] | None = None) -> list[dict]:
    rows = []
    clock = [0]  # stands still: with a TTL of an hour nothing expires, but every access checks
    for n in sizes:
        backend = KeyedStateBackend(time_provider=lambda: clock[0])
        desc = ValueStateDescriptor("v", default_value=0)
        desc.enable_time_to_live(StateTtlConfig.new_builder(timedelta(hours=1)).build())
        state = backend.get_state(desc)
        sck, value, update = backend.set_current_key, state.value, state.update
        for k in range(n):
            sck(k)
            update(0)
        keys = np.random.default_rng([seed, n]).integers(0, n, size=200_000).tolist()

        def updates(
            stop: threading.Event | None = None,
            keys: list[int] = keys,
            sck: Callable[[Any], None] = sck,
            value: Callable[[], Any] = value,
            update: Callable[[Any], None] = update,
        ) -> tuple[int, float]:
            done, t0 = 0, time.perf_counter_ns()
            for k in keys:
                sck(k)
                update(value() + 1)
                done += 1
                if stop is not None and (done & 255) == 0 and stop.is_set():
                    break
            return done, (time.perf_counter_ns() - t0) / max(done, 1)

        updates()  # warm-up
        _, plain_ns = updates()
        starts = []
        for _ in range(5):
            t0 = time.perf_counter_ns()
            s = backend.snapshot()
            starts.append((time.perf_counter_ns() - t0) / 1e3)
            s.release()
        with backend.snapshot() as s:
            out = io.BytesIO()
            start = time.perf_counter()
            _write(s, out)
            write_alone = time.perf_counter() - start
        size_mb = out.tell() / 2**20
        with backend.snapshot():
            _, cow_ns = updates()
        with backend.snapshot() as s:
            done_evt = threading.Event()
            res: dict = {}

            def writer(s: KeyedStateSnapshot = s, res: dict = res, done_evt: threading.Event = done_evt) -> None:
                t0 = time.perf_counter()
                res["n"] = _write(s, io.BytesIO())
                res["s"] = time.perf_counter() - t0
                done_evt.set()

            th = threading.Thread(target=writer)
            th.start()
            done_total, ns_sum = 0, 0.0
            while not done_evt.is_set():
                d, ns = updates(done_evt)
                done_total += d
                ns_sum += ns * d
            th.join()
        rows.append({"entries": n, "snapshot_start_us": round(statistics.median(starts), 1),
                     "write_s": round(write_alone, 3), "write_concurrent_s": round(res["s"], 3),
                     "written_mib": round(size_mb, 2), "entries_written": res["n"],
                     "updates_during_write": done_total, "update_ns_plain": round(plain_ns, 1),
                     "update_ns_snapshot_live": round(cow_ns, 1)})
        if progress:
            progress(f"snapshot {n:,} entries")
        del backend, state, sck, value, update, desc
    return rows


def print_snapshot(rows: list[dict]) -> None:
    print(f"{'entries':>11} {'start (us)':>11} {'write (s)':>10} {'write w/ updates (s)':>21} {'MiB':>8} "
          f"{'update ns/rec':>14} {'snapshot live':>14} {'ratio':>6}")
    for r in rows:
        ratio = r["update_ns_snapshot_live"] / r["update_ns_plain"]
        print(f"{r['entries']:>11,} {r['snapshot_start_us']:>11,.1f} {r['write_s']:>10.3f} "
              f"{r['write_concurrent_s']:>21.3f} {r['written_mib']:>8.1f} {r['update_ns_plain']:>14,.0f} "
              f"{r['update_ns_snapshot_live']:>14,.0f} {ratio:>6.2f}")


def plot_snapshot(rows: list[dict], path: str) -> str | None:
    """Three panels against the state size: snapshot start, the write (alone and with updates
    running), and the updates' ns/record with and without a live snapshot; None, or why not."""
    from cowmap.bench.report import NO_MATPLOTLIB, pyplot

    plt = pyplot()
    if plt is None:
        return NO_MATPLOTLIB
    n = [r["entries"] for r in rows]
    fig, axes = plt.subplots(1, 3, figsize=(12, 3.8))
    axes[0].plot(n, [r["snapshot_start_us"] for r in rows], "o-", color="tab:blue")
    axes[0].set_ylabel("snapshot() start (us, median)")
    axes[1].plot(n, [r["write_s"] for r in rows], "o-", label="written alone")
    axes[1].plot(n, [r["write_concurrent_s"] for r in rows], "s--", label="written while updates run")
    axes[1].set_ylabel("snapshot written out (s)")
    axes[1].set_yscale("log")
    axes[1].legend(fontsize=8)
    axes[2].plot(n, [r["update_ns_plain"] for r in rows], "o-", label="no snapshot live")
    axes[2].plot(n, [r["update_ns_snapshot_live"] for r in rows], "s--", label="right after snapshot(), held")
    axes[2].set_ylabel("update ns/record")
    axes[2].set_ylim(bottom=0)
    axes[2].legend(fontsize=8)
    for ax in axes:
        ax.set_xscale("log")
        ax.set_xlabel("entries (TTL ValueState)")
        ax.grid(True, which="both", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return None
