"""Figures 25-28: keyed timers, against a ``heapq`` + dict timer service of the same semantics.

1,000,000 event-time timers over 100,000 keys (10 per key, random timestamps), registered with
each key current as a record's processing would; the alternative takes the key as an argument.
The setup is ``cowmap.bench.timers``'s, which ``python -m cowmap.bench timers`` runs too.

25. Register, per timer. 26. Delete every timer, per timer. 27. Fire all of them with one
``advance_watermark``, per timer (a no-op ``on_timer``). 28. Memory per timer (tracemalloc),
the key objects excluded.
"""

from __future__ import annotations

import pytest

from cowmap.bench import timers

ROUNDS = 3


@pytest.fixture(scope="module")
def workload():
    return timers._workload(11)


@pytest.mark.benchmark(group="timers")
def test_register_delete_fire(benchmark, figures, workload):
    keys, times = workload
    ours, theirs = [], []

    def run():
        ours.append(timers._round(timers._Cowmap, keys, times))
        theirs.append(timers._round(timers._Heapq, keys, times))  # alternating: drifting load hits both

    benchmark.pedantic(run, rounds=ROUNDS, warmup_rounds=0, iterations=1)
    for f in ("register_ns", "delete_ns", "fire_ns"):
        figures.record(f"timers.{f}", sorted(x[f] for x in ours)[len(ours) // 2])
        figures.record(f"timers.heapq_{f}", sorted(x[f] for x in theirs)[len(theirs) // 2])
    figures.record("timers.bytes_per_timer", timers._memory(timers._Cowmap, keys, times))
    figures.record("timers.heapq_bytes_per_timer", timers._memory(timers._Heapq, keys, times))
