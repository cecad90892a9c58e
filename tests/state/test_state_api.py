"""The keyed-state API surface and its handling of bad input.

Errors follow docs/architecture.md#conventions: ``TypeError`` for wrong types (unhashable or None
keys), ``ValueError`` for bad values (TTL <= 0, None in a ListState, a state name
registered with another kind), ``RuntimeError`` for misuse (no current key, a
released snapshot). Snapshots are copy-on-write and must be isolated from every
later change, including in-place changes of mutable values handed out by the
states (Flink's heap backend copies a state shared with a snapshot before
handing it out; here the descriptor's ``copier`` does).
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest

import cowmap
from cowmap.state import (
    VOID_NAMESPACE,
    AggregateFunction,
    AggregatingStateDescriptor,
    KeyedStateBackend,
    KeyedStateSnapshot,
    KeyGroupRange,
    ListStateDescriptor,
    MapStateDescriptor,
    ReducingStateDescriptor,
    StateTtlConfig,
    StateVisibility,
    TtlTimeCharacteristic,
    UpdateType,
    ValueStateDescriptor,
    key_group_for,
)


def ttl_config(ms: int = 100) -> StateTtlConfig:
    return StateTtlConfig.new_builder(timedelta(milliseconds=ms)).build()


class ListAgg(AggregateFunction):
    """A mutable accumulator (a list), changed in place by ``add`` and ``merge``."""

    def create_accumulator(self) -> list[Any]:
        return []

    def add(self, value: Any, accumulator: list[Any]) -> list[Any]:
        accumulator.append(value)
        return accumulator

    def get_result(self, accumulator: list[Any]) -> list[Any]:
        return list(accumulator)

    def merge(self, acc_a: list[Any], acc_b: list[Any]) -> list[Any]:
        acc_a.extend(acc_b)
        return acc_a


def make_descriptor(kind: str, name: str | None = None) -> Any:
    name = name or kind
    if kind == "value":
        return ValueStateDescriptor(name)
    if kind == "list":
        return ListStateDescriptor(name)
    if kind == "map":
        return MapStateDescriptor(name)
    if kind == "reducing":
        return ReducingStateDescriptor(name, lambda a, b: a + b)
    if kind == "aggregating":
        return AggregatingStateDescriptor(name, ListAgg())
    raise AssertionError(kind)


def get_state(backend: KeyedStateBackend, desc: Any) -> Any:
    return {
        "value": backend.get_state,
        "list": backend.get_list_state,
        "map": backend.get_map_state,
        "reducing": backend.get_reducing_state,
        "aggregating": backend.get_aggregating_state,
    }[desc.kind](desc)


KINDS = ["value", "list", "map", "reducing", "aggregating"]

# every public state method, called with plausible arguments
METHODS: dict[str, list[tuple[str, Callable[[Any], Any]]]] = {
    "value": [("value", lambda s: s.value()), ("update", lambda s: s.update(1)), ("clear", lambda s: s.clear())],
    "list": [
        ("get", lambda s: s.get()),
        ("add", lambda s: s.add(1)),
        ("add_all", lambda s: s.add_all([1, 2])),
        ("update", lambda s: s.update([1])),
        ("clear", lambda s: s.clear()),
        ("merge_namespaces", lambda s: s.merge_namespaces("t", ["a", "b"])),
    ],
    "map": [
        ("get", lambda s: s.get("k")),
        ("put", lambda s: s.put("k", 1)),
        ("put_all", lambda s: s.put_all({"k": 1})),
        ("remove", lambda s: s.remove("k")),
        ("contains", lambda s: s.contains("k")),
        ("items", lambda s: s.items()),
        ("entries", lambda s: s.entries()),
        ("keys", lambda s: s.keys()),
        ("values", lambda s: s.values()),
        ("is_empty", lambda s: s.is_empty()),
        ("clear", lambda s: s.clear()),
        ("__getitem__", lambda s: s["k"]),
        ("__setitem__", lambda s: s.__setitem__("k", 1)),
        ("__delitem__", lambda s: s.__delitem__("k")),
        ("__contains__", lambda s: "k" in s),
        ("__iter__", lambda s: list(iter(s))),
    ],
    "reducing": [
        ("get", lambda s: s.get()),
        ("add", lambda s: s.add(1)),
        ("clear", lambda s: s.clear()),
        ("merge_namespaces", lambda s: s.merge_namespaces("t", ["a", "b"])),
    ],
    "aggregating": [
        ("get", lambda s: s.get()),
        ("add", lambda s: s.add(1)),
        ("clear", lambda s: s.clear()),
        ("merge_namespaces", lambda s: s.merge_namespaces("t", ["a", "b"])),
    ],
}

ALL_METHODS = [(kind, name, fn) for kind, methods in METHODS.items() for name, fn in methods]


# --------------------------------------------------------------------------- no current key


@pytest.mark.parametrize("with_ttl", [False, True], ids=["plain", "ttl"])
@pytest.mark.parametrize(("kind", "method", "call"), ALL_METHODS, ids=[f"{k}.{m}" for k, m, _ in ALL_METHODS])
def test_no_current_key_raises_runtime_error(
    kind: str, method: str, call: Callable[[Any], Any], with_ttl: bool
) -> None:
    backend = KeyedStateBackend(time_provider=lambda: 0)
    desc = make_descriptor(kind)
    if with_ttl:
        desc.enable_time_to_live(ttl_config())
    state = get_state(backend, desc)
    with pytest.raises(RuntimeError):
        call(state)
    assert backend.num_entries() == 0


@pytest.mark.parametrize(("kind", "method", "call"), ALL_METHODS, ids=[f"{k}.{m}" for k, m, _ in ALL_METHODS])
def test_no_current_key_in_a_restored_backend(kind: str, method: str, call: Callable[[Any], Any]) -> None:
    """A backend without a current key fails even when its states hold data."""
    clock = [0]
    src = KeyedStateBackend(time_provider=lambda: clock[0])
    s = get_state(src, make_descriptor(kind))
    src.set_current_key("k")
    for name, fn in METHODS[kind]:
        if name in ("add", "update", "put", "add_all", "put_all", "__setitem__"):
            fn(s)
    fresh = KeyedStateBackend(time_provider=lambda: clock[0])
    with src.snapshot() as snap:
        fresh.restore(snap)
    state = get_state(fresh, make_descriptor(kind))
    with pytest.raises(RuntimeError):
        call(state)


def test_current_key_is_none_before_set() -> None:
    backend = KeyedStateBackend()
    assert backend.get_current_key() is None
    backend.set_current_key(("a", 1))
    assert backend.get_current_key() == ("a", 1)


# --------------------------------------------------------------------------- bad keys


@pytest.mark.parametrize("key", [[1], {"a": 1}, {1, 2}, ([1],)], ids=["list", "dict", "set", "tuple_of_list"])
def test_unhashable_key_raises_type_error(key: Any) -> None:
    backend = KeyedStateBackend()
    state = backend.get_state(ValueStateDescriptor("v"))
    backend.set_current_key("good")
    state.update(1)
    with pytest.raises(TypeError):
        backend.set_current_key(key)
    assert backend.get_current_key() == "good"
    assert state.value() == 1


def test_none_key_raises_type_error() -> None:
    backend = KeyedStateBackend()
    with pytest.raises(TypeError):
        backend.set_current_key(None)
    assert backend.get_current_key() is None


@pytest.mark.parametrize("kind", KINDS)
def test_bad_namespaces(kind: str) -> None:
    backend = KeyedStateBackend()
    state = get_state(backend, make_descriptor(kind))
    with pytest.raises(TypeError):
        state.set_current_namespace(None)
    with pytest.raises(TypeError):
        state.set_current_namespace(["unhashable"])
    assert state.get_current_namespace() is VOID_NAMESPACE


@pytest.mark.parametrize("with_ttl", [False, True], ids=["plain", "ttl"])
def test_map_none_user_key_raises_type_error(with_ttl: bool) -> None:
    backend = KeyedStateBackend(time_provider=lambda: 0)
    desc = MapStateDescriptor("m")
    if with_ttl:
        desc.enable_time_to_live(ttl_config())
    m = backend.get_map_state(desc)
    backend.set_current_key(1)
    with pytest.raises(TypeError):
        m.put(None, 1)
    with pytest.raises(TypeError):
        m.put(["unhashable"], 1)
    assert m.is_empty()


# --------------------------------------------------------------------------- ListState and None


@pytest.mark.parametrize("with_ttl", [False, True], ids=["plain", "ttl"])
def test_list_rejects_none(with_ttl: bool) -> None:
    backend = KeyedStateBackend(time_provider=lambda: 0)
    desc = ListStateDescriptor("l")
    if with_ttl:
        desc.enable_time_to_live(ttl_config())
    lst = backend.get_list_state(desc)
    backend.set_current_key("k")
    lst.add_all([1, 2])
    with pytest.raises(ValueError):
        lst.add(None)
    with pytest.raises(ValueError):
        lst.add_all(None)
    with pytest.raises(ValueError):
        lst.update(None)
    # a None element rejects the whole call (Flink checks every element first)
    with pytest.raises(ValueError):
        lst.add_all([3, None, 4])
    with pytest.raises(ValueError):
        lst.update([5, None])
    assert lst.get() == [1, 2]


def test_list_update_empty_clears_and_get_returns_a_copy() -> None:
    backend = KeyedStateBackend()
    lst = backend.get_list_state(ListStateDescriptor("l"))
    backend.set_current_key("k")
    assert lst.get() == []
    lst.add(1)
    got = lst.get()
    got.append(99)
    assert lst.get() == [1]
    lst.update([])
    assert lst.get() == []
    assert backend.num_entries() == 0


def test_reducing_and_aggregating_basics() -> None:
    backend = KeyedStateBackend()
    r = backend.get_reducing_state(ReducingStateDescriptor("r", lambda a, b: a * b))
    a = backend.get_aggregating_state(AggregatingStateDescriptor("a", ListAgg()))
    backend.set_current_key(1)
    assert r.get() is None and a.get() is None
    for x in (2, 3, 7):
        r.add(x)
        a.add(x)
    assert r.get() == 42
    assert a.get() == [2, 3, 7]
    r.clear()
    a.clear()
    assert r.get() is None and a.get() is None
    assert backend.num_entries() == 0


def test_merge_namespaces_without_ttl() -> None:
    backend = KeyedStateBackend()
    lst = backend.get_list_state(ListStateDescriptor("l"))
    r = backend.get_reducing_state(ReducingStateDescriptor("r", lambda a, b: a + b))
    agg = backend.get_aggregating_state(AggregatingStateDescriptor("a", ListAgg()))
    backend.set_current_key("k")
    for ns, v in (("w1", 1), ("w2", 2), ("w2", 3), ("t", 10)):
        for s in (lst, r, agg):
            s.set_current_namespace(ns)
            s.add(v)
    for s in (lst, r, agg):
        s.merge_namespaces("t", ["w1", "w2", "absent"])
        s.set_current_namespace("t")
    assert lst.get() == [10, 1, 2, 3]
    assert r.get() == 16
    assert agg.get() == [10, 1, 2, 3]
    for s in (lst, r, agg):
        s.set_current_namespace("w2")
    assert (lst.get(), r.get(), agg.get()) == ([], None, None)
    assert set(backend.keys("l", "t")) == {"k"}
    assert list(backend.keys("l", "w1")) == []
    # merging into a target that does not exist yet
    for s in (lst, r, agg):
        s.merge_namespaces("new", ["t"])
        s.set_current_namespace("new")
    assert (lst.get(), r.get(), agg.get()) == ([10, 1, 2, 3], 16, [10, 1, 2, 3])


# --------------------------------------------------------------------------- registration


@pytest.mark.parametrize("first", KINDS)
@pytest.mark.parametrize("second", KINDS)
def test_same_name_with_another_kind_raises_value_error(first: str, second: str) -> None:
    backend = KeyedStateBackend()
    state = get_state(backend, make_descriptor(first, "name"))
    if first == second:
        again = get_state(backend, make_descriptor(second, "name"))
        assert type(again) is type(state)
        return
    with pytest.raises(ValueError):
        get_state(backend, make_descriptor(second, "name"))


def test_re_registering_keeps_the_data() -> None:
    backend = KeyedStateBackend()
    v = backend.get_state(ValueStateDescriptor("v"))
    backend.set_current_key(1)
    v.update("x")
    v2 = backend.get_state(ValueStateDescriptor("v", default_value="d"))
    assert v2.value() == "x"
    backend.set_current_key(2)
    assert v2.value() == "d"


def test_restored_state_registered_with_another_kind_raises_value_error() -> None:
    src = KeyedStateBackend()
    v = src.get_state(ValueStateDescriptor("s"))
    src.set_current_key(1)
    v.update(1)
    dst = KeyedStateBackend()
    with src.snapshot() as snap:
        dst.restore(snap)
    with pytest.raises(ValueError):
        dst.get_list_state(ListStateDescriptor("s"))
    assert dst.get_state(ValueStateDescriptor("s")) is not None
    dst.set_current_key(1)
    assert dst.get_state(ValueStateDescriptor("s")).value() == 1


def test_restore_into_a_state_of_another_kind_raises_value_error() -> None:
    src = KeyedStateBackend()
    src.get_state(ValueStateDescriptor("s"))
    dst = KeyedStateBackend()
    dst.get_map_state(MapStateDescriptor("s"))
    with src.snapshot() as snap, pytest.raises(ValueError):
        dst.restore(snap)


def test_wrong_descriptor_type_for_getter() -> None:
    backend = KeyedStateBackend()
    with pytest.raises(TypeError):
        backend.get_state(ListStateDescriptor("l"))  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        backend.get_map_state(ValueStateDescriptor("v"))  # type: ignore[arg-type]


def test_keys_of_unknown_state_raises_key_error() -> None:
    with pytest.raises(KeyError):
        list(KeyedStateBackend().keys("nope"))


# --------------------------------------------------------------------------- descriptors


def test_descriptors() -> None:
    v = ValueStateDescriptor("v", default_value=7)
    assert v.get_name() == v.name == "v"
    assert v.default_value == 7
    assert ValueStateDescriptor("v").default_value is None
    assert v.ttl_config is None
    cfg = ttl_config()
    v.enable_time_to_live(cfg)
    assert v.ttl_config == cfg
    assert ListStateDescriptor("l").get_name() == "l"
    assert MapStateDescriptor("m").get_name() == "m"
    with pytest.raises(ValueError):
        ValueStateDescriptor("")
    with pytest.raises(TypeError):
        ValueStateDescriptor(3)  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        v.enable_time_to_live(timedelta(seconds=1))  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        ReducingStateDescriptor("r", 5)  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        AggregatingStateDescriptor("a", object())  # type: ignore[arg-type]


def test_reduce_function_object_with_reduce_method() -> None:
    """PyFlink passes a ``ReduceFunction`` with a ``reduce(a, b)`` method."""

    class Max:
        def reduce(self, a: int, b: int) -> int:
            return max(a, b)

    backend = KeyedStateBackend()
    r = backend.get_reducing_state(ReducingStateDescriptor("r", Max()))
    backend.set_current_key(1)
    for x in (3, 9, 4):
        r.add(x)
    assert r.get() == 9


def test_disabled_ttl_config_turns_ttl_off() -> None:
    clock = [0]
    backend = KeyedStateBackend(time_provider=lambda: clock[0])
    desc = ValueStateDescriptor("v")
    desc.enable_time_to_live(StateTtlConfig.new_builder(timedelta(milliseconds=10)).set_update_type(UpdateType.Disabled).build())
    v = backend.get_state(desc)
    backend.set_current_key(1)
    v.update("x")
    clock[0] = 10**9
    assert v.value() == "x"


def test_value_state_default_and_update_none() -> None:
    clock = [0]
    backend = KeyedStateBackend(time_provider=lambda: clock[0])
    desc = ValueStateDescriptor("v", default_value="dflt")
    desc.enable_time_to_live(ttl_config(100))
    v = backend.get_state(desc)
    backend.set_current_key("k")
    assert v.value() == "dflt"
    v.update("x")
    assert v.value() == "x"
    assert backend.num_entries() == 1
    v.update(None)  # == clear()
    assert v.value() == "dflt"
    assert backend.num_entries() == 0
    v.update(0)  # falsy values are values
    assert v.value() == 0
    v.clear()
    assert v.value() == "dflt"
    v.update("y")
    clock[0] = 100
    assert v.value() == "dflt"  # expired


# --------------------------------------------------------------------------- StateTtlConfig


def test_ttl_config_defaults() -> None:
    cfg = StateTtlConfig.new_builder(timedelta(seconds=3)).build()
    assert cfg.get_ttl() == timedelta(seconds=3)
    assert cfg.ttl_ms == 3000
    assert cfg.is_enabled()
    assert cfg.get_update_type() is UpdateType.OnCreateAndWrite
    assert cfg.get_state_visibility() is StateVisibility.NeverReturnExpired
    assert cfg.cleanup_in_background
    assert (cfg.cleanup_size, cfg.run_cleanup_for_every_record) == (5, False)
    assert not cfg.cleanup_full_snapshot


def test_ttl_config_builder_methods() -> None:
    b = StateTtlConfig.new_builder(timedelta(seconds=1))
    assert b.set_update_type(StateTtlConfig.UpdateType.OnReadAndWrite) is b
    cfg = (
        b.set_state_visibility(StateTtlConfig.StateVisibility.ReturnExpiredIfNotCleanedUp)
        .set_ttl(timedelta(minutes=2))
        .cleanup_full_snapshot()
        .cleanup_incrementally(10, True)
        .set_ttl_time_characteristic(StateTtlConfig.TtlTimeCharacteristic.ProcessingTime)
        .use_processing_time()
        .build()
    )
    assert cfg.get_ttl() == timedelta(minutes=2)
    assert cfg.get_update_type() is UpdateType.OnReadAndWrite
    assert cfg.get_state_visibility() is StateVisibility.ReturnExpiredIfNotCleanedUp
    assert cfg.cleanup_full_snapshot
    assert (cfg.cleanup_size, cfg.run_cleanup_for_every_record) == (10, True)

    cfg2 = (
        StateTtlConfig.new_builder(timedelta(seconds=1))
        .update_ttl_on_read_and_write()
        .return_expired_if_not_cleaned_up()
        .build()
    )
    assert cfg2.update_type == UpdateType.OnReadAndWrite
    assert cfg2.state_visibility == StateVisibility.ReturnExpiredIfNotCleanedUp
    cfg3 = (
        StateTtlConfig.new_builder(timedelta(seconds=1))
        .update_ttl_on_read_and_write()
        .update_ttl_on_create_and_write()
        .return_expired_if_not_cleaned_up()
        .never_return_expired()
        .disable_cleanup_in_background()
        .build()
    )
    assert cfg3.update_type == UpdateType.OnCreateAndWrite
    assert cfg3.state_visibility == StateVisibility.NeverReturnExpired
    assert not cfg3.cleanup_in_background
    assert TtlTimeCharacteristic.ProcessingTime is StateTtlConfig.TtlTimeCharacteristic.ProcessingTime


@pytest.mark.parametrize(
    "ttl",
    [timedelta(0), timedelta(milliseconds=-1), timedelta(days=-3), timedelta(microseconds=500)],
    ids=["zero", "minus_1ms", "minus_3d", "under_1ms"],
)
def test_ttl_not_positive_raises_value_error(ttl: timedelta) -> None:
    """Flink: ``TTL is expected to be positive`` (checked on ``ttl.toMillis()``)."""
    with pytest.raises(ValueError):
        StateTtlConfig.new_builder(ttl).build()
    with pytest.raises(ValueError):
        StateTtlConfig.new_builder(timedelta(seconds=1)).set_ttl(ttl).build()


def test_bad_cleanup_size_raises_value_error() -> None:
    for size in (0, -5):
        with pytest.raises(ValueError):
            StateTtlConfig.new_builder(timedelta(seconds=1)).cleanup_incrementally(size, False).build()


def test_bad_ttl_type_raises_type_error() -> None:
    with pytest.raises(TypeError):
        StateTtlConfig.new_builder("1s").build()  # type: ignore[arg-type]


def test_exported_from_package_root() -> None:
    for name in ("KeyedStateBackend", "StateTtlConfig", "ValueStateDescriptor", "AggregateFunction", "KeyGroupRange"):
        assert getattr(cowmap, name) is not None


# --------------------------------------------------------------------------- MapState API


@pytest.mark.parametrize("with_ttl", [False, True], ids=["plain", "ttl"])
def test_map_state_api(with_ttl: bool) -> None:
    backend = KeyedStateBackend(time_provider=lambda: 5)
    desc = MapStateDescriptor("m")
    if with_ttl:
        desc.enable_time_to_live(ttl_config())
    m = backend.get_map_state(desc)
    backend.set_current_key("k")
    assert m.is_empty()
    assert m.items() == [] and m.keys() == [] and m.values() == [] and list(m) == []
    m["c"] = 3
    m.put("a", 1)
    m.put_all({"b": 2, "d": 4})
    m.put_all([("e", 5)])
    m.put_all(None)  # Flink: putAll(null) is a no-op
    assert m.keys() == ["c", "a", "b", "d", "e"]  # insertion order
    assert list(m) == ["c", "a", "b", "d", "e"]
    assert m.values() == [3, 1, 2, 4, 5]
    assert m.items() == m.entries() == [("c", 3), ("a", 1), ("b", 2), ("d", 4), ("e", 5)]
    m["a"] = 10  # overwrite keeps the position
    assert m.keys() == ["c", "a", "b", "d", "e"]
    assert m["a"] == 10 and m.get("a") == 10
    assert m["absent"] is None and m.get("absent") is None
    assert "a" in m and m.contains("a")
    assert "absent" not in m and not m.contains("absent")
    del m["a"]
    m.remove("absent")  # removing an absent key is fine
    assert "a" not in m
    m["a"] = 11  # re-added at the end
    assert m.keys() == ["c", "b", "d", "e", "a"]
    m.remove("c")  # head
    m.remove("a")  # tail
    m.remove("d")  # middle
    assert m.items() == [("b", 2), ("e", 5)]
    assert not m.is_empty()
    m.put("n", None)  # null values are legal (Flink MapState)
    assert m.contains("n") and m.get("n") is None
    assert ("n", None) in m.items()
    # iteration is a list made at the call: changing the state while looping is fine
    for k in m:
        m.remove(k)
    assert m.is_empty()
    m.put_all({"x": 1, "y": 2})
    m.clear()
    assert m.is_empty() and m.items() == []
    assert backend.num_entries() == 0


def test_map_state_is_per_key_and_namespace() -> None:
    backend = KeyedStateBackend()
    m = backend.get_map_state(MapStateDescriptor("m"))
    backend.set_current_key(1)
    m.put("a", 1)
    m.set_current_namespace("w")
    m.put("a", 2)
    m.put("b", 3)
    backend.set_current_key(2)
    assert m.is_empty()
    m.put("z", 9)
    backend.set_current_key(1)
    assert m.items() == [("a", 2), ("b", 3)]
    m.set_current_namespace(VOID_NAMESPACE)
    assert m.items() == [("a", 1)]
    m.clear()
    m.set_current_namespace("w")
    assert m.items() == [("a", 2), ("b", 3)]


def test_keys_and_num_entries() -> None:
    backend = KeyedStateBackend()
    v = backend.get_state(ValueStateDescriptor("v"))
    m = backend.get_map_state(MapStateDescriptor("m"))
    lst = backend.get_list_state(ListStateDescriptor("l"))
    assert backend.num_entries() == 0
    for k in range(5):
        backend.set_current_key(k)
        v.update(k)
        m.put_all({"a": 1, "b": 2, "c": 3})  # one (key, namespace) entry
        if k % 2:
            lst.set_current_namespace("w")
            lst.add_all([1, 2])
            lst.set_current_namespace(VOID_NAMESPACE)
    assert backend.num_entries() == 5 + 5 + 2
    assert sorted(backend.keys("v")) == [0, 1, 2, 3, 4]
    assert sorted(backend.keys("m")) == [0, 1, 2, 3, 4]
    assert sorted(backend.keys("l", "w")) == [1, 3]
    assert list(backend.keys("l")) == []
    assert list(backend.keys("v", "w")) == []
    assert sorted(backend.state_names()) == ["l", "m", "v"]
    backend.set_current_key(3)
    m.clear()
    v.clear()
    assert backend.num_entries() == 4 + 4 + 2
    assert sorted(backend.keys("m")) == [0, 1, 2, 4]


def test_keys_include_expired_not_cleaned_up_entries() -> None:
    """Flink's ``getKeys`` does not filter by TTL."""
    clock = [0]
    backend = KeyedStateBackend(time_provider=lambda: clock[0])
    desc = ValueStateDescriptor("v")
    desc.enable_time_to_live(StateTtlConfig.new_builder(timedelta(milliseconds=10)).disable_cleanup_in_background().build())
    v = backend.get_state(desc)
    for k in range(3):
        backend.set_current_key(k)
        v.update(k)
    clock[0] = 1000
    assert sorted(backend.keys("v")) == [0, 1, 2]
    backend.set_current_key(1)
    assert v.value() is None
    assert sorted(backend.keys("v")) == [0, 2]


# --------------------------------------------------------------------------- snapshots


def test_snapshot_release_is_idempotent_and_use_after_release_raises() -> None:
    backend = KeyedStateBackend()
    v = backend.get_state(ValueStateDescriptor("v"))
    backend.set_current_key(1)
    v.update(1)
    snap = backend.snapshot()
    assert isinstance(snap, KeyedStateSnapshot)
    assert not snap.released
    assert snap.state_names() == ["v"]
    assert snap.kind("v") == "value"
    assert list(snap.entries("v")) == [(1, VOID_NAMESPACE, 1, cowmap.NO_TIMESTAMP)]
    snap.release()
    snap.release()
    assert snap.released
    with pytest.raises(RuntimeError):
        list(snap.entries("v"))
    with pytest.raises(RuntimeError):
        snap.state_names()
    with pytest.raises(RuntimeError):
        snap.key_groups("v")
    with pytest.raises(RuntimeError):
        KeyedStateBackend().restore(snap)
    with pytest.raises(RuntimeError), snap:
        pass
    v.update(2)  # the backend goes on
    assert v.value() == 2


def test_snapshot_context_manager_releases() -> None:
    backend = KeyedStateBackend()
    backend.get_state(ValueStateDescriptor("v"))
    with backend.snapshot() as snap:
        assert not snap.released
    assert snap.released


def test_snapshot_of_unknown_state_raises_key_error() -> None:
    with KeyedStateBackend().snapshot() as snap, pytest.raises(KeyError):
        list(snap.entries("nope"))


def test_restore_rejects_other_objects() -> None:
    with pytest.raises(TypeError):
        KeyedStateBackend().restore({"v": []})  # type: ignore[arg-type]


def _entries(snap: KeyedStateSnapshot, name: str) -> list[Any]:
    return sorted(map(repr, snap.entries(name)))


def _frozen(snap: KeyedStateSnapshot) -> dict[str, list[Any]]:
    return {name: _entries(snap, name) for name in snap.state_names()}


@pytest.mark.parametrize("with_ttl", [False, True], ids=["plain", "ttl"])
def test_snapshot_isolation_for_every_kind(with_ttl: bool) -> None:
    clock = [0]
    backend = KeyedStateBackend(time_provider=lambda: clock[0])

    def reg(desc: Any) -> Any:
        if with_ttl:
            desc.enable_time_to_live(ttl_config(10**6))
        return get_state(backend, desc)

    v = reg(ValueStateDescriptor("v"))
    lst = reg(ListStateDescriptor("l"))
    m = reg(MapStateDescriptor("m"))
    r = reg(ReducingStateDescriptor("r", lambda a, b: a + b))
    agg = reg(AggregatingStateDescriptor("a", ListAgg()))
    for k in range(20):
        backend.set_current_key(k)
        v.update([k, "list value"])
        lst.add_all([k, {"d": k}])
        m.put_all({"x": [k], "y": {"n": k}})
        r.add(k)
        agg.add(k)
    clock[0] = 7
    snap = backend.snapshot()
    before = _frozen(snap)

    for k in range(20):
        backend.set_current_key(k)
        # in-place changes of values handed out after the snapshot
        v.value().append("mutated")
        lst.get()[1]["d"] = "mutated"
        m.get("x").append("mutated")
        m.get("y")["n"] = "mutated"
        for _, val in m.items():
            if isinstance(val, list):
                val.append("again")
        agg.add("more")  # ListAgg appends to the accumulator in place
        # and ordinary writes
        if k % 3 == 0:
            v.update("new")
            lst.update([1])
            m.put("z", 1)
            m.remove("x")
            r.add(100)
        elif k % 3 == 1:
            v.clear()
            lst.clear()
            m.clear()
            r.clear()
            agg.clear()
        else:
            lst.add("added")
            m["x"] = "replaced"
    for k in range(20, 30):  # new keys
        backend.set_current_key(k)
        v.update(k)
        lst.add(k)
        m.put("x", k)
        r.add(k)
        agg.add(k)
    assert _frozen(snap) == before
    # the live state did change
    backend.set_current_key(2)
    assert v.value() == [2, "list value", "mutated"]
    assert m.get("x") == "replaced"
    assert agg.get() == [2, "more"]
    # a second snapshot sees the changes, the first still does not
    snap2 = backend.snapshot()
    assert _frozen(snap2) != before
    snap.release()
    after2 = _frozen(snap2)
    backend.set_current_key(2)
    v.value().append("after second")
    assert _frozen(snap2) == after2
    snap2.release()


def test_value_mutated_in_place_without_update_after_snapshot() -> None:
    """Flink's heap backend copies a state a snapshot shares before handing it out."""
    backend = KeyedStateBackend()
    v = backend.get_state(ValueStateDescriptor("v"))
    backend.set_current_key("k")
    v.update({"count": 1, "items": [1]})
    with backend.snapshot() as snap:
        got = v.value()
        got["count"] += 1
        got["items"].append(2)
        assert v.value() == {"count": 2, "items": [1, 2]}  # the live value is the mutated one
        assert [e[2] for e in snap.entries("v")] == [{"count": 1, "items": [1]}]
        restored = KeyedStateBackend()
        restored.restore(snap)
    restored.set_current_key("k")
    assert restored.get_state(ValueStateDescriptor("v")).value() == {"count": 1, "items": [1]}


def test_custom_copier_is_used_for_shared_values() -> None:
    copies: list[Any] = []

    def copier(x: Any) -> Any:
        copies.append(x)
        return list(x)

    backend = KeyedStateBackend()
    v = backend.get_state(ValueStateDescriptor("v", copier=copier))
    backend.set_current_key(1)
    v.update([1])
    v.value().append(2)  # no snapshot: nothing to copy
    assert copies == []
    with backend.snapshot() as snap:
        v.value().append(3)
        assert copies == [[1, 2]]
        assert [e[2] for e in snap.entries("v")] == [[1, 2]]
    assert v.value() == [1, 2, 3]


@pytest.mark.parametrize("with_ttl", [False, True], ids=["plain", "ttl"])
def test_aggregate_function_with_mutable_accumulator_under_snapshots(with_ttl: bool) -> None:
    clock = [0]
    backend = KeyedStateBackend(time_provider=lambda: clock[0])
    desc = AggregatingStateDescriptor("a", ListAgg())
    if with_ttl:
        desc.enable_time_to_live(ttl_config(10**6))
    agg = backend.get_aggregating_state(desc)
    backend.set_current_key("k")
    snaps = []
    for i in range(5):
        agg.add(i)
        snaps.append(backend.snapshot())
    agg.add(5)
    assert agg.get() == [0, 1, 2, 3, 4, 5]
    for i, snap in enumerate(snaps):
        assert [e[2] for e in snap.entries("a")] == [list(range(i + 1))]
    # merge mutates acc_a in place: snapshots must not see it
    agg.set_current_namespace("w")
    agg.add("w")
    with backend.snapshot() as before_merge:
        agg.merge_namespaces(VOID_NAMESPACE, ["w"])
        agg.set_current_namespace(VOID_NAMESPACE)
        assert agg.get() == [0, 1, 2, 3, 4, 5, "w"]
        frozen = {e[1]: e[2] for e in before_merge.entries("a")}
        assert frozen == {VOID_NAMESPACE: [0, 1, 2, 3, 4, 5], "w": ["w"]}
    for i, snap in enumerate(snaps):
        assert [e[2] for e in snap.entries("a")] == [list(range(i + 1))]
        snap.release()
    agg.add(6)
    assert agg.get() == [0, 1, 2, 3, 4, 5, "w", 6]


def test_snapshot_is_readable_while_processing_goes_on() -> None:
    backend = KeyedStateBackend()
    v = backend.get_state(ValueStateDescriptor("v"))
    for k in range(500):
        backend.set_current_key(k)
        v.update(k)
    with backend.snapshot() as snap:
        it = snap.entries("v")
        seen = [next(it)]
        for k in range(500):
            backend.set_current_key(k)
            v.update(-k)
        for k in range(500, 1000):
            backend.set_current_key(k)
            v.update(k)
        seen.extend(it)
        assert sorted(e[0] for e in seen) == list(range(500))
        assert all(e[2] == e[0] for e in seen)


def test_default_time_provider_is_the_wall_clock_in_ms() -> None:
    import time

    from cowmap._core import wall_clock_ms

    before = time.time_ns() // 1_000_000
    now = wall_clock_ms()
    after = time.time_ns() // 1_000_000
    assert type(now) is int
    assert before <= now <= after
    backend = KeyedStateBackend()
    assert before <= backend.now() <= time.time_ns() // 1_000_000
    # a TTL write without a time_provider is stamped with the wall clock
    desc = ValueStateDescriptor("v")
    desc.enable_time_to_live(StateTtlConfig.new_builder(timedelta(hours=1)).build())
    state = backend.get_state(desc)
    backend.set_current_key("k")
    t0 = time.time_ns() // 1_000_000
    state.update(1)
    t1 = time.time_ns() // 1_000_000
    ts = backend._tables["v"].maps[backend.get_current_key_group()].timestamp("k", VOID_NAMESPACE)  # type: ignore[union-attr]
    assert t0 <= ts <= t1


class _BackendSubclass(KeyedStateBackend):
    """A user's subclass, with slots of its own and a ``_key`` of its own: the current
    key lives in the compiled key context, which no subclass attribute can shadow."""

    __slots__ = ("extra", "_key")


@pytest.mark.parametrize("cls", [KeyedStateBackend, _BackendSubclass])
def test_set_current_key_on_backend_subclasses(cls: type[KeyedStateBackend]) -> None:
    backends = [cls(), KeyedStateBackend(), _BackendSubclass()]  # interleaved types
    states = [b.get_state(ValueStateDescriptor("v", default_value=0)) for b in backends]
    for _rnd in range(3):
        for k in range(20):
            for b, s in zip(backends, states):
                b.set_current_key(k)
                assert b.get_current_key() == k
                assert b.get_current_key_group() == key_group_for(k, b.max_parallelism)
                s.update(s.value() + k)
    for b, s in zip(backends, states):
        for k in range(20):
            b.set_current_key(k)
            assert s.value() == 3 * k
    assert not hasattr(backends[-1], "_key")  # never written: the key is the context's


def test_set_current_key_outside_the_range_names_it_and_keeps_the_old_key() -> None:
    backend = KeyedStateBackend(max_parallelism=128, key_group_range=KeyGroupRange(0, 9))
    inside = next(k for k in range(1000) if key_group_for(k, 128) <= 9)
    outside = next(k for k in range(1000) if key_group_for(k, 128) > 9)
    backend.set_current_key(inside)
    with pytest.raises(ValueError, match=rf"key {outside} is in key group \d+, outside this backend's range"):
        backend.set_current_key(outside)
    assert backend.get_current_key() == inside
    with pytest.raises(AttributeError):
        backend.anything_else = 1  # type: ignore[attr-defined]  # slots: no stray attributes


def test_ttl_accesses_read_the_time_provider_once_each() -> None:
    """As Flink's TTL wrappers do: one clock read per state access (the states hand
    the provider to the core map, which calls it)."""
    calls: list[int] = []

    def clock() -> int:
        calls.append(1)
        return 1_000

    backend = KeyedStateBackend(time_provider=clock)
    calls.clear()  # (the backend reads it once at construction)
    cfg = StateTtlConfig.new_builder(timedelta(seconds=1)).disable_cleanup_in_background().build()
    vd, md = ValueStateDescriptor("v"), MapStateDescriptor("m")
    vd.enable_time_to_live(cfg)
    md.enable_time_to_live(cfg)
    value, mapped = backend.get_state(vd), backend.get_map_state(md)
    backend.set_current_key("k")
    for op in (lambda: value.update(1), value.value, lambda: mapped.put("u", 1), lambda: mapped.get("u")):
        calls.clear()
        op()
        assert len(calls) == 1


class _InstanceClock:
    def __init__(self) -> None:
        self.now = 1_000

    def __call__(self) -> int:
        return self.now


class _SubClock(_InstanceClock):
    pass


class _StaticClock:
    now = 1_000
    __call__ = staticmethod(lambda: _StaticClock.now)


@pytest.mark.parametrize("kind", ["instance", "subclass", "staticmethod"])
def test_callable_instances_as_time_providers(kind: str) -> None:
    """A clock object is called the way Python calls it, whatever its class's __call__
    is (the backend binds a plain-function __call__ once, see backend._direct_call)."""
    clock: Any = {"instance": _InstanceClock, "subclass": _SubClock, "staticmethod": _StaticClock}[kind]()
    backend = KeyedStateBackend(time_provider=clock)
    desc = ValueStateDescriptor("v")
    desc.enable_time_to_live(StateTtlConfig.new_builder(timedelta(milliseconds=10)).build())
    state = backend.get_state(desc)
    backend.set_current_key("k")
    state.update(1)
    assert backend.now() == 1_000 and state.value() == 1
    type(clock).now = clock.now = 1_010  # exactly expired (ts + ttl <= now)
    assert backend.now() == 1_010 and state.value() is None


def test_a_time_provider_returning_no_int_fails_the_access() -> None:
    now: list[object] = [5]
    backend = KeyedStateBackend(time_provider=lambda: now[0])
    now[0] = 5.0  # (the constructor checks the first read)
    desc = ValueStateDescriptor("v")
    desc.enable_time_to_live(ttl_config())
    state = backend.get_state(desc)
    backend.set_current_key("k")
    with pytest.raises(TypeError, match="time_provider must return int milliseconds"):
        state.update(1)


def test_map_state_put_after_a_snapshot_copies_no_value() -> None:
    """Overwriting a user entry that a snapshot shares keeps the old value for the
    snapshot as it is: the copier (a deep copy for mutable values) is not called,
    neither for an existing user key nor for a new one."""
    copies = []

    def copier(v: Any) -> Any:
        copies.append(v)
        return list(v)

    backend = KeyedStateBackend()
    state = backend.get_map_state(MapStateDescriptor("m", copier=copier))
    backend.set_current_key("k")
    old = [1, 2]
    state.put("a", old)
    snap = backend.snapshot()
    state.put("a", [3])
    state.put("b", [4])
    assert copies == []
    assert state.items() == [("a", [3]), ("b", [4])]
    restored = KeyedStateBackend()
    restored.restore(snap)
    snap.release()
    restored.set_current_key("k")
    assert restored.get_map_state(MapStateDescriptor("m")).items() == [("a", [1, 2])]


def test_map_state_reads_the_clock_once_per_access() -> None:
    """As Flink reads its TtlTimeProvider once per access: a put of a new user key
    (looked up, then inserted and linked) and of an existing one, a get and a
    contains each call the time provider exactly once, and the new entry carries
    the time that one call returned."""
    calls = [0]

    def clock() -> int:
        calls[0] += 1
        return 1_000 + calls[0]

    backend = KeyedStateBackend(time_provider=clock)
    desc = MapStateDescriptor("m")
    desc.enable_time_to_live(StateTtlConfig.new_builder(timedelta(milliseconds=50)).disable_cleanup_in_background().build())
    state = backend.get_map_state(desc)
    backend.set_current_key("k")
    inserted_at = {}
    for name, access in (("a", lambda: state.put("a", 1)), ("", lambda: state.put("a", 2)),
                         ("b", lambda: state.put("b", None)), ("", lambda: state.get("a")),
                         ("", lambda: state.contains("b")), ("", lambda: state.get("zz"))):
        before = calls[0]
        access()
        assert calls[0] == before + 1
        if name:
            inserted_at[name] = 1_000 + calls[0]  # what that one call returned
    assert state.items() == [("a", 2), ("b", None)]
    value_map = backend._tables["m"].maps[backend.get_current_key_group()]
    assert value_map.timestamp("b", "k") == inserted_at["b"]
    assert value_map.timestamp("a", "k") == inserted_at["a"] + 1  # OnCreateAndWrite: the second put
