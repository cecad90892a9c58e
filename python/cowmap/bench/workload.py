"""The ``ttl`` scenario's workload: settings, records, sweep points and batches.

Records are ``(group, user, value)``: group and user drawn uniformly (or Zipf-skewed) from
``groups x users`` of the sweep point, value uniform in 1..99, from ``numpy.random.default_rng
([seed, entries_per_key])`` — so every layout, and the Flink side (which reads the same records
from a file), replays the very same records at a sweep point.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import numpy as np

#: entries per key swept by default (a point above the total state size is dropped)
DEFAULT_SWEEP = (1, 10, 100, 1_000, 10_000)
LAYOUTS = ("value", "map")
TTL_MODES = ("off", "default", "every")
LAYOUT_LABELS = {"value": "ValueState(group,user)", "map": "MapState(group->user)"}
TTL_LABELS = {"off": "off", "default": "default cleanup", "every": "every-record cleanup"}
#: bytes per entry assumed when deciding which states may be in memory at once (measured: ~100-160
#: for ValueState, ~190 for MapState, up to ~390 for MapState at 1 entry/key)
PLAN_BYTES_PER_ENTRY = 400


@dataclasses.dataclass
class Settings:
    """What ``python -m cowmap.bench ttl`` measures (its command-line flags)."""

    groups: int = 20
    users_per_group: int = 10_000
    sweep: tuple[int, ...] = DEFAULT_SWEEP
    records: int = 40_000  # records per timed round (slow configs may time a prefix: round_budget_ms)
    repeats: int = 5
    warmup: int = 1  # warm-up passes per config before the timed rounds
    zipf: float | None = None
    seed: int = 42
    ttl_ms: int = 3_600_000  # nothing expires: the clock moves 1 ms per round
    layouts: tuple[str, ...] = LAYOUTS
    ttl_modes: tuple[str, ...] = TTL_MODES
    round_budget_ms: int = 2_000  # a round of one config times at most ~this long (min 200 records)
    min_records: int = 200
    flink_warmup_ms: int = 500  # JIT warm-up per Flink config
    full: bool = False

    @property
    def total(self) -> int:
        return self.groups * self.users_per_group

    def points(self) -> list[tuple[int, int, int]]:
        """``(entries_per_key, groups, users_per_group)`` per sweep point, at the fixed total
        ``groups x users_per_group`` (the point's groups are ``total // entries_per_key``)."""
        out = []
        for e in sorted(set(self.sweep) | {self.users_per_group}):
            if 1 <= e <= self.total:
                out.append((e, self.total // e, e))
        return out

    def to_json(self) -> dict:
        d = dataclasses.asdict(self)
        d["sweep"] = list(self.sweep)
        d["layouts"] = list(self.layouts)
        d["ttl_modes"] = list(self.ttl_modes)
        d["total_entries"] = self.total
        d["points"] = [{"entries_per_key": e, "groups": g, "users_per_group": u} for e, g, u in self.points()]
        return d


def _bounded_zipf(rng: np.random.Generator, n_values: int, size: int, s: float) -> np.ndarray:
    """``size`` draws from 0..n_values-1, P(rank k) ~ 1/k**s, ranks scattered over the ids."""
    if n_values == 1:
        return np.zeros(size, dtype=np.int64)
    w = 1.0 / np.arange(1, n_values + 1, dtype=np.float64) ** s
    cdf = np.cumsum(w)
    ranks = np.searchsorted(cdf, rng.random(size) * cdf[-1], side="right")
    np.minimum(ranks, n_values - 1, out=ranks)
    return rng.permutation(n_values)[ranks]


def make_records(st: Settings, entries_per_key: int, groups: int) -> np.ndarray:
    """An ``(records, 3)`` int32 array of ``(group, user, value)``."""
    rng = np.random.default_rng([st.seed, entries_per_key])
    n = st.records
    if st.zipf:
        g = _bounded_zipf(rng, groups, n, st.zipf)
        u = _bounded_zipf(rng, entries_per_key, n, st.zipf)
    else:
        g = rng.integers(0, groups, size=n)
        u = rng.integers(0, entries_per_key, size=n)
    v = rng.integers(1, 100, size=n)
    return np.stack([g, u, v], axis=1).astype("<i4")


def available_memory() -> int | None:
    """Bytes of RAM available now (Linux /proc/meminfo, else psutil), or None."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        import psutil

        return int(psutil.virtual_memory().available)
    except ImportError:
        return None


def plan_batches(st: Settings, entries: int, bytes_per_entry: int = PLAN_BYTES_PER_ENTRY,
                 avail: int | None = None) -> list[list[tuple[str, str]]]:
    """Groups of ``(layout, ttl mode)`` configs that are built and measured together (their
    timed rounds interleave, so machine noise hits them alike). All of a point's configs
    together when they fit in 60% of the available RAM, else one batch per layout, else one
    config per batch."""
    configs = [(lay, mode) for lay in st.layouts for mode in st.ttl_modes]
    if avail is None:
        avail = available_memory()
    budget = 0.6 * avail if avail else float("inf")
    per_state = entries * bytes_per_entry
    if len(configs) * per_state <= budget:
        return [configs]
    if len(st.ttl_modes) * per_state <= budget:
        return [[(lay, mode) for mode in st.ttl_modes] for lay in st.layouts]
    return [[c] for c in configs]


def units_per_batch(st: Settings, n_configs: int) -> int:
    """Progress units of one batch: a build, a warm-up and a check per config, one per round."""
    return 3 * n_configs + st.repeats


def cache_dir() -> Path:
    """Where the harness keeps compiled helpers (``$XDG_CACHE_HOME/cowmap`` or ~/.cache/cowmap)."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "cowmap"
