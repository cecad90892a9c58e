"""Regressions found in review of the keyed state layer: each test failed before its fix."""

from __future__ import annotations

import gc
import weakref
from datetime import timedelta
from typing import Any

import pytest

from cowmap.state import (
    KeyedStateBackend,
    ListStateDescriptor,
    MapStateDescriptor,
    StateTtlConfig,
    ValueStateDescriptor,
)


def _ttl(ms: int = 1000) -> StateTtlConfig:
    return StateTtlConfig.new_builder(timedelta(milliseconds=ms)).disable_cleanup_in_background().build()


def test_discarded_backend_is_collected() -> None:
    """A map's copier is a bound method of its table: the cycle must be collectable."""
    payload = object()
    backend = KeyedStateBackend()
    state = backend.get_state(ValueStateDescriptor("v"))
    for k in range(50):
        backend.set_current_key(k)
        state.update([payload])
    table = weakref.ref(backend._tables["v"])
    del backend, state
    gc.collect()
    assert table() is None


def test_mutable_default_value_is_not_shared_between_keys() -> None:
    desc = ValueStateDescriptor("counts", default_value={})
    backend = KeyedStateBackend()
    s = backend.get_state(desc)
    backend.set_current_key("alice")
    c = s.value()
    c["x"] = 1
    s.update(c)
    backend.set_current_key("carol")
    assert s.value() == {}
    assert desc.default_value == {}


@pytest.mark.parametrize("kind", ["value", "list", "map"])
def test_restored_state_shares_no_objects_with_its_source(kind: str) -> None:
    a = KeyedStateBackend()
    b = KeyedStateBackend()
    descs: dict[str, Any] = {
        "value": ValueStateDescriptor("s"),
        "list": ListStateDescriptor("s"),
        "map": MapStateDescriptor("s"),
    }

    def view(backend: KeyedStateBackend) -> Any:
        getter = {"value": backend.get_state, "list": backend.get_list_state, "map": backend.get_map_state}[kind]
        return getter(descs[kind])

    def read(s: Any) -> Any:
        return {"value": lambda: s.value(), "list": lambda: s.get()[0], "map": lambda: s.get("u")}[kind]()

    sa = view(a)
    a.set_current_key("k")
    write = {
        "value": lambda: sa.update({"n": 1}),
        "list": lambda: sa.add({"n": 1}),
        "map": lambda: sa.put("u", {"n": 1}),
    }
    write[kind]()
    with a.snapshot() as snap:
        b.restore(snap)
        sb = view(b)
        b.set_current_key("k")
        read(sb)["n"] = 2  # in place, in the restored backend
        assert read(sa) == {"n": 1}
        assert {"n": 1} in [e[-2] if kind != "list" else e[2][0] for e in snap.entries("s")]


def test_list_copier_sees_only_values_with_ttl() -> None:
    seen: list[type] = []

    def copier(x: Any) -> Any:
        seen.append(type(x))
        return dict(x)

    desc = ListStateDescriptor("l", copier=copier)
    desc.enable_time_to_live(_ttl())
    backend = KeyedStateBackend(time_provider=lambda: 0)
    s = backend.get_list_state(desc)
    backend.set_current_key(1)
    s.add({"a": 1})
    with backend.snapshot():
        s.add({"b": 2})  # the first change after a snapshot copies the stored list
    assert s.get() == [{"a": 1}, {"b": 2}]
    assert seen == [dict]


@pytest.mark.parametrize("first_ttl", [False, True])
def test_reregistering_a_list_with_other_ttl_keeps_older_snapshots(first_ttl: bool) -> None:
    """Switching TTL on or off is refused (a state keeps the setting it was made
    with), so the stored lists, and the snapshots sharing them, stay as they were."""
    backend = KeyedStateBackend(time_provider=lambda: 1000)

    def descriptor(ttl: bool) -> ListStateDescriptor:
        desc = ListStateDescriptor("l")
        if ttl:
            desc.enable_time_to_live(_ttl(10_000))
        return desc

    s = backend.get_list_state(descriptor(first_ttl))
    backend.set_current_key("k")
    s.update(["a", "b", "c"])
    snap = backend.snapshot()
    with pytest.raises(ValueError, match="'l'"):
        backend.get_list_state(descriptor(not first_ttl))
    assert s.get() == ["a", "b", "c"]
    (entry,) = snap.entries("l")
    assert entry[2] == ["a", "b", "c"]
    restored = KeyedStateBackend(time_provider=lambda: 1000)
    restored.restore(snap)
    snap.release()
    r = restored.get_list_state(descriptor(first_ttl))
    restored.set_current_key("k")
    assert r.get() == ["a", "b", "c"]


def test_restore_with_a_kind_mismatch_changes_nothing() -> None:
    a = KeyedStateBackend()
    a.set_current_key("k")
    a.get_list_state(ListStateDescriptor("events")).add("e1")
    a.get_state(ValueStateDescriptor("s")).update(1)
    b = KeyedStateBackend()
    b.get_map_state(MapStateDescriptor("s"))
    with a.snapshot() as snap, pytest.raises(ValueError, match="'s' is map state here"):
        b.restore(snap)
    assert b.num_entries() == 0
    assert b.state_names() == ["s"]


def test_reading_states_while_looping_over_keys() -> None:
    """Flink's applyToAllKeys pattern: reads may remove expired entries meanwhile."""
    clock = [0]
    backend = KeyedStateBackend(time_provider=lambda: clock[0])
    desc = ValueStateDescriptor("v")
    desc.enable_time_to_live(StateTtlConfig.new_builder(timedelta(milliseconds=10)).build())
    s = backend.get_state(desc)
    for k in range(100):
        backend.set_current_key(k)
        s.update(k)
    clock[0] = 10
    seen = 0
    for k in backend.keys("v"):
        backend.set_current_key(k)
        assert s.value() is None
        seen += 1
    assert seen == 100


def test_time_provider_must_return_int_milliseconds() -> None:
    with pytest.raises(TypeError, match="int milliseconds"):
        KeyedStateBackend(time_provider=lambda: 1000.0)


@pytest.mark.parametrize("ukey", [int, str])
def test_map_state_entries_add_nothing_to_a_full_collection(ukey) -> None:
    """The links of MapState's insertion-order list are tuples of user keys: once a
    collection has seen them, the garbage collector tracks nothing per user entry
    (lists were tracked for good, so a full collection walked every entry)."""
    backend = KeyedStateBackend()
    ms = backend.get_map_state(MapStateDescriptor("m"))
    gc.collect()
    before = len(gc.get_objects())
    n_keys, per_key = 20, 500
    for k in range(n_keys):
        backend.set_current_key(k)
        for u in range(per_key):
            ms.put(ukey(u), u * 1000)  # values are ints: untracked too
    for k in range(n_keys):  # changes to the list after the first fill
        backend.set_current_key(k)
        ms.remove(ukey(7))
        ms.put(ukey(per_key), 0)
    gc.collect()
    grown = len(gc.get_objects()) - before
    assert grown < n_keys * 5, grown  # per key: a directory list and such, not per entry
    backend.set_current_key(3)
    keys = ms.keys()
    assert len(keys) == per_key and keys[-1] == ukey(per_key) and ukey(7) not in keys


def _stored_elements(backend: KeyedStateBackend, name: str) -> int:
    t = backend._table(name)
    return sum(len(e[2]) // 2 for kg in t.live for e in t.maps[kg])


@pytest.mark.parametrize("visibility", ["never", "return_expired"])
def test_a_list_that_keeps_growing_drops_its_expired_elements_with_background_cleanup(visibility: str) -> None:
    """The sweep drops a list once its newest element expired, so a list appended to for ever
    kept every expired element (memory without bound; Flink's incremental cleanup rewrites a
    partly expired list). With background cleanup an append drops the expired head: the list
    holds at most about twice its live elements, and reads see the live ones as before. Without
    it the elements stay, as in Flink."""
    from cowmap.state import StateVisibility

    clock = [0]
    for cleanup in (True, False):
        backend = KeyedStateBackend(8, time_provider=lambda: clock[0])
        builder = StateTtlConfig.new_builder(timedelta(seconds=1))
        if visibility == "return_expired":
            builder = builder.set_state_visibility(StateVisibility.ReturnExpiredIfNotCleanedUp)
        if not cleanup:
            builder = builder.disable_cleanup_in_background()
        desc = ListStateDescriptor("clicks")
        desc.enable_time_to_live(builder.build())
        clicks = backend.get_list_state(desc)
        most = 0
        for i in range(3_000):
            clock[0] = i * 10  # 100 elements live at a time
            for user in range(3):
                backend.set_current_key(user)
                clicks.add(i)
            most = max(most, _stored_elements(backend, "clicks"))
        backend.set_current_key(0)
        got = clicks.get()
        if cleanup:
            assert most <= 3 * 2 * 101
            assert got[-100:] == list(range(2_900, 3_000)) and len(got) <= 2 * 101
        else:
            assert most == 3 * 3_000
        if visibility == "never" or not cleanup:
            assert got == (list(range(2_900, 3_000)) if visibility == "never" else list(range(3_000)))


def test_cleanup_sweeps_nothing_at_a_time_when_no_entry_can_have_expired() -> None:
    """Fresh entries over thousands of key groups at one time (a micro-batch):
    the sweeps, which can find nothing, stop within one key groups' worth of
    accesses instead of running on until whole rounds over the maps found
    nothing; as soon as the clock moves, sweeps run again and find what expired."""
    from unittest import mock

    from cowmap.state import KeyGroupRange
    from cowmap.state.table import CLEANUP_BATCH, StateTable

    now = [0]
    b = KeyedStateBackend(4096, KeyGroupRange(0, 4095), time_provider=lambda: now[0])
    d = ValueStateDescriptor("v")
    d.enable_time_to_live(StateTtlConfig.new_builder(timedelta(milliseconds=5)).build())
    s = b.get_state(d)
    n = 40_000
    with mock.patch.object(StateTable, "sweep", autospec=True, side_effect=StateTable.sweep) as sweep:
        for k in range(n):
            b.set_current_key(k)
            s.update(k)
        assert sweep.call_count <= 4096 // CLEANUP_BATCH + 1
    assert b.num_entries() == n
    now[0] = 10  # every entry expired: the next accesses' steps sweep again
    for k in range(n, n + 50 * CLEANUP_BATCH):
        b.set_current_key(k)
        s.value()
    assert b.num_entries() < n


@pytest.mark.parametrize("how", ["restore", "shorter_ttl"])
def test_expired_entries_restored_or_made_by_a_shorter_ttl_at_a_quiet_time_are_swept(how: str) -> None:
    """The cleanup skips its sweeps while the clock reads a time at which no
    entry could have expired; entries restored then with old timestamps, or a
    TTL shortened then, bring expired ones: the next steps sweep them, and a
    ``ReturnExpiredIfNotCleanedUp`` read does not find them after."""
    def cfg(ms: int) -> StateTtlConfig:
        return StateTtlConfig.new_builder(timedelta(milliseconds=ms)).return_expired_if_not_cleaned_up().build()

    now = [0]
    d = ValueStateDescriptor("v")
    d.enable_time_to_live(cfg(1_000 if how == "restore" else 100_000))
    old = KeyedStateBackend(128, time_provider=lambda: now[0])
    s = old.get_state(d)
    for k in range(1_000):
        old.set_current_key(("old", k))
        s.update(k)
    snap = old.snapshot()
    now[0] = 5_000
    b = old if how == "shorter_ttl" else KeyedStateBackend(128, time_provider=lambda: now[0])
    s2 = b.get_state(d)
    for k in range(5_000):  # fresh keys at 5,000: the cleanup goes quiet
        b.set_current_key(k)
        s2.update(k)
    if how == "restore":
        b.restore(snap)
    else:
        d2 = ValueStateDescriptor("v")
        d2.enable_time_to_live(cfg(1_000))
        s2 = b.get_state(d2)
    for k in range(5_000, 25_000):
        b.set_current_key(k)
        s2.update(k)
    assert b.num_entries() == 25_000
    b.set_current_key(("old", 999))
    assert s2.value() is None
