"""``KeyGroupUserMap`` (one key group's MapState entries) against a plain model: a dict
of ordered dicts, ``(key, namespace) -> {user_key: (value, ts)}`` in insertion order.

The state machine inserts, removes, clears, walks (with and without TTL), expires
entries on read, sweeps (bounded and full), snapshots, exports and imports, and checks
``_check()`` and the whole content after every step. The direct tests below cover every
way a sweep can take several entries of one list at once, and every order in which
their unlinks can come.
"""

from __future__ import annotations

import itertools
from typing import Any

import hypothesis.strategies as st
import pytest
from hypothesis import HealthCheck, settings
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from cowmap._core import EXPIRED
from cowmap.state import VOID_NAMESPACE
from cowmap.state.ttl import expired
from cowmap.state.user_map import NONE_VALUE, KeyGroupUserMap, make_ctx, split_ctx

TTL = 10
KEYS = st.sampled_from([0, 1, "k"])
NAMESPACES = st.sampled_from([VOID_NAMESPACE, "w"])
UKEYS = st.integers(0, 7)
VALUES = st.integers(-3, 30) | st.none()

Model = dict[tuple[Any, Any], dict[Any, tuple[Any, int]]]


def new_user_map() -> KeyGroupUserMap:
    return KeyGroupUserMap(lambda v: v)  # values are immutable here: nothing to copy


def content(um: KeyGroupUserMap) -> Model:
    """Everything ``um`` holds, read through its lists: ``(key, ns) -> {ukey: (value, ts)}``."""
    out: Model = {}
    for key, ns, _ in um.dirs:
        ctx = make_ctx(key, ns)
        out[key, ns] = {u: (v, um.values.timestamp(u, ctx)) for u, v in um.walk(key, ns, ctx)}
    return out


def as_lists(m: Model) -> dict[tuple[Any, Any], list[tuple[Any, Any, int]]]:
    """The model with its order made part of equality."""
    return {k: [(u, v, ts) for u, (v, ts) in d.items()] for k, d in m.items() if d}


def exported(records: Any) -> dict[tuple[Any, Any], list[tuple[Any, Any, int]]]:
    """Export records grouped per (key, ns), each group in the order exported."""
    out: dict[tuple[Any, Any], list[tuple[Any, Any, int]]] = {}
    for key, ns, ukey, value, ts in records:
        out.setdefault((key, ns), []).append((ukey, value, ts))
    return out


class UserMapMachine(RuleBasedStateMachine):
    @initialize()
    def setup(self) -> None:
        self.um = new_user_map()
        self.model: Model = {}
        self.now = 100
        self.snaps: list[tuple[Any, Model]] = []

    def _entries(self, key: Any, ns: Any) -> dict[Any, tuple[Any, int]]:
        return self.model.setdefault((key, ns), {})

    def _drop_empty(self) -> None:
        for k in [k for k, d in self.model.items() if not d]:
            del self.model[k]

    # ------------------------------------------------------------ time

    @rule(dt=st.integers(0, TTL + 2))
    def tick(self, dt: int) -> None:
        self.now += dt

    # ------------------------------------------------------------ writes

    @rule(key=KEYS, ns=NAMESPACES, ukey=UKEYS, value=VALUES)
    def insert(self, key: Any, ns: Any, ukey: Any, value: Any) -> None:
        entries = self._entries(key, ns)
        was_new = ukey not in entries
        assert self.um.insert(make_ctx(key, ns), ukey, value, self.now) is was_new
        entries[ukey] = (value, self.now)  # an existing key keeps its place

    @rule(key=KEYS, ns=NAMESPACES, ukey=UKEYS, value=VALUES)
    def put_then_link(self, key: Any, ns: Any, ukey: Any, value: Any) -> None:
        """MapState.put's path: write the value map, link only a new user key."""
        ctx = make_ctx(key, ns)
        if self.um.values.put(ukey, ctx, NONE_VALUE if value is None else value, self.now):
            self.um.link(ctx, ukey)
        self._entries(key, ns)[ukey] = (value, self.now)

    @rule(key=KEYS, ns=NAMESPACES, ukey=UKEYS)
    def remove(self, key: Any, ns: Any, ukey: Any) -> None:
        entries = self._entries(key, ns)
        assert self.um.remove(make_ctx(key, ns), ukey) is (ukey in entries)
        entries.pop(ukey, None)
        self._drop_empty()

    @rule(key=KEYS, ns=NAMESPACES)
    def clear_key(self, key: Any, ns: Any) -> None:
        self.um.clear_key(key, ns, make_ctx(key, ns))
        self.model.pop((key, ns), None)

    # ------------------------------------------------------------ reads

    @rule(key=KEYS, ns=NAMESPACES)
    def walk(self, key: Any, ns: Any) -> None:
        got = self.um.walk(key, ns, make_ctx(key, ns))
        assert got == [(u, v) for u, (v, _) in self.model.get((key, ns), {}).items()]

    @rule(key=KEYS, ns=NAMESPACES, refresh=st.booleans(), return_expired=st.booleans())
    def walk_with_ttl(self, key: Any, ns: Any, refresh: bool, return_expired: bool) -> None:
        reads = []

        def now() -> int:  # a time provider that counts its reads
            reads.append(1)
            return self.now

        got = self.um.walk(key, ns, make_ctx(key, ns), now, TTL, refresh, return_expired)
        entries = self.model.get((key, ns), {})
        want = []
        for u, (v, ts) in list(entries.items()):
            if expired(ts, TTL, self.now):
                del entries[u]
                if return_expired:
                    want.append((u, v))
            else:
                want.append((u, v))
                if refresh:
                    entries[u] = (v, self.now)
        assert got == want
        assert len(reads) == (1 if (key, ns) in self.model else 0)  # the clock, once, if there are entries
        self._drop_empty()

    @rule(key=KEYS, ns=NAMESPACES, ukey=UKEYS)
    def get_expiring(self, key: Any, ns: Any, ukey: Any) -> None:
        """MapState's TTL read: an expired entry leaves the value map, then is unlinked."""
        ctx = make_ctx(key, ns)
        v = self.um.values.get_unexpired(ukey, ctx, self.now, TTL)
        entries = self.model.get((key, ns), {})
        if ukey not in entries:
            assert v is None
            return
        value, ts = entries[ukey]
        if expired(ts, TTL, self.now):
            assert v is EXPIRED
            old = self.um.values.remove_and_get_old(ukey, ctx)
            self.um.unlink(ctx, ukey)
            assert (None if old is NONE_VALUE else old) == value
            del entries[ukey]
            self._drop_empty()
        else:
            assert (None if v is NONE_VALUE else v) == value

    # ------------------------------------------------------------ sweeps

    @rule(budget=st.sampled_from([1, 2, 5, None]))
    def sweep(self, budget: int | None) -> None:
        before = {(k, u) for k, d in self.model.items() for u in d}
        n = self.um.sweep(self.now, TTL, budget)
        after = content(self.um)
        gone = {(k, u) for k, u in before if u not in after.get(k, {})}
        assert len(gone) == n
        for k, u in gone:  # only expired entries go, and their neighbours stay in order
            assert expired(self.model[k][u][1], TTL, self.now)
            del self.model[k][u]
        if budget is None:  # a full pass takes every expired entry
            assert not any(expired(ts, TTL, self.now) for d in self.model.values() for _, ts in d.values())
        self._drop_empty()

    # ------------------------------------------------------------ snapshots

    @rule()
    def take_snapshot(self) -> None:
        model = {k: dict(d) for k, d in self.model.items()}
        self.snaps.append((self.um.values.snapshot(), model))

    @precondition(lambda self: self.snaps)
    @rule(i=st.integers(0, 5), cleanup=st.booleans(), release=st.booleans())
    def export(self, i: int, cleanup: bool, release: bool) -> None:
        snap, model = self.snaps[i % len(self.snaps)]
        now = self.now if cleanup else None
        got = exported(KeyGroupUserMap.export(snap, now, TTL))
        want = {
            k: [(u, v, ts) for u, v, ts in entries if now is None or not expired(ts, TTL, now)]
            for k, entries in as_lists(model).items()
        }
        assert got == {k: e for k, e in want.items() if e}
        if release:
            snap.release()
            self.snaps.remove((snap, model))

    @precondition(lambda self: self.snaps)
    @rule(i=st.integers(0, 5))
    def import_into_fresh(self, i: int) -> None:
        snap, model = self.snaps[i % len(self.snaps)]
        fresh = new_user_map()
        fresh.import_records(KeyGroupUserMap.export(snap, None, TTL), lambda v: v)
        fresh._check()
        assert as_lists(content(fresh)) == as_lists(model)

    @precondition(lambda self: self.snaps)
    @rule(i=st.integers(0, 5))
    def import_into_live(self, i: int) -> None:
        """A restore into a user map that has entries: a user key already there takes
        the record's value and timestamp and keeps its place; new ones go last."""
        snap, model = self.snaps[i % len(self.snaps)]
        self.um.import_records(KeyGroupUserMap.export(snap, None, TTL), lambda v: v)
        for k, entries in as_lists(model).items():
            mine = self._entries(*k)
            for u, v, ts in entries:
                mine[u] = (v, ts)

    # ------------------------------------------------------------ invariants

    @invariant()
    def matches_the_model(self) -> None:
        if not hasattr(self, "um"):
            return
        self.um._check()
        assert as_lists(content(self.um)) == as_lists(self.model)
        assert self.um.num_keys() == len(self.model)
        for key, ns in self.model:
            assert self.um.has_entries(key, ns)
        assert sorted(map(repr, self.um.keys(VOID_NAMESPACE))) == sorted(
            repr(k) for k, ns in self.model if ns is VOID_NAMESPACE
        )

    def teardown(self) -> None:
        for snap, _ in getattr(self, "snaps", []):
            snap.release()


UserMapMachine.TestCase.settings = settings(
    max_examples=150, stateful_step_count=60, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
TestUserMap = UserMapMachine.TestCase


# ------------------------------------------------------------ several entries of one list at once

N = 6  # entries per list in the exhaustive tests


def _filled(keys: list[Any], stamp: Any) -> KeyGroupUserMap:
    """Lists of user keys ``0..N-1`` for each of ``keys``, interleaved, entry ``u`` of key
    ``k`` with timestamp ``stamp(k, u)``."""
    um = new_user_map()
    for u in range(N):
        for k in keys:
            um.insert(make_ctx(k, VOID_NAMESPACE), u, (k, u), stamp(k, u))
    um._check()
    return um


def test_a_full_sweep_takes_any_subset_of_a_list_at_once() -> None:
    """Every subset of one list's entries expires together (head, tail, runs of
    neighbours, all of them), another list's entries interleaved with it stay."""
    for expiring in range(1 << N):
        case = f"expiring {expiring:0{N}b}"
        um = _filled(["a", "b"], lambda k, u, expiring=expiring: 0 if k == "a" and expiring >> u & 1 else 50)
        assert um.sweep(TTL, TTL, None) == bin(expiring).count("1"), case
        um._check()
        kept = [u for u in range(N) if not expiring >> u & 1]
        assert um.walk("a", VOID_NAMESPACE, "a") == [(u, ("a", u)) for u in kept], case
        assert um.walk("b", VOID_NAMESPACE, "b") == [(u, ("b", u)) for u in range(N)], case
        assert um.has_entries("a", VOID_NAMESPACE) is bool(kept), case
        # the list stays usable: a new entry goes last
        um.insert("a", "new", 0, 50)
        um._check()
        assert [u for u, _ in um.walk("a", VOID_NAMESPACE, "a")] == kept + ["new"], case


def test_unlink_all_in_any_order() -> None:
    """Entries gone from the value map together are unlinked right whatever order
    the removal records come in (a sweep reports them in hash order): every non-empty
    subset of a list of N - 1, in every order, in the void namespace and in another."""
    for size in range(1, N):
        for order in itertools.chain.from_iterable(
            itertools.permutations(subset) for subset in itertools.combinations(range(N - 1), size)
        ):
            um = new_user_map()
            for ns in (VOID_NAMESPACE, "w"):
                for u in range(N - 1):
                    um.insert(make_ctx("k", ns), u, u, 0)
            removed = []
            for ns in (VOID_NAMESPACE, "w"):
                ctx = make_ctx("k", ns)
                for u in order:
                    removed.append((u, ctx, um.values.remove_and_get_old(u, ctx)))
            um.unlink_all(removed)
            um._check()
            kept = [u for u in range(N - 1) if u not in order]
            for ns in (VOID_NAMESPACE, "w"):
                assert [u for u, _ in um.walk("k", ns, make_ctx("k", ns))] == kept, order
            assert um.num_keys() == (2 if kept else 0), order


def test_contexts_round_trip() -> None:
    for key, ns in [(1, VOID_NAMESPACE), ("k", "w"), ((1, 2, 3), 0), (("t", 1), VOID_NAMESPACE)]:
        assert split_ctx(make_ctx(key, ns)) == (key, ns)
    assert make_ctx("k", VOID_NAMESPACE) == "k"  # the void namespace builds no tuple


def test_check_catches_a_broken_list() -> None:
    """``_check`` is worth calling: it fails on a broken count, a one-sided link, a
    wrong tail, a linked entry without a value and a value without links."""
    def broken(how: str) -> KeyGroupUserMap:
        um = new_user_map()
        for u in range(3):
            um.insert("k", u, u, 0)
        um._check()
        if how == "count":
            um.dirs.get("k", VOID_NAMESPACE)[0] = 4
        elif how == "prev":
            um.links.put(2, "k", (0, None))
        elif how == "tail":
            um.dirs.get("k", VOID_NAMESPACE)[2] = 1
        elif how == "no value":
            um.values.remove(1, "k")
        elif how == "no links":
            um.values.put(9, "k", 9)
        return um

    for how in ("count", "prev", "tail", "no value", "no links"):
        with pytest.raises(AssertionError):
            broken(how)._check()


def test_directory_lists_stay_out_of_the_collectors_view() -> None:
    """One directory list per (key, namespace): a full collection must not walk
    them, also after a snapshot made the map copy one before a write."""
    import gc

    from cowmap import KeyedStateBackend, MapStateDescriptor

    b = KeyedStateBackend(4)
    s = b.get_map_state(MapStateDescriptor("m"))
    for k in range(50):
        b.set_current_key(k)
        s.put("a", 1)
    with b.snapshot():
        for k in range(50):
            b.set_current_key(k)
            s.put("b", 2)  # the directory list is copied (shared with the snapshot), then changed
        dirs = [dc for u in b._tables["m"].users if u is not None for _, _, dc in u.dirs]
        assert len(dirs) == 50 and not any(gc.is_tracked(dc) for dc in dirs)
        assert all(dc[0] == 2 for dc in dirs)
