"""Shared pieces of the cowmap benchmark suite: sizes, data, builders and the summary table.

Imported by ``conftest.py`` and the ``test_bench_*.py`` modules (pytest puts ``benches/`` on
``sys.path`` because it has no ``__init__.py``). Nothing here is imported by the package.

Sizes
    ``N_SMALL`` is 1,000,000. ``N_BIG`` is 10,000,000 when ``COWMAP_BENCH_FULL=1`` is set and
    2,000,000 otherwise; rows that the figures call "10M" then say in their name that they ran at
    2M (the 10M targets still apply, which is lenient: a smaller map is more cache friendly).

Data
    Keys are unique random int64 in ``[0, 2**62)`` from a fixed seed; the namespace is the int 0
    and the state of each entry is its key (an already existing object, so nothing is allocated
    per entry besides the map's own structures). Probing is in a random permutation of the keys.

Summary
    Every test records its figure into ``FIGURES`` (medians from ``benchmark.stats.stats.median``
    or values it measured itself); ``conftest.pytest_terminal_summary`` prints ``ROWS`` with
    cowmap's figure, the comparison measured in the same run, the ratio, the target and
    met / NOT met. Rows whose tests did not run show "not measured".
"""

from __future__ import annotations

import dataclasses
import os
import statistics
import time
from itertools import repeat
from typing import Any

import numpy as np

from cowmap import CopyOnWriteStateMap

FULL = os.environ.get("COWMAP_BENCH_FULL", "").strip() not in ("", "0")
NS = 0
SEED = 42
N_SMALL = 1_000_000
N_BIG = 10_000_000 if FULL else 2_000_000
SMALL_TAG = "1M"
BIG_TAG = "10M" if FULL else "2M"
#: How a "10M" row is named: plain "10M" in full mode, otherwise flagged as a 2M stand-in.
BIG_LABEL = "10M" if FULL else "2M (stand-in for 10M)"


# ---------------------------------------------------------------------------------------- data


@dataclasses.dataclass
class Dataset:
    """Unique random int64 keys and a random probing order over them."""

    n: int
    tag: str  # "1M", "2M" or "10M": used in figure keys
    label: str  # used in row and group names
    keys: np.ndarray  # int64, insertion order
    keys_list: list[int]
    probe: np.ndarray  # int64, a random permutation of keys
    probe_list: list[int]


def make_dataset(n: int, tag: str, label: str, seed: int = SEED) -> Dataset:
    rng = np.random.default_rng(seed)
    keys = rng.integers(0, 2**62, size=n, dtype=np.int64)
    if len(np.unique(keys)) != n:  # deterministic for a fixed seed; ~1e-5 odds at 10M
        raise RuntimeError(f"seed {seed} gave duplicate keys at n={n}; pick another seed")
    probe = rng.permutation(keys)
    return Dataset(n, tag, label, keys, keys.tolist(), probe, probe.tolist())


# ------------------------------------------------------------------------------------ builders


def settle(m: CopyOnWriteStateMap, any_key: Any) -> None:
    """Finish an incremental rehash in progress, so steady-state figures exclude it.

    Every operation moves >= 4 entries while a rehash runs; ``get`` of an existing key is one.
    """
    limit = 2 * m.capacity + 16
    while m.is_rehashing and limit > 0:
        m.get(any_key, NS)
        limit -= 1


def build_cowmap(ds: Dataset) -> CopyOnWriteStateMap:
    """A map holding every key of ``ds`` (state = key), grown from empty, rehash finished."""
    m = CopyOnWriteStateMap()
    m.put_many(ds.keys, NS, ds.keys_list)
    settle(m, ds.keys_list[0])
    assert len(m) == ds.n
    return m


def build_tuple_dict(ds: Dataset) -> dict:
    """The dict alternative keyed like the map: ``{(key, ns): state}``."""
    return dict(zip(zip(ds.keys_list, repeat(NS)), ds.keys_list))


def build_key_dict(ds: Dataset) -> dict:
    """The dict alternative keyed by the bare key (no namespace): ``{key: state}``."""
    return dict(zip(ds.keys_list, ds.keys_list))


# ------------------------------------------------------------------------------------- figures


class Figures:
    """Values recorded during the session, by key, plus caveats and free-form detail lines."""

    def __init__(self) -> None:
        self.values: dict[str, float] = {}
        self.caveats: dict[str, tuple[float, str]] = {}
        self.details: list[str] = []

    def record(self, key: str, value: float) -> float:
        self.values[key] = float(value)
        return float(value)

    def record_median(self, key: str, benchmark: Any, ops: int, scale: float = 1e9) -> float:
        """Record ``median seconds per round * scale / ops`` (default: ns per op)."""
        return self.record(key, benchmark.stats.stats.median * scale / ops)

    def caveat(self, key: str, upper_bound: float, text: str) -> None:
        """Mark ``key``'s value as a lower bound of a figure that may be up to ``upper_bound``."""
        self.caveats[key] = (float(upper_bound), text)

    def detail(self, line: str) -> None:
        self.details.append(line)


FIGURES = Figures()


class Interleaved:
    """A comparison loop timed in a benchmark's (untimed) setup, so it runs between the
    measured rounds: a ratio of the two is immune to the machine's load drifting over the
    minutes between tests. ``before`` runs (untimed) before each timing."""

    def __init__(self, loop: Any, before: Any = None) -> None:
        self.loop, self.before, self.times = loop, before, []

    def __call__(self) -> None:
        if self.before is not None:
            self.before()
        t0 = time.perf_counter()
        self.loop()
        self.times.append(time.perf_counter() - t0)

    def median(self) -> float:
        return statistics.median(self.times[1:])  # the first one ran with the warm-up round


@dataclasses.dataclass(frozen=True)
class Row:
    """One line of the summary: cowmap's figure against a comparison figure.

    ``kind`` is "ratio" (met when cowmap / comparison <= target) or "abs" (met when cowmap's
    figure <= target, in ``unit``; the ratio is shown for information). ``note`` is printed
    once under the table.
    """

    fig: str
    label: str
    unit: str
    cow: str
    other: str
    other_label: str
    kind: str
    target: float
    note: str = ""  # printed under the table when the row was measured (e.g. a reference figure)


def _rows() -> list[Row]:
    s, b, bl = SMALL_TAG, BIG_TAG, BIG_LABEL
    rows = [
        Row("1", "get hit, 1M keys, 1 call/op", "ns/op", "get.cowmap", "get.dict_tuple", "dict.get((key, ns))", "ratio", 0.8),
        Row("1", "get hit, 1M keys, 1 call/op", "ns/op", "get.cowmap", "get.dict_key", "dict.get(key)", "ratio", 1.5),
        Row("1", "put existing, 1M keys, 1 call/op", "ns/op", "put.cowmap", "put.dict_tuple", "d[(key, ns)] = v", "ratio", 0.8),
        Row("1", "put existing, 1M keys, 1 call/op", "ns/op", "put.cowmap", "put.dict_key", "d[key] = v", "ratio", 1.5),
        Row("1h", f"FlatStateMap get, prefetch() 4 ahead, @{bl}", "ns/get", "flat.get.hinted", "flat.get.plain",
            "same gets, no hint, interleaved", "ratio", 0.8),
    ]
    for tag, label, limit in ((s, "1M", 40.0), (b, bl, 100.0)):
        rows += [
            Row("2", f"get_many int64 @{label}", "ns/key", f"get_many.cowmap@{tag}", f"get_many.khash@{tag}", "Int64HashTable.lookup", "abs", limit),
            Row("2", f"get_many int64 @{label}", "ns/key", f"get_many.cowmap@{tag}", f"get_many.khash@{tag}", "Int64HashTable.lookup", "ratio", 1.0),
            Row("2", f"get_many int64 @{label}", "ns/key", f"get_many.cowmap@{tag}", f"get_many.index@{tag}", "pd.Index.get_indexer", "ratio", 1.0),
            Row("2", f"put_many existing @{label}", "ns/key", f"put_many.cowmap@{tag}", f"put_many.khash@{tag}", "Int64HashTable.map_locations", "abs", limit),
            Row("2", f"put_many existing @{label}", "ns/key", f"put_many.cowmap@{tag}", f"put_many.khash@{tag}", "Int64HashTable.map_locations", "ratio", 1.0),
        ]
    rows += [
        Row("3", f"snapshot() start @{bl}", "ms", "snapshot.cowmap", "snapshot.dict_copy", "dict.copy() of {(key, ns): v}", "abs", 1.0),
        Row("4", f"worst put growing 0->{bl} (incl. noise)", "ms", "growth.worst.cowmap", "growth.worst.dict", "dict[(key, ns)] = v growing", "abs", 1.0),
        Row("4", f"worst recurring put growing 0->{bl}", "ms", "growth.recurring.cowmap", "growth.recurring.dict", "dict[(key, ns)] = v growing", "abs", 1.0),
        Row("4", f"worst recurring put, CPU-checked, 0->{bl}", "ms", "growth.recurring_cpu.cowmap", "growth.recurring_cpu.dict", "dict[(key, ns)] = v growing", "abs", 1.0),
    ]
    for tag, label in ((s, "1M"), (b, bl)):
        rows += [
            Row("5", f"overhead/entry memory_stats @{label}", "B", f"mem.stats.cowmap@{tag}", f"mem.getsizeof.dict@{tag}", "dict (key, ns): getsizeof", "abs", 64.0),
            Row("5", f"overhead/entry tracemalloc @{label}", "B", f"mem.traced.cowmap@{tag}", f"mem.traced.dict@{tag}", "dict (key, ns): tracemalloc", "abs", 64.0),
        ]
    rows += [
        Row("6", "1st put after snapshot, 1M, put loop", "ns/op", "cow.put.snapshot", "cow.put.plain", "same put loop, no snapshot", "ratio", 3.0),
        Row("6", "1st put after snapshot, 1M, put_many", "ns/key", "cow.put_many.snapshot", "cow.put_many.plain", "same put_many, no snapshot", "ratio", 3.0),
    ]
    return rows + _state_rows() + _async_rows() + _columnar_rows() + _checkpoint_rows() + _timer_rows()


def _checkpoint_rows() -> list[Row]:
    """Figures 20-24 (test_bench_checkpoint.py): durable checkpoints vs pickle of a dict, an
    unaligned-style checkpoint's start vs draining first, and an incremental save vs a full one."""
    n = f"{BIG_LABEL} ValueState + MapState"
    return [
        Row("20", f"full checkpoint save, {n}", "ns/entry", "checkpoint.save", "checkpoint.pickle_dump",
            "pickle.dump of {int: int}, same disk", "ratio", 1.0),
        Row("20", f"full checkpoint save, {n} (>= 3M entries/s)", "ns/entry", "checkpoint.save",
            "checkpoint.pickle_dump", "pickle.dump of {int: int}, same disk", "abs", 1e9 / 3_000_000),
        Row("21", f"restore, {n}", "ns/entry", "checkpoint.restore", "checkpoint.pickle_load",
            "pickle.load of that dict", "ratio", 1.0),
        Row("21", f"restore, {n} (>= 2M entries/s)", "ns/entry", "checkpoint.restore", "checkpoint.pickle_load",
            "pickle.load of that dict", "abs", 1e9 / 2_000_000),
        Row("22", "records while save_async writes (>= 50% of the rate)", "ns/rec", "checkpoint.async_rate",
            "checkpoint.base_rate", "same loop, no checkpoint", "ratio", 2.0),
        Row("22", "longest stall of 1,000-record slices while save_async writes", "ms",
            "checkpoint.async_stall", "checkpoint.stall_limit", "the 20 ms limit", "abs", 20.0),
        Row("23", "unaligned checkpoint start, 10,000 records behind one key", "ms", "checkpoint.unaligned",
            "checkpoint.drain_first", "drain first, then save_async", "abs", 10.0),
        Row("24", f"incremental save after 1% changed, {n}: time", "ms", "checkpoint.incremental",
            "checkpoint.incremental_full", "that round's full save", "ratio", 0.05),
        Row("24", f"incremental save after 1% changed, {n}: bytes", "MB", "checkpoint.incremental_mb",
            "checkpoint.incremental_full_mb", "that round's full save", "ratio", 0.03),
    ]


def _timer_rows() -> list[Row]:
    """Figures 25-28 (test_bench_timers.py): 1M event-time timers over 100k keys vs heapq + dict."""
    rows = []
    for fig, f, label, unit, limit in (
        ("25", "register_ns", "register a timer", "ns/timer", 300.0),
        ("26", "delete_ns", "delete a timer", "ns/timer", 400.0),
        ("27", "fire_ns", "fire a timer (advance_watermark)", "ns/timer", 300.0),
        ("28", "bytes_per_timer", "memory per timer, keys excluded", "B", 64.0),
    ):
        alt = "heapq + dict, same semantics"
        rows.append(Row(fig, f"{label}, 1M timers/100k keys", unit, f"timers.{f}", f"timers.heapq_{f}", alt, "abs", limit))
        rows.append(Row(fig, f"{label}, 1M timers/100k keys", unit, f"timers.{f}", f"timers.heapq_{f}", alt, "ratio", 1.0))
    return rows


def _columnar_rows() -> list[Row]:
    """Figures 16-19 (test_bench_columnar.py): a pandas UDF's batches, 1M rows over 200k keys
    in calls of 10k, through the columnar state calls."""
    rows = []
    for fig, case, label, limit, loop_x in (
        ("16", "value_ttl", "ValueState get_many+update_many, TTL, int64 keys", 100.0, 6.0),
        ("16", "value", "ValueState get_many+update_many, no TTL, int64 keys", 100.0, 6.0),
        ("17", "value_str", "ValueState get_many+update_many, TTL, str keys", 300.0, None),
        ("18", "map_dedup", "MapState contains_many+put_many (dedup), TTL", 200.0, None),
        ("19", "reduce_add", "ReducingState(np.add) add_many, TTL", 100.0, None),
    ):
        k = f"columnar.{case}"
        rows.append(Row(fig, label, "ns/row", k, f"{k}.loop", "per-record loop, same rows", "abs", limit))
        if loop_x is not None:
            rows.append(Row(fig, label, "ns/row", k, f"{k}.loop", "per-record loop, same rows", "ratio", 1 / loop_x))
        rows.append(Row(fig, label, "ns/row", k, f"{k}.pandas", "pd.Series reindex+combine+write", "ratio", 1.0))
    return rows


def _async_rows() -> list[Row]:
    """Figures 12-15 (test_bench_async.py)."""
    n = "1M records/100k keys"
    return [
        Row("12", f"async core calls per 1,000 records, {n}", "calls", "async.calls_per_1000",
            "async.sync_calls_per_1000", "sync path (2 per record)", "abs", 10.0),
        Row("13", f"async ValueState get+update per record, {n}", "ns/rec", "async.ns_per_record",
            "async.sync_ns_per_record", "sync path, same records", "ratio", 3.0),
        Row("12", f"async MapState calls per 1,000 records, {n}", "calls", "async.map.calls_per_1000",
            "async.sync_calls_per_1000", "sync path (2 per record)", "abs", 10.0),
        Row("13", f"async MapState get+put per record, {n}", "ns/rec", "async.map.ns_per_record",
            "async.map.sync_ns_per_record", "sync path, same records", "ratio", 3.0),
        Row("14", "async time with 1 ms per state call, 2k records", "s", "async.latency.time",
            "async.latency.sync_time", "sync path, same latency", "ratio", 0.05),
        Row("15", "async hot key: 200k records of 1 key", "s", "async.hotkey.time",
            "async.hotkey.distinct_time", "200k records of distinct keys", "ratio", 3.0),
    ]


# Keyed-state figures 7-11 (test_bench_state.py). Figure 7: MapState with TTL at these entries
# per key; the key count is 5000, cut to MAP_MAX_ENTRIES // entries-per-key where that is less.
MAP_SIZES = (1, 10, 100, 1000, 10_000)
MAP_KEYS = 5000
MAP_MAX_ENTRIES = 50_000_000 if FULL else 5_000_000
#: Figure 7's control: entries per key 1 vs 10,000 at the same total (500k keys x 1, 50 x 10,000).
MAP_EQ_TOTAL = 500_000
#: Figure 8: MapState vs ValueState on the records of MAP_KEYS keys x this many user keys.
MAP_VS_VALUE_SIZE = 100
FLINK_MAPSTATE_NOTE = (
    "fig 7 reference, not measured here: Flink 2.3.0 heap backend, MapState.get with TTL, 5000 keys, "
    "random access, measured before this suite existed: 323 ns @1 entry/key, 1,207 @10, 10,705 @100, "
    "44,689 @400 (x138 from 1 to 400); python -m cowmap.bench --with-flink measures Flink live"
)


def map_keys_for(size: int) -> int:
    """Figure 7's key count at ``size`` entries per key."""
    return min(MAP_KEYS, MAP_MAX_ENTRIES // size)


def _state_rows() -> list[Row]:
    base = f"{map_keys_for(1):,} keys x 1/key, interleaved"
    rows = [
        Row("7", f"MapState TTL get/put, {map_keys_for(n):,} keys x {n:,}/key", "ns/acc", f"map.ttl@{n}",
            f"map.ttl@{n}.base", base, "ratio", 2.0, FLINK_MAPSTATE_NOTE)
        for n in MAP_SIZES[1:]
    ]
    eq = MAP_EQ_TOTAL
    rows += [
        Row("7", f"MapState TTL, {eq // 10_000} keys x 10,000/key (control)", "ns/acc", "map.ttl.eq@10000",
            "map.ttl.eq@1", f"{eq:,} keys x 1/key (same total)", "ratio", 2.0),
        Row("8", f"MapState TTL get/put, {MAP_KEYS:,} keys x {MAP_VS_VALUE_SIZE}/key", "ns/acc", "map_vs_value.map",
            "map_vs_value.value", "ValueState TTL, key (key, ukey)", "ratio", 1.5),
        Row("9", "ValueState value+update TTL, 1M keys, w/ set_key", "ns/rec", "value.ttl", "value.ttl.plain",
            "same without TTL, interleaved", "ratio", 1.5),
        Row("9", "same, TTL with the default (C wall) clock", "ns/rec", "value.ttl.wall", "value.ttl.wall.plain",
            "same without TTL, interleaved", "ratio", 1.5),
        Row("9", "ValueState value+update TTL, 1M keys, net of set_key", "ns/rec", "value.ttl.net",
            "value.plain.net", "same without TTL", "ratio", 1.5,
            "fig 9 'net of set_key': each figure minus the same run's loop of set_current_key alone"),
        Row("9", "ReducingState add(1) TTL, 1M keys, w/ set_key", "ns/rec", "reducing.ttl", "reducing.ttl.value",
            "ValueState TTL update(value() + 1), interleaved", "ratio", 1.0),
        Row("9", "AggregatingState add(1) TTL (a count), 1M keys, w/ set_key", "ns/rec", "aggregating.ttl",
            "aggregating.ttl.value", "ValueState TTL update(value() + 1), interleaved", "ratio", 1.2),
        Row("10", "ValueState value+update, 1M keys, w/ set_key", "ns/rec", "value.plain", "dict.counter",
            "d[k] = d.get(k, 0) + 1", "ratio", 2.0),
        Row("11", "backend snapshot() start, 1M entries, 128 kgs", "ms", "state.snapshot", "state.snapshot.dict_copy",
            "dict.copy() of {key: v}", "abs", 2.0),
    ]
    return rows


ROWS = _rows()


def _fmt(v: float | None, unit: str) -> str:
    if v is None:
        return "-"
    if v != v:
        return "nan"
    digits = 3 if abs(v) < 10 else 1
    return f"{v:,.{digits}f} {unit}"


def _fmt_ratio(ratio: float | None) -> str:
    if ratio is None:
        return "-"
    return f"{ratio:.2f}" if ratio >= 0.01 else f"{ratio:.1e}"


def render_summary(figs: Figures) -> list[str]:
    """The summary table as text lines (plus details), for the terminal."""
    header = ["#", "figure", "cowmap", "comparison", "compared with", "ratio", "target", "verdict"]
    table = []
    n_met = n_not = n_na = 0
    for r in ROWS:
        cow = figs.values.get(r.cow)
        other = figs.values.get(r.other)
        ratio = cow / other if cow is not None and other else None
        if r.kind == "ratio":
            target = f"ratio <= {r.target:g}"
            ok = None if ratio is None else ratio <= r.target
        else:
            target = f"<= {r.target:g} {r.unit}"
            ok = None if cow is None else cow <= r.target
            if ok and r.cow in figs.caveats and figs.caveats[r.cow][0] > r.target:
                ok = "inconclusive"
        if ok == "inconclusive":
            verdict = "inconclusive (lower bound)"
            n_na += 1
        elif ok is None:
            verdict = "not measured"
            n_na += 1
        elif ok:
            verdict = "met"
            n_met += 1
        else:
            verdict = "NOT met  <<<"
            n_not += 1
        cow_s = _fmt(cow, r.unit) + (" *" if r.cow in figs.caveats else "")
        table.append([r.fig, r.label, cow_s, _fmt(other, r.unit), r.other_label,
                      _fmt_ratio(ratio), target, verdict])
    widths = [max(len(row[i]) for row in [header] + table) for i in range(len(header))]
    right = {2, 3, 5}

    def line(cells: list[str]) -> str:
        padded = (c.rjust(w) if i in right else c.ljust(w) for i, (c, w) in enumerate(zip(cells, widths)))
        return "  ".join(padded).rstrip()

    out = [line(header), line(["-" * w for w in widths])]
    out += [line(row) for row in table]
    out.append(f"targets: {n_met} met, {n_not} NOT met, {n_na} not measured or inconclusive "
               f"(of {len(ROWS)} rows)")
    notes = list(dict.fromkeys(r.note for r in ROWS if r.note and r.cow in figs.values))
    if notes:
        out.append("notes:")
        out += [f"  {n}" for n in notes]
    if figs.caveats:
        out.append("* caveats: " + "; ".join(text for _, text in figs.caveats.values()))
    if figs.details:
        out.append("details:")
        out += [f"  {d}" for d in figs.details]
    return out
