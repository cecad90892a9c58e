"""The ``columnar`` scenario: a pandas UDF's view of keyed state, a column at a time.

What a PySpark pandas UDF sees: 1,000,000 rows over 200,000 keys, in calls of 10,000 rows.
Each case runs every row once through cowmap's columnar twins, through the per-record loop they
replace (``set_current_key`` per row; on a prefix of the rows, since it is slow), and through
the pandas way (the state kept in a ``pd.Series`` indexed by key: look the batch up, combine,
write back), all on the same rows in the same run. Figures are ns per row, medians of the
repeats; the loop and pandas rounds alternate with cowmap's, so drifting load hits all three.

Cases:
  value_ttl   ValueState read-modify-write (``get_many`` + ``update_many``), TTL on (default
              cleanup); int64 keys
  value       the same without TTL
  value_str   the same with TTL and string keys of 10-20 characters
  map_dedup   MapState ``contains_many`` + ``put_many`` of the rows not yet seen (dedup of
              (key, item) pairs), TTL on
  reduce_add  ReducingState(np.add) ``add_many`` (grouping within the call included), TTL on
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import numpy as np

from cowmap.state import (
    KeyedStateBackend,
    MapStateDescriptor,
    ReducingStateDescriptor,
    StateTtlConfig,
    ValueStateDescriptor,
)

ROWS = 1_000_000
KEYS = 200_000
CALL = 10_000
#: rows the per-record loop runs per round (ns/row is what is compared)
LOOP_ROWS = 200_000
CASES = ("value_ttl", "value", "value_str", "map_dedup", "reduce_add")
#: per case: the target on cowmap's ns/row, and the least speed-up over the loop (None: none set)
TARGETS: dict[str, tuple[float, float | None]] = {
    "value_ttl": (100.0, 6.0),
    "value": (100.0, 6.0),
    "value_str": (300.0, None),
    "map_dedup": (200.0, None),
    "reduce_add": (100.0, None),
}


@dataclass
class Data:
    """The rows: int64 keys, string keys (10-20 chars) and int64 values, from a fixed seed."""

    keys: np.ndarray
    str_keys: np.ndarray  # object array of str
    items: np.ndarray  # MapState user keys
    values: np.ndarray
    all_keys: np.ndarray
    all_str_keys: np.ndarray


def make_data(rows: int = ROWS, keys: int = KEYS, seed: int = 42) -> Data:
    rng = np.random.default_rng(seed)
    all_keys = rng.permutation(np.arange(keys, dtype=np.int64) * 7919 + 1_000_003)
    idx = rng.integers(0, keys, size=rows)
    lengths = rng.integers(10, 21, size=keys)
    # unique 10-char prefixes, padded to 10-20 chars
    all_str = np.array([f"u{k:08x}-".ljust(int(n), "~") for k, n in zip(all_keys.tolist(), lengths)], dtype=object)
    return Data(all_keys[idx], all_str[idx], rng.integers(0, 50, size=rows, dtype=np.int64),
                rng.integers(0, 100, size=rows, dtype=np.int64), all_keys, all_str)


def _ttl() -> StateTtlConfig:
    return StateTtlConfig.new_builder(timedelta(hours=1)).build()


class _Clock:
    def __init__(self) -> None:
        self.now = 1_000

    def __call__(self) -> int:
        return self.now


@dataclass
class Case:
    """One case: ``cowmap()``, ``loop()`` and ``pandas()`` each run their rows once."""

    name: str
    cowmap: Callable[[], None]
    loop: Callable[[], None] | None
    pandas: Callable[[], None]
    loop_rows: int = LOOP_ROWS
    #: whether cowmap's state equals the pandas side's, both having run the same rounds
    check: Callable[[], bool] = field(default=lambda: True)


def _calls(n: int) -> range:
    return range(0, n, CALL)


def _value_case(d: Data, name: str) -> Case:
    import pandas as pd

    ttl = name != "value"
    keys, universe = (d.str_keys, d.all_str_keys) if name == "value_str" else (d.keys, d.all_keys)
    clock = _Clock()
    backends = []
    states = []
    for _ in range(2):  # one for the columnar calls, one for the loop
        b = KeyedStateBackend(time_provider=clock)
        desc = ValueStateDescriptor("v", default_value=0)
        if ttl:
            desc.enable_time_to_live(_ttl())
        s = b.get_state(desc)
        s.update_many(universe, np.zeros(len(universe), dtype=np.int64))
        backends.append(b)
        states.append(s)
    col, loop_state = states
    loop_keys = keys[:LOOP_ROWS].tolist()
    series = pd.Series(np.zeros(len(universe), dtype=np.int64), index=pd.Index(universe))

    def cowmap(col: Any = col, keys: np.ndarray = keys) -> None:
        for i in _calls(len(keys)):
            k = keys[i : i + CALL]
            col.update_many(k, col.get_many(k, dtype=np.int64) + 1)

    def loop(sck: Any = backends[1].set_current_key, value: Any = loop_state.value,
             update: Any = loop_state.update, keys: list[Any] = loop_keys) -> None:
        for k in keys:
            sck(k)
            update(value() + 1)

    def pandas_way(keys: np.ndarray = keys) -> None:
        nonlocal series
        for i in _calls(len(keys)):
            k = keys[i : i + CALL]
            cur = series.reindex(k, fill_value=0)  # look up
            new = cur.to_numpy() + 1  # combine
            series.loc[k] = new  # write back

    def check() -> bool:
        return bool((col.get_many(universe, dtype=np.int64) == series.to_numpy()).all())

    return Case(name, cowmap, loop, pandas_way, len(loop_keys), check)


def _map_case(d: Data) -> Case:
    import pandas as pd

    clock = _Clock()
    backends, states = [], []
    for _ in range(2):
        b = KeyedStateBackend(time_provider=clock)
        desc = MapStateDescriptor("seen")
        desc.enable_time_to_live(_ttl())
        backends.append(b)
        states.append(b.get_map_state(desc))
    col, loop_state = states
    loop_pairs = list(zip(d.keys[:LOOP_ROWS].tolist(), d.items[:LOOP_ROWS].tolist()))
    seen = pd.MultiIndex.from_arrays([np.empty(0, dtype=np.int64), np.empty(0, dtype=np.int64)])

    def cowmap(col: Any = col, keys: np.ndarray = d.keys, items: np.ndarray = d.items) -> None:
        for i in _calls(len(keys)):
            k, u = keys[i : i + CALL], items[i : i + CALL]
            new = ~col.contains_many(k, u)
            if new.any():
                col.put_many(k[new], u[new], np.ones(int(new.sum()), dtype=np.int64))

    def loop(sck: Any = backends[1].set_current_key, contains: Any = loop_state.contains,
             put: Any = loop_state.put, pairs: list[tuple[int, int]] = loop_pairs) -> None:
        for k, u in pairs:
            sck(k)
            if not contains(u):
                put(u, 1)

    def pandas_way(keys: np.ndarray = d.keys, items: np.ndarray = d.items) -> None:
        nonlocal seen
        for i in _calls(len(keys)):
            mi = pd.MultiIndex.from_arrays([keys[i : i + CALL], items[i : i + CALL]])
            new = mi[~mi.isin(seen)]
            if len(new):
                seen = seen.append(new.unique())

    def check() -> bool:
        return bool(col.contains_many(seen.get_level_values(0).to_numpy(), seen.get_level_values(1).to_numpy()).all()
                    and sum(len(s.items()) for s in _each_key(backends[0], col, np.unique(d.keys))) == len(seen))

    return Case("map_dedup", cowmap, loop, pandas_way, len(loop_pairs), check)


def _reduce_case(d: Data) -> Case:
    import pandas as pd

    clock = _Clock()
    backends, states = [], []
    for _ in range(2):
        b = KeyedStateBackend(time_provider=clock)
        desc = ReducingStateDescriptor("sum", np.add)
        desc.enable_time_to_live(_ttl())
        backends.append(b)
        states.append(b.get_reducing_state(desc))
    col, loop_state = states
    loop_rows = list(zip(d.keys[:LOOP_ROWS].tolist(), d.values[:LOOP_ROWS].tolist()))
    series = pd.Series(np.zeros(len(d.all_keys), dtype=np.int64), index=pd.Index(d.all_keys))

    def cowmap(col: Any = col, keys: np.ndarray = d.keys, values: np.ndarray = d.values) -> None:
        for i in _calls(len(keys)):
            col.add_many(keys[i : i + CALL], values[i : i + CALL])

    def loop(sck: Any = backends[1].set_current_key, add: Any = loop_state.add,
             rows: list[tuple[int, int]] = loop_rows) -> None:
        for k, v in rows:
            sck(k)
            add(v)

    def pandas_way(keys: np.ndarray = d.keys, values: np.ndarray = d.values) -> None:
        for i in _calls(len(keys)):
            g = pd.Series(values[i : i + CALL]).groupby(keys[i : i + CALL]).sum()
            cur = series.reindex(g.index, fill_value=0)
            series.loc[g.index] = cur.to_numpy() + g.to_numpy()

    def check() -> bool:
        return bool((col.get_many(d.all_keys, dtype=np.int64, default=0) == series.to_numpy()).all())

    return Case("reduce_add", cowmap, loop, pandas_way, len(loop_rows), check)


def _each_key(backend: KeyedStateBackend, state: Any, keys: np.ndarray) -> Any:
    """``state`` with each of ``keys`` current in turn (for the checks)."""
    for k in keys.tolist():
        backend.set_current_key(k)
        yield state


def make_case(name: str, d: Data) -> Case:
    if name.startswith("value"):
        return _value_case(d, name)
    if name == "map_dedup":
        return _map_case(d)
    if name == "reduce_add":
        return _reduce_case(d)
    raise ValueError(f"unknown case {name!r}; expected one of {', '.join(CASES)}")


class Interleaved:
    """A comparison timed between the measured rounds of another side (its first
    run is a warm-up): drifting load then hits both sides alike."""

    def __init__(self, fn: Callable[[], None]) -> None:
        self.fn: Callable[[], None] = fn
        self.times: list[float] = []

    def __call__(self) -> None:
        t0 = time.perf_counter()
        self.fn()
        self.times.append(time.perf_counter() - t0)

    def median(self) -> float:
        return statistics.median(self.times[1:] or self.times)


def _timed(fn: Callable[[], None]) -> float:
    t0 = time.perf_counter_ns()
    fn()
    return time.perf_counter_ns() - t0


def measure(case: Case, rows: int, repeats: int) -> dict[str, Any]:
    """One warm-up and ``repeats`` timed rounds of each side, alternating; ns per row."""
    case.cowmap()
    if case.loop is not None:
        case.loop()
    case.pandas()
    cow: list[float] = []
    loop: list[float] = []
    pd_: list[float] = []
    for _ in range(repeats):
        cow.append(_timed(case.cowmap) / rows)
        if case.loop is not None:
            loop.append(_timed(case.loop) / case.loop_rows)
        pd_.append(_timed(case.pandas) / rows)
    target, speedup = TARGETS[case.name]
    cow_ns = statistics.median(cow)
    loop_ns = statistics.median(loop) if loop else None
    pandas_ns = statistics.median(pd_)
    loop_x = loop_ns / cow_ns if loop_ns is not None else None
    met = cow_ns <= target and pandas_ns / cow_ns > 1.0
    if speedup is not None and loop_x is not None:
        met = met and loop_x >= speedup
    out: dict[str, Any] = {"case": case.name, "cowmap_ns": cow_ns, "cowmap_spread": [min(cow), max(cow)],
                           "loop_ns": loop_ns, "pandas_ns": pandas_ns, "target_ns": target,
                           "min_speedup": speedup, "loop_speedup": loop_x, "pandas_speedup": pandas_ns / cow_ns,
                           "state_ok": case.check()}
    out["met"] = met
    return out


def run_columnar(cases: tuple[str, ...] = CASES, repeats: int = 5, rows: int = ROWS,
                 progress: Callable[[str], Any] | None = None) -> list[dict[str, Any]]:
    d = make_data(rows)
    out = []
    for name in cases:
        case = make_case(name, d)
        out.append(measure(case, rows, repeats))
        if progress:
            progress(name)
        del case
    return out


def print_columnar(rows: list[dict[str, Any]]) -> None:
    print(f"{'case':<11} {'cowmap ns/row':>14} {'loop ns/row':>12} {'x loop':>7} {'pandas ns/row':>14} "
          f"{'x pandas':>9} {'target':>16}  verdict")
    for r in rows:
        loop = f"{r['loop_ns']:>12,.0f}" if r["loop_ns"] is not None else f"{'-':>12}"
        lx = f"{r['loop_speedup']:>7.1f}" if r["loop_speedup"] is not None else f"{'-':>7}"
        tgt = f"<= {r['target_ns']:.0f} ns" + (f", >= {r['min_speedup']:.0f}x" if r["min_speedup"] else "")
        verdict = "met" if r["met"] else "NOT met"
        if not r["state_ok"]:
            verdict += ", STATE DIFFERS from the pandas side's: figures do not count"
        print(f"{r['case']:<11} {r['cowmap_ns']:>14,.1f} {loop} {lx} {r['pandas_ns']:>14,.0f} "
              f"{r['pandas_speedup']:>9.1f} {tgt:>16}  {verdict}")


def plot_columnar(rows: list[dict[str, Any]], path: str) -> str | None:
    """A bar chart of ns/row per case, cowmap vs loop vs pandas (log scale); None, or why not."""
    from cowmap.bench.report import NO_MATPLOTLIB, pyplot

    plt = pyplot()
    if plt is None:
        return NO_MATPLOTLIB
    names = [r["case"] for r in rows]
    x = np.arange(len(names))
    fig, ax = plt.subplots(figsize=(8, 4.5))
    for off, key, label in ((-0.27, "cowmap_ns", "cowmap columnar"), (0.0, "loop_ns", "per-record loop"),
                            (0.27, "pandas_ns", "pandas Series")):
        ax.bar(x + off, [r[key] or 0 for r in rows], width=0.27, label=label)
    ax.set_xticks(x, names)
    ax.set_yscale("log")
    ax.set_ylabel("ns per row (log)")
    ax.set_title(f"{ROWS:,} rows over {KEYS:,} keys in calls of {CALL:,}")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return None


def run_flink_value(keys: int = KEYS, repeats: int = 5) -> tuple[dict[str, Any] | None, str]:
    """Flink 2.3's heap ValueState with TTL (default cleanup), read-modify-write per
    record over ``keys`` keys (the ``ttl`` scenario's value layout at one user per
    group), for the ``--with-flink`` row: ``(row or None, message)``."""
    from cowmap.bench import flink, report
    from cowmap.bench.workload import Settings

    paths, msg = flink.check()
    if not paths:
        return None, msg
    st = Settings(groups=keys, users_per_group=1, sweep=(1,), layouts=("value",), ttl_modes=("default",),
                  repeats=repeats, records=200_000)
    try:
        rows, errors = flink.run_flink(st, paths)
    except (OSError, RuntimeError) as e:
        return None, f"Flink side failed: {e}"
    if not rows:
        return None, "; ".join(errors) or "the Flink side gave no result"
    return report.finish_row(rows[0]), ""


def flink_line(cow: dict[str, Any], flink_row: dict[str, Any]) -> str:
    """The ``--with-flink`` verdict: cowmap's columnar ValueState TTL vs Flink per record."""
    ratio = flink_row["ns_median"] / cow["cowmap_ns"]
    return (f"Flink 2.3 heap ValueState, TTL, per record over {KEYS:,} keys: {flink_row['ns_median']:,.1f} ns/record; "
            f"cowmap columnar {cow['cowmap_ns']:,.1f} ns/row: {ratio:.1f}x faster (target >= 5x: "
            f"{'met' if ratio >= 5 else 'NOT met'})")
