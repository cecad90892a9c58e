"""Hypothesis state machine: the keyed-state backend against ``state_model.Model``.

All five state kinds live in one backend with one TTL config; a manual clock
moves forward. Rules cover every state operation, namespaces and merges, and
snapshots (taken, checked later against the model as it was, released, and
restored into a fresh backend). Configs where Flink's background cleanup would
make reads depend on hash-table order are not exact-modelled: with
``ReturnExpiredIfNotCleanedUp`` cleanup is disabled, and with incremental
cleanup merges (whose result timestamps depend on what was cleaned) are left out.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import hypothesis.strategies as st
from hypothesis import HealthCheck, settings
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule
from state_model import Model, SumCount

from cowmap.state import (
    VOID_NAMESPACE,
    AggregatingStateDescriptor,
    KeyedStateBackend,
    ListStateDescriptor,
    MapStateDescriptor,
    ReducingStateDescriptor,
    StateTtlConfig,
    StateVisibility,
    UpdateType,
    ValueStateDescriptor,
)

KEYS = st.integers(0, 7) | st.sampled_from(["a", "b", ("t", 1)])
NAMESPACES = st.sampled_from([VOID_NAMESPACE, 0, 1, "w"])
VALUES = st.integers(-5, 50)
UKEYS = st.integers(0, 5) | st.sampled_from(["x", "y"])
TTL = 10
MAX_TS = (1 << 63) - 1


class BackendMachine(RuleBasedStateMachine):
    ttl: int | None = None
    on_read = False
    return_expired = False
    cleanup = "none"  # "none" | "incremental" | "every_record"
    merges = True
    start = 0  # the clock's first reading

    @initialize()
    def setup(self) -> None:
        self.clock = [self.start]
        self.model = Model(self.ttl, self.on_read, self.return_expired)
        self.model.now = self.start
        self.backend = self._new_backend()
        self.states = self._register(self.backend)
        self.key: Any = None
        self.ns: Any = VOID_NAMESPACE
        self.snapshots: list[tuple[Any, Model]] = []

    def _new_backend(self) -> KeyedStateBackend:
        return KeyedStateBackend(max_parallelism=16, time_provider=lambda: self.clock[0])

    def _register(self, backend: KeyedStateBackend) -> dict[str, Any]:
        descs = {
            "value": ValueStateDescriptor("value"),
            "list": ListStateDescriptor("list"),
            "map": MapStateDescriptor("map"),
            "reducing": ReducingStateDescriptor("reducing", lambda a, b: a + b),
            "aggregating": AggregatingStateDescriptor("aggregating", SumCount()),
        }
        if self.ttl is not None:
            b = StateTtlConfig.new_builder(timedelta(milliseconds=self.ttl))
            b.set_update_type(UpdateType.OnReadAndWrite if self.on_read else UpdateType.OnCreateAndWrite)
            if self.return_expired:
                b.set_state_visibility(StateVisibility.ReturnExpiredIfNotCleanedUp)
            if self.cleanup == "none":
                b.disable_cleanup_in_background()
            else:
                b.cleanup_incrementally(3, self.cleanup == "every_record")
            cfg = b.build()
            for d in descs.values():
                d.enable_time_to_live(cfg)
        return {
            "value": backend.get_state(descs["value"]),
            "list": backend.get_list_state(descs["list"]),
            "map": backend.get_map_state(descs["map"]),
            "reducing": backend.get_reducing_state(descs["reducing"]),
            "aggregating": backend.get_aggregating_state(descs["aggregating"]),
        }

    # ------------------------------------------------------------ context

    @property
    def k(self) -> tuple[Any, Any]:
        return (self.key, self.ns)

    def has_key(self) -> bool:
        return self.key is not None

    @rule(key=KEYS)
    def set_key(self, key: Any) -> None:
        self.backend.set_current_key(key)
        self.key = key

    @rule(ns=NAMESPACES)
    def set_namespace(self, ns: Any) -> None:
        for s in self.states.values():
            s.set_current_namespace(ns)
        self.ns = ns

    @rule(dt=st.integers(0, TTL + 2))
    def tick(self, dt: int) -> None:
        self.clock[0] = min(self.clock[0] + dt, MAX_TS)
        self.model.now = self.clock[0]

    # ------------------------------------------------------------ value

    @precondition(has_key)
    @rule()
    def value_get(self) -> None:
        assert self.states["value"].value() == self.model.value_get(self.k)

    @precondition(has_key)
    @rule(v=VALUES | st.none())
    def value_update(self, v: Any) -> None:
        self.states["value"].update(v)
        self.model.value_update(self.k, v)

    @precondition(has_key)
    @rule()
    def value_clear(self) -> None:
        self.states["value"].clear()
        self.model.value_clear(self.k)

    # ------------------------------------------------------------ list

    @precondition(has_key)
    @rule()
    def list_get(self) -> None:
        assert self.states["list"].get() == self.model.list_get(self.k)

    @precondition(has_key)
    @rule(v=VALUES)
    def list_add(self, v: int) -> None:
        self.states["list"].add(v)
        self.model.list_add_all(self.k, [v])

    @precondition(has_key)
    @rule(vs=st.lists(VALUES, max_size=3))
    def list_add_all(self, vs: list[int]) -> None:
        self.states["list"].add_all(vs)
        self.model.list_add_all(self.k, vs)

    @precondition(has_key)
    @rule(vs=st.lists(VALUES, max_size=3))
    def list_update(self, vs: list[int]) -> None:
        self.states["list"].update(vs)
        self.model.list_update(self.k, vs)

    @precondition(has_key)
    @rule()
    def list_clear(self) -> None:
        self.states["list"].clear()
        self.model.list_clear(self.k)

    # ------------------------------------------------------------ map

    @precondition(has_key)
    @rule(uk=UKEYS)
    def map_get(self, uk: Any) -> None:
        assert self.states["map"].get(uk) == self.model.map_get(self.k, uk)

    @precondition(has_key)
    @rule(uk=UKEYS)
    def map_contains(self, uk: Any) -> None:
        assert self.states["map"].contains(uk) == self.model.map_contains(self.k, uk)

    @precondition(has_key)
    @rule(uk=UKEYS, v=VALUES)
    def map_put(self, uk: Any, v: int) -> None:
        self.states["map"].put(uk, v)
        self.model.map_put(self.k, uk, v)

    @precondition(has_key)
    @rule(entries=st.dictionaries(UKEYS, VALUES, max_size=3))
    def map_put_all(self, entries: dict) -> None:
        self.states["map"].put_all(entries)
        for uk, v in entries.items():
            self.model.map_put(self.k, uk, v)

    @precondition(has_key)
    @rule(uk=UKEYS)
    def map_remove(self, uk: Any) -> None:
        self.states["map"].remove(uk)
        self.model.map_remove(self.k, uk)

    @precondition(has_key)
    @rule()
    def map_items(self) -> None:
        got, want = self.states["map"].items(), self.model.map_items(self.k)
        if self.cleanup == "none":
            assert got == want  # insertion order
        else:  # order depends on whether cleanup removed an expired entry before a re-put
            assert sorted(got, key=repr) == sorted(want, key=repr)

    @precondition(has_key)
    @rule()
    def map_is_empty(self) -> None:
        got = self.states["map"].is_empty()
        if got and self.cleanup != "none" and not self._has_unexpired("map", self.model.map.get(self.k, {})):
            self.model.map.pop(self.k, None)  # background cleanup got there first
        assert got == self.model.map_is_empty(self.k)

    @precondition(has_key)
    @rule()
    def map_clear(self) -> None:
        self.states["map"].clear()
        self.model.map_clear(self.k)

    # ------------------------------------------------------------ reducing / aggregating

    @precondition(has_key)
    @rule(kind=st.sampled_from(["reducing", "aggregating"]))
    def merging_get(self, kind: str) -> None:
        assert self.states[kind].get() == getattr(self.model, f"{kind}_get")(self.k)

    @precondition(has_key)
    @rule(kind=st.sampled_from(["reducing", "aggregating"]), v=VALUES)
    def merging_add(self, kind: str, v: int) -> None:
        self.states[kind].add(v)
        getattr(self.model, f"{kind}_add")(self.k, v)

    @precondition(has_key)
    @rule(kind=st.sampled_from(["reducing", "aggregating"]))
    def merging_clear(self, kind: str) -> None:
        self.states[kind].clear()
        self.model.clear(kind, self.k)

    @precondition(lambda self: self.has_key() and self.merges)
    @rule(
        kind=st.sampled_from(["list", "reducing", "aggregating"]),
        dest=NAMESPACES,
        sources=st.lists(NAMESPACES, max_size=3, unique=True),
    )
    def merge_namespaces(self, kind: str, dest: Any, sources: list) -> None:
        self.states[kind].merge_namespaces(dest, sources)
        if kind == "list":
            self.model.list_merge(self.key, dest, sources)
        else:
            self.model.merge(kind, self.key, dest, sources)

    # ------------------------------------------------------------ snapshots

    @rule()
    def take_snapshot(self) -> None:
        self.snapshots.append((self.backend.snapshot(), self.model.copy()))

    @precondition(lambda self: self.snapshots)
    @rule(i=st.integers(0, 7), release=st.booleans())
    def check_snapshot(self, i: int, release: bool) -> None:
        snap, model = self.snapshots[i % len(self.snapshots)]
        ordered = self.cleanup == "none"  # else cleanup may re-append an entry the model keeps in place
        assert self._snapshot_view(snap, snap.timestamp, ordered) == self._model_view(model, snap.timestamp, ordered)
        if release:
            snap.release()
            self.snapshots.remove((snap, model))

    @precondition(lambda self: self.snapshots)
    @rule(i=st.integers(0, 7))
    def restore_snapshot(self, i: int) -> None:
        snap, model = self.snapshots[i % len(self.snapshots)]
        fresh = self._new_backend()
        fresh.restore(snap)
        fresh._tables["map"]._check()
        again = fresh.snapshot()
        try:
            # a restore keeps each key's MapState insertion order
            assert self._snapshot_view(again, snap.timestamp, True) == self._snapshot_view(snap, snap.timestamp, True)
        finally:
            again.release()

    # ------------------------------------------------------------ views for comparison

    def _visible(self, ts: int, at: int) -> bool:
        """Whether a physical element must be compared: with NeverReturnExpired an
        element expired at snapshot time can never be read again, and cleanup may
        or may not have removed it."""
        if self.ttl is None or self.return_expired:
            return True
        return min(ts + self.ttl, (1 << 63) - 1) > at

    @staticmethod
    def _map_view(maps: dict, ordered: bool) -> dict:
        """Per (key, namespace): the user entries, as a list in order if ``ordered``."""
        return {k: list(v.items()) if ordered else v for k, v in maps.items()}

    def _snapshot_view(self, snap: Any, at: int, ordered: bool) -> dict:
        keep_ts = self.ttl is not None
        view: dict[str, dict] = {}
        for kind in ("value", "reducing", "aggregating"):
            view[kind] = {
                (k, ns): (tuple(v) if kind == "aggregating" else v, ts if keep_ts else None)
                for k, ns, v, ts in snap.entries(kind)
                if self._visible(ts, at)
            }
        lists: dict = {}
        for k, ns, vals, stamps in snap.entries("list"):
            stamps = stamps if stamps is not None else [0] * len(vals)
            elems = [(v, ts if keep_ts else None) for v, ts in zip(vals, stamps) if self._visible(ts, at)]
            if elems:
                lists[(k, ns)] = elems
        view["list"] = lists
        maps: dict = {}
        for k, ns, uk, v, ts in snap.entries("map"):
            if self._visible(ts, at):
                maps.setdefault((k, ns), {})[uk] = (v, ts if keep_ts else None)
        view["map"] = self._map_view(maps, ordered)
        return view

    def _model_view(self, model: Model, at: int, ordered: bool) -> dict:
        keep_ts = self.ttl is not None
        view: dict[str, dict] = {}
        for kind in ("value", "reducing", "aggregating"):
            view[kind] = {
                k: (tuple(v) if kind == "aggregating" else v, ts if keep_ts else None)
                for k, (v, ts) in getattr(model, kind).items()
                if self._visible(ts, at)
            }
        lists: dict = {}
        for k, recs in model.list.items():
            elems = [(v, ts if keep_ts else None) for v, ts in recs if self._visible(ts, at)]
            if elems:
                lists[k] = elems
        view["list"] = lists
        maps: dict = {}
        for k, m in model.map.items():
            entries = {uk: (v, ts if keep_ts else None) for uk, (v, ts) in m.items() if self._visible(ts, at)}
            if entries:
                maps[k] = entries
        view["map"] = self._map_view(maps, ordered)
        return view

    @invariant()
    def map_state_lists_hold(self) -> None:
        """Every key group's MapState lists agree with its value map (``_check``)."""
        if hasattr(self, "backend"):
            self.backend._tables["map"]._check()

    @invariant()
    def keys_cover_the_model(self) -> None:
        if not hasattr(self, "backend"):
            return
        for kind in ("value", "list", "map", "reducing", "aggregating"):
            stored = {(k, VOID_NAMESPACE) for k in self.backend.keys(kind, VOID_NAMESPACE)}
            visible = {
                k
                for k, rec in getattr(self.model, kind).items()
                if k[1] is VOID_NAMESPACE and self._has_unexpired(kind, rec)
            }
            assert visible <= stored

    def _has_unexpired(self, kind: str, rec: Any) -> bool:
        if kind == "list":
            return any(not self.model.expired(ts) for _, ts in rec)
        if kind == "map":
            return any(not self.model.expired(ts) for _, ts in rec.values())
        return not self.model.expired(rec[1])

    def teardown(self) -> None:
        for snap, _ in getattr(self, "snapshots", []):
            snap.release()


def _machine(name: str, **attrs: Any) -> type[RuleBasedStateMachine]:
    cls = type(name, (BackendMachine,), attrs)
    cls.TestCase.settings = settings(
        max_examples=100,
        stateful_step_count=80,
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
    )
    return cls


NoTtl = _machine("NoTtl")
TtlOnWrite = _machine("TtlOnWrite", ttl=TTL)
TtlOnReadReturnExpired = _machine("TtlOnReadReturnExpired", ttl=TTL, on_read=True, return_expired=True)
TtlOnWriteReturnExpired = _machine("TtlOnWriteReturnExpired", ttl=TTL, return_expired=True)
TtlOnReadIncremental = _machine("TtlOnReadIncremental", ttl=TTL, on_read=True, cleanup="incremental", merges=False)
TtlEveryRecord = _machine("TtlEveryRecord", ttl=TTL, cleanup="every_record", merges=False)
# timedelta.max as TTL, the clock a few ms before 2**63 - 1: ts + ttl saturates
TtlOverflow = _machine("TtlOverflow", ttl=timedelta.max // timedelta(milliseconds=1), start=MAX_TS - 3 * TTL)

TestNoTtl = NoTtl.TestCase
TestTtlOnWrite = TtlOnWrite.TestCase
TestTtlOnReadReturnExpired = TtlOnReadReturnExpired.TestCase
TestTtlOnWriteReturnExpired = TtlOnWriteReturnExpired.TestCase
TestTtlOnReadIncremental = TtlOnReadIncremental.TestCase
TestTtlEveryRecord = TtlEveryRecord.TestCase
TestTtlOverflow = TtlOverflow.TestCase
