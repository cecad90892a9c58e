"""Timer benchmark: register, delete and fire 1,000,000 event-time timers over 100,000 keys.

cowmap's ``TimerService`` (the keys' timers registered with each key current, as a
record's processing would) against :class:`HeapqTimers`, the obvious pure-Python
service of the same semantics (``heapq`` + a dict for one timer per key,
namespace and time), in the same run. Figures are per timer, from Python; memory
is what the service holds per timer (tracemalloc), the key objects excluded.
"""

from __future__ import annotations

import gc
import heapq
import itertools
import random
import statistics
import time
import tracemalloc
from collections.abc import Callable
from typing import Any

from cowmap.state.backend import KeyedStateBackend

TARGETS = {"register_ns": 300.0, "delete_ns": 400.0, "fire_ns": 300.0, "bytes_per_timer": 64.0}
KEYS = 100_000
PER_KEY = 10

__all__ = ["TARGETS", "HeapqTimers", "report", "run"]


class HeapqTimers:
    """Event-time timers with ``heapq`` and a dict: one timer per (key, namespace,
    ts). Heap entries are tuples ``(ts, seq, key, namespace)``; the dict maps a
    live timer to its entry's ``seq``, so delete is lazy (a dict pop; the entry is
    skipped when it surfaces), the usual way with ``heapq``. ``advance_watermark``
    fires due timers in timestamp order (registration order among equal ones)."""

    def __init__(self, on_timer: Callable[[int, Any, Any], object]) -> None:
        self.heap: list[tuple[int, int, Any, Any]] = []
        self.live: dict[tuple[Any, Any, int], int] = {}
        self.seq = itertools.count()
        self.on_timer = on_timer
        self.watermark = -(1 << 63)

    def register(self, key: Any, ts: int, namespace: Any = None) -> None:
        k = (key, namespace, ts)
        if k not in self.live:
            seq = self.live[k] = next(self.seq)
            heapq.heappush(self.heap, (ts, seq, key, namespace))

    def delete(self, key: Any, ts: int, namespace: Any = None) -> None:
        self.live.pop((key, namespace, ts), None)

    def advance_watermark(self, wm: int) -> int:
        if wm <= self.watermark:
            return 0
        self.watermark = wm
        heap, live, n = self.heap, self.live, 0
        while heap and heap[0][0] <= wm:
            ts, seq, key, ns = heapq.heappop(heap)
            k = (key, ns, ts)
            if live.get(k) == seq:
                del live[k]
                self.on_timer(ts, key, ns)
                n += 1
        return n

    def __len__(self) -> int:
        return len(self.live)


def _on_timer(ts: int, key: Any, namespace: Any, domain: Any = None) -> None:
    pass


def _workload(seed: int, keys: int = KEYS, per_key: int = PER_KEY) -> tuple[list[int], list[list[int]]]:
    """Keys in random order, each with ``per_key`` random timestamps."""
    r = random.Random(seed)
    ks = list(range(keys))
    r.shuffle(ks)
    return ks, [[r.randrange(1 << 40) for _ in range(per_key)] for _ in ks]


Keys = list[int]
Times = list[list[int]]


class _Cowmap:
    """cowmap's side of a round: each key current while its timers are set, as
    a record's processing would have it."""

    def __init__(self) -> None:
        b = KeyedStateBackend()
        self.svc = b.get_timer_service("bench", _on_timer)
        self.sck = b.set_current_key

    def register_all(self, keys: Keys, times: Times) -> None:
        self._each(keys, times, self.svc.register_event_time_timer)

    def delete_all(self, keys: Keys, times: Times) -> None:
        self._each(keys, times, self.svc.delete_event_time_timer)

    def _each(self, keys: Keys, times: Times, op: Callable[[int], None]) -> None:
        """``op(t)`` for every timer, its key current (``op`` a local: no extra lookup per timer)."""
        sck = self.sck
        for k, ts in zip(keys, times):
            sck(k)
            for t in ts:
                op(t)

    def __len__(self) -> int:
        return self.svc.num_event_time_timers()

    def refill(self) -> _Cowmap:
        return self  # its timers all deleted: fire what is registered again

    def fire_all(self) -> int:
        return self.svc.advance_watermark(1 << 40)


class _Heapq:
    """The heapq + dict side of a round: the key is an argument."""

    def __init__(self) -> None:
        self.svc = HeapqTimers(_on_timer)

    def register_all(self, keys: Keys, times: Times) -> None:
        self._each(keys, times, self.svc.register)

    def delete_all(self, keys: Keys, times: Times) -> None:
        self._each(keys, times, self.svc.delete)

    @staticmethod
    def _each(keys: Keys, times: Times, op: Callable[[Any, int], None]) -> None:
        for k, ts in zip(keys, times):
            for t in ts:
                op(k, t)

    def __len__(self) -> int:
        return len(self.svc)

    def refill(self) -> _Heapq:
        return _Heapq()  # a fresh one: the lazily deleted entries would be skipped, not fired

    def fire_all(self) -> int:
        return self.svc.advance_watermark(1 << 40)


def _round(make: Callable[[], _Cowmap | _Heapq], keys: Keys, times: Times) -> dict[str, float]:
    """ns per timer to register every timer, delete every timer, and (registered
    again) fire them all with one advance."""
    side = make()
    n = sum(map(len, times))
    gc.collect()
    t0 = time.perf_counter()
    side.register_all(keys, times)
    t1 = time.perf_counter()
    if len(side) != n:
        raise AssertionError(f"{len(side)} timers registered of {n}")
    t2 = time.perf_counter()
    side.delete_all(keys, times)
    t3 = time.perf_counter()
    if len(side) != 0:
        raise AssertionError("timers left after deleting them all")
    side = side.refill()
    side.register_all(keys, times)
    t4 = time.perf_counter()
    fired = side.fire_all()
    t5 = time.perf_counter()
    if fired != n:
        raise AssertionError(f"fired {fired} of {n}")
    return {"register_ns": (t1 - t0) / n * 1e9, "delete_ns": (t3 - t2) / n * 1e9,
            "fire_ns": (t5 - t4) / n * 1e9}


def _memory(make: Callable[[], _Cowmap | _Heapq], keys: Keys, times: Times) -> float:
    """Bytes per timer that registering every timer allocates (tracemalloc), keys excluded."""
    gc.collect()
    tracemalloc.start()
    m0 = tracemalloc.get_traced_memory()[0]
    side = make()
    side.register_all(keys, times)
    mem = tracemalloc.get_traced_memory()[0] - m0
    tracemalloc.stop()
    del side
    return mem / sum(map(len, times))


def run(repeats: int = 5, keys: int = KEYS, per_key: int = PER_KEY, seed: int = 11,
        log: Callable[[str], None] = print) -> dict[str, Any]:
    """Alternating rounds of cowmap and heapq on the same workload; medians per figure."""
    ks, times = _workload(seed, keys, per_key)
    rounds: dict[str, list[dict[str, float]]] = {"cowmap": [], "heapq": []}
    for r in range(repeats):
        for name, make in (("cowmap", _Cowmap), ("heapq", _Heapq)):
            rounds[name].append(_round(make, ks, times))
            gc.collect()
        c, h = rounds["cowmap"][-1], rounds["heapq"][-1]
        log(f"  round {r + 1}: " + ", ".join(
            f"{f} {c[f]:.0f} vs {h[f]:.0f}" for f in ("register_ns", "delete_ns", "fire_ns")))
    for name, make in (("cowmap", _Cowmap), ("heapq", _Heapq)):
        mem = _memory(make, ks, times)
        for x in rounds[name]:
            x["bytes_per_timer"] = mem  # deterministic: measured once
    med = {name: {f: statistics.median(x[f] for x in rs) for f in TARGETS} for name, rs in rounds.items()}
    spread = {name: {f: (min(x[f] for x in rs), max(x[f] for x in rs)) for f in TARGETS}
              for name, rs in rounds.items()}
    return {"timers": keys * per_key, "keys": keys, "repeats": repeats, "median": med, "spread": spread,
            "raw": rounds}


def report(res: dict[str, Any]) -> list[str]:
    c, h = res["median"]["cowmap"], res["median"]["heapq"]
    cs = res["spread"]["cowmap"]
    lines = [f"timers: {res['timers']:,} event-time timers over {res['keys']:,} keys, median of {res['repeats']} "
             f"rounds (cowmap's spread in brackets)"]
    for f, label, unit in (("register_ns", "register", "ns"), ("delete_ns", "delete", "ns"),
                           ("fire_ns", "fire", "ns"), ("bytes_per_timer", "memory", "B/timer")):
        ok_target = c[f] <= TARGETS[f]
        ok_vs = c[f] < h[f]
        lines.append(
            f"  {label:<8} {c[f]:7.0f} {unit} [{cs[f][0]:.0f}-{cs[f][1]:.0f}] (target <= {TARGETS[f]:.0f}: "
            f"{'met' if ok_target else 'NOT met'}); heapq + dict {h[f]:7.0f} {unit} -> {h[f] / c[f]:.2f}x "
            f"({'met' if ok_vs else 'NOT met'})")
    return lines


def plot(res: dict[str, Any], path: str) -> str | None:
    """ns per timer for register, delete and fire, and bytes per timer, cowmap against
    ``heapq`` + dict (medians, cowmap's min-max as bars); None, or why not."""
    from cowmap.bench.report import NO_MATPLOTLIB, pyplot

    plt = pyplot()
    if plt is None:
        return NO_MATPLOTLIB
    c, h, cs = res["median"]["cowmap"], res["median"]["heapq"], res["spread"]["cowmap"]
    fig, axes = plt.subplots(1, 2, figsize=(10, 4), gridspec_kw={"width_ratios": [3, 1]})
    for ax, figures, unit in ((axes[0], ("register_ns", "delete_ns", "fire_ns"), "ns per timer (median)"),
                              (axes[1], ("bytes_per_timer",), "bytes per timer")):
        xs = list(range(len(figures)))
        err = [[c[f] - cs[f][0] for f in figures], [cs[f][1] - c[f] for f in figures]]
        ax.bar([x - 0.2 for x in xs], [c[f] for f in figures], width=0.4, yerr=err, capsize=3,
               label="cowmap TimerService", color="tab:blue")
        ax.bar([x + 0.2 for x in xs], [h[f] for f in figures], width=0.4, label="heapq + dict", color="tab:gray")
        for x, f in zip(xs, figures):  # each label above its bar (and cowmap's above its min-max bar)
            for off, v, top in ((-0.2, c[f], cs[f][1]), (0.2, h[f], h[f])):
                ax.annotate(f"{v:,.0f}", (x + off, max(v, top)), xytext=(0, 2), textcoords="offset points",
                            ha="center", fontsize=8)
        ax.set_xticks(xs, [f.split("_")[0] if f != "bytes_per_timer" else "memory" for f in figures])
        ax.set_ylabel(unit)
    axes[0].legend(fontsize=8)
    fig.suptitle(f"{res['timers']:,} event-time timers over {res['keys']:,} keys, median of {res['repeats']} rounds",
                 fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return None
