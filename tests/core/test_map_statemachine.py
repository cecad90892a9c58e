"""Hypothesis state machines: every map operation mirrored on a plain dict model.

The model is ``{(key, ns): (state, ts)}``. Snapshots are taken, read and released at random;
each remembers a frozen copy of the model at the moment it was taken. The pattern follows
pyroaring's ``RuleBasedStateMachine`` tests.

``PlainStateMachine`` uses immutable states and no copier. ``CopierStateMachine`` uses list
states with a copier and mutates states in place (through ``get``, ``get_many``, ``transform``,
and the old states handed back by ``put_and_get_old``/``remove_and_get_old``) the way Flink's
heap backend lets user code do, which snapshots must never see.
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import Bundle, RuleBasedStateMachine, consumes, invariant, rule

from cowmap import NO_TIMESTAMP, CopyOnWriteStateMap, StateMapSnapshot

from core_helpers import ListStates, PlainStates, as_dict

INT64_MIN = -(2**63)
INT64_MAX = 2**63 - 1

# Keys: small ints (negative too, -1 and -2 share a hash), strings, tuples, values equal to ints
# (1.0, True) and big ints whose hash collides with a small int (2**61 + 1 hashes like 2).
INT_KEYS = st.integers(-8, 8)
KEYS = st.one_of(
    INT_KEYS,
    st.sampled_from(["a", "b", "", "ns"]),
    st.tuples(st.integers(0, 2), st.sampled_from(["x", "y"])),
    st.sampled_from([1.0, True, 2**61 + 1, 2**64 + 3, -(2**63)]),
)
NP_KEYS = st.one_of(INT_KEYS, st.sampled_from([2**61 + 1, -(2**63), INT64_MAX, -1, -2]))
NAMESPACES = st.sampled_from([0, 1, "ns", ("n", 2)])
TIMESTAMPS = st.one_of(
    st.integers(-20, 60), st.sampled_from([NO_TIMESTAMP, NO_TIMESTAMP - 5, INT64_MIN, INT64_MIN + 3])
)
OPT_TS = st.one_of(st.none(), TIMESTAMPS)  # None: call without ts (NO_TIMESTAMP)
NOWS = st.one_of(st.integers(-30, 90), st.sampled_from([INT64_MAX, INT64_MIN]))
TTLS = st.one_of(st.integers(1, 40), st.sampled_from([2**62, INT64_MAX]))


def is_expired(ts: int, ttl: int, now: int) -> bool:
    return min(ts + ttl, (1 << 63) - 1) <= now  # saturating at 2**63 - 1, as Flink's TtlUtils


class SnapRecord:
    """A live snapshot and the model (normalised ``{(key, ns): (state, ts)}``) at its moment."""

    def __init__(self, snapshot: StateMapSnapshot, expected: dict) -> None:
        self.snapshot = snapshot
        self.expected = expected

    def __repr__(self) -> str:
        return f"SnapRecord(version={self.snapshot.version}, n={len(self.expected)})"


class PlainStateMachine(PlainStates, RuleBasedStateMachine):
    """Immutable states (ints, strings, None, tuples); no copier."""

    snapshots = Bundle("snapshots")

    def __init__(self) -> None:
        super().__init__()
        self.m = CopyOnWriteStateMap(capacity=4, copier=self.make_copier())
        self.model: dict[tuple[Any, Any], tuple[Any, int]] = {}
        self.live: list[SnapRecord] = []
        self.visitor = None

    # -- hooks overridden by the copier machine (see also PlainStates) -------------------

    def transform_fn(self, old: Any, value: Any) -> Any:
        return (old, value)

    def expected_transform(self, old_norm: Any, value: Any) -> Any:
        return (old_norm, value)

    # -- helpers ----------------------------------------------------------------------------

    def set_model(self, key: Any, ns: Any, state_norm: Any, ts: int | None) -> None:
        self.model[(key, ns)] = (state_norm, NO_TIMESTAMP if ts is None else ts)

    def frozen_model(self) -> dict:
        return dict(self.model)  # states in the model are immutable

    def contents(self) -> dict:
        return {k: self.norm(v) for k, v in as_dict(iter(self.m)).items()}

    # -- single-entry operations --------------------------------------------------------------

    @rule(key=KEYS, ns=NAMESPACES, state=st.data(), ts=OPT_TS)
    def put(self, key, ns, state, ts) -> None:
        drawn = state.draw(self.STATES)
        if ts is None:
            self.m.put(key, ns, self.new_state(drawn))
        else:
            self.m.put(key, ns, self.new_state(drawn), ts)
        self.set_model(key, ns, self.norm(self.new_state(drawn)), ts)

    @rule(key=KEYS, ns=NAMESPACES)
    def get(self, key, ns) -> None:
        assert self.norm(self.m.get(key, ns)) == self.expected_state(key, ns)

    @rule(key=KEYS, ns=NAMESPACES)
    def contains_key(self, key, ns) -> None:
        assert self.m.contains_key(key, ns) == ((key, ns) in self.model)

    @rule(key=KEYS, ns=NAMESPACES)
    def remove(self, key, ns) -> None:
        self.m.remove(key, ns)
        self.model.pop((key, ns), None)

    @rule(key=KEYS, ns=NAMESPACES, state=st.data(), ts=OPT_TS)
    def put_and_get_old(self, key, ns, state, ts) -> None:
        new = self.new_state(state.draw(self.STATES))
        new_norm = self.norm(new)
        old = self.m.put_and_get_old(key, ns, new) if ts is None else self.m.put_and_get_old(key, ns, new, ts)
        assert self.norm(old) == self.expected_state(key, ns)
        self.set_model(key, ns, new_norm, ts)
        self.scribble(old)

    @rule(key=KEYS, ns=NAMESPACES)
    def remove_and_get_old(self, key, ns) -> None:
        old = self.m.remove_and_get_old(key, ns)
        assert self.norm(old) == self.expected_state(key, ns)
        self.model.pop((key, ns), None)
        self.scribble(old)

    def scribble(self, old_state: Any) -> None:
        """Mutate a state the map handed back and no longer holds (copier machine only)."""

    @rule(key=KEYS, ns=NAMESPACES, value=st.integers(0, 9), ts=OPT_TS)
    def transform(self, key, ns, value, ts) -> None:
        expected_old = self.expected_state(key, ns)
        seen = []

        def fn(old, v):
            seen.append(self.norm(old))
            return self.transform_fn(old, v)

        if ts is None:
            self.m.transform(key, ns, value, fn)
        else:
            self.m.transform(key, ns, value, fn, ts)
        assert seen == [expected_old]
        self.set_model(key, ns, self.expected_transform(expected_old, value), ts)

    # -- timestamps ---------------------------------------------------------------------------

    @rule(key=KEYS, ns=NAMESPACES, ts=TIMESTAMPS)
    def set_timestamp(self, key, ns, ts) -> None:
        present = (key, ns) in self.model
        assert self.m.set_timestamp(key, ns, ts) is present
        if present:
            self.model[(key, ns)] = (self.model[(key, ns)][0], ts)

    @rule(key=KEYS, ns=NAMESPACES)
    def timestamp(self, key, ns) -> None:
        entry = self.model.get((key, ns))
        assert self.m.timestamp(key, ns) == (None if entry is None else entry[1])

    @rule(key=KEYS, ns=NAMESPACES)
    def get_with_timestamp(self, key, ns) -> None:
        got = self.m.get_with_timestamp(key, ns)
        entry = self.model.get((key, ns))
        if entry is None:
            assert got is None
        else:
            assert isinstance(got, tuple) and len(got) == 2
            assert (self.norm(got[0]), got[1]) == entry

    # -- batch operations ---------------------------------------------------------------------

    @rule(keys=st.lists(KEYS, max_size=6), ns=NAMESPACES)
    def get_many(self, keys, ns) -> None:
        got = self.m.get_many(keys, ns)
        assert [self.norm(s) for s in got] == [self.expected_state(k, ns) for k in keys]

    @rule(keys=st.lists(NP_KEYS, max_size=6), ns=NAMESPACES)
    def get_many_numpy(self, keys, ns) -> None:
        got = self.m.get_many(np.array(keys, dtype=np.int64), ns)
        assert [self.norm(s) for s in got] == [self.expected_state(k, ns) for k in keys]

    @rule(keys=st.lists(KEYS, max_size=6), data=st.data(), ns=NAMESPACES, ts=OPT_TS, numpy=st.booleans())
    def put_many(self, keys, data, ns, ts, numpy) -> None:
        if numpy:
            keys = [k for k in keys if type(k) is int and INT64_MIN <= k <= INT64_MAX]
        states = [self.new_state(data.draw(self.STATES)) for _ in keys]
        norms = [self.norm(s) for s in states]
        arg = np.array(keys, dtype=np.int64) if numpy else keys
        if ts is None:
            self.m.put_many(arg, ns, states)
        else:
            self.m.put_many(arg, ns, states, ts=ts)
        for k, s in zip(keys, norms):
            self.set_model(k, ns, s, ts)

    @rule(keys=st.lists(KEYS, max_size=6), ns=NAMESPACES)
    def contains_many(self, keys, ns) -> None:
        got = self.m.contains_many(keys, ns)
        assert isinstance(got, np.ndarray) and got.dtype == np.bool_
        assert got.tolist() == [(k, ns) in self.model for k in keys]

    @rule(keys=st.lists(NP_KEYS, max_size=6), ns=NAMESPACES)
    def contains_many_numpy(self, keys, ns) -> None:
        got = self.m.contains_many(np.array(keys, dtype=np.int64), ns)
        assert got.tolist() == [(k, ns) in self.model for k in keys]

    @rule(keys=st.lists(KEYS, max_size=6), ns=NAMESPACES, numpy=st.booleans())
    def remove_many(self, keys, ns, numpy) -> None:
        if numpy:
            keys = [k for k in keys if type(k) is int and INT64_MIN <= k <= INT64_MAX]
        expected = 0
        for k in keys:
            if (k, ns) in self.model:
                del self.model[(k, ns)]
                expected += 1
        arg = np.array(keys, dtype=np.int64) if numpy else keys
        assert self.m.remove_many(arg, ns) == expected

    # -- TTL sweeps -----------------------------------------------------------------------

    def check_partial_sweep(self, now: int, ttl: int, max_entries: int) -> None:
        """A partial sweep may remove any subset of the expired entries, nothing else."""
        removed = self.m.sweep_expired(now, ttl, max_entries)
        present = set(as_dict(iter(self.m)))
        lost = [key for key in self.model if key not in present]
        assert len(lost) == removed
        for key in lost:
            ts = self.model[key][1]
            assert is_expired(ts, ttl, now), f"unexpired {key} (ts={ts}, ttl={ttl}, now={now}) swept"
            del self.model[key]

    def check_full_sweep(self, now: int, ttl: int) -> None:
        """``max_entries=None`` removes exactly the expired entries."""
        expired = [key for key, (_, ts) in self.model.items() if is_expired(ts, ttl, now)]
        assert self.m.sweep_expired(now, ttl, None) == len(expired)
        for key in expired:
            del self.model[key]

    @rule(now=NOWS, ttl=TTLS, max_entries=st.integers(1, 8))
    def sweep_partial(self, now, ttl, max_entries) -> None:
        self.check_partial_sweep(now, ttl, max_entries)

    @rule(now=NOWS, ttl=TTLS)
    def sweep_full(self, now, ttl) -> None:
        self.check_full_sweep(now, ttl)

    @rule(data=st.data(), ttl=TTLS, delta=st.sampled_from([-1, 0, 1]), max_entries=st.none() | st.integers(1, 8))
    def sweep_at_boundary(self, data, ttl, delta, max_entries) -> None:
        """Sweep with ``now`` right at (or next to) some entry's expiry instant ``ts + ttl``."""
        if not self.model:
            return
        key = data.draw(st.sampled_from(sorted(self.model, key=repr)))
        now = min(max(self.model[key][1] + ttl + delta, INT64_MIN), INT64_MAX)
        if max_entries is None:
            self.check_full_sweep(now, ttl)
        else:
            self.check_partial_sweep(now, ttl, max_entries)

    # -- iteration and visitor --------------------------------------------------------------

    @rule(probes=st.lists(st.tuples(KEYS, NAMESPACES), min_size=1, max_size=4))
    def iterate_with_lookups(self, probes) -> None:
        """Lookups inside the loop run rehash steps; each entry still comes exactly once."""
        seen = []
        for i, entry in enumerate(self.m):
            seen.append(entry)
            k, ns = probes[i % len(probes)]
            self.m.contains_key(k, ns)
            self.m.get(k, ns)
        assert {key: self.norm(v) for key, v in as_dict(seen).items()} == {
            key: v for key, (v, _) in self.model.items()
        }

    @rule()
    def check_timestamps(self) -> None:
        entries = list(self.m)
        got = {(k, ns): (self.norm(s), self.m.timestamp(k, ns)) for k, ns, s in entries}
        assert got == self.model

    @rule(n=st.integers(1, 8), action=st.sampled_from(["read", "update", "remove"]), new=st.data())
    def visitor_step(self, n, action, new) -> None:
        if self.visitor is None or not self.visitor.has_next():
            self.visitor = self.m.incremental_visitor(n)
        batch = self.visitor.next_entries()
        if batch is None:
            self.visitor = None
            return
        for k, ns, s in batch:
            # entries come from the current table: they are live and current
            assert (k, ns) in self.model
            assert self.norm(s) == self.model[(k, ns)][0]
            if action == "update":
                state = self.new_state(new.draw(self.STATES))
                old_ts = self.model[(k, ns)][1]
                self.visitor.update(k, ns, state)
                ts = self.m.timestamp(k, ns)
                assert ts in (old_ts, NO_TIMESTAMP)  # kept, or reset like any write without ts
                self.model[(k, ns)] = (self.norm(state), ts)
            elif action == "remove":
                self.visitor.remove(k, ns)
                del self.model[(k, ns)]

    @rule(n=st.integers(1, 8))
    def full_visit(self, n) -> None:
        v = self.m.incremental_visitor(n)
        seen = {}
        calls = 0
        while (batch := v.next_entries()) is not None:
            calls += 1
            assert calls <= 10_000
            for k, ns, s in batch:
                seen[(k, ns)] = self.norm(s)
        assert seen == {key: v for key, (v, _) in self.model.items()}

    @rule(
        n=st.integers(1, 4),
        new_keys=st.lists(st.integers(100, 400), max_size=40),
        probes=st.lists(st.tuples(KEYS, NAMESPACES), min_size=1, max_size=4),
    )
    def visit_with_churn(self, n, new_keys, probes) -> None:
        """A whole visit while puts (which may rehash) and lookups (rehash steps) happen between
        the calls: every entry present throughout is returned at least once."""
        present_throughout = set(self.model)
        v = self.m.incremental_visitor(n)
        seen = set()
        calls = 0
        while (batch := v.next_entries()) is not None:
            calls += 1
            assert calls <= 10_000
            for k, ns, s in batch:
                assert self.norm(s) == self.model[(k, ns)][0]
                seen.add((k, ns))
            if new_keys:
                key = new_keys.pop()
                self.m.put(key, "churn", None)
                self.set_model(key, "churn", None, None)
            k, ns = probes[calls % len(probes)]
            self.m.get(k, ns)
        missing = present_throughout - seen
        assert not missing, f"visit missed entries present throughout: {missing}"

    # -- snapshots --------------------------------------------------------------------------

    @rule(target=snapshots)
    def take_snapshot(self) -> SnapRecord:
        rec = SnapRecord(self.m.snapshot(), self.frozen_model())
        if self.live:
            assert rec.snapshot.version > max(r.snapshot.version for r in self.live)
        self.live.append(rec)
        return rec

    @rule(rec=snapshots)
    def check_snapshot(self, rec: SnapRecord) -> None:
        s = rec.snapshot
        assert not s.released
        assert len(s) == len(rec.expected)
        got = {key: (self.norm(st_), ts) for key, (st_, ts) in as_dict(s.iter_with_timestamps()).items()}
        assert got == rec.expected
        got_states = {key: self.norm(v) for key, v in as_dict(iter(s)).items()}
        assert got_states == {key: v for key, (v, _) in rec.expected.items()}

    @rule(rec=consumes(snapshots))
    def release_snapshot(self, rec: SnapRecord) -> None:
        # check once more before letting go: later changes must not have leaked in
        self.check_snapshot(rec)
        rec.snapshot.release()
        assert rec.snapshot.released
        rec.snapshot.release()  # idempotent
        self.live.remove(rec)

    # -- invariants -------------------------------------------------------------------------

    @invariant()
    def same_size(self) -> None:
        assert len(self.m) == len(self.model)

    @invariant()
    def same_contents(self) -> None:
        assert self.contents() == {key: v for key, (v, _) in self.model.items()}

    @invariant()
    def snapshot_bookkeeping(self) -> None:
        versions = sorted(r.snapshot.version for r in self.live)
        assert self.m.snapshot_versions == versions
        assert self.m.highest_required_snapshot_version == (versions[-1] if versions else 0)

    def teardown(self) -> None:
        for rec in self.live:
            self.check_snapshot(rec)
            rec.snapshot.release()


class CopierStateMachine(ListStates, PlainStateMachine):
    """List states with a copier; states are mutated in place wherever user code may do so."""

    def transform_fn(self, old, value):
        # Flink's test transformation: append in place and hand back the same list
        if old is None:
            old = []
        old.append(value)
        return old

    def expected_transform(self, old_norm, value):
        return (old_norm or ()) + (value,)

    @rule(key=KEYS, ns=NAMESPACES, value=st.integers(0, 9))
    def get_and_mutate(self, key, ns, value) -> None:
        calls = self.copier.calls
        state = self.m.get(key, ns)
        assert self.norm(state) == self.expected_state(key, ns)
        again = self.m.get(key, ns)
        assert again is state  # the second get of the same entry returns the same object
        if not self.live:
            assert self.copier.calls == calls  # no snapshot: nothing is ever copied
        if state is not None:
            state.append(value)
            old_norm, ts = self.model[(key, ns)]
            self.model[(key, ns)] = (old_norm + (value,), ts)

    @rule(keys=st.lists(INT_KEYS, min_size=1, max_size=5, unique=True), ns=NAMESPACES, value=st.integers(0, 9))
    def get_many_and_mutate(self, keys, ns, value) -> None:
        calls = self.copier.calls
        states = self.m.get_many(np.array(keys, dtype=np.int64), ns)
        assert [self.norm(s) for s in states] == [self.expected_state(k, ns) for k in keys]
        if not self.live:
            assert self.copier.calls == calls
        for k, s in zip(keys, states):
            if s is not None:
                s.append(value)
                old_norm, ts = self.model[(k, ns)]
                self.model[(k, ns)] = (old_norm + (value,), ts)

    @invariant()
    def no_copies_without_snapshots(self) -> None:
        if not self.live:
            calls = self.copier.calls
            for k, ns, _ in list(self.m)[:3]:
                a = self.m.get(k, ns)
                assert self.m.get(k, ns) is a
            assert self.copier.calls == calls


_SETTINGS = settings(
    # fewer in the reruns on other builds (variant_build.rerun_tests), to keep them short
    max_examples=int(os.environ.get("COWMAP_STATEMACHINE_EXAMPLES", "400")),
    stateful_step_count=100,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)

TestPlainStateMachine = PlainStateMachine.TestCase
TestPlainStateMachine.settings = _SETTINGS

TestCopierStateMachine = CopierStateMachine.TestCase
TestCopierStateMachine.settings = _SETTINGS
