"""Bad input and failing user functions in the keyed-state layer.

A call with a bad argument raises before it changes anything (TypeError for a
wrong type, ValueError for a bad value, RuntimeError for misuse), and a merge
whose reduce or merge function raises leaves the state as it was.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator
from datetime import timedelta
from decimal import Decimal
from typing import Any

import pytest

from cowmap.state import (
    AggregateFunction,
    AggregatingStateDescriptor,
    KeyedStateBackend,
    ListStateDescriptor,
    MapStateDescriptor,
    ReducingStateDescriptor,
    StateTtlConfig,
    UpdateType,
    ValueStateDescriptor,
)
from cowmap.state.ttl import MAX_TIMESTAMP

MERGING = ["list", "reducing", "aggregating"]


class Boom(Exception):
    pass


class ListAgg(AggregateFunction):
    """A mutable accumulator changed in place; ``merge`` raises once ``fail`` is set,
    after it has changed its first argument."""

    def __init__(self) -> None:
        self.fail = False

    def create_accumulator(self) -> list[Any]:
        return []

    def add(self, value: Any, accumulator: list[Any]) -> list[Any]:
        accumulator.append(value)
        return accumulator

    def get_result(self, accumulator: list[Any]) -> list[Any]:
        return list(accumulator)

    def merge(self, acc_a: list[Any], acc_b: list[Any]) -> list[Any]:
        acc_a.extend(acc_b)
        if self.fail:
            raise Boom("merge failed half way")
        return acc_a


class Reduce:
    """``a + b`` on lists, in place; raises (after the change) once ``fail`` is set."""

    def __init__(self) -> None:
        self.fail = False

    def __call__(self, a: list[Any], b: list[Any]) -> list[Any]:
        a += b
        if self.fail:
            raise Boom("reduce failed half way")
        return a


def _ttl(ms: int = 1000) -> StateTtlConfig:
    return StateTtlConfig.new_builder(timedelta(milliseconds=ms)).disable_cleanup_in_background().build()


def _merging(kind: str, ttl: bool = False) -> tuple[KeyedStateBackend, Any, Any]:
    """A backend at time 0 with one ``kind`` state; the reduce/aggregate function
    (None for lists) lets a test make the merge fail."""
    backend = KeyedStateBackend(time_provider=lambda: 0)
    fn: Any = None
    if kind == "list":
        desc: Any = ListStateDescriptor("s")
    elif kind == "reducing":
        fn = Reduce()
        desc = ReducingStateDescriptor("s", fn)
    else:
        fn = ListAgg()
        desc = AggregatingStateDescriptor("s", fn)
    if ttl:
        desc.enable_time_to_live(_ttl())
    getter = {
        "list": backend.get_list_state,
        "reducing": backend.get_reducing_state,
        "aggregating": backend.get_aggregating_state,
    }[kind]
    return backend, getter(desc), fn


def _add(state: Any, kind: str, ns: Any, value: Any) -> None:
    state.set_current_namespace(ns)
    state.add([value] if kind == "reducing" else value)


def _contents(state: Any, namespaces: list[Any]) -> dict[Any, Any]:
    out = {}
    for ns in namespaces:
        state.set_current_namespace(ns)
        out[ns] = state.get()
    return out


def _filled(kind: str, ttl: bool = False) -> tuple[KeyedStateBackend, Any, Any, dict[Any, Any]]:
    backend, state, fn = _merging(kind, ttl)
    backend.set_current_key("k")
    for ns, v in (("a", 1), ("a", 2), ("b", 3), ("t", 9)):
        _add(state, kind, ns, v)
    return backend, state, fn, _contents(state, ["a", "b", "t"])


# --------------------------------------------------------------------------- merge_namespaces: bad arguments


@pytest.mark.parametrize("kind", MERGING)
@pytest.mark.parametrize("ttl", [False, True])
@pytest.mark.parametrize(
    "target, sources",
    [
        (None, ["a", "b"]),
        ([], ["a", "b"]),
        ({"t": 1}, ["a"]),
        (("t", []), ["a"]),
        ("t", None),
        ("t", 5),
        ("t", "ab"),
        ("t", b"ab"),
        ("t", ["a", None]),
        ("t", ["a", []]),
        ("t", ["a", ("b", {})]),
    ],
    ids=[
        "target-None",
        "target-list",
        "target-dict",
        "target-tuple-of-list",
        "sources-None",
        "sources-int",
        "sources-str",
        "sources-bytes",
        "source-None",
        "source-list",
        "source-tuple-of-dict",
    ],
)
def test_merge_namespaces_bad_arguments_raise_type_error_and_change_nothing(
    kind: str, ttl: bool, target: Any, sources: Any
) -> None:
    backend, state, _, before = _filled(kind, ttl)
    with pytest.raises(TypeError, match="namespace"):
        state.merge_namespaces(target, sources)
    assert _contents(state, ["a", "b", "t"]) == before
    assert backend.num_entries() == 3


@pytest.mark.parametrize("kind", MERGING)
def test_merge_namespaces_sources_failing_half_way_change_nothing(kind: str) -> None:
    backend, state, _, before = _filled(kind)

    def sources() -> Iterator[str]:
        yield "a"
        raise Boom("the sources ran dry")

    with pytest.raises(Boom):
        state.merge_namespaces("t", sources())
    assert _contents(state, ["a", "b", "t"]) == before


@pytest.mark.parametrize("kind", MERGING)
def test_merge_namespaces_without_current_key_raises_runtime_error(kind: str) -> None:
    backend, state, _ = _merging(kind)
    for target in ("t", None):  # misuse is reported before the arguments are looked at
        with pytest.raises(RuntimeError, match="no current key"):
            state.merge_namespaces(target, ["a"])


@pytest.mark.parametrize("kind", MERGING)
def test_merge_namespaces_checks_arguments_before_the_key_group_has_a_map(kind: str) -> None:
    backend, state, _ = _merging(kind)
    backend.set_current_key("k")  # nothing stored yet: the early return must not skip the checks
    with pytest.raises(TypeError, match="namespace"):
        state.merge_namespaces(None, ["a"])
    with pytest.raises(TypeError, match="namespace"):
        state.merge_namespaces("t", ["a", []])


# --------------------------------------------------------------------------- merge_namespaces: atomic


@pytest.mark.parametrize("kind", ["reducing", "aggregating"])
@pytest.mark.parametrize("ttl", [False, True])
@pytest.mark.parametrize("sources", [["a", "b"], ["a"]], ids=["fold-of-sources", "into-target"])
def test_merge_function_raising_leaves_the_state_unchanged(kind: str, ttl: bool, sources: list[str]) -> None:
    """The function changes its first argument in place, then raises: neither the
    sources nor the target may keep any of it."""
    backend, state, fn, before = _filled(kind, ttl)
    fn.fail = True
    with pytest.raises(Boom):
        state.merge_namespaces("t", sources)
    assert _contents(state, ["a", "b", "t"]) == before
    assert backend.num_entries() == 3
    fn.fail = False  # and the same merge works afterwards
    state.merge_namespaces("t", sources)
    merged = _contents(state, ["a", "b", "t"])
    tail = [1, 2, 3] if len(sources) == 2 else [1, 2]
    assert merged["t"] == [9, *tail]


@pytest.mark.parametrize("kind", ["reducing", "aggregating"])
def test_merge_function_raising_leaves_snapshots_and_state_unchanged(kind: str) -> None:
    backend, state, fn, before = _filled(kind)
    with backend.snapshot() as snap:
        fn.fail = True
        with pytest.raises(Boom):
            state.merge_namespaces("t", ["a", "b"])
        assert {e[1]: e[2] for e in snap.entries("s")} == {"a": [1, 2], "b": [3], "t": [9]}
    assert _contents(state, ["a", "b", "t"]) == before


@pytest.mark.parametrize("kind", MERGING)
def test_merge_with_the_target_among_the_sources_counts_it_once(kind: str) -> None:
    backend, state, _, _ = _filled(kind)
    state.merge_namespaces("t", ["a", "t", "b", "a"])
    assert _contents(state, ["a", "b", "t"]) == {"a": _empty(kind), "b": _empty(kind), "t": [1, 2, 9, 3]}
    assert backend.num_entries() == 1


def _empty(kind: str) -> Any:
    return [] if kind == "list" else None


@pytest.mark.parametrize("kind", ["reducing", "aggregating"])
def test_re_entrant_merge_function_reading_the_state_and_switching_keys(kind: str) -> None:
    """A function that reads the state it merges and changes the current key:
    the merge still goes to the key it started with, and the reads see the
    state as it was before the merge."""
    backend, state, fn, _ = _filled(kind)
    seen: list[Any] = []
    inner = fn.merge if kind == "aggregating" else fn.__call__

    def spy(a: Any, b: Any) -> Any:
        backend.set_current_key("k")
        ns = state.get_current_namespace()
        state.set_current_namespace("a")
        seen.append(state.get())
        state.set_current_namespace(ns)
        backend.set_current_key("other")
        return inner(a, b)

    if kind == "aggregating":
        fn.merge = spy
    else:
        state._t.descriptor.reduce_function = spy
    state.merge_namespaces("t", ["a", "b"])
    assert backend.get_current_key() == "other"
    assert backend.keys("s", "t") == ["k"]
    backend.set_current_key("k")
    assert _contents(state, ["a", "b", "t"]) == {"a": None, "b": None, "t": [9, 1, 2, 3]}
    assert seen == [[1, 2], [1, 2]]


@pytest.mark.parametrize("kind", ["reducing", "aggregating"])
def test_re_entrant_merge_function_merging_again_raises_runtime_error(kind: str) -> None:
    """A function that calls ``merge_namespaces`` of the state it is merging is
    misuse (it would nest without end): RuntimeError, and the state unchanged."""
    backend, state, fn, before = _filled(kind)
    inner = fn.merge if kind == "aggregating" else fn.__call__

    def again(a: Any, b: Any) -> Any:
        state.merge_namespaces("t", ["a", "b"])
        return inner(a, b)

    if kind == "aggregating":
        fn.merge = again
    else:
        state._t.descriptor.reduce_function = again
    with pytest.raises(RuntimeError, match="merge_namespaces.*'s'"):
        state.merge_namespaces("t", ["a", "b"])
    assert _contents(state, ["a", "b", "t"]) == before
    if kind == "aggregating":
        fn.merge = inner
    else:
        state._t.descriptor.reduce_function = inner
    state.set_current_namespace("t")
    state.add([5] if kind == "reducing" else 5)  # the state is usable again afterwards
    assert state.get() == [9, 5]


@pytest.mark.parametrize("kind", ["reducing", "aggregating"])
def test_snapshot_taken_by_the_merge_function_sees_the_state_before_the_merge(kind: str) -> None:
    """Nothing is written until the result is known: a snapshot taken from inside
    the function has every source and the old target (it used to miss the
    sources, already removed, while the target did not have them yet)."""
    backend, state, fn, _ = _filled(kind)
    snaps: list[Any] = []
    inner = fn.merge if kind == "aggregating" else fn.__call__

    def snapshotting(a: Any, b: Any) -> Any:
        snaps.append(backend.snapshot())
        return inner(a, b)

    if kind == "aggregating":
        fn.merge = snapshotting
    else:
        state._t.descriptor.reduce_function = snapshotting
    state.merge_namespaces("t", ["a", "b"])
    for snap in snaps:
        assert {e[1]: e[2] for e in snap.entries("s")} == {"a": [1, 2], "b": [3], "t": [9]}
        snap.release()
    assert _contents(state, ["a", "b", "t"]) == {"a": None, "b": None, "t": [9, 1, 2, 3]}


@pytest.mark.parametrize("kind", MERGING)
def test_merge_with_a_copier_raising_changes_nothing(kind: str) -> None:
    """With a snapshot live, reading a source copies it first; a copier that
    fails on the second source must not cost the first one."""

    def copier(v: Any) -> Any:
        if v == 3 or v == [3]:
            raise Boom("cannot copy")
        return list(v) if isinstance(v, list) else v

    backend = KeyedStateBackend()
    if kind == "list":
        desc: Any = ListStateDescriptor("s", copier=copier)
        state = backend.get_list_state(desc)
    elif kind == "reducing":
        state = backend.get_reducing_state(ReducingStateDescriptor("s", Reduce(), copier=copier))
    else:
        state = backend.get_aggregating_state(AggregatingStateDescriptor("s", ListAgg(), copier=copier))
    backend.set_current_key("k")
    for ns, v in (("a", 1), ("a", 2), ("b", 3), ("t", 9)):
        _add(state, kind, ns, v)
    before = _contents(state, ["a", "b", "t"])
    with backend.snapshot(), pytest.raises(Boom):
        state.merge_namespaces("t", ["a", "b"])
    assert _contents(state, ["a", "b", "t"]) == before  # read once nothing is shared


# --------------------------------------------------------------------------- StateTtlConfig


_HUGE = [2**63 - 1, 2**63, 2**70]


@pytest.mark.parametrize("ms", _HUGE)
def test_ttl_beyond_the_longest_time_is_clamped_on_every_path(ms: int) -> None:
    """Every way of making a config stores the same clamped TTL, and a state
    using it works (it used to raise OverflowError on every access)."""
    dummy = StateTtlConfig(1000)
    configs = [
        StateTtlConfig(ms),
        StateTtlConfig(ttl_ms=ms),
        StateTtlConfig.new_builder(ms).build(),  # type: ignore[arg-type]
        StateTtlConfig.new_builder(timedelta(seconds=1)).set_ttl(ms).build(),  # type: ignore[arg-type]
        dataclasses.replace(dummy, ttl_ms=ms),
    ]
    for cfg in configs:
        assert cfg.ttl_ms == MAX_TIMESTAMP
        assert cfg == configs[0]
        assert cfg.get_ttl() == timedelta.max  # the longest a timedelta can say
    backend = KeyedStateBackend(time_provider=lambda: 5)
    desc = ValueStateDescriptor("v")
    desc.enable_time_to_live(configs[0])
    state = backend.get_state(desc)
    backend.set_current_key(1)
    state.update("x")
    assert state.value() == "x"


def test_ttl_given_as_a_timedelta_to_the_constructor_is_stored_in_ms() -> None:
    cfg = StateTtlConfig(timedelta(seconds=2))  # type: ignore[arg-type]
    assert cfg.ttl_ms == 2000 and type(cfg.ttl_ms) is int
    assert cfg == StateTtlConfig(2000)


def _every_ttl_path(ttl: Any) -> list[Callable[[], Any]]:
    """Every way a TTL reaches a config: constructor, builder, set_ttl, dataclasses.replace."""
    dummy = StateTtlConfig(1000)
    return [
        lambda: StateTtlConfig(ttl),
        lambda: StateTtlConfig.new_builder(ttl).build(),
        lambda: StateTtlConfig.new_builder(timedelta(seconds=1)).set_ttl(ttl),
        lambda: dataclasses.replace(dummy, ttl_ms=ttl),
    ]


@pytest.mark.parametrize("ttl", [0, -1, -(2**70), timedelta(0), timedelta(microseconds=999), timedelta(days=-1)])
def test_ttl_not_positive_raises_value_error_on_every_path(ttl: Any) -> None:
    for make in _every_ttl_path(ttl):
        with pytest.raises(ValueError, match="ttl"):
            make()


@pytest.mark.parametrize("ttl", [True, False, 1.5, 1000.0, "1s", None, [1000], Decimal(1000)])
def test_ttl_of_a_wrong_type_raises_type_error_on_every_path(ttl: Any) -> None:
    for make in _every_ttl_path(ttl):
        with pytest.raises(TypeError, match="ttl"):
            make()


@pytest.mark.parametrize("size", [True, False, 1.5, "5", None])
def test_cleanup_size_of_a_wrong_type_raises_type_error(size: Any) -> None:
    with pytest.raises(TypeError, match="cleanup_size"):
        StateTtlConfig(1000, cleanup_size=size)
    with pytest.raises(TypeError, match="cleanup_size"):
        StateTtlConfig.new_builder(timedelta(seconds=1)).cleanup_incrementally(size)


@pytest.mark.parametrize("size", [0, -1])
def test_cleanup_size_not_positive_raises_value_error(size: int) -> None:
    with pytest.raises(ValueError, match="cleanup_size"):
        StateTtlConfig(1000, cleanup_size=size)
    with pytest.raises(ValueError, match="cleanup_size"):
        StateTtlConfig.new_builder(timedelta(seconds=1)).cleanup_incrementally(size)


def test_huge_cleanup_size_is_clamped_and_cleanup_works() -> None:
    """Like Flink's int cleanup size, at most 2**31 - 1 (it used to overflow in the sweep)."""
    clock = [0]
    backend = KeyedStateBackend(time_provider=lambda: clock[0])
    cfg = StateTtlConfig.new_builder(timedelta(milliseconds=10)).cleanup_incrementally(2**70).build()
    assert cfg.cleanup_size == 2**31 - 1
    assert StateTtlConfig(10, cleanup_size=2**70) == dataclasses.replace(cfg, incremental_cleanup=False)
    desc = ValueStateDescriptor("v")
    desc.enable_time_to_live(cfg)
    state = backend.get_state(desc)
    for k in range(20):
        backend.set_current_key(k)
        state.update(k)
    clock[0] = 100
    for k in range(20):
        backend.set_current_key(k)
        state.value()
    assert backend.num_entries() == 0


@pytest.mark.parametrize(
    "field",
    ["cleanup_in_background", "incremental_cleanup", "run_cleanup_for_every_record", "cleanup_full_snapshot"],
)
@pytest.mark.parametrize("value", ["no", 1, None])
def test_flag_of_a_wrong_type_raises_type_error(field: str, value: Any) -> None:
    with pytest.raises(TypeError, match=field):
        StateTtlConfig(1000, **{field: value})


@pytest.mark.parametrize("field", ["update_type", "state_visibility"])
def test_enum_of_a_wrong_type_raises_type_error(field: str) -> None:
    with pytest.raises(TypeError, match=field):
        StateTtlConfig(1000, **{field: 1})


def test_time_characteristic_of_a_wrong_type_raises_type_error() -> None:
    builder = StateTtlConfig.new_builder(timedelta(seconds=1))
    with pytest.raises(TypeError, match="TtlTimeCharacteristic"):
        builder.set_ttl_time_characteristic("ProcessingTime")  # type: ignore[arg-type]


# --------------------------------------------------------------------------- TTL on/off fixed per state

KINDS = ["value", "list", "map", "reducing", "aggregating"]


def _descriptor(kind: str, ttl_ms: int | None, name: str = "s") -> Any:
    if kind == "value":
        desc: Any = ValueStateDescriptor(name)
    elif kind == "list":
        desc = ListStateDescriptor(name)
    elif kind == "map":
        desc = MapStateDescriptor(name)
    elif kind == "reducing":
        desc = ReducingStateDescriptor(name, lambda a, b: a + b)
    else:
        desc = AggregatingStateDescriptor(name, _SumAgg())
    if ttl_ms is not None:
        desc.enable_time_to_live(_ttl(ttl_ms))
    return desc


class _SumAgg(AggregateFunction):
    def create_accumulator(self) -> int:
        return 0

    def add(self, value: int, accumulator: int) -> int:
        return accumulator + value

    def get_result(self, accumulator: int) -> int:
        return accumulator

    def merge(self, acc_a: int, acc_b: int) -> int:
        return acc_a + acc_b


def _register(backend: KeyedStateBackend, desc: Any) -> Any:
    return {
        "value": backend.get_state,
        "list": backend.get_list_state,
        "map": backend.get_map_state,
        "reducing": backend.get_reducing_state,
        "aggregating": backend.get_aggregating_state,
    }[desc.kind](desc)


def _write(state: Any, kind: str, v: int) -> None:
    if kind == "value":
        state.update(v)
    elif kind == "map":
        state.put("u", v)
    else:
        state.add(v)


def _read(state: Any, kind: str) -> Any:
    if kind == "value":
        return state.value()
    if kind == "map":
        return state.get("u")
    if kind == "list":
        return state.get() or None
    return state.get()


def _backend(clock: list[int]) -> KeyedStateBackend:
    return KeyedStateBackend(time_provider=lambda: clock[0])


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("snapshot_ttl", [False, True])
def test_restore_with_ttl_switched_raises_value_error_and_changes_nothing(kind: str, snapshot_ttl: bool) -> None:
    """Flink refuses to restore a state written without TTL into a descriptor with
    TTL and the reverse (the serializers are incompatible); the check comes before
    anything is restored, also of the other states in the snapshot."""
    clock = [0]
    src = _backend(clock)
    src.set_current_key("k")
    _write(_register(src, _descriptor(kind, 100 if snapshot_ttl else None)), kind, 1)
    _register(src, _descriptor("value", None, name="other")).update(2)
    dst = _backend(clock)
    dst.set_current_key("k")
    mine = _register(dst, _descriptor(kind, None if snapshot_ttl else 100))
    _write(mine, kind, 7)
    with src.snapshot() as snap, pytest.raises(ValueError, match="'s'.*TTL"):
        dst.restore(snap)
    assert dst.state_names() == ["s"]
    assert dst.num_entries() == 1
    assert _read(mine, kind) == ([7] if kind == "list" else 7)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("first_ttl", [False, True])
def test_registering_with_ttl_switched_raises_value_error_and_changes_nothing(kind: str, first_ttl: bool) -> None:
    """One rule for every kind: a state keeps the TTL setting (on or off) it was
    made with (lists used to be converted, the other kinds not)."""
    clock = [0]
    backend = _backend(clock)
    backend.set_current_key("k")
    state = _register(backend, _descriptor(kind, 100 if first_ttl else None))
    _write(state, kind, 1)
    with backend.snapshot() as snap:
        with pytest.raises(ValueError, match="'s'.*TTL"):
            _register(backend, _descriptor(kind, None if first_ttl else 100))
        (entry,) = snap.entries("s")
    assert backend.num_entries() == 1
    clock[0] = 1000  # the state still has the TTL setting it had: expired only if it had TTL
    again = _register(backend, _descriptor(kind, 100 if first_ttl else None))
    assert _read(again, kind) == (None if first_ttl else ([1] if kind == "list" else 1))


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("snapshot_ttl", [False, True])
def test_restored_state_registered_with_ttl_switched_raises_value_error(kind: str, snapshot_ttl: bool) -> None:
    clock = [0]
    src = _backend(clock)
    src.set_current_key("k")
    _write(_register(src, _descriptor(kind, 100 if snapshot_ttl else None)), kind, 1)
    dst = _backend(clock)
    with src.snapshot() as snap:
        dst.restore(snap)
    with pytest.raises(ValueError, match="'s'.*TTL"):
        _register(dst, _descriptor(kind, None if snapshot_ttl else 100))
    clock[0] = 1000
    dst.set_current_key("k")
    state = _register(dst, _descriptor(kind, 100 if snapshot_ttl else None))
    assert _read(state, kind) == (None if snapshot_ttl else ([1] if kind == "list" else 1))


@pytest.mark.parametrize("kind", KINDS)
def test_restore_uses_the_ttl_setting_at_snapshot_time_not_the_descriptors_later_one(kind: str) -> None:
    """A descriptor given TTL after the snapshot does not turn it on for the
    restored state (that mixed entries without timestamps with list elements
    stamped at restore time)."""
    clock = [0]
    src = _backend(clock)
    src.set_current_key("k")
    desc = _descriptor(kind, None)
    _write(_register(src, desc), kind, 1)
    with src.snapshot() as snap:
        desc.enable_time_to_live(_ttl(100))
        assert snap.descriptor("s").ttl_config is None
        dst = _backend(clock)
        dst.restore(snap)
    with pytest.raises(ValueError, match="'s'.*TTL"):
        _register(dst, desc)
    clock[0] = 10_000
    dst.set_current_key("k")
    state = _register(dst, _descriptor(kind, None))
    assert _read(state, kind) == ([1] if kind == "list" else 1)


@pytest.mark.parametrize("kind", KINDS)
def test_descriptor_ttl_changed_after_registration_is_applied_or_refused(kind: str) -> None:
    """Registering the same descriptor object again after its TTL config changed
    is a re-registration (it used to be ignored): a new TTL applies, switching
    TTL off is refused."""
    clock = [0]
    backend = _backend(clock)
    backend.set_current_key("k")
    desc = _descriptor(kind, 10_000)
    _write(_register(backend, desc), kind, 1)
    desc.enable_time_to_live(_ttl(100))
    state = _register(backend, desc)
    clock[0] = 100
    assert _read(state, kind) is None
    off = StateTtlConfig.new_builder(timedelta(seconds=1)).set_update_type(UpdateType.Disabled).build()
    desc.enable_time_to_live(off)  # turns TTL off
    with pytest.raises(ValueError, match="'s'.*TTL"):
        _register(backend, desc)


@pytest.mark.parametrize("kind", KINDS)
def test_ttl_duration_may_change_on_restore_and_re_registration(kind: str) -> None:
    """Only switching TTL on or off is refused: a state with TTL may be restored or
    re-registered with another TTL, its timestamps kept (Flink's TTL serializer
    stays compatible)."""
    clock = [0]
    src = _backend(clock)
    src.set_current_key("k")
    _write(_register(src, _descriptor(kind, 100)), kind, 1)
    dst = _backend(clock)
    _register(dst, _descriptor(kind, 10_000))
    with src.snapshot() as snap:
        dst.restore(snap)
    dst.set_current_key("k")
    clock[0] = 5000
    state = _register(dst, _descriptor(kind, 10_000))
    assert _read(state, kind) == ([1] if kind == "list" else 1)
    state = _register(dst, _descriptor(kind, 100))
    assert _read(state, kind) is None


def test_descriptor_given_an_equal_ttl_config_again_keeps_its_state_object() -> None:
    backend = _backend([0])
    desc = _descriptor("value", 100)
    state = backend.get_state(desc)
    state.set_current_namespace("w")
    desc.enable_time_to_live(_ttl(100))  # an equal config, another object
    assert backend.get_state(desc) is state
    assert state.get_current_namespace() == "w"


@pytest.mark.parametrize("value", ["no", 1, None])
def test_builder_flag_of_a_wrong_type_raises_type_error(value: Any) -> None:
    """The builder checks as the constructor does (it used to take any truthy value)."""
    with pytest.raises(TypeError, match="run_cleanup_for_every_record"):
        StateTtlConfig.new_builder(timedelta(seconds=1)).cleanup_incrementally(5, value)


@pytest.mark.parametrize("spark", [False, True])
def test_a_nan_key_namespace_or_user_key_is_refused_before_anything_is_written(spark: bool) -> None:
    """A NaN equals no other NaN in Python: state written under one (each column row, each float
    object a new NaN) could never be read, cleared or found again, and piled up. Refused as a key
    (alone or in a tuple), as a namespace, a timer's namespace and a MapState user key, on the
    per-key calls and the columnar ones, for Flink's and Spark's key groups."""
    import numpy as np

    nan = float("nan")
    b = KeyedStateBackend(128, spark_key_types=["double", "bigint"] if spark else None)
    v = b.get_state(ValueStateDescriptor("v"))
    m = b.get_map_state(MapStateDescriptor("m"))
    timers = b.get_timer_service("t", lambda *a: None)
    key = (1.5, 2) if spark else 1.5
    bad_keys = [(nan, 2), (np.float64("nan"), 2)] if spark else [nan, (1, nan), np.float64("nan")]
    for k in bad_keys:
        with pytest.raises(ValueError, match="NaN"):
            b.set_current_key(k)
        with pytest.raises(ValueError, match=r"keys\[1\].*NaN"):
            v.update_many([key, k], [1, 2])
    if not spark:
        with pytest.raises(ValueError, match=r"keys\[1\].*NaN"):
            v.update_many(np.array([1.0, np.nan]), [1, 2])
    b.set_current_key(key)
    for bad in (nan, np.float64("nan")):  # (a loop over a numpy column gives numpy floats)
        with pytest.raises(ValueError, match="namespace must not be NaN"):
            v.set_current_namespace(bad)
        with pytest.raises(ValueError, match="namespace must not be NaN"):
            v.update_many([key], [1], namespace=bad)
        with pytest.raises(ValueError, match="timer's namespace must not be NaN"):
            timers.register_event_time_timer(5, namespace=bad)
        for write in (lambda u=bad: m.put(u, 1), lambda u=bad: m.put_all({u: 1}),
                      lambda: m.put_many([key], np.array([np.nan]), [1]), lambda u=bad: m.put_many([key], [u], [1])):
            with pytest.raises(ValueError, match="user keys must not be NaN"):
                write()
    assert b.num_entries() == 0 and timers.num_event_time_timers() == 0
    assert b.get_current_key() == key


def test_the_key_hash_functions_still_hash_nan_as_java_and_spark_do() -> None:
    """Only storing state under a NaN is refused: the hash functions give Java's hash of the
    canonical NaN (and Spark's), whatever NaN's bits."""
    import struct

    from cowmap import key_group_for
    from cowmap._keygroups import key_hash, spark_hash, spark_type_codes

    other_nan = struct.unpack("<d", struct.pack("<Q", 0x7FF8000000000123))[0]
    assert key_hash(float("nan")) == key_hash(other_nan) == key_hash(-float("nan")) == 0x7FF80000  # Double.hashCode
    assert key_group_for(float("nan"), 128) == key_group_for(other_nan, 128)
    assert key_hash((1, float("nan"))) == key_hash((1, other_nan))
    codes = spark_type_codes(["double"])
    assert spark_hash(float("nan"), codes) == spark_hash(other_nan, codes)


def test_columns_a_loop_would_see_otherwise_are_refused_or_read_as_the_loop_sees_them() -> None:
    """A masked array's mask, and numpy datetimes (``tolist()`` makes ints of some units and
    datetimes of others), were used silently: refused. A pandas datetime column gives the
    Timestamps a loop over it sees; pyarrow tables are not columns."""
    import numpy as np
    import pandas as pd
    import pyarrow as pa

    b = KeyedStateBackend()
    v = b.get_state(ValueStateDescriptor("v"))
    with pytest.raises(TypeError, match=r"values is a masked array: pass \.filled"):
        v.update_many([1, 2], np.ma.array([1, 2], mask=[0, 1]))
    with pytest.raises(TypeError, match=r"keys is a masked array"):
        v.update_many(np.ma.array([1, 2], mask=[0, 1]), [1, 2])
    for unit in ("ns", "us", "s", "D"):
        with pytest.raises(TypeError, match=rf"values is a numpy datetime64\[{unit}\] array: pass \.astype"):
            v.update_many([1], np.array(["2026-01-01"], dtype=f"datetime64[{unit}]"))
    with pytest.raises(TypeError, match=r"keys is a numpy timedelta64\[ns\] array"):
        v.get_many(np.array([7], dtype="timedelta64[ns]"))
    stamps = pd.Series(pd.to_datetime(["2026-01-01", "2026-01-02"]))
    v.update_many([1, 2], stamps)
    assert v.get_many([1, 2]) == list(stamps)  # Timestamps, as `for s in stamps` gives
    with pytest.raises(TypeError, match="stable key hash for Timestamp"):
        v.get_many(stamps)  # a Timestamp key, as set_current_key(stamps[0]) refuses it
    table = pa.table({"k": [1, 2]})
    for bad in (table, table.to_batches()[0]):
        with pytest.raises(TypeError, match=f"keys must be a pyarrow Array or ChunkedArray, not {type(bad).__name__}"):
            v.get_many(bad)
    assert b.num_entries() == 2


def test_an_int64_read_refuses_a_default_or_a_state_beyond_int64_by_name() -> None:
    import numpy as np

    b = KeyedStateBackend()
    v = b.get_state(ValueStateDescriptor("v"))
    v.update_many([1, 2], [5, 2**64])
    for bad in (1.5, "x", 2**63):
        with pytest.raises(TypeError, match=rf"default={bad!r} does not fit an int64 read; nothing was read"):
            v.get_many([1], dtype=np.int64, default=bad)
    with pytest.raises(TypeError, match="default='x' does not fit a float64 read"):
        v.get_many([1], dtype=np.float64, default="x")
    assert v.get_many([1, 3], dtype=np.int64, default=np.int64(7)).tolist() == [5, 7]
    with pytest.raises(OverflowError, match=r"state of key 2 is 18446744073709551616, beyond int64: .* dtype=None"):
        v.get_many([1, 2], dtype=np.int64, default=0)


def test_a_clock_may_return_numpy_ints_and_one_beyond_int64_is_named() -> None:
    import numpy as np

    now: list[Any] = [np.int64(10)]
    b = KeyedStateBackend(time_provider=lambda: now[0])
    desc = ValueStateDescriptor("v")
    desc.enable_time_to_live(StateTtlConfig.new_builder(timedelta(milliseconds=100)).build())
    v = b.get_state(desc)
    b.set_current_key("k")
    v.update(1)
    v.update_many(["j"], [2])
    now[0] = np.int32(109)
    assert v.value() == 1 and v.get_many(["j"]) == [2]
    now[0] = 110
    assert v.value() is None
    now[0] = 2**70
    for access in (lambda: v.update(1), lambda: v.get_many(["j"])):
        with pytest.raises(ValueError, match="time_provider's time 1180591620717411303424 is beyond int64"):
            access()
    now[0] = True
    with pytest.raises(TypeError, match="time_provider must return int milliseconds, got True"):
        v.update(1)


def test_an_unhashable_user_key_is_a_type_error_whether_or_not_the_key_has_entries() -> None:
    """get, contains and remove returned None / False / None for an unhashable user key where the
    key group had no entries yet, and raised where it had."""
    b = KeyedStateBackend(max_parallelism=1)
    m = b.get_map_state(MapStateDescriptor("m"))
    b.set_current_key("k")
    for have_entries in (False, True):
        if have_entries:
            m.put("u", 1)
        for call in (m.get, m.contains, m.remove):
            with pytest.raises(TypeError, match="unhashable"):
                call([1])
    assert m.items() == [("u", 1)]
