"""``python -m cowmap.bench`` (or ``cowmap-bench``): cowmap's benchmark harness.

Scenarios: ``ttl`` (default) -- ValueState keyed by (group, user) vs MapState keyed by group,
TTL off / default cleanup / cleanup every record, swept over entries per key at a fixed total
state size, optionally side by side with Flink's heap backend (``--with-flink``); ``core`` --
the compiled map's get/put/snapshot vs a dict; ``snapshot`` -- snapshot start and write time vs
state size with updates running; ``columnar`` -- a pandas UDF's batches (1M rows over 200k keys in
calls of 10k) through the columnar state calls vs the per-record loop vs a pandas Series;
``checkpoint`` -- durable checkpoints of a 10M-entry ValueState + 1M-entry MapState (save,
restore, save_async) vs pickle of a plain dict; ``timers`` -- register, delete and fire 1M
event-time timers over 100k keys vs ``heapq`` + a dict; ``spark`` -- one stateful streaming query through
``transformWithStateInPandas``, ``transformWithState``, ``applyInPandasWithState``, ``mapInPandas`` with a
dict and ``cowmap.spark`` (per-key and columnar), rows/s (needs the ``spark`` extra and a JDK 17+).
"""

from __future__ import annotations

import argparse
import platform
import sys
import time
from collections.abc import Callable

SCENARIOS = ("ttl", "core", "snapshot", "columnar", "checkpoint", "timers", "spark")


def _int_list(text: str) -> tuple[int, ...]:
    try:
        vals = tuple(int(x.replace("_", "")) for x in text.split(",") if x.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated ints, got {text!r}") from None
    if not vals or min(vals) < 1:
        raise argparse.ArgumentTypeError(f"expected ints >= 1, got {text!r}")
    return vals


def _names(allowed: tuple[str, ...]) -> Callable[[str], tuple[str, ...]]:
    def parse(text: str) -> tuple[str, ...]:
        vals = tuple(x.strip() for x in text.split(",") if x.strip())
        bad = [v for v in vals if v not in allowed]
        if bad or not vals:
            raise argparse.ArgumentTypeError(f"expected some of {','.join(allowed)}, got {text!r}")
        return vals

    return parse


def _parser() -> argparse.ArgumentParser:
    from cowmap.bench.workload import DEFAULT_SWEEP, LAYOUTS, TTL_MODES, Settings

    d = Settings()
    p = argparse.ArgumentParser(prog="python -m cowmap.bench", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("scenario", nargs="?", default="ttl", choices=SCENARIOS,
                   help="what to measure (default: ttl; core = map get/put/snapshot vs dict; "
                        "snapshot = snapshot start/write vs state size; columnar = batch calls vs "
                        "loop vs pandas)")
    p.add_argument("--out", metavar="results.json", help="write the results as JSON (every scenario)")
    p.add_argument("--plot", metavar="file.png", help="write a PNG plot (every scenario; needs matplotlib)")
    g = p.add_argument_group("ttl scenario")
    g.add_argument("--groups", type=int, default=None,
                   help=f"groups (default {d.groups}; --full: 1,000); total state = groups x users-per-group")
    g.add_argument("--users-per-group", type=int, default=None,
                   help=f"users per group (default {d.users_per_group:,}; --full: 10,000)")
    g.add_argument("--sweep", type=_int_list, default=DEFAULT_SWEEP,
                   help="entries per key to sweep at the fixed total (default 1,10,100,1000,10000)")
    g.add_argument("--records", type=int, default=None,
                   help=f"records per timed round (default {d.records:,}; --full: 100,000)")
    g.add_argument("--warmup", type=int, default=d.warmup, help="warm-up passes per config (default 1)")
    g.add_argument("--zipf", type=float, nargs="?", const=1.1, default=None, metavar="S",
                   help="draw groups and users Zipf-skewed with exponent S (default 1.1) instead of uniformly")
    g.add_argument("--seed", type=int, default=d.seed)
    g.add_argument("--layouts", type=_names(LAYOUTS), default=LAYOUTS, help="value,map (default both)")
    g.add_argument("--ttl-modes", type=_names(TTL_MODES), default=TTL_MODES,
                   help="off,default,every (default all three)")
    g.add_argument("--round-budget-ms", type=int, default=d.round_budget_ms,
                   help="time at most ~this per round and config: slower configs time a prefix of the records")
    g.add_argument("--full", action="store_true",
                   help="the seed's size: 1,000 groups x 10,000 users (10M entries per state: up to ~4 GB "
                        "RAM per state, states of a batch at once, and a long while -- see docs/benchmarks/ttl.md)")
    g.add_argument("--with-flink", action="store_true",
                   help="also run Flink 2.3's heap backend on the same workload (needs Java 17+ and "
                        "apache-flink-libraries==2.3.0); columnar: its ValueState per record vs value_ttl")
    g.add_argument("--no-progress", action="store_true", help="no progress bar")
    c = p.add_argument_group("core and snapshot scenarios")
    c.add_argument("--n", type=int, default=None, help="core: number of keys (default 1,000,000)")
    c.add_argument("--sizes", type=_int_list, default=(10_000, 100_000, 1_000_000),
                   help="snapshot: state sizes (default 10000,100000,1000000)")
    k = p.add_argument_group("columnar scenario")
    k.add_argument("--cases", type=_names(_columnar_cases()), default=_columnar_cases(),
                   help="some of " + ",".join(_columnar_cases()) + " (default all)")
    k.add_argument("--rows", type=int, default=None, help="columnar: rows per round (default 1,000,000)")
    q = p.add_argument_group("checkpoint scenario")
    q.add_argument("--entries", type=int, default=10_000_000, help="ValueState entries (default 10,000,000)")
    q.add_argument("--map-entries", type=int, default=1_000_000, help="MapState entries (default 1,000,000)")
    q.add_argument("--dir", default=None, help="where to write (default: the system's temporary directory)")
    m = p.add_argument_group("timers scenario")
    m.add_argument("--timer-keys", type=int, default=100_000, help="keys (default 100,000)")
    m.add_argument("--timers-per-key", type=int, default=10, help="timers per key (default 10)")
    s = p.add_argument_group("spark scenario")
    s.add_argument("--spark-rows", type=int, default=500_000,
                   help="rows of the one large micro-batch (default 500,000)")
    s.add_argument("--spark-keys", type=int, default=50_000, help="keys of the large micro-batch (default 50,000)")
    s.add_argument("--spark-batches", type=int, default=10, help="micro-batches with every key (default 10)")
    s.add_argument("--spark-keys-every", type=int, default=10_000,
                   help="keys in each of those micro-batches, once each (default 10,000)")
    s.add_argument("--spark-systems", type=_names(_spark_systems()), default=_spark_systems(),
                   help="some of " + ",".join(_spark_systems()) + " (default all)")
    s.add_argument("--spark-sockets", choices=("unix", "tcp"), default="unix",
                   help="how the JVM talks to Python workers (spark.python.unix.domain.socket.enabled), for "
                        "every system alike; over TCP a mapInPandas task often waits 40-55 ms for its input "
                        "(default unix)")
    s.add_argument("--commit-keys", type=int, default=10_000_000,
                   help="keys of the commit figure, 1%% of them changed (default 10,000,000; 0: skip)")
    p.add_argument("--repeats", type=int, default=None, help="timed repeats; the median is shown (default 5)")
    return p


def _spark_systems() -> tuple[str, ...]:
    from cowmap.bench.spark import SYSTEMS

    return SYSTEMS


def _main_spark(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    from cowmap.bench import spark

    sizes = (args.spark_rows, args.spark_keys, args.spark_batches, args.spark_keys_every)
    if min(sizes) < 1 or args.commit_keys < 0:
        parser.error("--spark-rows, --spark-keys, --spark-batches and --spark-keys-every must be >= 1")
    res = spark.run(args.spark_systems, args.spark_rows, args.spark_keys, args.spark_batches, args.spark_keys_every,
                    repeats=args.repeats or 1, commit_keys=args.commit_keys, sockets=args.spark_sockets)
    print("\n".join(spark.report(res)))
    _outputs(args, {"scenario": "spark", "format": 1, "result": res}, lambda path: spark.plot(res, path))
    failed = [  # (the dict and the floor persist nothing: their counts are not expected to hold)
        s for w in res["workloads"].values() for s, f in w["figures"].items()
        if not f["state_ok"] and s not in spark.STATELESS
    ]
    return 0 if not failed else 1


def _columnar_cases() -> tuple[str, ...]:
    from cowmap.bench.columnar import CASES

    return CASES


def _main_columnar(parser: argparse.ArgumentParser, args: argparse.Namespace, repeats: int) -> int:
    from cowmap.bench import columnar

    rows = args.rows if args.rows is not None else columnar.ROWS
    if rows < columnar.CALL:
        parser.error(f"--rows must be >= {columnar.CALL:,}")
    print(f"cowmap columnar benchmark: {rows:,} rows over {columnar.KEYS:,} keys in calls of "
          f"{columnar.CALL:,}; per-record loop on {columnar.LOOP_ROWS:,} rows; median of {repeats} rounds")
    res = columnar.run_columnar(args.cases, repeats, rows,
                                progress=None if args.no_progress else lambda n: print(f"  done: {n}", flush=True))
    columnar.print_columnar(res)
    flink_row = None
    if args.with_flink:
        cow = next((r for r in res if r["case"] == "value_ttl"), None)
        if cow is None:
            print("--with-flink compares the value_ttl case: add it to --cases", file=sys.stderr)
        else:
            flink_row, msg = columnar.run_flink_value(repeats=repeats)
            print(columnar.flink_line(cow, flink_row) if flink_row else msg,
                  file=sys.stdout if flink_row else sys.stderr)
    _outputs(args, {"scenario": "columnar", "format": 1, "rows": res, "flink": flink_row,
                    "machine": {"python": platform.python_version(), "platform": platform.platform(),
                                "cpus": _cpus()}},
             lambda path: columnar.plot_columnar(res, path))
    return 0 if all(r["state_ok"] for r in res) else 1


#: the extra that brings each optional module a scenario may need
_EXTRA_OF = {"pandas": "bench", "psutil": "bench", "cachetools": "bench", "matplotlib": "plot", "pyspark": "spark",
             "pyarrow": "arrow"}


def main(argv: list[str] | None = None) -> int:
    """Run the scenario ``argv`` asks for; 2 with how to install what it needs if that is missing."""
    parser = _parser()
    args = parser.parse_args(argv)
    try:
        return _run(parser, args)
    except ModuleNotFoundError as e:
        top = (e.name or "").partition(".")[0]
        if top not in _EXTRA_OF:
            raise
        print(f"the {args.scenario} benchmark needs {top}: pip install \"cowmap[{_EXTRA_OF[top]}]\"", file=sys.stderr)
        return 2


def _run(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    if (args.n is not None and args.n < 1) or (args.repeats is not None and args.repeats < 1):
        parser.error("--n and --repeats must be >= 1")
    repeats = args.repeats if args.repeats is not None else 5
    if args.scenario == "core":
        from cowmap.bench.core import plot_core, print_rows, run_core, to_json

        n = args.n if args.n is not None else 1_000_000
        print(f"cowmap core benchmark: {n:,} random int64 keys, median of {repeats} runs")
        rows = run_core(n, repeats)
        print_rows(rows)
        _outputs(args, to_json(rows, n, repeats), lambda path: plot_core(rows, path, n))
        return 0
    if args.scenario == "columnar":
        return _main_columnar(parser, args, repeats)
    if args.scenario == "checkpoint":
        from cowmap.bench import checkpoint

        if args.entries < 1 or args.map_entries < 0:
            parser.error("--entries must be >= 1 and --map-entries >= 0")
        res = checkpoint.run(args.entries, args.map_entries, args.repeats or 3, args.dir)
        print("\n".join(checkpoint.report(res)))
        _outputs(args, {"scenario": "checkpoint", "format": 1, "result": res}, lambda path: checkpoint.plot(res, path))
        return 0
    if args.scenario == "spark":
        return _main_spark(parser, args)
    if args.scenario == "timers":
        from cowmap.bench import timers

        if args.timer_keys < 1 or args.timers_per_key < 1:
            parser.error("--timer-keys and --timers-per-key must be >= 1")
        res = timers.run(repeats, args.timer_keys, args.timers_per_key)
        print("\n".join(timers.report(res)))
        _outputs(args, {"scenario": "timers", "format": 1, "result": res}, lambda path: timers.plot(res, path))
        return 0
    if args.n is not None:
        parser.error("--n is for the core scenario (ttl: --records, --groups, --users-per-group)")
    if args.scenario == "snapshot":
        from cowmap.bench.snapshot import plot_snapshot, print_snapshot, run_snapshot

        print(f"cowmap snapshot benchmark: ValueState with TTL, sizes {', '.join(f'{s:,}' for s in args.sizes)}")
        sizes = run_snapshot(list(args.sizes))
        print_snapshot(sizes)
        _outputs(args, {"scenario": "snapshot", "format": 1, "rows": sizes}, lambda path: plot_snapshot(sizes, path))
        return 0
    return _main_ttl(parser, args, repeats)


def _main_ttl(parser: argparse.ArgumentParser, args: argparse.Namespace, repeats: int) -> int:
    from cowmap.bench import report
    from cowmap.bench.progress import Progress
    from cowmap.bench.ttl import run_cowmap
    from cowmap.bench.workload import Settings, available_memory, plan_batches, units_per_batch

    st = Settings(repeats=repeats, warmup=args.warmup, zipf=args.zipf, seed=args.seed, sweep=args.sweep,
                  layouts=args.layouts, ttl_modes=args.ttl_modes, round_budget_ms=args.round_budget_ms,
                  full=args.full)
    if args.full:
        st.groups, st.users_per_group, st.records = 1_000, 10_000, 100_000
    st.groups = args.groups if args.groups is not None else st.groups
    st.users_per_group = args.users_per_group if args.users_per_group is not None else st.users_per_group
    st.records = args.records if args.records is not None else st.records
    for name in ("groups", "users_per_group", "records", "warmup", "round_budget_ms"):
        if getattr(st, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be >= 1")
    if args.zipf is not None and args.zipf <= 0:
        parser.error("--zipf exponent must be > 0")
    points = st.points()
    per_point = len(st.layouts) * len(st.ttl_modes)
    print(f"cowmap ttl benchmark: {st.total:,} entries per state ({st.groups:,} groups x "
          f"{st.users_per_group:,} users), entries/key {', '.join(f'{e:,}' for e, _, _ in points)}; "
          f"{len(points) * per_point} configs; {st.records:,} records per round "
          f"({f'Zipf s={st.zipf:g}' if st.zipf else 'uniform'}, seed {st.seed}), "
          f"{st.warmup} warm-up + {st.repeats} timed rounds")
    avail = available_memory()
    if avail and st.total * 400 > 0.6 * avail:
        print(f"warning: one state needs up to ~{st.total * 400 / 2**30:.1f} GiB, {avail / 2**30:.1f} GiB available",
              file=sys.stderr)
    if st.total >= 1_000_000:
        est = len(points) * per_point * st.total * 5e-6 * (2 if args.with_flink else 1)
        print(f"note: filling {len(points) * per_point} states of {st.total:,} entries takes a while "
              f"(roughly {est / 60:.0f} min or more on a slow machine)", file=sys.stderr)
    flink_paths, flink_msg = None, ""
    if args.with_flink:
        from cowmap.bench import flink

        flink_paths, flink_msg = flink.check()
        if flink_msg:
            print(flink_msg, file=sys.stderr)
    units = sum(units_per_batch(st, len(b)) for b in plan_batches(st, st.total)) * len(points)
    if flink_paths:
        jvm_batches = plan_batches(st, st.total, flink.JVM_BYTES_PER_ENTRY)
        units += sum(units_per_batch(st, len(b)) for b in jvm_batches) * len(points)
    bar = Progress(units, enabled=not args.no_progress)
    t0 = time.monotonic()
    rows, errors = run_cowmap(st, on_progress=bar.update)
    flink_status = {"requested": bool(args.with_flink), "ran": False, "message": flink_msg}
    if flink_paths:
        try:
            frows, ferrors = flink.run_flink(st, flink_paths, on_progress=bar.update)
        except (OSError, RuntimeError) as e:
            frows, ferrors = [], [f"Flink side failed: {e}"]
        rows += frows
        errors += ferrors
        flink_status.update(ran=bool(frows), jar=str(flink_paths["jar"]),
                            java=flink.java_version(flink_paths["java"]))
    bar.close()
    wall = time.monotonic() - t0
    rows = [report.finish_row(r) for r in rows]
    ts = report.targets(rows)
    lost = [r for r in rows if not r["state_ok"]]
    print()
    print("\n".join(report.rows_table(rows)))
    print()
    print("\n".join(report.matrix_table(rows)))
    print()
    print("\n".join(report.targets_lines(ts)))
    print(f"wall time {wall:,.0f} s")
    for err in errors:
        print(f"error: {err}", file=sys.stderr)
    if lost:
        print(f"STATE LOST in {len(lost)} row(s): entries alive or value sums differ from what the records "
              "wrote -- those figures do not count", file=sys.stderr)
    doc = {"scenario": "ttl", "format": 1, "settings": st.to_json(),
           "machine": {"python": platform.python_version(), "platform": platform.platform(),
                       "cpus": _cpus()},
           "flink": flink_status, "wall_s": round(wall, 1), "rows": sorted(rows, key=report.sort_key),
           "targets": ts, "state_lost": bool(lost), "errors": errors}
    _outputs(args, doc, lambda path: report.plot(rows, path, _title(st, any(r["system"] == "flink" for r in rows))))
    return 1 if lost or (errors and not rows) else 0


def _outputs(args: argparse.Namespace, doc: dict, plot: Callable[[str], str | None]) -> None:
    """A scenario's ``--out`` (its JSON document) and ``--plot`` (``plot(path)`` writes it and
    returns None, or says why not: on stderr)."""
    from cowmap.bench import report

    if args.out:
        report.write_json(args.out, doc)
        print(f"wrote {args.out}")
    if args.plot:
        why = plot(args.plot)
        print(why if why else f"wrote {args.plot}", file=sys.stderr if why else sys.stdout)


def _title(st: object, with_flink: bool) -> str:
    dist = f"Zipf s={st.zipf:g}" if st.zipf else "uniform"  # type: ignore[attr-defined]
    vs = ", cowmap vs Flink 2.3 heap backend" if with_flink else ""
    return f"read-modify-write per record, {st.total:,} entries per state, {dist} records{vs}"  # type: ignore[attr-defined]


def _cpus() -> int | None:
    import os

    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count()


if __name__ == "__main__":
    raise SystemExit(main())
