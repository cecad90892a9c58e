"""Random operation traces for the Flink parity harness (tests/state/test_flink_parity.py).

This module has four parts:

* the **text format** read by ``FlinkTraceReplay.java`` (``format_traces``) and the parser of
  its results (``parse_results``);
* a **shadow model** of Flink 2.3's heap keyed state with TTL (``ShadowModel``), which predicts
  every read and, where background cleanup makes Flink's answer depend on hash-table order, says
  which answers are acceptable;
* a seeded **generator** (``generate_trace``) that uses the shadow model to aim at the
  interesting spots (the inclusive expiry boundary ``ts + ttl``, timestamps that saturate at
  ``Long.MAX_VALUE``, re-writes of expired entries, merges, snapshots);
* a **replayer** of the same trace against cowmap (``replay_cowmap``) and the **comparison**
  (``compare``), plus a small CLI (``python tests/flink_parity/trace.py --help``).

Text format
-----------
One trace::

    trace <id> kind=<value|list|map|reducing|aggregating> ttl=<ms|none>
          upd=<OnCreateAndWrite|OnReadAndWrite> vis=<NeverReturnExpired|ReturnExpiredIfNotCleanedUp>
          calls=<TTL builder calls in the order they are made, comma-separated, or ->
    <one operation per line>
    end

(the header is one line). Builder calls: ``full`` = ``cleanupFullSnapshot()``,
``inc:<size>:<0|1>`` = ``cleanupIncrementally(size, runCleanupForEveryRecord)``, ``nobg`` =
``disableCleanupInBackground()``. They are made in the listed order on both sides.

Operations (all arguments are integers; keys, namespaces and user keys are 32-bit):

=================  ================================================================
``time T``         the TTL clock now reads ``T`` ms
``key K``          ``set_current_key(K)``
``ns N``           ``set_current_namespace(N)`` on the trace's one state
``snap``           take a snapshot and hold it (Flink: the asynchronous part runs at once)
``restore``        restore the held snapshot into a fresh backend, which replaces the current
                   one (the current key and namespace are set again on it)
``snaprestore``    ``snap`` then ``restore``
value              ``get`` | ``update V`` | ``clear``
list               ``get`` | ``add V`` | ``addall V...`` | ``update V...`` | ``clear`` |
                   ``merge TARGET SOURCE...``
map                ``get UK`` | ``put UK V`` | ``putall UK V UK V...`` | ``remove UK`` |
                   ``contains UK`` | ``entries`` | ``keys`` | ``values`` | ``isempty`` | ``clear``
reducing (sum)     ``get`` | ``add V`` | ``clear`` | ``merge TARGET SOURCE...``
aggregating        same as reducing; accumulator (sum, count), result printed ``sum/count``
=================  ================================================================

Results: ``trace <id>``, then ``<op index> <result>`` for every read (op indices count the
operation lines of the trace from 0), then ``end <id>``. A failed operation (read or write)
prints ``<op index> error <exception type>: <message>``; two errors count as agreement.

Normalised read results:

* absent value / map value / reducing or aggregating result: ``null``;
* list ``get``: ``[v1,v2,...]`` in list order; an empty or absent list is ``[]`` (Flink returns
  ``null`` from a list state without TTL and an empty iterable with TTL; cowmap returns ``[]``);
* map ``entries``: ``{uk:v,...}`` sorted by user key; ``keys`` / ``values``: ``[...]`` sorted
  (iteration order is hash-table order on both sides, so it is not compared);
* ``contains`` / ``isempty``: ``true`` / ``false``.

Relaxed comparison
------------------
With incremental (background) cleanup, which expired entries are still present at a read depends
on the order in which each implementation's cleanup walks its hash tables, and those orders
differ (Flink's ``TtlIncrementalCleanup`` walks ``CopyOnWriteStateMap`` buckets). For those
configurations the shadow model tracks every entry's timestamp and accepts a read on which Flink
and cowmap disagree only if **both** answers differ from the no-cleanup answer at most in entries
the model says are expired at that time (for ``isempty``: only if the model says every remaining
entry is expired). The generator keeps those configurations free of the two cases where a
cleaned-or-not expired entry would change *unexpired* state (adding to, or merging, an expired
reducing/aggregating accumulator: it ``clear``s such accumulators first), and never moves the
clock backwards there. Every other configuration (no TTL, cleanup disabled, full-snapshot cleanup
only) must agree exactly.

Avoided on purpose
------------------
* A Flink 2.3 bug: when a reducing/aggregating merge combines only expired accumulators (or a
  reducing ``add`` happens while the clock reads ``Long.MAX_VALUE``, where a new value is born
  expired) under ``NeverReturnExpired``, ``TtlReduceFunction``/``TtlAggregateFunction.merge``
  return null and ``StateTable.transform`` stores that null; reads see no value, but the next
  snapshot throws ``NullPointerException`` (in the serializer, or in
  ``TtlStateSnapshotTransformer`` with full-snapshot cleanup). The generator ``clear``s the
  expired accumulators first (``avoid_null_state``).
* Flink applies full-snapshot cleanup when the snapshot's asynchronous part runs (here: at once,
  at ``snap`` time). With full-snapshot cleanup the generator restores a held snapshot before it
  moves the clock, so an implementation that filters when the snapshot is read agrees too.
* Merging a namespace into itself (target among the sources).
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import itertools
import os
import random
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

LONG_MAX = (1 << 63) - 1
INT_MIN, INT_MAX = -(1 << 31), (1 << 31) - 1
#: The largest TTL a ``datetime.timedelta`` can hold, in whole milliseconds.
MAX_TIMEDELTA_MS = 86_399_999_999_999_999

KINDS = ("value", "list", "map", "reducing", "aggregating")
UPDATE_TYPES = ("OnCreateAndWrite", "OnReadAndWrite")
VISIBILITIES = ("NeverReturnExpired", "ReturnExpiredIfNotCleanedUp")
#: Cleanup modes of a configuration; see ``Config.cleanup_calls``.
CLEANUP_MODES = ("none", "full_snapshot", "incremental", "default", "full+incremental")
READ_OPS = {
    "value": {"get"},
    "list": {"get"},
    "map": {"get", "contains", "entries", "keys", "values", "isempty"},
    "reducing": {"get"},
    "aggregating": {"get"},
}

HERE = Path(__file__).resolve().parent
JAVA_SOURCE = HERE / "FlinkTraceReplay.java"


# --------------------------------------------------------------------------------------------
# Configurations and traces


@dataclasses.dataclass(frozen=True)
class Config:
    """One state kind with one TTL setting; ``ttl_ms`` None means TTL disabled."""

    kind: str
    ttl_ms: int | None
    update_type: str = "OnCreateAndWrite"
    visibility: str = "NeverReturnExpired"
    calls: tuple[str, ...] = ()
    cleanup_mode: str = "none"

    @property
    def incremental(self) -> tuple[int, bool] | None:
        """Incremental cleanup as Flink 2.3 resolves the builder calls
        (``StateTtlConfig.CleanupStrategies.getIncrementalCleanupStrategy``): an explicit
        ``cleanupIncrementally`` always wins; otherwise the default (5, false) unless
        ``disableCleanupInBackground`` was called. Call order does not matter in Flink."""
        if self.ttl_ms is None:
            return None
        explicit = [c for c in self.calls if c.startswith("inc:")]
        if explicit:
            _, size, every = explicit[-1].split(":")
            return int(size), every == "1"
        return None if "nobg" in self.calls else (5, False)

    @property
    def full_snapshot(self) -> bool:
        return self.ttl_ms is not None and "full" in self.calls

    @property
    def relaxed(self) -> bool:
        """True where background cleanup makes some reads order-dependent."""
        return self.incremental is not None

    @property
    def return_expired(self) -> bool:
        return self.visibility == "ReturnExpiredIfNotCleanedUp"

    @property
    def on_read(self) -> bool:
        return self.update_type == "OnReadAndWrite"

    def label(self) -> str:
        if self.ttl_ms is None:
            return f"{self.kind}/no-ttl"
        upd = "read" if self.on_read else "write"
        vis = "return-expired" if self.return_expired else "never-expired"
        return f"{self.kind}/{upd}/{vis}/{self.cleanup_mode}"

    def header_fields(self) -> str:
        ttl = "none" if self.ttl_ms is None else str(self.ttl_ms)
        calls = ",".join(self.calls) if self.calls else "-"
        return f"kind={self.kind} ttl={ttl} upd={self.update_type} vis={self.visibility} calls={calls}"


def cleanup_calls(mode: str, rng: random.Random) -> tuple[str, ...]:
    """Builder calls for a cleanup mode (random parameters and call order)."""

    def inc() -> str:
        return f"inc:{rng.choice([1, 2, 3, 5, 10, 1000])}:{rng.randint(0, 1)}"

    if mode == "none":
        return ("nobg",)
    if mode == "full_snapshot":
        calls = ["full", "nobg"]
        rng.shuffle(calls)
        return tuple(calls)
    if mode == "incremental":
        calls = [inc()]
        if rng.random() < 0.3:  # an explicit cleanupIncrementally survives disableCleanupInBackground
            calls.insert(0, "nobg")
        return tuple(calls)
    if mode == "default":
        return ()
    if mode == "full+incremental":
        calls = ["full"] if rng.random() < 0.5 else ["full", inc()]
        rng.shuffle(calls)
        return tuple(calls)
    raise ValueError(mode)


def all_config_templates() -> list[tuple[str, str | None, str, str, str]]:
    """(kind, 'ttl' or None, update type, visibility, cleanup mode) for every configuration."""
    out: list[tuple[str, str | None, str, str, str]] = []
    for kind in KINDS:
        out.append((kind, None, "OnCreateAndWrite", "NeverReturnExpired", "none"))
        for upd, vis, mode in itertools.product(UPDATE_TYPES, VISIBILITIES, CLEANUP_MODES):
            out.append((kind, "ttl", upd, vis, mode))
    return out


Op = tuple  # ("get",), ("put", 1, 5), ("merge", 0, 1, 2), ...


@dataclasses.dataclass
class Trace:
    id: str
    config: Config
    ops: list[Op]
    seed: int | None = None
    #: directed traces: the outputs Flink 2.3.0 gives (``#= <op index> <result>`` lines)
    expected: dict[int, str] = dataclasses.field(default_factory=dict)
    #: directed traces: the ``#`` comment lines above the header
    doc: str = ""

    def with_ops(self, ops: list[Op], suffix: str = "") -> Trace:
        return Trace(self.id + suffix, self.config, list(ops), self.seed)


def op_text(op: Op) -> str:
    return " ".join(str(x) for x in op)


def format_trace(trace: Trace) -> str:
    lines = [f"trace {trace.id} {trace.config.header_fields()}"]
    lines.extend(op_text(op) for op in trace.ops)
    lines.append("end")
    return "\n".join(lines) + "\n"


def format_traces(traces: Iterable[Trace]) -> str:
    return "".join(format_trace(t) for t in traces)


def parse_header(line: str) -> tuple[str, Config]:
    tok = line.split()
    assert tok[0] == "trace", line
    fields = dict(t.split("=", 1) for t in tok[2:])
    calls = () if fields.get("calls", "-") == "-" else tuple(fields["calls"].split(","))
    ttl = None if fields["ttl"] == "none" else int(fields["ttl"])
    return tok[1], Config(
        kind=fields["kind"],
        ttl_ms=ttl,
        update_type=fields.get("upd", "OnCreateAndWrite"),
        visibility=fields.get("vis", "NeverReturnExpired"),
        calls=calls,
        cleanup_mode="custom",
    )


def parse_traces(text: str) -> list[Trace]:
    """Reads traces back from the text format (for hand-written traces). Comment lines above a
    header become ``Trace.doc``; ``#= <op index> <result>`` lines inside a trace (ignored by
    FlinkTraceReplay) become ``Trace.expected``."""
    traces: list[Trace] = []
    cur: Trace | None = None
    doc: list[str] = []
    for raw in text.splitlines():
        line = raw.strip()
        if line.startswith("#=") and cur is not None:
            idx, _, result = line[2:].strip().partition(" ")
            cur.expected[int(idx)] = result
            continue
        if not line:
            if cur is None:
                doc = []  # a blank line ends a comment block that is not a trace's doc
            continue
        if line.startswith("#"):
            if cur is None:
                doc.append(line.lstrip("# "))
            continue
        if cur is None:
            tid, cfg = parse_header(line)
            cur = Trace(tid, cfg, [], doc=" ".join(doc))
            doc = []
        elif line == "end":
            traces.append(cur)
            cur = None
        else:
            head, *args = line.split()
            cur.ops.append((head, *(int(a) for a in args)))
    assert cur is None, "unterminated trace"
    return traces


def parse_results(text: str) -> dict[str, dict[int, str]]:
    """``{trace id: {op index: result}}`` from FlinkTraceReplay's output."""
    out: dict[str, dict[int, str]] = {}
    cur: dict[int, str] | None = None
    for line in text.splitlines():
        if line.startswith("trace "):
            cur = out.setdefault(line.split()[1], {})
        elif line.startswith("end "):
            cur = None
        elif line.strip():
            assert cur is not None, f"result outside a trace: {line!r}"
            idx, _, result = line.partition(" ")
            cur[int(idx)] = result
    return out


# --------------------------------------------------------------------------------------------
# Shadow model of Flink 2.3's heap backend with TTL


def flink_expired(ts: int, ttl: int | None, now: int) -> bool:
    """``TtlUtils.expired``: ``ts + ttl <= now``, the sum saturating at Long.MAX_VALUE."""
    if ttl is None:
        return False
    end = ts + (min(LONG_MAX - ts, ttl) if ts > 0 else ttl)
    return end <= now


def fmt_list(values: Iterable[object]) -> str:
    return "[" + ",".join(str(v) for v in values) + "]"


def fmt_map(entries: dict[int, int]) -> str:
    return "{" + ",".join(f"{k}:{entries[k]}" for k in sorted(entries)) + "}"


def parse_list(s: str) -> list[int] | None:
    if not (s.startswith("[") and s.endswith("]")):
        return None
    body = s[1:-1]
    try:
        return [int(x) for x in body.split(",")] if body else []
    except ValueError:
        return None


def parse_map(s: str) -> dict[int, int] | None:
    if not (s.startswith("{") and s.endswith("}")):
        return None
    body = s[1:-1]
    out: dict[int, int] = {}
    try:
        for item in body.split(",") if body else []:
            k, v = item.split(":")
            out[int(k)] = int(v)
    except ValueError:
        return None
    return out


@dataclasses.dataclass
class Read:
    """The model's answer for one read: ``canonical`` is what Flink returns when no background
    cleanup has run; ``allowed`` (relaxed configurations only) accepts every answer that differs
    from it only in entries expired at that time."""

    canonical: str
    allowed: Callable[[str], bool] | None = None
    note: str = ""

    def accepts(self, out: str) -> bool:
        if out == self.canonical:
            return True
        return self.allowed is not None and self.allowed(out)


class ShadowModel:
    """Flink 2.3 heap keyed state with TTL, as read from flink-runtime's ``state/ttl`` and
    ``state/heap`` packages (class and method names below are Flink's). Background cleanup is
    not simulated; in relaxed configurations expired entries are simply "maybe present"."""

    def __init__(self, config: Config) -> None:
        self.cfg = config
        self.ttl = config.ttl_ms
        self.now = 0
        self.key: int | None = None
        self.ns: int | None = None
        # (key, ns) -> value: (v, ts) | list[[v, ts]] | dict[uk, (v, ts)] | (acc, ts)
        self.slots: dict[tuple[int, int], object] = {}
        self.held: dict | None = None
        self.write_times: list[int] = []  # recent write timestamps, for the generator
        #: set when a relaxed configuration reaches a case the model cannot follow exactly
        self.uncertain = False
        #: set when Flink would store a null reducing/aggregating state (see ``_store``)
        self.null_stored = False

    # helpers
    def exp(self, ts: int) -> bool:
        return flink_expired(ts, self.ttl, self.now)

    @property
    def slot(self) -> tuple[int, int]:
        assert self.key is not None and self.ns is not None
        return (self.key, self.ns)

    def _wrote(self) -> None:
        self.write_times.append(self.now)
        del self.write_times[:-8]

    def expired_slots(self, nss: Iterable[int]) -> list[int]:
        """Namespaces (for the current key) whose value/accumulator is present and expired."""
        out = []
        for ns in nss:
            st = self.slots.get((self.key, ns))  # type: ignore[arg-type]
            if st is not None and self.exp(st[1]):  # type: ignore[index]
                out.append(ns)
        return out

    def snapshot_state(self) -> dict:
        """The state a full snapshot taken now contains (``TtlStateSnapshotTransformer``)."""
        kind = self.cfg.kind
        snap: dict = {}
        for slot, st in self.slots.items():
            if kind == "list":
                lst = [list(e) for e in st]  # type: ignore[union-attr]
                if self.cfg.full_snapshot:
                    # ListStateSnapshotTransformer with STOP_ON_FIRST_INCLUDED: only the expired
                    # elements *before* the first unexpired one are dropped.
                    i = 0
                    while i < len(lst) and self.exp(lst[i][1]):
                        i += 1
                    lst = lst[i:]
                if lst:
                    snap[slot] = lst
            elif kind == "map":
                m = dict(st)  # type: ignore[arg-type]
                if self.cfg.full_snapshot:
                    m = {k: e for k, e in m.items() if not self.exp(e[1])}
                if m:
                    snap[slot] = m
            else:
                if not (self.cfg.full_snapshot and self.exp(st[1])):  # type: ignore[index]
                    snap[slot] = st
        return snap

    def _copy(self, slots: dict) -> dict:
        if self.cfg.kind == "list":
            return {s: [list(e) for e in v] for s, v in slots.items()}
        if self.cfg.kind == "map":
            return {s: dict(v) for s, v in slots.items()}
        return dict(slots)

    # TtlReduceFunction.reduce / TtlAggregateFunction.merge
    def _ttl_merge(self, a, b):
        def unexpired(x):
            if x is None:
                return None
            if self.cfg.return_expired or not self.exp(x[1]):
                return x[0]
            return None

        ua, ub = unexpired(a), unexpired(b)
        if ua is not None and ub is not None:
            if self.cfg.kind == "reducing":
                return (ua + ub, self.now)
            return ((ua[0] + ub[0], ua[1] + ub[1]), self.now)
        if ua is not None:
            return (ua, self.now)
        if ub is not None:
            return (ub, self.now)
        return None

    def _store(self, slot: tuple[int, int], st) -> None:
        """A reducing/aggregating transform result. ``TtlReduceFunction.reduce`` and
        ``TtlAggregateFunction.merge`` return null when neither side is (visibly) unexpired, and
        ``StateTable.transform`` stores that null in the state entry: reads see no value, but
        Flink 2.3's next snapshot of the backend then fails with a NullPointerException. The
        generator avoids producing it; the model treats the entry as absent."""
        if st is None:
            self.null_stored = True
            self.slots.pop(slot, None)
        else:
            self.slots[slot] = st

    def _fmt_acc(self, acc) -> str:
        if self.cfg.kind == "aggregating":
            return f"{acc[0]}/{acc[1]}"
        return str(acc)

    def apply(self, op: Op) -> Read | None:
        """Applies one operation; returns the model's ``Read`` for reads, else None."""
        name = op[0]
        if name == "time":
            self.now = op[1]
            return None
        if name == "key":
            self.key = op[1]
            return None
        if name == "ns":
            self.ns = op[1]
            return None
        if name == "snap":
            self.held = self.snapshot_state()
            return None
        if name == "restore":
            assert self.held is not None
            self.slots = self._copy(self.held)
            return None
        if name == "snaprestore":
            self.slots = self.snapshot_state()
            return None
        return getattr(self, "_" + self.cfg.kind)(op)

    # ---- value (TtlValueState)
    def _value(self, op: Op) -> Read | None:
        name, slot = op[0], self.slot
        if name == "update":
            self.slots[slot] = (op[1], self.now)
            self._wrote()
            return None
        if name == "clear":
            self.slots.pop(slot, None)
            return None
        assert name == "get", op
        st = self.slots.get(slot)
        if st is None:
            return Read("null")
        v, ts = st
        if not self.exp(ts):
            if self.cfg.on_read:
                self.slots[slot] = (v, self.now)
            return Read(str(v))
        del self.slots[slot]  # getWithTtlCheckAndUpdate clears an expired value
        if not self.cfg.return_expired:
            return Read("null")
        if self.cfg.relaxed:
            return Read(str(v), lambda out: out == "null", "expired value: returned unless cleaned up")
        return Read(str(v))

    # ---- list (TtlListState)
    def _list(self, op: Op) -> Read | None:
        name, slot = op[0], self.slot
        if name == "add":
            self.slots.setdefault(slot, []).append([op[1], self.now])  # type: ignore[union-attr]
            self._wrote()
            return None
        if name == "addall":
            if len(op) > 1:
                self.slots.setdefault(slot, []).extend([v, self.now] for v in op[1:])  # type: ignore[union-attr]
                self._wrote()
            return None
        if name == "update":
            if len(op) > 1:
                self.slots[slot] = [[v, self.now] for v in op[1:]]
                self._wrote()
            else:
                self.slots.pop(slot, None)  # HeapListState.update([]) clears
            return None
        if name == "clear":
            self.slots.pop(slot, None)
            return None
        if name == "merge":
            # AbstractHeapMergingState.mergeNamespaces with HeapListState.mergeState = concatenation
            target, sources = op[1], op[2:]
            merged = None
            for s in sources:
                st = self.slots.pop((self.key, s), None)  # type: ignore[arg-type]
                if merged is not None and st is not None:
                    merged = merged + st
                elif merged is None:
                    merged = st
            if merged is not None:
                t = self.slots.get((self.key, target))  # type: ignore[arg-type]
                self.slots[(self.key, target)] = (t + merged) if t is not None else merged  # type: ignore[index]
            return None
        assert name == "get", op
        lst: list = self.slots.get(slot, [])  # type: ignore[assignment]
        unexpired = [e for e in lst if not self.exp(e[1])]
        everything = [e[0] for e in lst]
        canonical = fmt_list(everything if self.cfg.return_expired else [e[0] for e in unexpired])
        # storage effects: updateTs (OnReadAndWrite) keeps only the unexpired elements, with new
        # timestamps; IteratorWithCleanup clears the list when no element is unexpired.
        if not unexpired:
            self.slots.pop(slot, None)
        elif self.cfg.on_read:
            self.slots[slot] = [[e[0], self.now] for e in unexpired]
        if self.cfg.relaxed and self.cfg.return_expired and len(unexpired) < len(lst):
            must = [e[0] for e in unexpired]

            def allowed(out: str, everything=everything, must=must) -> bool:
                got = parse_list(out)
                if got is None:
                    return False
                present = set(got)
                if len(present) != len(got) or not present.issubset(everything):
                    return False
                return [v for v in everything if v in present] == got and set(must) <= present

            return Read(canonical, allowed, "expired list elements: returned unless cleaned up")
        return Read(canonical)

    # ---- map (TtlMapState)
    def _map(self, op: Op) -> Read | None:
        name, slot = op[0], self.slot
        m: dict = self.slots.get(slot)  # type: ignore[assignment]
        if name == "put":
            self.slots.setdefault(slot, {})[op[1]] = (op[2], self.now)  # type: ignore[index]
            self._wrote()
            return None
        if name == "putall":
            if len(op) > 1:
                d = self.slots.setdefault(slot, {})
                for i in range(1, len(op) - 1, 2):
                    d[op[i]] = (op[i + 1], self.now)  # type: ignore[index]
                self._wrote()
            else:
                # TtlMapState.putAll(empty) still reaches HeapMapState.putAll, which creates an
                # empty user map: invisible (isEmpty() is true for an empty map).
                pass
            return None
        if name == "remove":
            if m is not None:
                m.pop(op[1], None)
                if not m:
                    del self.slots[slot]  # HeapMapState.remove clears an emptied map
            return None
        if name == "clear":
            self.slots.pop(slot, None)
            return None
        if name in ("get", "contains"):
            uk = op[1]
            e = m.get(uk) if m is not None else None
            absent = "null" if name == "get" else "false"
            if e is None:
                return Read(absent)
            v, ts = e
            shown = str(v) if name == "get" else "true"
            if not self.exp(ts):
                if self.cfg.on_read:
                    m[uk] = (v, self.now)
                return Read(shown)
            del m[uk]  # getWrappedWithTtlCheckAndUpdate removes the expired entry
            if not m:
                del self.slots[slot]
            if not self.cfg.return_expired:
                return Read(absent)
            note = "expired map entry: returned unless cleaned up"
            if self.cfg.relaxed:
                return Read(shown, lambda out, absent=absent: out == absent, note)
            return Read(shown, None, note)
        if name == "isempty":
            # TtlMapState.isEmpty() does not look at timestamps: a map holding only expired
            # entries is not empty until they are cleaned up.
            if m is None or not m:
                return Read("true")
            if self.cfg.relaxed and all(self.exp(ts) for _, ts in m.values()):
                return Read("false", lambda out: out == "true", "only expired entries left")
            return Read("false")
        assert name in ("entries", "keys", "values"), op
        live: dict[int, int] = {}
        dead: dict[int, int] = {}
        for uk, (v, ts) in list((m or {}).items()):
            if self.exp(ts):
                dead[uk] = v
                del m[uk]  # EntriesIterator removes every expired entry it meets
            else:
                live[uk] = v
                if self.cfg.on_read:
                    m[uk] = (v, self.now)
        if m is not None and not m:
            del self.slots[slot]
        shown = dict(live)
        if self.cfg.return_expired:
            shown.update(dead)

        def render(d: dict[int, int]) -> str:
            if name == "entries":
                return fmt_map(d)
            if name == "keys":
                return fmt_list(sorted(d))
            return fmt_list(sorted(d.values()))

        canonical = render(shown)
        if not (self.cfg.relaxed and self.cfg.return_expired and dead):
            return Read(canonical)

        def allowed(out: str) -> bool:
            if name == "entries":
                got = parse_map(out)
                if got is None:
                    return False
                return all(got.get(k) == v for k, v in live.items()) and all(
                    k in live or dead.get(k) == v for k, v in got.items()
                )
            got_l = parse_list(out)
            if got_l is None or got_l != sorted(got_l):
                return False
            pool = live if name == "keys" else {v: v for v in live.values()}
            extra = set(dead) if name == "keys" else set(dead.values())
            want = set(pool)
            return want <= set(got_l) and set(got_l) <= want | extra and len(set(got_l)) == len(got_l)

        return Read(canonical, allowed, "expired map entries: returned unless cleaned up")

    # ---- reducing (TtlReducingState + TtlReduceFunction) and aggregating (TtlAggregatingState
    # + TtlAggregateFunction): same TTL logic, sum vs (sum, count) accumulators
    def _reducing(self, op: Op) -> Read | None:
        name, slot = op[0], self.slot
        agg = self.cfg.kind == "aggregating"
        if name == "add":
            x = op[1]
            st = self.slots.get(slot)
            if st is not None and self.exp(st[1]) and self.cfg.relaxed and self.cfg.return_expired:
                self.uncertain = True  # merged or not depends on cleanup: the generator avoids it
            if agg:
                # TtlAggregateFunction.add: an accumulator that is not visibly unexpired is
                # replaced by a fresh one; the result always gets the current time.
                base = st[0] if st is not None and (self.cfg.return_expired or not self.exp(st[1])) else (0, 0)
                self.slots[slot] = ((base[0] + x, base[1] + 1), self.now)
            elif st is None:
                self.slots[slot] = (x, self.now)  # ReduceTransformation: no previous state
            else:
                # TtlReduceFunction.reduce(previous, new): null if both are expired, which
                # happens when the clock reads Long.MAX_VALUE (a new value is born expired)
                self._store(slot, self._ttl_merge(st, (x, self.now)))
            self._wrote()
            return None
        if name == "clear":
            self.slots.pop(slot, None)
            return None
        if name == "merge":
            target, sources = op[1], op[2:]
            if self.cfg.relaxed and self.expired_slots((target, *sources)):
                self.uncertain = True
            merged = None
            for s in sources:
                st = self.slots.pop((self.key, s), None)  # type: ignore[arg-type]
                if merged is not None and st is not None:
                    merged = self._ttl_merge(merged, st)
                    if merged is None:
                        self.null_stored = True  # dropped here; a later source may take its place
                elif merged is None:
                    merged = st
            if merged is not None:
                t = self.slots.get((self.key, target))  # type: ignore[arg-type]
                self._store((self.key, target), self._ttl_merge(t, merged) if t is not None else merged)  # type: ignore[arg-type]
            return None
        assert name == "get", op
        st = self.slots.get(slot)
        if st is None:
            return Read("null")
        acc, ts = st
        if not self.exp(ts):
            if self.cfg.on_read:
                self.slots[slot] = (acc, self.now)
            return Read(self._fmt_acc(acc))
        del self.slots[slot]
        if not self.cfg.return_expired:
            return Read("null")
        if self.cfg.relaxed:
            return Read(self._fmt_acc(acc), lambda out: out == "null", "expired accumulator")
        return Read(self._fmt_acc(acc))

    _aggregating = _reducing


def predict(trace: Trace) -> tuple[dict[int, Read], bool]:
    """The model's reads for a trace, and whether the model lost track (see ``uncertain``)."""
    model = ShadowModel(trace.config)
    reads: dict[int, Read] = {}
    for i, op in enumerate(trace.ops):
        r = model.apply(op)
        if r is not None:
            reads[i] = r
    return reads, model.uncertain


# --------------------------------------------------------------------------------------------
# Generator


KEYS = (0, 1, 2, 3)
ODD_KEYS = (INT_MAX, INT_MIN, -1, 42, 123456789)
NAMESPACES = (0, 1, 2)
USER_KEYS = (0, 1, 2, 3, 4)


def random_ttl(rng: random.Random) -> tuple[int, int]:
    """(ttl ms, start time): mostly small TTLs; sometimes huge ones with the clock near
    Long.MAX_VALUE so ``ts + ttl`` saturates."""
    r = rng.random()
    if r < 0.12:
        ttl = rng.choice([MAX_TIMEDELTA_MS, rng.randint(10**12, MAX_TIMEDELTA_MS)])
        start = max(0, LONG_MAX - rng.randint(0, 3 * ttl))
        return ttl, start
    if r < 0.2:
        return rng.choice([10**6, 10**9]), rng.randint(0, 10**12)
    return rng.choice([1, 2, 3, 5, 8, 10, 20, 50]), rng.randint(0, 1000)


def generate_trace(template: tuple, seed: int, n_ops: int = 70, trace_id: str | None = None) -> Trace:
    """One random trace for a configuration template (see ``all_config_templates``)."""
    kind, ttl_flag, upd, vis, mode = template
    rng = random.Random(seed)
    if ttl_flag is None:
        ttl, now = None, rng.randint(0, 1000)
        calls: tuple[str, ...] = ()
    else:
        ttl, now = random_ttl(rng)
        calls = cleanup_calls(mode, rng)
    cfg = Config(kind, ttl, upd, vis, calls, mode if ttl is not None else "none")
    model = ShadowModel(cfg)
    ops: list[Op] = []
    counter = itertools.count(rng.randint(1, 50) * 100)
    keys = KEYS + tuple(rng.sample(ODD_KEYS, 1))
    holding_snapshot = False

    def emit(op: Op) -> None:
        ops.append(op)
        model.apply(op)

    def pick_key() -> int:
        return rng.choice(keys) if rng.random() < 0.9 else rng.choice(ODD_KEYS)

    def next_time() -> int:
        t = model.now
        step_scale = max(1, (ttl or 10) // 3)
        r = rng.random()
        if r < 0.35 and model.write_times and ttl is not None:
            # the inclusive expiry boundary of a recent write, or one before it
            ts = rng.choice(model.write_times)
            end = ts + (min(LONG_MAX - ts, ttl) if ts > 0 else ttl)
            cand = end - rng.choice([0, 0, 1])
            if cand >= t:
                return cand
        if r < 0.45 and ttl is not None and ttl > 10**12 and rng.random() < 0.5:
            return LONG_MAX
        if r < 0.55:
            return t
        if r < 0.9:
            return min(LONG_MAX, t + rng.randint(0, step_scale))
        return min(LONG_MAX, t + rng.randint(ttl or 10, 3 * (ttl or 10)))

    emit(("time", now))
    emit(("key", pick_key()))
    emit(("ns", rng.choice(NAMESPACES)))
    while len(ops) < n_ops:
        r = rng.random()
        if r < 0.2:
            if cfg.full_snapshot and holding_snapshot:
                # Flink filters a full snapshot when its asynchronous part runs (at once, here);
                # cowmap may filter when the snapshot is read. Restore before the clock moves so
                # both filter at the same time.
                emit(("restore",))
                holding_snapshot = False
            t = next_time()
            if not cfg.relaxed and ttl is not None and rng.random() < 0.04 and model.now > 0:
                t = max(0, model.now - rng.randint(1, 2 * ttl))  # the clock goes backwards
            emit(("time", t))
            continue
        if r < 0.31:
            emit(("key", pick_key()))
            continue
        if r < 0.39:
            emit(("ns", rng.choice(NAMESPACES)))
            continue
        if r < (0.44 if cfg.full_snapshot else 0.42):
            c = rng.random()
            if c < 0.4:
                emit(("snaprestore",))
            elif c < 0.75 or not holding_snapshot:
                emit(("snap",))
                holding_snapshot = True
            else:
                emit(("restore",))
                holding_snapshot = False
            continue
        batch = state_ops(kind, rng, counter, model)
        if kind in ("reducing", "aggregating") and batch[-1][0] in ("add", "merge"):
            batch = avoid_null_state(batch, model)
        for op in batch:
            emit(op)
    return Trace(trace_id or f"s{seed}", cfg, ops, seed)


def state_ops(kind: str, rng: random.Random, counter, model: ShadowModel) -> list[Op]:
    """One state operation (plus the clears the relaxed configurations need before it)."""
    cfg = model.cfg
    r = rng.random()

    def vals(n: int) -> tuple[int, ...]:
        return tuple(next(counter) for _ in range(n))

    def merge_op() -> list[Op]:
        target = rng.choice(NAMESPACES)
        others = [n for n in NAMESPACES if n != target]
        sources = rng.sample(others, rng.choice([0, 1, 1, 2, 2]))
        out: list[Op] = []
        if kind in ("reducing", "aggregating") and cfg.relaxed:
            stale = model.expired_slots((target, *sources))
            if stale:
                back = model.ns
                for ns in stale:
                    out += [("ns", ns), ("clear",)]
                out.append(("ns", back))
        return out + [("merge", target, *sources)]

    if kind == "value":
        if r < 0.45:
            return [("get",)]
        if r < 0.9:
            return [("update", next(counter))]
        return [("clear",)]
    if kind == "list":
        if r < 0.32:
            return [("get",)]
        if r < 0.6:
            return [("add", next(counter))]
        if r < 0.68:
            return [("addall", *vals(rng.randint(0, 3)))]
        if r < 0.76:
            return [("update", *vals(rng.choice([0, 1, 2, 3])))]
        if r < 0.8:
            return [("clear",)]
        return merge_op()
    if kind == "map":
        uk = rng.choice(USER_KEYS)
        if r < 0.16:
            return [("get", uk)]
        if r < 0.42:
            return [("put", uk, next(counter))]
        if r < 0.5:
            uks = rng.sample(USER_KEYS, rng.randint(0, 3))
            flat: list[int] = []
            for k in uks:
                flat += [k, next(counter)]
            return [("putall", *flat)]
        if r < 0.58:
            return [("remove", uk)]
        if r < 0.68:
            return [("contains", uk)]
        if r < 0.76:
            return [("entries",)]
        if r < 0.8:
            return [("keys",)]
        if r < 0.84:
            return [("values",)]
        if r < 0.96:
            return [("isempty",)]
        return [("clear",)]
    # reducing / aggregating
    if r < 0.38:
        return [("get",)]
    if r < 0.82:
        pre: list[Op] = []
        if cfg.relaxed and cfg.return_expired and model.expired_slots((model.ns,)):
            pre = [("clear",)]  # whether Flink merges the expired accumulator depends on cleanup
        return pre + [("add", rng.randint(1, 9))]
    if r < 0.9:
        return [("clear",)]
    return merge_op()


def avoid_null_state(batch: list[Op], model: ShadowModel) -> list[Op]:
    """Prefixes ``clear``s of the expired accumulators involved when the batch would make Flink
    store a null state (a Flink 2.3 bug: the next snapshot throws; see ``ShadowModel._store``)."""
    probe = copy.deepcopy(model)
    probe.null_stored = False
    for op in batch:
        probe.apply(op)
    if not probe.null_stored:
        return batch
    op = batch[-1]
    involved = (model.ns,) if op[0] == "add" else tuple(op[1:])
    # replay the prefix (ns switches / clears) to know the current namespace at the op
    probe = copy.deepcopy(model)
    for pre in batch[:-1]:
        probe.apply(pre)
    stale = probe.expired_slots(involved)
    back = probe.ns
    out = list(batch[:-1])
    for ns in stale:
        out += [("ns", ns), ("clear",)]
    if stale:
        out.append(("ns", back))
    return out + [op]


def remap_keys(trace: Trace, salt: int = 7919) -> Trace:
    """The same trace with every key renamed (an injective map on 32-bit ints): semantics are
    unchanged, but keys land in other key groups and buckets, so background cleanup visits
    entries in another order. Used to check the relaxed comparison against Flink itself."""

    def f(k: int) -> int:
        return ((k * salt + 12345) % (1 << 32)) - (1 << 31)

    ops = [("key", f(op[1])) if op[0] == "key" else op for op in trace.ops]
    return Trace(trace.id + "r", trace.config, ops, trace.seed)


# --------------------------------------------------------------------------------------------
# Running Flink


def find_flink_jar() -> Path | None:
    """``$COWMAP_FLINK_DIST_JAR``, else ``pyflink/lib/flink-dist-*.jar`` of an installed
    ``apache-flink-libraries`` (found without importing pyflink)."""
    env = os.environ.get("COWMAP_FLINK_DIST_JAR")
    if env:
        p = Path(env)
        return p if p.is_file() else None
    import importlib.util

    try:
        spec = importlib.util.find_spec("pyflink")
    except (ImportError, ValueError):
        spec = None
    roots = list(spec.submodule_search_locations or []) if spec else []
    for root in roots:
        jars = sorted(Path(root, "lib").glob("flink-dist-*.jar"))
        if jars:
            return jars[-1]
    return None


def compile_replayer(jar: Path, out_dir: Path, javac: str = "javac") -> None:
    subprocess.run(
        [javac, "-nowarn", "-encoding", "UTF-8", "-cp", str(jar), "-d", str(out_dir), str(JAVA_SOURCE)],
        check=True,
        capture_output=True,
        text=True,
    )


def run_flink(traces: Sequence[Trace], jar: Path, classes: Path, java: str = "java") -> dict[str, dict[int, str]]:
    """Replays the traces in one JVM; returns ``{trace id: {op index: result}}``."""
    proc = subprocess.run(
        [java, "-Xss4m", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1", "-cp", f"{classes}{os.pathsep}{jar}",
         "FlinkTraceReplay"],
        input=format_traces(traces),
        capture_output=True,
        text=True,
        check=False,
    )
    if proc.returncode != 0:
        raise RuntimeError(f"FlinkTraceReplay failed ({proc.returncode}):\n{proc.stderr[-4000:]}")
    results = parse_results(proc.stdout)
    missing = [t.id for t in traces if t.id not in results]
    if missing:
        raise RuntimeError(f"no Flink results for traces {missing[:5]}; stderr:\n{proc.stderr[-4000:]}")
    return results


# --------------------------------------------------------------------------------------------
# Replaying against cowmap


def _cowmap_agg_class():
    from cowmap.state import AggregateFunction

    class SumCount(AggregateFunction):
        def create_accumulator(self):
            return (0, 0)

        def add(self, value, accumulator):
            return (accumulator[0] + value, accumulator[1] + 1)

        def get_result(self, accumulator):
            return accumulator

        def merge(self, a, b):
            return (a[0] + b[0], a[1] + b[1])

    return SumCount


def cowmap_ttl_config(cfg: Config):
    from datetime import timedelta

    from cowmap.state import StateTtlConfig, StateVisibility, UpdateType

    b = (
        StateTtlConfig.new_builder(timedelta(milliseconds=cfg.ttl_ms))
        .set_update_type(getattr(UpdateType, cfg.update_type))
        .set_state_visibility(getattr(StateVisibility, cfg.visibility))
    )
    for call in cfg.calls:
        if call == "full":
            b = b.cleanup_full_snapshot()
        elif call == "nobg":
            b = b.disable_cleanup_in_background()
        else:
            _, size, every = call.split(":")
            b = b.cleanup_incrementally(int(size), every == "1")
    return b.build()


def replay_cowmap(trace: Trace) -> dict[int, str]:
    """Runs a trace against cowmap; returns ``{op index: result}`` normalised as Flink's."""
    import cowmap.state as cs

    cfg = trace.config
    clock = [0]
    agg_cls = _cowmap_agg_class() if cfg.kind == "aggregating" else None

    def new_backend():
        return cs.KeyedStateBackend(max_parallelism=128, time_provider=lambda: clock[0])

    def new_state(backend):
        kind = cfg.kind
        if kind == "value":
            d = cs.ValueStateDescriptor("s")
        elif kind == "list":
            d = cs.ListStateDescriptor("s")
        elif kind == "map":
            d = cs.MapStateDescriptor("s")
        elif kind == "reducing":
            d = cs.ReducingStateDescriptor("s", lambda a, b: a + b)
        else:
            d = cs.AggregatingStateDescriptor("s", agg_cls())
        if cfg.ttl_ms is not None:
            d.enable_time_to_live(cowmap_ttl_config(cfg))
        getter = {
            "value": backend.get_state,
            "list": backend.get_list_state,
            "map": backend.get_map_state,
            "reducing": backend.get_reducing_state,
            "aggregating": backend.get_aggregating_state,
        }[kind]
        return getter(d)

    backend = new_backend()
    state = new_state(backend)
    cur_key: int | None = None
    cur_ns: int | None = None
    held = None
    out: dict[int, str] = {}

    def reopen(snap):
        nonlocal backend, state
        b2 = new_backend()
        b2.restore(snap)
        backend = b2
        state = new_state(b2)
        if cur_key is not None:
            backend.set_current_key(cur_key)
        if cur_ns is not None:
            state.set_current_namespace(cur_ns)

    def run(op: Op) -> str | None:
        nonlocal cur_key, cur_ns, held
        name, args = op[0], op[1:]
        if name == "time":
            clock[0] = args[0]
            return None
        if name == "key":
            cur_key = args[0]
            backend.set_current_key(cur_key)
            return None
        if name == "ns":
            cur_ns = args[0]
            state.set_current_namespace(cur_ns)
            return None
        if name == "snap":
            if held is not None:
                held.release()
            held = backend.snapshot()
            return None
        if name == "restore":
            if held is None:
                raise RuntimeError("restore without snap")
            reopen(held)
            return None
        if name == "snaprestore":
            snap = backend.snapshot()
            try:
                reopen(snap)
            finally:
                snap.release()
            return None
        kind = cfg.kind
        s = state
        if kind == "value":
            if name == "get":
                v = s.value()
                return "null" if v is None else str(v)
            if name == "update":
                s.update(args[0])
                return None
            if name == "clear":
                s.clear()
                return None
        elif kind == "list":
            if name == "get":
                got = s.get()
                return fmt_list(list(got) if got is not None else [])
            if name == "add":
                s.add(args[0])
                return None
            if name == "addall":
                s.add_all(list(args))
                return None
            if name == "update":
                s.update(list(args))
                return None
            if name == "clear":
                s.clear()
                return None
            if name == "merge":
                s.merge_namespaces(args[0], list(args[1:]))
                return None
        elif kind == "map":
            if name == "get":
                v = s.get(args[0])
                return "null" if v is None else str(v)
            if name == "put":
                s.put(args[0], args[1])
                return None
            if name == "putall":
                s.put_all({args[i]: args[i + 1] for i in range(0, len(args) - 1, 2)})
                return None
            if name == "remove":
                s.remove(args[0])
                return None
            if name == "contains":
                return "true" if s.contains(args[0]) else "false"
            if name == "entries":
                items = list(s.items())
                d = dict(items)
                if len(d) != len(items):
                    raise AssertionError(f"duplicate user keys in items(): {items}")
                return fmt_map(d)
            if name == "keys":
                return fmt_list(sorted(s.keys()))
            if name == "values":
                return fmt_list(sorted(s.values()))
            if name == "isempty":
                return "true" if s.is_empty() else "false"
            if name == "clear":
                s.clear()
                return None
        else:  # reducing / aggregating
            if name == "get":
                v = s.get()
                if v is None:
                    return "null"
                return f"{v[0]}/{v[1]}" if kind == "aggregating" else str(v)
            if name == "add":
                s.add(args[0])
                return None
            if name == "clear":
                s.clear()
                return None
            if name == "merge":
                s.merge_namespaces(args[0], list(args[1:]))
                return None
        raise ValueError(f"unknown op {op!r} for {kind}")

    try:
        for i, op in enumerate(trace.ops):
            try:
                res = run(op)
            except Exception as e:  # noqa: BLE001 - reported as an output line, like Flink's
                res = f"error {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
            if res is not None:
                out[i] = res
    finally:
        if held is not None:
            held.release()
    return out


# --------------------------------------------------------------------------------------------
# Comparison


@dataclasses.dataclass
class Mismatch:
    trace: Trace
    index: int
    flink: str | None
    other: str | None
    expected: Read | None
    other_name: str = "cowmap"

    def describe(self, context: int = 12) -> str:
        t = self.trace
        lo = max(0, self.index - context)
        lines = [
            f"trace {t.id} (seed {t.seed}) config {t.config.label()}: {t.config.header_fields()}",
            f"first disagreement at op #{self.index}: {op_text(t.ops[self.index]) if self.index < len(t.ops) else '?'}",
            f"  flink : {self.flink}",
            f"  {self.other_name:6}: {self.other}",
        ]
        if self.expected is not None:
            note = f"  ({self.expected.note})" if self.expected.note else ""
            lines.append(f"  model : {self.expected.canonical}{note}")
        lines.append(f"ops {lo}..{self.index} (of {len(t.ops)}):")
        for i in range(lo, min(self.index + 1, len(t.ops))):
            lines.append(f"  {i:4d}  {op_text(t.ops[i])}")
        return "\n".join(lines)


@dataclasses.dataclass
class Stats:
    traces: int = 0
    reads: int = 0
    identical: int = 0
    relaxed_accepted: int = 0
    both_errors: int = 0
    mismatched_traces: int = 0

    def add(self, other: Stats) -> None:
        for f in dataclasses.fields(self):
            setattr(self, f.name, getattr(self, f.name) + getattr(other, f.name))


def _is_error(s: str | None) -> bool:
    return s is not None and s.startswith("error")


def compare(
    trace: Trace,
    flink: dict[int, str],
    other: dict[int, str],
    reads: dict[int, Read] | None = None,
    other_name: str = "cowmap",
) -> tuple[Stats, Mismatch | None]:
    """Compares two result sets of one trace: exact, or relaxed where the configuration has
    background cleanup (see the module docstring). Returns stats and the first mismatch."""
    if reads is None:
        reads, _ = predict(trace)
    st = Stats(traces=1)
    first: Mismatch | None = None
    for idx in sorted(set(flink) | set(other)):
        a, b = flink.get(idx), other.get(idx)
        st.reads += 1
        if a == b:
            st.identical += 1
            if _is_error(a):
                st.both_errors += 1
            continue
        if _is_error(a) and _is_error(b):
            st.identical += 1
            st.both_errors += 1
            continue
        exp = reads.get(idx)
        if (
            trace.config.relaxed
            and exp is not None
            and a is not None
            and b is not None
            and exp.allowed is not None
            and exp.accepts(a)
            and exp.accepts(b)
        ):
            st.relaxed_accepted += 1
            continue
        if first is None:
            first = Mismatch(trace, idx, a, b, exp, other_name)
    if first is not None:
        st.mismatched_traces = 1
    return st, first


def compare_with_model(trace: Trace, flink: dict[int, str]) -> Mismatch | None:
    """Checks Flink's results against the shadow model (validates the model itself)."""
    reads, uncertain = predict(trace)
    if uncertain:
        return None
    for idx in sorted(set(flink) | set(reads)):
        got, exp = flink.get(idx), reads.get(idx)
        if exp is None or got is None:
            return Mismatch(trace, idx, got, exp.canonical if exp else None, exp, "model")
        ok = exp.accepts(got) if trace.config.relaxed else got == exp.canonical
        if not ok:
            return Mismatch(trace, idx, got, exp.canonical, exp, "model")
    return None


def minimize(trace: Trace, still_fails: Callable[[list[Trace]], list[bool]], max_rounds: int = 200) -> Trace:
    """Greedy one-op-at-a-time shrinking; ``still_fails`` judges a batch of candidates at once
    (one JVM per batch). Also tries dropping whole chunks first."""
    ops = list(trace.ops)
    for n in range(max_rounds):
        cands: list[list[Op]] = []
        for size in (16, 8, 4, 2):
            for i in range(0, len(ops), size):
                if len(ops) > size:
                    cands.append(ops[:i] + ops[i + size :])
        cands += [ops[:i] + ops[i + 1 :] for i in range(len(ops))]
        batch = [trace.with_ops(c, f"m{n}_{j}") for j, c in enumerate(cands)]
        verdicts = still_fails(batch)
        for cand, bad in zip(cands, verdicts):
            if bad:
                ops = cand
                break
        else:
            break
    return trace.with_ops(ops, "min")


# --------------------------------------------------------------------------------------------
# CLI


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--jar", help="flink-dist-2.3.0.jar (default: $COWMAP_FLINK_DIST_JAR or pyflink/lib)")
    ap.add_argument("--traces", type=int, default=12, help="traces per configuration")
    ap.add_argument("--ops", type=int, default=70, help="operations per trace")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--only", default="", help="substring filter on configuration labels")
    ap.add_argument("--against", choices=["cowmap", "model", "flink-remapped"], default="cowmap")
    ap.add_argument("--minimize", action="store_true", help="shrink the first mismatch of each configuration")
    ap.add_argument("--dump", help="write the generated traces to this file")
    ap.add_argument("--replay", help="run the traces of this file (text format) instead of generating")
    ap.add_argument("--drop-ops", default="", help="comma-separated op names to leave out (e.g. isempty)")
    args = ap.parse_args(argv)

    jar = Path(args.jar) if args.jar else find_flink_jar()
    if jar is None or not jar.is_file():
        print("flink-dist jar not found (pip install apache-flink-libraries==2.3.0 or set COWMAP_FLINK_DIST_JAR)")
        return 2
    with tempfile.TemporaryDirectory() as tmp:
        classes = Path(tmp)
        compile_replayer(jar, classes)
        if args.replay:
            traces = parse_traces(Path(args.replay).read_text())
        else:
            traces = []
            for ci, tpl in enumerate(all_config_templates()):
                for j in range(args.traces):
                    seed = args.seed * 1_000_003 + ci * 1000 + j
                    tr = generate_trace(tpl, seed, args.ops)
                    if args.drop_ops:
                        dropped = set(args.drop_ops.split(","))
                        tr.ops = [op for op in tr.ops if op[0] not in dropped]
                    if args.only in tr.config.label():
                        traces.append(tr)
        if args.dump:
            Path(args.dump).write_text(format_traces(traces))
        flink = run_flink(traces, jar, classes)
        per_label: dict[str, Stats] = {}
        firsts: dict[str, Mismatch] = {}
        other_results: dict[str, dict[int, str]] = {}
        if args.against == "flink-remapped":
            rem = [remap_keys(t) for t in traces]
            rr = run_flink(rem, jar, classes)
            other_results = {t.id: rr[t.id + "r"] for t in traces}
        for t in traces:
            label = t.config.label()
            if args.against == "model":
                mm = compare_with_model(t, flink[t.id])
                st = Stats(traces=1, reads=len(flink[t.id]), mismatched_traces=int(mm is not None))
            else:
                other = other_results[t.id] if args.against == "flink-remapped" else replay_cowmap(t)
                st, mm = compare(t, flink[t.id], other, other_name=args.against[:6])
            per_label.setdefault(label, Stats()).add(st)
            if mm is not None and label not in firsts:
                firsts[label] = mm
        total = Stats()
        for label in sorted(per_label):
            s = per_label[label]
            total.add(s)
            print(
                f"{label:52} traces {s.traces:3} reads {s.reads:5} identical {s.identical:5} "
                f"relaxed {s.relaxed_accepted:4} bad-traces {s.mismatched_traces}"
            )
        print(
            f"TOTAL traces {total.traces} reads {total.reads} identical {total.identical} "
            f"relaxed-accepted {total.relaxed_accepted} both-error {total.both_errors} "
            f"mismatched traces {total.mismatched_traces}"
        )
        for _label, mm in sorted(firsts.items()):
            print("\n" + mm.describe())
            if args.minimize and args.against == "cowmap":
                small = minimize(mm.trace, lambda batch: _still_fails(batch, jar, classes))
                print("minimal repro:\n" + format_trace(small))
                fr = run_flink([small], jar, classes)[small.id]
                cr = replay_cowmap(small)
                for idx in sorted(set(fr) | set(cr)):
                    mark = "  " if fr.get(idx) == cr.get(idx) else "!!"
                    print(f"  {mark} op {idx} {op_text(small.ops[idx])}: flink={fr.get(idx)} cowmap={cr.get(idx)}")
    return 1 if total.mismatched_traces else 0


def _still_fails(batch: list[Trace], jar: Path, classes: Path) -> list[bool]:
    fl = run_flink(batch, jar, classes)
    out = []
    for t in batch:
        try:
            _, mm = compare(t, fl[t.id], replay_cowmap(t))
        except Exception:  # noqa: BLE001 - a candidate the model cannot follow
            mm = None
        out.append(mm is not None)
    return out


if __name__ == "__main__":
    sys.exit(main())
