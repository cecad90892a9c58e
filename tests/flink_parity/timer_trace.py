"""Timer parity traces: cowmap's TimerService against Flink 2.3's InternalTimerServiceImpl.

A trace is text, one operation per line (ints throughout; keys and namespaces are Flink
``IntSerializer`` ints, max parallelism 128 as in the state traces):

    trace <id>
    key <k>                 make k the current key
    reg <e|p> <ts> <ns>     register an event-time (e) or processing-time (p) timer
    del <e|p> <ts> <ns>     delete one
    wm <t>                  advance the watermark to t (increasing: Flink's operators never
                            move it back, and cowmap ignores a watermark that does)
    pt <t>                  processing time reaches t
    end

Each ``wm`` and ``pt`` is followed by a ``key``: Flink leaves the last fired timer's key
current after firing (its operators set the key of every record before running user code),
while cowmap gives the caller's key back.

Both sides print ``fire <e|p> <ts> <key> <ns>`` per timer fired, in firing order, then
``left <event timers> <processing timers>``. A firing timer reacts by :func:`react` (the same
rule in FlinkTimerReplay.java): it may register a timer of its domain for its key and namespace
(often due at once: it fires in the same advance) and delete another.

Sequences are compared after :func:`canonical` sorts each run of timers fired at the same time
of the same domain: that order is an artefact of the data structure, which Flink does not
define either (its heap backend keeps one heap over all key groups, its RocksDB backend orders
timers by their serialized key; cowmap keeps a heap per key group). Everything else must be
equal: which timers fire, at which point, and in timestamp order. A reaction registers only
later timers and touches only its own key and namespace, so the order within a run cannot
change what follows.

``python tests/flink_parity/timer_trace.py --record N`` writes N random traces with Flink's
outputs to timer_traces.txt (needs the jar, see test_timer_parity.py).
"""

from __future__ import annotations

import argparse
import os
import random
import runpy
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
MAX_PARALLELISM = 128
JAVA_MAIN = "org.apache.flink.streaming.api.operators.FlinkTimerReplay"


def react(event: bool, ts: int, key: int, ns: int) -> list[tuple[str, int]]:
    """What a firing timer does: ``("reg", ts)`` / ``("del", ts)`` for its key and namespace."""
    c = key + ts
    out = []
    if c % 3 == 0:
        out.append(("reg", ts + 1 + c % 4))
    if c % 5 == 0:
        out.append(("del", ts + 1))
    return out


def canonical(lines: list[str]) -> list[str]:
    """``lines`` with each run of consecutive ``fire`` lines of one domain and timestamp sorted."""
    out: list[str] = []
    run: list[str] = []
    for line in lines + [""]:
        t = line.split()
        if run and (len(t) < 3 or t[0] != "fire" or t[1:3] != run[0].split()[1:3]):
            out += sorted(run)
            run = []
        if t and t[0] == "fire":
            run.append(line)
        elif line:
            out.append(line)
    return out


def random_trace(rng: random.Random, tid: int, ops: int) -> list[str]:
    """A trace of ``ops`` operations: few keys, namespaces and timestamps, so timers collide,
    repeat and tie."""
    keys = rng.sample(range(-50, 5000), rng.randint(2, 24))
    span = rng.choice([8, 30, 200])
    lines = [f"trace {tid}"]
    wm = pt = -10
    for _ in range(ops):
        r = rng.random()
        if r < 0.15:
            lines.append(f"key {rng.choice(keys)}")
        elif r < 0.70:
            lines.append(f"reg {rng.choice('eep')} {rng.randint(-5, span)} {rng.randint(0, 2)}")
        elif r < 0.82:
            lines.append(f"del {rng.choice('eep')} {rng.randint(-5, span)} {rng.randint(0, 2)}")
        elif r < 0.94:
            wm += rng.randint(1, max(2, span // 4))
            lines += [f"wm {wm}", f"key {rng.choice(keys)}"]
        else:
            pt += rng.randint(1, max(2, span // 4))
            lines += [f"pt {pt}", f"key {rng.choice(keys)}"]
    if not any(line.startswith("key") for line in lines[1:2]):
        lines.insert(1, f"key {keys[0]}")
    lines.append("end")
    return lines


def run_cowmap(lines: list[str]) -> list[str]:
    """Run trace lines (one or more traces) through cowmap; the output lines."""
    from cowmap import KeyedStateBackend, TimeDomain

    out: list[str] = []
    backend = svc = None
    tid = None

    def on_timer(ts: int, key: int, ns: int, domain: TimeDomain) -> None:
        assert backend is not None and svc is not None and backend.get_current_key() == key
        event = domain is TimeDomain.EVENT_TIME
        out.append(f"fire {'e' if event else 'p'} {ts} {key} {ns}")
        for what, at in react(event, ts, key, ns):
            if what == "reg":
                (svc.register_event_time_timer if event else svc.register_processing_time_timer)(at, ns)
            else:
                (svc.delete_event_time_timer if event else svc.delete_processing_time_timer)(at, ns)

    for line in lines:
        t = line.split()
        if not t:
            continue
        op = t[0]
        if op == "trace":
            tid = t[1]
            backend = KeyedStateBackend(max_parallelism=MAX_PARALLELISM)
            svc = backend.get_timer_service("t", on_timer)
            out.append(f"trace {tid}")
        elif op == "key":
            backend.set_current_key(int(t[1]))
        elif op in ("reg", "del"):
            ts, ns, event = int(t[2]), int(t[3]), t[1] == "e"
            if op == "reg":
                (svc.register_event_time_timer if event else svc.register_processing_time_timer)(ts, ns)
            else:
                (svc.delete_event_time_timer if event else svc.delete_processing_time_timer)(ts, ns)
        elif op == "wm":
            svc.advance_watermark(int(t[1]))
        elif op == "pt":
            svc.advance_processing_time(int(t[1]))
        elif op == "end":
            out.append(f"left {svc.num_event_time_timers()} {svc.num_processing_time_timers()}")
            out.append(f"end {tid}")
        else:
            raise ValueError(f"unknown op {line!r}")
    return out


def run_flink(lines: list[str], jar: str) -> list[str]:
    """Compile FlinkTimerReplay.java and run the trace lines through Flink; the output lines."""
    java, javac = shutil.which("java"), shutil.which("javac")
    if not java or not javac:
        raise RuntimeError("java and javac (JDK 17+) are needed to run Flink")
    with tempfile.TemporaryDirectory() as d:
        subprocess.run([javac, "-nowarn", "-cp", jar, "-d", d, str(HERE / "FlinkTimerReplay.java")],
                       check=True, capture_output=True)
        res = subprocess.run([java, "-cp", f"{d}{os.pathsep}{jar}", JAVA_MAIN], input="\n".join(lines) + "\n",
                             capture_output=True, text=True, check=True)
    return [line for line in res.stdout.splitlines() if line.strip()]


def read_recorded(path: Path) -> list[tuple[list[str], list[str]]]:
    """(trace lines, Flink's output lines) per trace of a recorded file: each trace's input,
    then its output lines, each prefixed ``> ``."""
    out: list[tuple[list[str], list[str]]] = []
    trace: list[str] = []
    result: list[str] = []
    for line in path.read_text().splitlines():
        if not line.strip() or line.startswith("#"):
            continue
        if line.startswith("> "):
            result.append(line[2:])
            if line.startswith("> end "):
                out.append((trace, result))
                trace, result = [], []
        else:
            trace.append(line)
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--record", type=int, metavar="N", help="write N traces with Flink's outputs to timer_traces.txt")
    p.add_argument("--seed", type=int, default=2023)
    p.add_argument("--ops", type=int, default=80)
    args = p.parse_args()
    # trace.py (the state traces) finds the jar; run as a file: its name clashes with the stdlib's
    found = runpy.run_path(str(HERE / "trace.py"))["find_flink_jar"]()
    jar = str(found) if found is not None else None
    if jar is None:
        print("flink-dist jar not found (pip install apache-flink-libraries==2.3.0 or set COWMAP_FLINK_DIST_JAR)")
        return 2
    rng = random.Random(args.seed)
    traces = [random_trace(rng, i, args.ops) for i in range(args.record or 50)]
    flink = run_flink([x for t in traces for x in t], jar)
    ours = run_cowmap([x for t in traces for x in t])
    same = canonical(flink) == canonical(ours)
    print(f"{len(traces)} traces: {'same' if same else 'DIFFERENT'} firing sequences")
    if args.record:
        blocks = []
        it = iter(flink)
        for t in traces:
            res = []
            for line in it:
                res.append(line)
                if line.startswith("end "):
                    break
            blocks.append("\n".join(t + ["> " + r for r in res]))
        header = ("# Timer traces with Apache Flink 2.3.0's outputs (InternalTimerServiceImpl, heap queues),\n"
                  f"# recorded by timer_trace.py --record {args.record} --seed {args.seed} --ops {args.ops}\n")
        (HERE / "timer_traces.txt").write_text(header + "\n".join(blocks) + "\n")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
