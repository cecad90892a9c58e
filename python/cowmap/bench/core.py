"""The ``core`` scenario: CopyOnWriteStateMap against a Python dict, side by side."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

import numpy as np

from cowmap import CopyOnWriteStateMap


def _median_ns_per_op(fn: Callable[[], None], ops: int, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter_ns()
        fn()
        times.append((time.perf_counter_ns() - t0) / ops)
    return statistics.median(times)


def run_core(n: int = 1_000_000, repeats: int = 5, seed: int = 42) -> list[tuple[str, float, float, str]]:
    """Rows of (figure, cowmap ns, alternative ns, alternative name), measured in one run."""
    rng = np.random.default_rng(seed)
    keys_np = rng.integers(0, 2**62, size=n, dtype=np.int64)
    keys = keys_np.tolist()
    probe = rng.permutation(keys_np).tolist()
    ns = 0
    m = CopyOnWriteStateMap()
    d_tuple: dict = {}
    d_key: dict = {}
    for k in keys:
        m.put(k, ns, k)
        d_tuple[(k, ns)] = k
        d_key[k] = k
    get, put = m.get, m.put

    def cow_get() -> None:
        for k in probe:
            get(k, ns)

    def dict_tuple_get() -> None:
        for k in probe:
            d_tuple.get((k, ns))

    def dict_key_get() -> None:
        for k in probe:
            d_key.get(k)

    def cow_put() -> None:
        for k in probe:
            put(k, ns, k)

    def dict_tuple_put() -> None:
        for k in probe:
            d_tuple[(k, ns)] = k

    probe_np = np.asarray(probe, dtype=np.int64)

    def cow_get_many() -> None:
        m.get_many(probe_np, ns)

    def timed(op: Callable[[], None]) -> float:
        return _median_ns_per_op(op, n, repeats)

    rows = [
        ("get hit (ns/op)", timed(cow_get), timed(dict_tuple_get), "dict[(key, ns)]"),
        ("get hit (ns/op)", timed(cow_get), timed(dict_key_get), "dict[key]"),
        ("put hit (ns/op)", timed(cow_put), timed(dict_tuple_put), "dict[(key, ns)]"),
    ]
    try:
        import pandas as pd

        index = pd.Index(keys_np)
        rows.append(("batch get int64 (ns/key)", _median_ns_per_op(cow_get_many, n, repeats),
                     _median_ns_per_op(lambda: index.get_indexer(probe_np), n, repeats), "pandas khash get_indexer"))
    except ImportError:
        pass
    t0 = time.perf_counter_ns()
    snap = m.snapshot()
    snap_ns = time.perf_counter_ns() - t0
    snap.release()
    rows.append(("snapshot() start (us)", snap_ns / 1e3, float("nan"), "-"))
    return rows


def to_json(rows: list[tuple[str, float, float, str]], n: int, repeats: int) -> dict:
    """The ``--out`` document: one entry per row, as printed."""
    return {"scenario": "core", "format": 1, "keys": n, "repeats": repeats,
            "rows": [{"figure": name, "cowmap": round(ours, 1), "other": None if other != other else round(other, 1),
                      "other_is": what} for name, ours, other, what in rows]}


def plot_core(rows: list[tuple[str, float, float, str]], path: str, n: int) -> str | None:
    """Bars of cowmap against its alternative per figure (the rows with one); None, or why not."""
    from cowmap.bench.report import NO_MATPLOTLIB, pyplot

    plt = pyplot()
    if plt is None:
        return NO_MATPLOTLIB
    pairs = [r for r in rows if r[2] == r[2]]
    labels = [f"{name.split(' (')[0]}\nvs {what}" for name, _, _, what in pairs]
    y = np.arange(len(pairs))
    fig, ax = plt.subplots(figsize=(8, 0.8 * len(pairs) + 1.6))
    ax.barh(y - 0.2, [r[1] for r in pairs], height=0.4, label="cowmap", color="tab:blue")
    ax.barh(y + 0.2, [r[2] for r in pairs], height=0.4, label="the alternative", color="tab:gray")
    for i, (_, ours, other, _) in enumerate(pairs):
        ax.annotate(f"{ours:.0f}", (ours, i - 0.2), xytext=(3, 0), textcoords="offset points", va="center", fontsize=8)
        ax.annotate(f"{other:.0f}", (other, i + 0.2), xytext=(3, 0), textcoords="offset points", va="center",
                    fontsize=8)
    ax.set_yticks(y, labels, fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel("ns per operation (median)")
    snap = next((r[1] for r in rows if r[0].startswith("snapshot")), None)
    title = f"{n:,} random int64 keys" + (f"; snapshot() of them: {snap:,.0f} us" if snap is not None else "")
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=8, loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return None


def print_rows(rows: list[tuple[str, float, float, str]]) -> None:
    print(f"{'figure':28} {'cowmap':>10} {'other':>10} {'ratio':>7}  other is")
    for name, ours, other, what in rows:
        ratio = ours / other if other == other else float("nan")
        print(f"{name:28} {ours:10.1f} {other:10.1f} {ratio:7.2f}  {what}")
