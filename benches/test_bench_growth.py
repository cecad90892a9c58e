"""Figure 4: the worst single ``put`` while a map grows from empty to the "10M" size.

Not a pytest-benchmark timing loop: each test times every insert itself. It runs inside
``benchmark.pedantic(..., rounds=1, iterations=1)`` only so that ``--benchmark-only`` keeps
it (pytest-benchmark's number for it is the total time of all runs, not a figure).

Timed: a fresh ``CopyOnWriteStateMap()`` (default capacity) receives the "10M" keys (2M
unless COWMAP_BENCH_FULL=1) in order, one ``m.put(k, 0, k)`` per key, each bracketed by
``time.perf_counter_ns()``; durations go to a preallocated ``array('q')``. Three runs; the
cyclic garbage collector is off during the runs (for both contenders) so that its pauses
are not charged to either map. The comparison is a dict growing the same way,
``d[(k, 0)] = k`` (its resize pauses are what the incremental rehash is meant to avoid).

Reported per run: the max and the top-5 spikes (position, us; peaks at least 1,000 inserts
apart). A spike is *recurring* when every run has a spike of at least that size within
+-1,000 inserts of the same position (all three within one span of 1,000): that is caused by
the map (a resize, an allocation, first touch of fresh memory); the others are machine noise
(preemption, interrupts on a shared 2-core box). Rather than only matching the top-5 lists
(under load every top-5 slot can be noise, hiding a real pause just below it), recurrence is
computed over every position: each run's durations go through a sliding max of +-500
inserts, the three are combined with an element-wise min, and the peaks of that curve are
the recurring spikes, each worth the smallest of its three occurrences.

On a loaded machine preemptions are frequent enough (one scheduler slice is ~4 ms) that some
coincide within +-1,000 inserts in all three runs and pass as recurring. So two more runs
check the peaks of the recurring curve (the 16 highest, and every other one above 0.5 ms,
at most 256): every insert within +-1,000 of one is timed with both the wall clock and
``time.thread_time_ns()`` (CPU time of this thread, which includes page faults and the
map's own work but not time spent preempted; a one-off stall such as direct reclaim under
memory pressure still counts, hence two runs). A peak is worth
``min(its recurring size, in each check run the largest CPU time of an insert near it)``.

Rows (target for each: <= 1 ms):

- "worst" = max over the 3 runs of the per-run max (noise included);
- "worst recurring" = the highest peak of the recurring curve (wall clock, the definition
  above; can still include coinciding preemptions);
- "worst recurring, CPU-checked" = the highest checked peak value. If an unchecked peak
  is higher (only when more than 256 peaks exceed 0.5 ms) it is a lower bound, and the
  verdict says "inconclusive" unless the bound already misses the target.
"""

from __future__ import annotations

import gc
import statistics
import time
from array import array

import numpy as np
import pytest

from cowmap import CopyOnWriteStateMap

from benchlib import BIG_LABEL, NS

RUNS = 3
TOP = 5
CHECKED = 16
CHECK_ABOVE_NS = 500_000
CHECK_MAX = 256
CHECK_RUNS = 2
SEP = 1_000
GROUP = f"4. grow 0 -> {BIG_LABEL}, every put timed, 3+2 runs (total time, not a figure)"


# ------------------------------------------------------------------------- timed growth


def _grow_cowmap(keys, wall):
    m = CopyOnWriteStateMap()
    put, pc, ns = m.put, time.perf_counter_ns, NS
    for i, k in enumerate(keys):
        t0 = pc()
        put(k, ns, k)
        wall[i] = pc() - t0
    assert len(m) == len(keys)


def _grow_dict(keys, wall):
    d = {}
    pc, ns = time.perf_counter_ns, NS
    for i, k in enumerate(keys):
        t0 = pc()
        d[(k, ns)] = k
        wall[i] = pc() - t0
    assert len(d) == len(keys)


def _grow_cowmap_checked(keys, mask, wall, cpu):
    """Grow the same way; inserts where ``mask`` is set are timed by wall clock and CPU time."""
    m = CopyOnWriteStateMap()
    put, pc, tt, ns = m.put, time.perf_counter_ns, time.thread_time_ns, NS
    for i, k in enumerate(keys):
        if mask[i]:
            c0 = tt()
            t0 = pc()
            put(k, ns, k)
            t1 = pc()
            cpu[i] = tt() - c0
            wall[i] = t1 - t0
        else:
            put(k, ns, k)
    assert len(m) == len(keys)


def _grow_dict_checked(keys, mask, wall, cpu):
    d = {}
    pc, tt, ns = time.perf_counter_ns, time.thread_time_ns, NS
    for i, k in enumerate(keys):
        if mask[i]:
            c0 = tt()
            t0 = pc()
            d[(k, ns)] = k
            t1 = pc()
            cpu[i] = tt() - c0
            wall[i] = t1 - t0
        else:
            d[(k, ns)] = k
    assert len(d) == len(keys)


# ------------------------------------------------------------------------------ analysis


def top_spikes(dt: np.ndarray, k: int = TOP, sep: int = SEP) -> list[tuple[int, int]]:
    """The k largest durations more than ``sep`` positions apart, as (position, ns), largest first.

    Works on the max of each block of ``sep`` positions, so a wide plateau (the recurring
    curve has one of width ~1,000 per spike) costs a few candidates, not thousands.
    """
    nblocks = -(-len(dt) // sep)
    blocks = np.pad(dt, (0, nblocks * sep - len(dt))).reshape(nblocks, sep)
    bpos = blocks.argmax(axis=1) + np.arange(nblocks) * sep
    bmax = blocks.max(axis=1)
    chosen: list[int] = []
    for b in np.argsort(bmax, kind="stable")[::-1].tolist():
        pos = int(bpos[b])
        if all(abs(pos - j) > sep for j in chosen):
            chosen.append(pos)
            if len(chosen) == k:
                break
    return [(i, int(dt[i])) for i in chosen]


def sliding_max(x: np.ndarray, half: int) -> np.ndarray:
    """``out[i] = max(x[i - half : i + half + 1])`` (clipped at the ends), by doubling."""
    length = 2 * half + 1
    m = np.pad(x, (half, half), constant_values=0)  # durations are >= 0
    k = 1
    while 2 * k <= length:
        m = np.maximum(m[:-k], m[k:])  # now m[i] = max(padded[i : i + 2k])
        k *= 2
    return np.maximum(m[: len(x)], m[length - k : length - k + len(x)])


def analyse(runs: list[np.ndarray]) -> dict:
    """Per-run spikes, the recurring curve and its peaks; all durations in ns."""
    windowed = [sliding_max(dt, SEP // 2) for dt in runs]
    curve = np.minimum.reduce(windowed)
    peaks = top_spikes(curve, k=CHECK_MAX + 1)
    n_check = max(CHECKED, sum(1 for _, v in peaks[:CHECK_MAX] if v >= CHECK_ABOVE_NS))
    peaks, unchecked = peaks[:n_check], peaks[n_check:]
    return {
        "spikes": [top_spikes(dt) for dt in runs],
        "peaks": [(pos, [int(w[pos]) for w in windowed], value) for pos, value in peaks],
        "worst_ns": max(int(dt.max()) for dt in runs),
        "worst_recurring_ns": int(curve.max()),
        "unchecked_ns": unchecked[0][1] if unchecked else 0,  # highest peak not CPU-checked
        "median_ns": statistics.median(float(np.median(dt)) for dt in runs),
    }


def check_peaks(peaks, checks: list[tuple[np.ndarray, np.ndarray]]) -> list[tuple[int, int, list, list]]:
    """(position, recurring ns, [max wall ns], [max CPU ns]) near each peak, one item per check run."""
    out = []
    for pos, _, value in peaks:
        lo, hi = max(0, pos - SEP), pos + SEP + 1
        out.append((pos, value, [int(w[lo:hi].max()) for w, _ in checks],
                    [int(c[lo:hi].max()) for _, c in checks]))
    return out


# --------------------------------------------------------------------------------- tests


def _run(benchmark, figures, big, name, grow, grow_checked):
    keys = big.keys_list
    n = len(keys)
    runs: list[np.ndarray] = []
    checked: dict = {}

    def all_runs():
        gc_was_enabled = gc.isenabled()
        gc.disable()
        try:
            for _ in range(RUNS):
                wall = array("q", bytes(8 * n))
                grow(keys, wall)
                runs.append(np.frombuffer(wall, dtype=np.int64))
                gc.collect()  # between runs, outside any timing
            checked["analysis"] = a = analyse(runs)
            mask = bytearray(n)
            for pos, _, _ in a["peaks"]:
                lo, hi = max(0, pos - SEP), min(n, pos + SEP + 1)
                mask[lo:hi] = b"\x01" * (hi - lo)
            checks = []
            for _ in range(CHECK_RUNS):
                wall, cpu = array("q", bytes(8 * n)), array("q", bytes(8 * n))
                grow_checked(keys, mask, wall, cpu)
                checks.append((np.frombuffer(wall, dtype=np.int64), np.frombuffer(cpu, dtype=np.int64)))
                gc.collect()
            checked["peaks"] = check_peaks(a["peaks"], checks)
        finally:
            if gc_was_enabled:
                gc.enable()

    benchmark.pedantic(all_runs, rounds=1, iterations=1)
    a, peaks = checked["analysis"], checked["peaks"]
    confirmed = max((min(value, *cpus) for _, value, _, cpus in peaks), default=0)
    figures.record(f"growth.worst.{name}", a["worst_ns"] / 1e6)
    figures.record(f"growth.recurring.{name}", a["worst_recurring_ns"] / 1e6)
    figures.record(f"growth.recurring_cpu.{name}", confirmed / 1e6)
    if confirmed < a["unchecked_ns"]:
        figures.caveat(f"growth.recurring_cpu.{name}", a["unchecked_ns"] / 1e6,
                       f"{name}: lower bound, an unchecked recurring peak is {a['unchecked_ns'] / 1e3:,.0f} us")

    figures.detail(f"fig 4 {name}: median put while growing {a['median_ns']:.0f} ns")
    for r, (dt, sp) in enumerate(zip(runs, a["spikes"]), 1):
        shown = ", ".join(f"{p:,}: {v / 1e3:,.0f} us" for p, v in sp)
        figures.detail(f"fig 4 {name} run {r}: max {dt.max() / 1e3:,.0f} us; top-5 spikes at {shown}")
    rec = "; ".join(f"~{p:,}: {v / 1e3:,.0f} us ({'/'.join(f'{x / 1e3:,.0f}' for x in per_run)})"
                    for p, per_run, v in a["peaks"][:TOP])
    figures.detail(f"fig 4 {name}: top recurring spikes, position: size (each run's max within +-500): {rec}")
    by_checked = sorted(peaks, key=lambda pk: min(pk[1], *pk[3]), reverse=True)
    chk = "; ".join(f"~{p:,}: {v / 1e3:,.0f} us -> wall {'/'.join(f'{x / 1e3:,.0f}' for x in ws)}, "
                    f"CPU {'/'.join(f'{x / 1e3:,.0f}' for x in cs)} us"
                    for p, v, ws, cs in by_checked[:6])
    figures.detail(f"fig 4 {name}: CPU check of the {len(peaks)} highest recurring peaks, "
                   f"highest checked value first (recurring -> check runs): {chk}")


@pytest.mark.benchmark(group=GROUP)
def test_growth_cowmap(benchmark, figures, big):
    _run(benchmark, figures, big, "cowmap", _grow_cowmap, _grow_cowmap_checked)


@pytest.mark.benchmark(group=GROUP)
def test_growth_dict(benchmark, figures, big):
    _run(benchmark, figures, big, "dict", _grow_dict, _grow_dict_checked)
