"""Results of the ``ttl`` scenario: per-row figures, the terminal tables, targets, JSON, plot.

Fields of a row (``rows`` in the JSON; one per system x layout x TTL mode x entries per key):
``system`` (cowmap | flink), ``layout`` (value | map), ``ttl`` (off | default | every),
``entries_per_key``, ``groups``, ``users_per_group``, ``records_per_round`` (records timed per
round; slow configs time a prefix of the point's records), ``ns_per_record`` (one figure per
timed round), ``ns_median``, ``ns_min``, ``ns_max``, ``records_per_s`` (from the median),
``build_s``, ``mem_bytes`` (cowmap: RSS growth while filling the state; Flink: live heap after
GC), ``peak_mem_bytes`` (cowmap: high-water RSS growth during the fill), ``bytes_per_entry``,
``alive`` and ``expected`` (entries read back vs ``groups x users``), ``value_sum`` and
``value_sum_expected``, and ``state_ok`` (alive == expected and the sums agree).
"""

from __future__ import annotations

import json
import statistics
import textwrap
from pathlib import Path
from typing import Any

from cowmap.bench.workload import LAYOUT_LABELS, TTL_LABELS

TTL_ORDER = {"off": 0, "default": 1, "every": 2}
SYSTEM_ORDER = {"cowmap": 0, "flink": 1}


def finish_row(r: dict) -> dict:
    """Adds the derived fields to a raw row (in place) and returns it."""
    t = r.get("ns_per_record") or []
    r["ns_median"] = round(statistics.median(t), 1) if t else None
    r["ns_min"] = min(t) if t else None
    r["ns_max"] = max(t) if t else None
    r["records_per_s"] = round(1e9 / r["ns_median"]) if r["ns_median"] else None
    r.setdefault("peak_mem_bytes", None)
    r["bytes_per_entry"] = round(r["mem_bytes"] / r["expected"], 1) if r.get("expected") else None
    r["state_ok"] = r["alive"] == r["expected"] and r["value_sum"] == r["value_sum_expected"]
    return r


def sort_key(r: dict) -> tuple:
    return (TTL_ORDER.get(r["ttl"], 9), r["entries_per_key"], SYSTEM_ORDER.get(r["system"], 9), r["layout"] != "value",
            r["layout"])


def _label(r: dict) -> str:
    return LAYOUT_LABELS.get(r["layout"], r["layout"])


def _fmt_int(x: float | None) -> str:
    return "-" if x is None else f"{x:,.0f}"


def _table(header: list[str], body: list[list[str]], right: set[int]) -> list[str]:
    widths = [max(len(row[i]) for row in [header] + body) for i in range(len(header))]

    def line(cells: list[str]) -> str:
        return "  ".join(c.rjust(w) if i in right else c.ljust(w)
                         for i, (c, w) in enumerate(zip(cells, widths))).rstrip()

    return [line(header), line(["-" * w for w in widths])] + [line(b) for b in body]


def rows_table(rows: list[dict]) -> list[str]:
    """One line per measured config."""
    header = ["system", "layout", "TTL", "entries/key", "keys", "ns/record", "min-max", "records/s",
              "MiB", "B/entry", "alive/expected"]
    body = []
    for r in sorted(rows, key=sort_key):
        ok = "ok" if r["state_ok"] else "LOST STATE <<<"
        keys = r["groups"] if r["layout"] != "value" else r["groups"] * r["users_per_group"]
        body.append([r["system"], _label(r), TTL_LABELS.get(r["ttl"], r["ttl"]), f"{r['entries_per_key']:,}",
                     f"{keys:,}", _fmt_int(r["ns_median"]), f"{_fmt_int(r['ns_min'])}-{_fmt_int(r['ns_max'])}",
                     _fmt_int(r["records_per_s"]), f"{r['mem_bytes'] / 2**20:,.1f}",
                     _fmt_int(r["bytes_per_entry"]), f"{r['alive']:,}/{r['expected']:,} {ok}"])
    return _table(header, body, {3, 4, 5, 6, 7, 8, 9})


def matrix_table(rows: list[dict]) -> list[str]:
    """Median ns/record: one line per system x layout x TTL, one column per entries/key."""
    es = sorted({r["entries_per_key"] for r in rows})
    lines: dict[tuple, dict[int, Any]] = {}
    for r in sorted(rows, key=lambda r: (TTL_ORDER.get(r["ttl"], 9), SYSTEM_ORDER.get(r["system"], 9),
                                         r["layout"] != "value", r["layout"])):
        lines.setdefault((r["system"], _label(r), TTL_LABELS.get(r["ttl"], r["ttl"])), {})[r["entries_per_key"]] = r
    header = ["ns/record (median)", "TTL"] + [f"{e:,}/key" for e in es]
    body = []
    for (system, label, ttl), by_e in lines.items():
        cells = []
        for e in es:
            row = by_e.get(e)
            cells.append("-" if row is None else _fmt_int(row["ns_median"]) + ("" if row["state_ok"] else "!"))
        body.append([f"{system} {label}", ttl] + cells)
    return _table(header, body, set(range(2, 2 + len(es))))


# ----------------------------------------------------------------------------------- targets


def _find(rows: list[dict], system: str, layout: str, ttl: str, e: int) -> dict | None:
    for r in rows:
        if (r["system"], r["layout"], r["ttl"], r["entries_per_key"]) == (system, layout, ttl, e) and r["ns_median"]:
            return r
    return None


def targets(rows: list[dict]) -> list[dict]:
    """The state-layout benchmark's targets (docs/benchmarks/ttl.md; default cleanup, same run), each
    with its figures and verdict (``met`` is None when the run did not measure what it needs)."""
    es = sorted({r["entries_per_key"] for r in rows if r["system"] == "cowmap"})
    out = []

    def add(name: str, limit: str, ratios: dict[int, float], met: bool | None, note: str = "") -> None:
        out.append({"target": name, "limit": limit, "ratios": {str(k): round(v, 2) for k, v in ratios.items()},
                    "met": met, "note": note})

    # 1. cowmap MapState: largest vs 1 entry/key
    lo = _find(rows, "cowmap", "map", "default", 1)
    hi = _find(rows, "cowmap", "map", "default", max(es)) if es else None
    if lo and hi and hi is not lo:
        ratio = hi["ns_median"] / lo["ns_median"]
        add(f"cowmap MapState ns/record at {max(es):,} vs 1 entry/key", "<= 2x", {max(es): ratio}, ratio <= 2,
            f"{hi['ns_median']:,.0f} vs {lo['ns_median']:,.0f} ns")
    else:
        add("cowmap MapState ns/record at 10,000 vs 1 entry/key", "<= 2x", {}, None, "needs 1 and >1 entries/key")
    # 2. MapState vs ValueState, same records, every point
    r2 = {}
    for e in es:
        m, v = _find(rows, "cowmap", "map", "default", e), _find(rows, "cowmap", "value", "default", e)
        if m and v:
            r2[e] = m["ns_median"] / v["ns_median"]
    add("cowmap MapState vs ValueState, same records (every point)", "<= 1.5x", r2,
        (max(r2.values()) <= 1.5) if r2 else None,
        f"worst {max(round(v, 2) for v in r2.values()):.2f}x" if r2 else "not measured")
    # 3. Flink MapState at 1,000/key vs cowmap MapState
    e3 = 1000 if 1000 in es else None
    f3, c3 = (None, None) if e3 is None else (_find(rows, "flink", "map", "default", e3),
                                               _find(rows, "cowmap", "map", "default", e3))
    if f3 and c3:
        ratio = f3["ns_median"] / c3["ns_median"]
        add("Flink heap MapState / cowmap MapState at 1,000 entries/key (cowmap faster by)", ">= 50x", {1000: ratio},
            ratio >= 50, f"Flink {f3['ns_median']:,.0f} vs cowmap {c3['ns_median']:,.0f} ns")
    else:
        add("Flink heap MapState / cowmap MapState at 1,000 entries/key (cowmap faster by)", ">= 50x", {}, None,
            "needs --with-flink and 1,000 entries/key in the sweep")
    # 4. cowmap ValueState vs Flink ValueState, every point
    r4 = {}
    for e in es:
        c, f = _find(rows, "cowmap", "value", "default", e), _find(rows, "flink", "value", "default", e)
        if c and f:
            r4[e] = c["ns_median"] / f["ns_median"]
    add("cowmap ValueState / Flink heap ValueState (every point)", "<= 3x", r4,
        (max(r4.values()) <= 3) if r4 else None,
        (f"worst {max(round(v, 2) for v in r4.values()):.2f}x, median {statistics.median(r4.values()):.2f}x"
         if r4 else "needs --with-flink"))
    return out


def targets_lines(ts: list[dict]) -> list[str]:
    out = ["targets (TTL with default cleanup, same run):"]
    for t in ts:
        verdict = "not measured" if t["met"] is None else ("met" if t["met"] else "NOT met")
        ratios = ", ".join(f"{float(v):.2f}x @{int(k):,}" for k, v in t["ratios"].items())
        out.append(f"  {t['target']}: {ratios or '-'} (target {t['limit']}) -> {verdict}"
                   + (f"; {t['note']}" if t["note"] else ""))
    return out


# ---------------------------------------------------------------------------------- outputs


def write_json(path: str | Path, doc: dict) -> None:
    Path(path).write_text(json.dumps(doc, indent=1) + "\n")


#: what a scenario's ``--plot`` says when it cannot draw
NO_MATPLOTLIB = "matplotlib is not installed (pip install 'cowmap[plot]' or matplotlib): no plot written"


def pyplot() -> Any:
    """matplotlib's pyplot on the Agg backend (files, no display), or None without matplotlib."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    return plt


def plot(rows: list[dict], path: str | Path, title: str = "") -> str | None:
    """Writes the PNG; returns None, or why it could not (matplotlib missing)."""
    plt = pyplot()
    if plt is None:
        return NO_MATPLOTLIB
    modes = [m for m in TTL_ORDER if any(r["ttl"] == m for r in rows)]
    width = max(5.2 * len(modes), 6.5)
    fig, axes = plt.subplots(1, len(modes), figsize=(width, 4.8), sharey=True, squeeze=False)
    styles = {("cowmap", "value"): ("tab:blue", "o", "-"), ("cowmap", "map"): ("tab:green", "s", "-"),
              ("flink", "value"): ("tab:orange", "o", "--"), ("flink", "map"): ("tab:red", "s", "--")}
    for ax, mode in zip(axes[0], modes):
        series: dict[tuple[str, str], list[dict]] = {}
        for r in sorted(rows, key=lambda r: r["entries_per_key"]):
            if r["ttl"] == mode and r["ns_median"]:
                series.setdefault((r["system"], r["layout"]), []).append(r)
        by_system = sorted(series.items(), key=lambda kv: (SYSTEM_ORDER.get(kv[0][0], 9), kv[0][1] != "value"))
        for (system, layout), rs in by_system:
            color, marker, ls = styles.get((system, layout), (None, "^", ":"))
            x = [r["entries_per_key"] for r in rs]
            y = [r["ns_median"] for r in rs]
            err = [[r["ns_median"] - r["ns_min"] for r in rs], [r["ns_max"] - r["ns_median"] for r in rs]]
            ax.errorbar(x, y, yerr=err, color=color, marker=marker, linestyle=ls, capsize=3,
                        label=f"{system} {LAYOUT_LABELS.get(layout, layout)}")
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_title(f"TTL {TTL_LABELS.get(mode, mode)}")
        ax.set_xlabel("entries per key (fixed total state size)")
        ax.grid(True, which="both", alpha=0.3)
    axes[0][0].set_ylabel("ns per record (median, min-max bars)")
    axes[0][0].legend(fontsize=8)
    if title:
        fig.suptitle(textwrap.fill(title, int(12 * width)), fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return None
