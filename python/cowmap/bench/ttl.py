"""The ``ttl`` scenario, cowmap side: ValueState vs MapState, TTL off / default / every record.

One record is a read-modify-write of the state of ``(group, user)``:

- **ValueState** keyed by the tuple ``(group, user)``:
  ``set_current_key((g, u)); state.update(state.value() + v)``;
- **MapState** keyed by ``group``, the user as map key:
  ``set_current_key(g); state.put(u, state.get(u) + v)``.

Every state is first filled with value 0 for all ``groups x users`` of the sweep point (so every
record hits an entry), each in its own ``KeyedStateBackend`` (``max_parallelism=128``) with a
manual clock that moves 1 ms per round; TTL is an hour, so nothing expires but every access pays
the TTL checks and cleanup steps. After the timed rounds every entry is read back: the entries
alive must equal ``groups x users`` and the values must sum to what the records added, or the row
is flagged (a layout that is fast because it loses state is caught).

A batch of configs (see ``workload.plan_batches``) runs in a forked child process on Linux, so
its memory figures start from a clean heap: ``mem_bytes`` is the RSS growth while filling a
state, ``peak_mem_bytes`` the high-water growth (``ru_maxrss``) during the fill.
"""

from __future__ import annotations

import functools
import gc
import os
import sys
import time
import traceback
from collections.abc import Callable
from datetime import timedelta
from typing import Any

from cowmap.bench.workload import Settings, make_records, plan_batches, units_per_batch
from cowmap.state import KeyedStateBackend, MapStateDescriptor, StateTtlConfig, ValueStateDescriptor

Emit = Callable[[tuple], None]


# ----------------------------------------------------------------------------------- layouts


def ttl_config(mode: str, ttl_ms: int) -> StateTtlConfig | None:
    if mode == "off":
        return None
    b = StateTtlConfig.new_builder(timedelta(milliseconds=ttl_ms))
    if mode == "every":
        b = b.cleanup_incrementally(5, run_cleanup_for_every_record=True)
    elif mode != "default":
        raise ValueError(f"unknown TTL mode {mode!r} (off, default, every)")
    return b.build()


class Layout:
    """How one state layout is filled, replayed and checked; subclass for another layout.

    ``name`` goes into the results (``"value"``, ``"map"``, or a test's own name).
    """

    name = ""

    def __init__(self, backend: KeyedStateBackend, ttl: StateTtlConfig | None) -> None:
        self.backend = backend
        self.ttl = ttl

    def fill(self, groups: int, users: int) -> None:
        raise NotImplementedError

    def replay(self, records: list[tuple[int, int, int]]) -> None:
        raise NotImplementedError

    def check(self, groups: int, users: int) -> tuple[int, int]:
        """``(entries alive, sum of their values)``, read through the state API."""
        raise NotImplementedError


class ValueLayout(Layout):
    name = "value"

    def __init__(self, backend: KeyedStateBackend, ttl: StateTtlConfig | None) -> None:
        super().__init__(backend, ttl)
        desc = ValueStateDescriptor("v")
        if ttl is not None:
            desc.enable_time_to_live(ttl)
        self.state = backend.get_state(desc)

    def fill(self, groups: int, users: int) -> None:
        sck, update = self.backend.set_current_key, self.state.update
        for g in range(groups):
            for u in range(users):
                sck((g, u))
                update(0)

    def replay(self, records: list[tuple[int, int, int]]) -> None:
        sck, value, update = self.backend.set_current_key, self.state.value, self.state.update
        for g, u, v in records:
            sck((g, u))
            update(value() + v)

    def check(self, groups: int, users: int) -> tuple[int, int]:
        sck, value = self.backend.set_current_key, self.state.value
        alive = total = 0
        for g in range(groups):
            for u in range(users):
                sck((g, u))
                x = value()
                if x is not None:
                    alive += 1
                    total += x
        return alive, total


class MapLayout(Layout):
    name = "map"

    def __init__(self, backend: KeyedStateBackend, ttl: StateTtlConfig | None) -> None:
        super().__init__(backend, ttl)
        desc = MapStateDescriptor("m")
        if ttl is not None:
            desc.enable_time_to_live(ttl)
        self.state = backend.get_map_state(desc)

    def fill(self, groups: int, users: int) -> None:
        sck, put_all = self.backend.set_current_key, self.state.put_all
        zeros = dict.fromkeys(range(users), 0)
        for g in range(groups):
            sck(g)
            put_all(zeros)

    def replay(self, records: list[tuple[int, int, int]]) -> None:
        sck, get, put = self.backend.set_current_key, self.state.get, self.state.put
        for g, u, v in records:
            sck(g)
            put(u, get(u) + v)

    def check(self, groups: int, users: int) -> tuple[int, int]:
        sck, items = self.backend.set_current_key, self.state.items
        alive = total = 0
        for g in range(groups):
            sck(g)
            for _, x in items():
                alive += 1
                total += x
        return alive, total


LAYOUT_CLASSES: dict[str, type[Layout]] = {"value": ValueLayout, "map": MapLayout}


# ------------------------------------------------------------------------------------ memory


def _rss() -> int:
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, AttributeError):
        pass
    try:
        import psutil

        return int(psutil.Process().memory_info().rss)
    except ImportError:
        return _maxrss()


def _maxrss() -> int:
    try:
        import resource
    except ImportError:  # Windows
        return 0
    r = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return r if sys.platform == "darwin" else r * 1024


# ------------------------------------------------------------------------------------ a batch


def run_batch(st: Settings, point: tuple[int, int, int], records: list[tuple[int, int, int]],
              configs: list[tuple[str, str]], classes: dict[str, type[Layout]], emit: Emit) -> None:
    """Build, warm up, time (rounds interleaved over ``configs``) and check; ``emit`` gets
    ``("progress", text)`` per unit of work and ``("row", dict)`` per config."""
    e, groups, users = point
    clock = [0]
    now = functools.partial(clock.__getitem__, 0)  # a C-level callable: no Python frame per call
    where = f"@{e:,}/key"
    states: list[dict[str, Any]] = []
    for layout, mode in configs:
        gc.collect()
        rss0 = _rss()
        backend = KeyedStateBackend(max_parallelism=128, time_provider=now)
        lay = classes[layout](backend, ttl_config(mode, st.ttl_ms))
        t0 = time.perf_counter()
        lay.fill(groups, users)
        build_s = time.perf_counter() - t0
        rss1 = _rss()
        states.append({"layout": layout, "ttl": mode, "obj": lay, "build_s": build_s,
                       "mem_bytes": max(0, rss1 - rss0), "peak_mem_bytes": max(0, rss1 - rss0, _maxrss() - rss0),
                       "n": len(records), "sum_expected": 0, "warmup_records": 0, "times": []})
        emit(("progress", f"cowmap build {layout} {mode} {where}"))
    gc.collect()
    if hasattr(gc, "freeze"):
        gc.freeze()  # the filled states are long-lived: keep the collector from walking them
    budget_ns = st.round_budget_ms * 1_000_000
    for s in states:
        # warm-up; the first pass also picks how many records fit in the round budget
        lay = s["obj"]
        clock[0] += 1
        t0 = time.perf_counter_ns()
        done, chunk = 0, max(1, st.min_records)
        while done < len(records):
            lay.replay(records[done:done + chunk])
            done = min(len(records), done + chunk)
            if done >= st.min_records and time.perf_counter_ns() - t0 > budget_ns:
                break
        s["n"] = done
        s["recs"] = records if done == len(records) else records[:done]
        s["sum_n"] = sum(r[2] for r in s["recs"])
        s["sum_expected"] += s["sum_n"]
        s["warmup_records"] += done
        for _ in range(st.warmup - 1):
            clock[0] += 1
            lay.replay(s["recs"])
            s["sum_expected"] += s["sum_n"]
            s["warmup_records"] += done
        emit(("progress", f"cowmap warm-up {s['layout']} {s['ttl']} {where}"))
    for rep in range(st.repeats):
        clock[0] += 1
        for s in states:
            replay, recs = s["obj"].replay, s["recs"]
            t0 = time.perf_counter_ns()
            replay(recs)
            s["times"].append((time.perf_counter_ns() - t0) / s["n"])
            s["sum_expected"] += s["sum_n"]
        emit(("progress", f"cowmap round {rep + 1}/{st.repeats} {where}"))
    for s in states:
        alive, total = s["obj"].check(groups, users)
        emit(("row", {
            "system": "cowmap", "layout": s["layout"], "ttl": s["ttl"], "entries_per_key": e,
            "groups": groups, "users_per_group": users, "records_per_round": s["n"],
            "warmup_records": s["warmup_records"], "ns_per_record": [round(t, 1) for t in s["times"]],
            "build_s": round(s["build_s"], 3), "mem_bytes": s["mem_bytes"], "peak_mem_bytes": s["peak_mem_bytes"],
            "alive": alive, "expected": groups * users, "value_sum": total, "value_sum_expected": s["sum_expected"],
        }))
        emit(("progress", f"cowmap check {s['layout']} {s['ttl']} {where}"))
    if hasattr(gc, "unfreeze"):
        gc.unfreeze()
    states.clear()
    gc.collect()


def _child(conn: Any, st: Settings, point: tuple[int, int, int], records: list[tuple[int, int, int]],
           configs: list[tuple[str, str]], classes: dict[str, type[Layout]]) -> None:
    try:
        run_batch(st, point, records, configs, classes, emit=conn.send)
        conn.send(("done",))
    except BaseException:  # noqa: BLE001 - reported to the parent, which carries on
        conn.send(("error", traceback.format_exc()))
    finally:
        conn.close()


def _fork_context() -> Any:
    if not sys.platform.startswith("linux"):
        return None
    import multiprocessing

    try:
        return multiprocessing.get_context("fork")
    except ValueError:
        return None


def run_cowmap(st: Settings, on_progress: Callable[[str], None] | None = None,
               layouts: dict[str, type[Layout]] | None = None) -> tuple[list[dict], list[str]]:
    """Every sweep point x layout x TTL mode; returns ``(rows, errors)``.

    ``layouts`` maps a layout name in ``st.layouts`` to its class (default: ValueState and
    MapState; tests pass their own).
    """
    classes = dict(LAYOUT_CLASSES, **(layouts or {}))
    progress = on_progress or (lambda _text: None)
    ctx = _fork_context()
    rows: list[dict] = []
    errors: list[str] = []
    for point in st.points():
        e, groups, _ = point
        records = [tuple(r) for r in make_records(st, e, groups).tolist()]
        for configs in plan_batches(st, st.total):
            got = _run_isolated(ctx, st, point, records, configs, classes, progress)
            rows += got[0]
            errors += got[1]
    return rows, errors


def _run_isolated(ctx: Any, st: Settings, point: tuple[int, int, int], records: list, configs: list,
                  classes: dict, progress: Callable[[str], None]) -> tuple[list[dict], list[str]]:
    rows: list[dict] = []
    errors: list[str] = []
    units = units_per_batch(st, len(configs))
    seen = 0

    def handle(msg: tuple) -> None:
        nonlocal seen
        if msg[0] == "progress":
            seen += 1
            progress(msg[1])
        elif msg[0] == "row":
            rows.append(msg[1])
        elif msg[0] == "error":
            errors.append(f"cowmap batch {configs} @{point[0]}/key failed:\n{msg[1]}")

    if ctx is None:  # no fork: in this process (memory figures then include reused heap)
        try:
            run_batch(st, point, records, configs, classes, handle)
        except Exception:  # noqa: BLE001
            handle(("error", traceback.format_exc()))
    else:
        parent, child = ctx.Pipe(duplex=False)
        proc = ctx.Process(target=_child, args=(child, st, point, records, configs, classes))
        proc.start()
        child.close()
        while True:
            try:
                msg = parent.recv()
            except EOFError:
                break
            if msg[0] == "done":
                break
            handle(msg)
        proc.join()
        if proc.exitcode not in (0, None) and not errors:
            errors.append(f"cowmap batch {configs} @{point[0]}/key: child process exited with code "
                          f"{proc.exitcode} (killed for lack of memory?)")
    for _ in range(units - seen):  # keep the bar's total right when a batch died early
        progress("")
    return rows, errors
