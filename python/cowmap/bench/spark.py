"""Spark benchmark: the same stateful streaming query through Spark's stateful
operators, an unpersisted dict in ``mapInPandas``, and ``cowmap.spark``.

The query: rows ``(k, v)``; per key, a count and a total kept in state with a
TTL of an hour; for every key of a micro-batch, one output row ``(k, count,
total)``. The input is parquet files read as a stream, one file per
micro-batch (``availableNow``); the output goes to a memory sink, and every
persisted system's final counts are checked against pandas. Figures are rows
per second over the whole query (Spark's per-batch planning and scheduling
included: it is what a user waits for), each system on a fresh checkpoint in
the same session, one after another.

Workloads: ``large`` — one micro-batch of ``rows`` rows over ``keys`` keys;
``every_key`` — ``batches`` micro-batches, each holding every one of
``keys_every`` keys once (where Spark's state calls, one socket round trip
each, cost the most). Plus ``commit``: ``cowmap.spark``'s commit of a micro-batch
that changed 1% of ``commit_keys`` keys against a full checkpoint of them.
"""

from __future__ import annotations

import os
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable, Iterator
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from cowmap.bench.report import _table
from cowmap.state import StateTtlConfig, ValueStateDescriptor

if TYPE_CHECKING:  # pandas (the bench extra) is imported where a run needs it: the harness lists
    import pandas as pd  # this scenario's systems without it

__all__ = ["STATELESS", "SYSTEMS", "TARGETS", "report", "run"]

TTL_MS = 3_600_000
OUT = "k long, count long, total long"
SYSTEMS = ("tws_pandas", "tws_row", "apply_in_pandas_with_state", "dict_map_in_pandas", "shuffle_floor",
           "cowmap_per_key", "cowmap_columnar")
#: systems that keep no state: their output is not checked against pandas
STATELESS = ("dict_map_in_pandas", "shuffle_floor")
LABELS = {
    "tws_pandas": "transformWithStateInPandas",
    "tws_row": "transformWithState (Row)",
    "apply_in_pandas_with_state": "applyInPandasWithState",
    "dict_map_in_pandas": "mapInPandas + dict (not persisted)",
    "shuffle_floor": "Spark's floor: shuffle + mapInPandas, no work",
    "cowmap_per_key": "cowmap.spark per-key",
    "cowmap_columnar": "cowmap.spark columnar",
}
#: (figure, target) as docs/benchmarks/spark.md states them
TARGETS = {
    "per_key_vs_tws_pandas_large": 15.0,
    "per_key_vs_tws_row_large": 10.0,
    "per_key_vs_tws_pandas_every_key": 20.0,
    "columnar_vs_dict": 1.0,
    "per_key_vs_dict": 1 / 1.3,
    "commit_share": 0.05,
}
_ROCKSDB = "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"
_HDFS = "org.apache.spark.sql.execution.streaming.state.HDFSBackedStateStoreProvider"


# ---------------------------------------------------------------- the systems' code


def _ttl_state(name: str) -> ValueStateDescriptor:
    d = ValueStateDescriptor(name)
    d.enable_time_to_live(StateTtlConfig.new_builder(timedelta(milliseconds=TTL_MS)).build())
    return d


class CowmapPerKey:
    """Per-key style: the key current, one get and one update per key."""

    def open(self, ctx: Any) -> None:
        self.agg = ctx.get_state(_ttl_state("agg"))

    def process(self, batch: pd.DataFrame, ctx: Any) -> pd.DataFrame:
        import pandas as pd

        agg = self.agg
        ks, cs, ts = [], [], []
        for key, rows in ctx.groups(batch):
            c, t = agg.value() or (0, 0)
            c += len(rows)
            t += rows.sum("v")
            agg.update((c, t))
            ks.append(key)
            cs.append(c)
            ts.append(t)
        return pd.DataFrame({"k": ks, "count": cs, "total": ts})


class CowmapColumnar:
    """Columnar style: a pandas aggregation and four state calls per batch."""

    def open(self, ctx: Any) -> None:
        self.count = ctx.get_state(_ttl_state("count"))
        self.total = ctx.get_state(_ttl_state("total"))

    def process(self, batch: pd.DataFrame, ctx: Any) -> pd.DataFrame:
        import pandas as pd

        g = batch.groupby("k", sort=False)["v"].agg(["size", "sum"])
        keys = g.index.to_numpy()
        count = self.count.get_many(keys, dtype=np.int64, default=0) + g["size"].to_numpy()
        total = self.total.get_many(keys, dtype=np.int64, default=0) + g["sum"].to_numpy()
        self.count.update_many(keys, count)
        self.total.update_many(keys, total)
        return pd.DataFrame({"k": keys, "count": count, "total": total})


_DICT: dict[int, tuple[int, int]] = {}


def dict_map_in_pandas(frames: Iterator[pd.DataFrame]) -> Iterator[pd.DataFrame]:
    import pandas as pd

    """The speed reference: the same per-key work on a dict of the Python worker, saved nowhere."""
    d = _DICT
    for batch in frames:
        g = batch.groupby("k", sort=False)["v"].agg(["size", "sum"])
        ks, cs, ts = g.index.tolist(), [], []
        for k, n, s in zip(ks, g["size"].tolist(), g["sum"].tolist(), strict=True):
            c, t = d.get(k, (0, 0))
            c += n
            t += s
            d[k] = (c, t)
            cs.append(c)
            ts.append(t)
        yield pd.DataFrame({"k": ks, "count": cs, "total": ts})


def shuffle_floor(frames: Iterator[pd.DataFrame]) -> Iterator[pd.DataFrame]:
    """What any system routing rows by key through ``mapInPandas`` costs at least: the
    same shuffle and Arrow transfer, one output row per key of the batch, no state."""
    import pandas as pd

    cols = [f["k"] for f in frames]
    if cols:
        yield pd.DataFrame({"k": pd.unique(pd.concat(cols, ignore_index=True)), "count": 0, "total": 0})


def apply_in_pandas_with_state(key: tuple, frames: Iterator[pd.DataFrame], state: Any) -> Iterator[pd.DataFrame]:
    import pandas as pd

    if state.hasTimedOut:
        state.remove()
        return
    c, t = state.get if state.exists else (0, 0)
    for f in frames:
        c += len(f)
        t += int(f["v"].sum())
    state.update((c, t))
    state.setTimeoutDuration(TTL_MS)
    yield pd.DataFrame({"k": [key[0]], "count": [c], "total": [t]})


def _stateful_processors() -> tuple[type, type]:
    import pandas as pd
    from pyspark.sql import Row
    from pyspark.sql.streaming import StatefulProcessor

    class TwsPandas(StatefulProcessor):
        def init(self, handle: Any) -> None:
            self.agg = handle.getValueState("agg", "count long, total long", TTL_MS)

        def handleInputRows(self, key: tuple, rows: Iterator[pd.DataFrame], timerValues: Any) -> Iterator[pd.DataFrame]:
            c, t = self.agg.get() if self.agg.exists() else (0, 0)
            for f in rows:
                c += len(f)
                t += int(f["v"].sum())
            self.agg.update((c, t))
            yield pd.DataFrame({"k": [key[0]], "count": [c], "total": [t]})

        def close(self) -> None:
            pass

    class TwsRow(StatefulProcessor):
        def init(self, handle: Any) -> None:
            self.agg = handle.getValueState("agg", "count long, total long", TTL_MS)

        def handleInputRows(self, key: tuple, rows: Iterator[Any], timerValues: Any) -> Iterator[Any]:
            c, t = self.agg.get() if self.agg.exists() else (0, 0)
            for r in rows:
                c += 1
                t += r.v
            self.agg.update((c, t))
            yield Row(k=key[0], count=c, total=t)

        def close(self) -> None:
            pass

    return TwsPandas, TwsRow


def _query(spark: Any, system: str, stream: Any, state_dir: str, partitions: int) -> Any:
    """The output DataFrame of ``system`` over the stream; sets the state store it needs."""
    spark.conf.set("spark.sql.streaming.stateStore.providerClass", _ROCKSDB if system.startswith("tws") else _HDFS)
    grouped = stream.groupBy("k")
    if system == "tws_pandas":
        return grouped.transformWithStateInPandas(_stateful_processors()[0](), OUT, "Append", "ProcessingTime")
    if system == "tws_row":
        return grouped.transformWithState(_stateful_processors()[1](), OUT, "Append", "ProcessingTime")
    if system == "apply_in_pandas_with_state":
        return grouped.applyInPandasWithState(
            apply_in_pandas_with_state, OUT, "count long, total long", "Append", "ProcessingTimeTimeout"
        )
    if system in STATELESS:
        fn = dict_map_in_pandas if system == "dict_map_in_pandas" else shuffle_floor
        return stream.repartition(partitions, "k").mapInPandas(fn, OUT)
    from cowmap.spark import apply_with_state

    processor = CowmapPerKey if system == "cowmap_per_key" else CowmapColumnar
    return apply_with_state(stream, "k", processor, OUT, checkpoint_location=state_dir, num_partitions=partitions)


# ---------------------------------------------------------------- workloads


def _write(src: Path, batches: list[pd.DataFrame]) -> None:
    src.mkdir(parents=True)
    start = time.time()
    for i, b in enumerate(batches):
        path = src / f"part-{i:04d}.parquet"
        b.to_parquet(path, index=False)
        os.utime(path, (start + i, start + i))


def workload(name: str, rows: int, keys: int, batches: int, keys_every: int, seed: int) -> list[pd.DataFrame]:
    import pandas as pd

    r = np.random.default_rng(seed)
    if name == "large":
        return [pd.DataFrame({"k": r.integers(0, keys, rows), "v": r.integers(0, 1000, rows)})]
    return [  # each key once per micro-batch
        pd.DataFrame({"k": r.permutation(keys_every), "v": r.integers(0, 1000, keys_every)}) for _ in range(batches)
    ]


def _check(out: pd.DataFrame, batches: list[pd.DataFrame], system: str) -> bool:
    import pandas as pd

    whole = pd.concat(batches)
    want = whole.groupby("k")["v"].agg(["size", "sum"])
    final = out.sort_values("count").groupby("k").tail(1).set_index("k").sort_index()
    ok = final.index.tolist() == want.index.tolist() and final["count"].tolist() == want["size"].tolist()
    if not ok and system not in STATELESS:
        raise AssertionError(f"{system}: the final counts differ from pandas' (state lost or doubled)")
    return ok


def _time_query(
    spark: Any, system: str, src: Path, work: Path, partitions: int, schema: str
) -> tuple[float, pd.DataFrame]:
    stream = spark.readStream.schema(schema).option("maxFilesPerTrigger", 1).parquet(str(src))
    out = _query(spark, system, stream, str(work / "state"), partitions)
    t0 = time.perf_counter()
    table = f"cowmap_bench_{system}_{work.name}".replace("-", "_")
    q = (
        out.writeStream.format("memory").queryName(table).outputMode("append")
        .option("checkpointLocation", str(work / "chk")).trigger(availableNow=True).start()
    )
    q.awaitTermination()
    seconds = time.perf_counter() - t0
    result = spark.table(table).toPandas()
    spark.catalog.dropTempView(table)
    return seconds, result


def _first_line(e: BaseException) -> str:
    """The gist of a (long, JVM-wrapped) error: its Python error line when it has one."""
    text = str(e)
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    errs = [ln for ln in lines if ln.split(":")[0].endswith(("Error", "Exception")) and "Traceback" not in ln]
    return (errs[-1] if errs else lines[0] if lines else type(e).__name__)[:300]


def run(
    systems: tuple[str, ...] = SYSTEMS,
    rows: int = 500_000,
    keys: int = 50_000,
    batches: int = 10,
    keys_every: int = 10_000,
    partitions: int = 2,
    repeats: int = 1,
    commit_keys: int = 10_000_000,
    seed: int = 5,
    log: Callable[[str], None] = print,
    spark: Any = None,
    sockets: str = "unix",
) -> dict[str, Any]:
    """Every system on both workloads in one SparkSession (``local[partitions]``,
    or ``spark`` when given: it is left running); medians of ``repeats``.

    ``sockets``: how the session's JVM talks to its Python workers, ``"unix"``
    (domain sockets) or ``"tcp"``, every system alike. Over TCP, a
    ``mapInPandas`` task often waits 40-55 ms for its input (the length of TCP's
    delayed ACK), a fifth to a third of a 10,000-row micro-batch's time here."""
    if sockets not in ("unix", "tcp"):
        raise ValueError(f"sockets must be 'unix' or 'tcp', not {sockets!r}")
    from pyspark.sql import SparkSession

    own = spark is None
    if own:
        spark = (
            SparkSession.builder.master(f"local[{partitions}]").appName("cowmap-bench-spark")
            .config("spark.ui.enabled", "false").config("spark.sql.shuffle.partitions", str(partitions))
            .config("spark.sql.streaming.noDataMicroBatches.enabled", "false")
            .config("spark.python.unix.domain.socket.enabled", str(sockets == "unix").lower()).getOrCreate()
        )
        spark.sparkContext.setLogLevel("ERROR")
    tmp = Path(tempfile.mkdtemp(prefix="cowmap-bench-spark-"))
    import pyspark

    uds = spark.conf.get("spark.python.unix.domain.socket.enabled", "false")
    res: dict[str, Any] = {"rows": rows, "keys": keys, "batches": batches, "keys_every": keys_every,
                           "partitions": partitions, "repeats": repeats, "pyspark": pyspark.__version__,
                           "sockets": "unix" if uds == "true" else "tcp", "workloads": {}}
    try:
        warm = workload("large", 2_000, 200, 1, 1, seed)
        failed: dict[str, str] = {}
        for system in systems:  # a first query per system: workers, JIT and imports warmed
            src = tmp / f"warm-{system}"
            _write(src, warm)
            try:
                _time_query(spark, system, src, tmp / f"warm-{system}-run", partitions, "k long, v long")
            except Exception as e:  # noqa: BLE001 - a system that fails here is reported, the others still run
                failed[system] = _first_line(e)
                log(f"  {LABELS[system]} failed, left out: {failed[system]}")
        res["failed"] = failed
        for name in ("large", "every_key"):
            data = workload(name, rows, keys, batches, keys_every, seed)
            src = tmp / f"src-{name}"
            _write(src, data)
            n = sum(len(b) for b in data)
            running = [s for s in systems if s not in failed]
            times: dict[str, list[float]] = {s: [] for s in running}
            ok: dict[str, bool] = {}
            # round by round, every system once a round: a slow spell of the shared machine
            # then falls on every system alike instead of on whichever ran its repeats in it
            for rep in range(repeats):
                for system in running:
                    work = tmp / f"{name}-{system}-{rep}"
                    seconds, out = _time_query(spark, system, src, work, partitions, "k long, v long")
                    ok[system] = _check(out, data, system)
                    times[system].append(seconds)
                    shutil.rmtree(work, ignore_errors=True)
                if repeats > 1:
                    log(f"  {name:<9} round {rep + 1} of {repeats} done")
            figures: dict[str, dict[str, Any]] = {}
            for system in running:
                med = statistics.median(times[system])
                figures[system] = {"seconds": times[system], "rows_per_s": n / med, "state_ok": ok[system]}
                log(f"  {name:<9} {LABELS[system]:<36} {n / med:>12,.0f} rows/s ({med:.2f} s)")
            res["workloads"][name] = {"rows": n, "micro_batches": len(data), "figures": figures}
    finally:
        if own:
            spark.stop()
        shutil.rmtree(tmp, ignore_errors=True)
    if commit_keys:
        res["commit"] = commit_cost(commit_keys, seed=seed, log=log)
    return res


# ---------------------------------------------------------------- the commit of a micro-batch


def commit_cost(keys: int, changed: float = 0.01, repeats: int = 3, seed: int = 5,
                log: Callable[[str], None] = print) -> dict[str, Any]:
    """Seconds of ``cowmap.spark``'s commit (an incremental checkpoint at the next
    version, then pruning old versions) after a micro-batch changed ``changed`` of
    ``keys`` keys, against a full checkpoint of them; medians of ``repeats``."""
    from cowmap.checkpoint import CheckpointStorage
    from cowmap.state import KeyedStateBackend

    r = np.random.default_rng(seed)
    tmp = Path(tempfile.mkdtemp(prefix="cowmap-bench-commit-"))
    try:
        backend = KeyedStateBackend(4096, spark_key_types=["bigint"])
        count = backend.get_state(_ttl_state("count"))
        all_keys = np.arange(keys, dtype=np.int64)
        count.update_many(all_keys, np.ones(keys, dtype=np.int64))
        storage = CheckpointStorage(tmp / "state")
        full, incr = [], []
        version = 0
        for _ in range(repeats):
            version += 1
            t0 = time.perf_counter()
            storage.save(backend, incremental=False, checkpoint_id=version)
            full.append(time.perf_counter() - t0)
            some = r.choice(all_keys, int(keys * changed), replace=False)
            count.update_many(some, count.get_many(some, dtype=np.int64, default=0) + 1)
            version += 1
            t0 = time.perf_counter()
            storage.save(backend, checkpoint_id=version)
            storage.retain(5)
            incr.append(time.perf_counter() - t0)
        f, i = statistics.median(full), statistics.median(incr)
        log(f"  commit    {keys:,} keys, {changed:.0%} changed: {i * 1e3:,.0f} ms vs a full checkpoint "
            f"{f * 1e3:,.0f} ms ({i / f:.1%})")
        return {"keys": keys, "changed": changed, "full_s": full, "incremental_s": incr, "share": i / f}
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


#: each figure's workload, system and the system it is compared with
PAIRS = {
    "per_key_vs_tws_pandas_large": ("large", "cowmap_per_key", "tws_pandas"),
    "per_key_vs_tws_row_large": ("large", "cowmap_per_key", "tws_row"),
    "per_key_vs_tws_pandas_every_key": ("every_key", "cowmap_per_key", "tws_pandas"),
    "columnar_vs_dict": ("large", "cowmap_columnar", "dict_map_in_pandas"),
    "per_key_vs_dict": ("large", "cowmap_per_key", "dict_map_in_pandas"),
}


def _figure(res: dict[str, Any], workload: str, system: str) -> dict[str, Any] | None:
    f: dict[str, Any] | None = res["workloads"].get(workload, {}).get("figures", {}).get(system)
    return f


def ratios(res: dict[str, Any]) -> dict[str, float | None]:
    out: dict[str, float | None] = {}
    for name, (workload, system, ref) in PAIRS.items():
        a, b = _figure(res, workload, system), _figure(res, workload, ref)
        out[name] = a["rows_per_s"] / b["rows_per_s"] if a and b else None
    out["commit_share"] = res["commit"]["share"] if "commit" in res else None
    return out


def round_ratios(res: dict[str, Any], name: str) -> list[float]:
    """Figure ``name`` in each round of the run (the two systems' queries of one
    round ran one shortly after the other): its spread."""
    workload, system, ref = PAIRS[name]
    a, b = _figure(res, workload, system), _figure(res, workload, ref)
    ta, tb = (a or {}).get("seconds") or [], (b or {}).get("seconds") or []
    if len(ta) != len(tb):
        return []
    return [y / x for x, y in zip(ta, tb, strict=True)]


def report(res: dict[str, Any]) -> list[str]:
    lines = [f"spark: rows/s over the whole query, local[{res['partitions']}], median of {res['repeats']}, "
             f"PySpark {res.get('pyspark', '?')}, Python workers over {res.get('sockets', '?')} sockets"]
    names = list(res["workloads"])
    header = ["system"]
    for w in names:
        nb = res["workloads"][w]["micro_batches"]
        header.append(f"{w} ({res['workloads'][w]['rows']:,} rows, {nb} batch{'' if nb == 1 else 'es'})")
    body = []
    for system in SYSTEMS:
        cells = [LABELS[system]]
        for w in names:
            f = res["workloads"][w]["figures"].get(system)
            cells.append("-" if f is None else f"{f['rows_per_s']:,.0f}")
        body.append(cells)
    lines += ["  " + line for line in _table(header, body, right=set(range(1, len(header))))]
    labels = {
        "per_key_vs_tws_pandas_large": "per-key vs transformWithStateInPandas, one large batch",
        "per_key_vs_tws_row_large": "per-key vs transformWithState (Row), one large batch",
        "per_key_vs_tws_pandas_every_key": "per-key vs transformWithStateInPandas, every key in each batch",
        "columnar_vs_dict": "columnar (persisted) vs mapInPandas + dict",
        "per_key_vs_dict": "per-key (persisted) vs mapInPandas + dict",
        "commit_share": "commit with 1% changed / full checkpoint",
    }
    for system, why in res.get("failed", {}).items():
        lines.append(f"  {LABELS[system]} failed: {why}")
    for name, value in ratios(res).items():
        target = TARGETS[name]
        if value is None:
            lines.append(f"  {labels[name]}: not measured")
            continue
        if name == "commit_share":
            met = value <= target
            lines.append(f"  {labels[name]}: {value:.1%} (target <= {target:.0%}: {'met' if met else 'NOT met'})")
        else:
            met = value >= target
            rounds = round_ratios(res, name)
            spread = f", rounds {min(rounds):.2f}x-{max(rounds):.2f}x" if len(rounds) > 1 else ""
            lines.append(
                f"  {labels[name]}: {value:.2f}x{spread} (target >= {target:.2f}x: {'met' if met else 'NOT met'})"
            )
    for workload, ref in (("large", "tws_row"), ("every_key", "tws_pandas")):
        floor, other = _figure(res, workload, "shuffle_floor"), _figure(res, workload, ref)
        if floor and other:
            x = floor["rows_per_s"] / other["rows_per_s"]
            lines.append(f"  Spark's floor vs {LABELS[ref]}, {workload}: {x:.2f}x "
                         "(the most a system routing rows by key through mapInPandas can reach)")
    return lines


def plot(res: dict[str, Any], path: str) -> str | None:
    """A bar chart of rows/s per system and workload (log scale); None, or why not."""
    from cowmap.bench.report import NO_MATPLOTLIB, pyplot

    plt = pyplot()
    if plt is None:
        return NO_MATPLOTLIB
    names = list(res["workloads"])
    fig, ax = plt.subplots(figsize=(10, 4.5))
    width = 0.8 / len(names)
    for j, w in enumerate(names):
        vals = [res["workloads"][w]["figures"].get(s, {}).get("rows_per_s", 0) for s in SYSTEMS]
        ax.barh([i + j * width for i in range(len(SYSTEMS))], vals, height=width, label=w)
    ax.set_yticks([i + width * (len(names) - 1) / 2 for i in range(len(SYSTEMS))], [LABELS[s] for s in SYSTEMS])
    for i, system in enumerate(SYSTEMS):
        if system in res.get("failed", {}):
            ax.annotate("failed (see the report)", (0.01, i), xycoords=("axes fraction", "data"), va="center")
    ax.set_xscale("log")
    ax.set_xlabel("rows/s (whole query, log scale)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return None
