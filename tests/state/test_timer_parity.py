"""Parity of cowmap's timer services with Apache Flink 2.3.0's ``InternalTimerServiceImpl``.

Traces of timer operations (tests/flink_parity/timer_trace.py: register, delete, watermarks,
processing time, timers registering and deleting timers as they fire) run through Flink's real
timer service by a small Java program of ours (tests/flink_parity/FlinkTimerReplay.java) and
through cowmap; the firing sequences must agree, up to the order among timers of one time and
domain, which Flink leaves to its data structure (see timer_trace.py).

tests/flink_parity/timer_traces.txt holds traces with the outputs Flink gave, recorded with the
jar, and runs without it. The random traces need the jar and a JDK and skip otherwise:
``pip install apache-flink-libraries==2.3.0`` or ``COWMAP_FLINK_DIST_JAR=/path/to/flink-dist-2.3.0.jar``.
"""

from __future__ import annotations

import os
import random
import shutil

import pytest
from parity_modules import PARITY_DIR, load

tt = load("timer_trace.py")
JAR = load("trace.py").find_flink_jar()
RECORDED = tt.read_recorded(PARITY_DIR / "timer_traces.txt")


def test_recorded_traces_fire_as_flink_fired() -> None:
    assert len(RECORDED) >= 30
    fired = 0
    for trace, flink in RECORDED:
        ours = tt.run_cowmap(trace)
        assert tt.canonical(ours) == tt.canonical(flink), f"trace {trace[0]}"
        fired += sum(line.startswith("fire") for line in flink)
    assert fired > 1000  # the traces fire plenty, in-callback registrations included


def test_canonical_keeps_all_but_the_order_within_a_time() -> None:
    a = ["trace 1", "fire e 5 1 0", "fire e 5 2 0", "fire e 6 1 0", "left 0 0", "end 1"]
    b = ["trace 1", "fire e 5 2 0", "fire e 5 1 0", "fire e 6 1 0", "left 0 0", "end 1"]
    assert tt.canonical(a) == tt.canonical(b)
    c = ["trace 1", "fire e 6 1 0", "fire e 5 2 0", "fire e 5 1 0", "left 0 0", "end 1"]
    assert tt.canonical(a) != tt.canonical(c)  # timestamp order is compared
    d = ["trace 1", "fire e 5 1 0", "fire p 5 2 0", "fire e 6 1 0", "left 0 0", "end 1"]
    assert tt.canonical(a) != tt.canonical(d)  # and the domain


@pytest.mark.skipif(JAR is None or shutil.which("javac") is None,
                    reason="needs flink-dist-2.3.0.jar (apache-flink-libraries==2.3.0) and a JDK")
def test_random_traces_against_flink() -> None:
    rng = random.Random(int(os.environ.get("COWMAP_FLINK_PARITY_SEED", "20230")))
    traces = [tt.random_trace(rng, i, 120) for i in range(60)]
    lines = [x for t in traces for x in t]
    assert tt.canonical(tt.run_cowmap(lines)) == tt.canonical(tt.run_flink(lines, str(JAR)))
