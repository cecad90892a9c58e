"""``ReducingState``/``AggregatingState`` ``get``/``add`` and ``ListState`` ``get``/``add`` are
compiled (cowmap._core): what they must keep doing that the Python methods did —
TTL reads and writes, functions that raise, switch the key or change their
argument while a snapshot shares it, deleted fields, reference counts — and the
key of the call, which the Python methods lost when a function switched keys."""

from __future__ import annotations

import gc
import operator
import sys
from datetime import timedelta
from typing import Any

import pytest

from cowmap.state import (
    AggregateFunction,
    AggregatingStateDescriptor,
    KeyedStateBackend,
    ListStateDescriptor,
    ReducingStateDescriptor,
    StateTtlConfig,
    StateVisibility,
    UpdateType,
)


class Boom(Exception):
    pass


def _ttl(ms: int = 100, *, return_expired: bool = False, on_read: bool = False, cleanup: bool = True) -> StateTtlConfig:
    b = StateTtlConfig.new_builder(timedelta(milliseconds=ms))
    if not cleanup:
        b = b.disable_cleanup_in_background()
    if on_read:
        b = b.set_update_type(UpdateType.OnReadAndWrite)
    if return_expired:
        b = b.set_state_visibility(StateVisibility.ReturnExpiredIfNotCleanedUp)
    return b.build()


class Sum(AggregateFunction):
    """Accumulator a one-item list, changed in place (as a Java accumulator object is)."""

    def create_accumulator(self) -> list[int]:
        return [0]

    def add(self, value: int, acc: list[int]) -> list[int]:
        acc[0] += value
        return acc

    def get_result(self, acc: list[int]) -> int:
        return acc[0]

    def merge(self, a: list[int], b: list[int]) -> list[int]:
        return [a[0] + b[0]]


def _backend(clock: Any = None) -> KeyedStateBackend:
    return KeyedStateBackend(128, time_provider=clock) if clock is not None else KeyedStateBackend(128)


def _reducing(backend: KeyedStateBackend, fn: Any = operator.add, ttl: StateTtlConfig | None = None) -> Any:
    d = ReducingStateDescriptor("r", fn)
    if ttl is not None:
        d.enable_time_to_live(ttl)
    return backend.get_reducing_state(d)


def _aggregating(backend: KeyedStateBackend, fn: Any = None, ttl: StateTtlConfig | None = None) -> Any:
    d = AggregatingStateDescriptor("a", fn if fn is not None else Sum())
    if ttl is not None:
        d.enable_time_to_live(ttl)
    return backend.get_aggregating_state(d)


def _summing_with_hook(kind: str, backend: KeyedStateBackend, hook: Any, ttl: StateTtlConfig | None = None) -> Any:
    """A summing reducing or aggregating state whose function calls ``hook()`` first."""

    def reduce(a: int, b: int) -> int:
        hook()
        return a + b

    class Hooked(Sum):
        def add(self, value: int, acc: list[int]) -> list[int]:
            hook()
            return super().add(value, acc)

    return _reducing(backend, reduce, ttl) if kind == "reducing" else _aggregating(backend, Hooked(), ttl)


def _list(backend: KeyedStateBackend, ttl: StateTtlConfig | None = None) -> Any:
    d = ListStateDescriptor("l")
    if ttl is not None:
        d.enable_time_to_live(ttl)
    return backend.get_list_state(d)


KINDS = ["reducing", "aggregating", "list"]


def _make(kind: str, backend: KeyedStateBackend, ttl: StateTtlConfig | None = None) -> Any:
    return {"reducing": _reducing, "aggregating": _aggregating, "list": _list}[kind](backend, ttl=ttl)


def _clocked(kind: str, **ttl: Any) -> tuple[list[int], KeyedStateBackend, Any]:
    """A state of ``kind`` with a 100 ms TTL (``_ttl``'s options) on a clock the
    test moves (``now[0]``), key ``"k"`` current."""
    now = [1_000]
    backend = _backend(lambda: now[0])
    s = _make(kind, backend, _ttl(100, **ttl))
    backend.set_current_key("k")
    return now, backend, s


def _read(kind: str, s: Any) -> Any:
    """The state's value as a number (list: the sum of its elements); None when empty."""
    v = s.get()
    if kind == "list":
        return sum(v) if v else None
    return v


@pytest.mark.parametrize("ttl", [False, True])
@pytest.mark.parametrize("kind", KINDS)
def test_no_current_key_is_a_runtime_error(kind: str, ttl: bool) -> None:
    s = _make(kind, _backend(), _ttl() if ttl else None)
    with pytest.raises(RuntimeError, match="no current key"):
        s.add(1)
    with pytest.raises(RuntimeError, match="no current key"):
        s.get()


@pytest.mark.parametrize("ttl", [False, True])
@pytest.mark.parametrize("kind", ["reducing", "list"])
def test_adding_none_is_a_value_error_and_writes_nothing(kind: str, ttl: bool) -> None:
    backend = _backend()
    s = _make(kind, backend, _ttl() if ttl else None)
    backend.set_current_key("k")
    with pytest.raises(ValueError, match="None"):
        s.add(None)
    assert backend.num_entries() == 0


@pytest.mark.parametrize("ttl", [False, True])
@pytest.mark.parametrize("kind", KINDS)
def test_adds_accumulate_per_key_and_namespace(kind: str, ttl: bool) -> None:
    backend = _backend()
    s = _make(kind, backend, _ttl(10**9) if ttl else None)
    for key, ns, v in [("a", "x", 1), ("b", "x", 10), ("a", "x", 2), ("a", "y", 100), ("b", "x", 20)]:
        backend.set_current_key(key)
        s.set_current_namespace(ns)
        s.add(v)
    expect = {("a", "x"): 3, ("b", "x"): 30, ("a", "y"): 100, ("b", "y"): None}
    for (key, ns), total in expect.items():
        backend.set_current_key(key)
        s.set_current_namespace(ns)
        assert _read(kind, s) == total


@pytest.mark.parametrize("ttl", [False, True])
@pytest.mark.parametrize("kind", ["reducing", "aggregating"])
def test_a_function_switching_the_key_leaves_the_result_with_the_key_of_the_call(kind: str, ttl: bool) -> None:
    holder: list[Any] = []

    def switch() -> None:
        for b in holder:
            b.set_current_key("other")

    backend = _backend()
    s = _summing_with_hook(kind, backend, switch, _ttl(10**9) if ttl else None)
    backend.set_current_key("k")
    s.add(1)
    holder.append(backend)
    backend.set_current_key("k")
    s.add(2)
    assert backend.get_current_key() == "other"
    backend.set_current_key("k")
    assert s.get() == 3
    backend.set_current_key("other")
    assert s.get() is None
    assert backend.num_entries() == 1


@pytest.mark.parametrize("ttl", [False, True])
@pytest.mark.parametrize("kind", ["reducing", "aggregating"])
def test_a_function_that_raises_changes_nothing(kind: str, ttl: bool) -> None:
    fail = [False]

    def maybe_fail() -> None:
        if fail[0]:
            raise Boom("function")

    backend = _backend()
    s = _summing_with_hook(kind, backend, maybe_fail, _ttl(10**9) if ttl else None)
    backend.set_current_key("k")
    s.add(5)
    fail[0] = True
    with pytest.raises(Boom):
        s.add(1)
    assert s.get() == 5
    backend.set_current_key("new")
    if kind == "aggregating":  # a new key's accumulator is made, then add fails: nothing stored
        with pytest.raises(Boom):
            s.add(1)
        assert backend.num_entries() == 1


@pytest.mark.parametrize("ttl", [False, True])
@pytest.mark.parametrize("kind", KINDS)
def test_a_snapshot_keeps_its_values_while_adds_change_them_in_place(kind: str, ttl: bool) -> None:
    """The aggregating accumulator and the list are changed in place by add: a
    snapshot sharing them must keep the values it was taken with."""
    backend = _backend()
    s = _make(kind, backend, _ttl(10**9) if ttl else None)
    backend.set_current_key("k")
    s.add(1)

    def snapshot_value(snap: Any) -> Any:
        ((key, _, value, _),) = list(snap.entries(s.name))
        assert key == "k"
        return sum(value) if kind == "list" else (value[0] if kind == "aggregating" else value)

    with backend.snapshot() as snap:
        s.add(2)
        s.add(3)
        assert _read(kind, s) == 6
        assert snapshot_value(snap) == 1
        with backend.snapshot() as later:
            s.add(4)
            assert (snapshot_value(snap), snapshot_value(later), _read(kind, s)) == (1, 6, 10)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("return_expired", [False, True])
def test_an_expired_value_is_not_added_to_unless_it_stays_visible(kind: str, return_expired: bool) -> None:
    # (without background cleanup: with it, an append drops a list's expired elements)
    now, backend, s = _clocked(kind, return_expired=return_expired, cleanup=False)
    s.add(1)
    now[0] += 100  # expired (inclusive)
    s.add(10)
    # (a list's elements keep their own times: the expired one is still stored, hidden unless visible)
    assert _read(kind, s) == (11 if return_expired else 10)
    now[0] += 99
    assert _read(kind, s) == (11 if return_expired else 10)  # the add stamped the value anew


def test_with_background_cleanup_an_append_drops_a_lists_expired_head() -> None:
    """(the default) even where expired elements would stay visible: cleaned up"""
    now, backend, s = _clocked("list", return_expired=True)
    s.add(1)
    now[0] += 100
    s.add(10)
    assert s.get() == [10]


@pytest.mark.parametrize("kind", ["reducing", "aggregating"])
@pytest.mark.parametrize("return_expired", [False, True])
def test_an_expired_value_is_removed_by_get(kind: str, return_expired: bool) -> None:
    now, backend, s = _clocked(kind, return_expired=return_expired)
    s.add(4)
    now[0] += 100
    assert s.get() == (4 if return_expired else None)
    assert backend.num_entries() == 0
    assert s.get() is None


@pytest.mark.parametrize("on_read", [False, True])
@pytest.mark.parametrize("kind", ["reducing", "aggregating"])
def test_get_refreshes_only_on_read_and_write(kind: str, on_read: bool) -> None:
    now, backend, s = _clocked(kind, on_read=on_read)
    s.add(4)
    now[0] += 60
    assert s.get() == 4
    now[0] += 60
    assert s.get() == (4 if on_read else None)


@pytest.mark.parametrize("kind", KINDS)
def test_each_access_takes_one_cleanup_step(kind: str) -> None:
    backend = _backend()
    s = _make(kind, backend, _ttl(100))
    table = s._t
    sweeps: list[int] = []
    table.run_cleanup = lambda: sweeps.append(table.ticks)
    backend.set_current_key("k")
    table.ticks = 3
    s.add(1)
    s.get()
    assert (table.ticks, sweeps) == (1, [])
    s.add(1)
    assert sweeps == [0]


@pytest.mark.parametrize("ttl", [False, True])
@pytest.mark.parametrize("kind", ["reducing", "aggregating"])
def test_no_reference_is_leaked_or_lost(kind: str, ttl: bool) -> None:
    value = object()
    backend = _backend()
    cfg = _ttl(10**9) if ttl else None

    class Keep(Sum):
        def add(self, v: Any, acc: Any) -> Any:
            return v

        def get_result(self, acc: Any) -> Any:
            return acc

    s = _reducing(backend, lambda a, b: b, cfg) if kind == "reducing" else _aggregating(backend, Keep(), cfg)
    key = ("a", "key", 1)
    backend.set_current_key(key)
    s.add(value)
    gc.collect()
    before_v, before_k = sys.getrefcount(value), sys.getrefcount(key)
    for _ in range(10_000):
        s.add(value)
        assert s.get() is value
    assert (sys.getrefcount(value), sys.getrefcount(key)) == (before_v, before_k)


@pytest.mark.parametrize("ttl", [False, True])
def test_list_add_holds_no_reference_it_should_not(ttl: bool) -> None:
    value = object()
    backend = _backend()
    s = _list(backend, _ttl(10**9) if ttl else None)
    backend.set_current_key("k")
    s.add(value)
    gc.collect()
    before = sys.getrefcount(value)
    for _ in range(100):
        s.add(value)
    assert sys.getrefcount(value) == before + 100
    s.clear()
    assert sys.getrefcount(value) == before - 1


@pytest.mark.parametrize("field", ["maps", "ttl", "update_on_read", "return_expired", "cleanup_size", "ticks"])
@pytest.mark.parametrize("kind", KINDS)
def test_a_deleted_table_field_is_an_attribute_error_not_a_crash(kind: str, field: str) -> None:
    backend = _backend()
    s = _make(kind, backend, _ttl())
    backend.set_current_key("k")
    s.add(1)
    delattr(s._t, field)
    with pytest.raises(AttributeError, match=field):
        s.add(2)
    with pytest.raises(AttributeError, match=field):
        s.get()


@pytest.mark.parametrize("kind", ["reducing", "aggregating"])
def test_fields_deleted_by_the_function_do_not_crash_the_add(kind: str) -> None:
    """The state's function is a call out to Python: what it deletes must not be
    read afterwards by the add in progress, and the next access reports it."""
    holder: list[Any] = []

    def delete_fields() -> None:
        for table in holder:
            for name in ("ttl", "return_expired", "update_on_read", "maps"):
                if hasattr(table, name):
                    delattr(table, name)

    backend = _backend()
    s = _summing_with_hook(kind, backend, delete_fields, _ttl())
    backend.set_current_key("k")
    s.add(1)
    holder.append(s._t)
    s.add(2)
    with pytest.raises(AttributeError):
        s.add(3)
    with pytest.raises(AttributeError):
        s.get()


# --------------------------------------------------------------------------- ListState.get with TTL


@pytest.mark.parametrize("on_read", [False, True])
@pytest.mark.parametrize("return_expired", [False, True])
def test_list_get_of_a_partly_expired_list(on_read: bool, return_expired: bool) -> None:
    now, backend, s = _clocked("list", on_read=on_read, return_expired=return_expired)
    s.add("old")
    now[0] += 50
    s.add("new")
    now[0] += 50  # "old" expired (inclusive), "new" live for 50 more ms
    assert s.get() == (["old", "new"] if return_expired else ["new"])
    now[0] += 60  # past "new"'s own time; a read rewrote it under OnReadAndWrite
    if on_read:
        assert s.get() == ["new"]  # the expired element was dropped by the rewrite
    else:
        assert s.get() == (["old", "new"] if return_expired else [])
        assert backend.num_entries() == 0  # wholly expired: removed by the read


@pytest.mark.parametrize("on_read", [False, True])
def test_list_get_refreshes_a_live_list_only_on_read_and_write(on_read: bool) -> None:
    now, backend, s = _clocked("list", on_read=on_read)
    s.add(1)
    s.add(2)
    now[0] += 60
    assert s.get() == [1, 2]
    now[0] += 60
    assert s.get() == ([1, 2] if on_read else [])


@pytest.mark.parametrize("partly", [False, True])
def test_list_get_rewriting_timestamps_leaves_a_snapshot_as_it_was(partly: bool) -> None:
    now, backend, s = _clocked("list", on_read=True)
    s.add(1)
    if partly:
        now[0] += 50
    s.add(2)
    with backend.snapshot() as snap:
        before = list(snap.entries(s.name))
        now[0] += 60
        assert s.get() == ([2] if partly else [1, 2])
        assert list(snap.entries(s.name)) == before
    assert before == [("k", before[0][1], [1, 2], [1_000, 1_050 if partly else 1_000])]


@pytest.mark.parametrize("ttl", [False, True])
def test_list_get_returns_a_new_list_each_time(ttl: bool) -> None:
    backend = _backend()
    s = _list(backend, _ttl(10**9) if ttl else None)
    backend.set_current_key("k")
    s.add(1)
    got = s.get()
    got.append(99)
    assert s.get() == [1]
    assert s.get() is not s.get()


def test_list_get_of_no_key_and_of_an_empty_state() -> None:
    backend = _backend()
    s = _list(backend, _ttl())
    with pytest.raises(RuntimeError, match="no current key"):
        s.get()
    backend.set_current_key("k")
    assert s.get() == []
    s.add(1)
    backend.set_current_key("other")  # same key group's map or not: nothing stored for it
    assert s.get() == []


@pytest.mark.parametrize("kind", KINDS)
def test_fields_deleted_by_the_clock_do_not_crash_the_access(kind: str) -> None:
    now = [1_000]
    victim: list[Any] = []

    def clock() -> int:
        for name in ("return_expired", "update_on_read", "ttl", "maps"):
            for table in victim:
                if hasattr(table, name):
                    delattr(table, name)
        return now[0]

    backend = _backend(clock)
    s = _make(kind, backend, _ttl(100, return_expired=True, on_read=True))
    backend.set_current_key("k")
    s.add(1)
    now[0] += 200  # expired: the read takes its expired branch after calling the clock
    victim.append(s._t)
    assert _read(kind, s) == 1  # returned once under ReturnExpiredIfNotCleanedUp, as decided before the call
    with pytest.raises(AttributeError):
        s.get()
    with pytest.raises(AttributeError):
        s.add(2)


# --------------------------------------------------------------------------- clear (every kind but MapState)


def _value(backend: KeyedStateBackend, ttl: StateTtlConfig | None = None) -> Any:
    from cowmap.state import ValueStateDescriptor

    d = ValueStateDescriptor("v")
    if ttl is not None:
        d.enable_time_to_live(ttl)
    return backend.get_state(d)


def _put(kind: str, s: Any, v: int) -> None:
    if kind == "value":
        s.update(v)
    else:
        s.add(v)


def _got(kind: str, s: Any) -> Any:
    return s.value() if kind == "value" else s.get()


@pytest.mark.parametrize("ttl", [False, True])
@pytest.mark.parametrize("kind", [*KINDS, "value"])
def test_clear_removes_only_the_current_key_and_namespace(kind: str, ttl: bool) -> None:
    backend = _backend()
    cfg = _ttl(10**9) if ttl else None
    s = _value(backend, cfg) if kind == "value" else _make(kind, backend, cfg)
    with pytest.raises(RuntimeError, match="no current key"):
        s.clear()
    for key in ("a", "b"):
        backend.set_current_key(key)
        for ns in ("x", "y"):
            s.set_current_namespace(ns)
            _put(kind, s, 1)
    backend.set_current_key("a")
    s.set_current_namespace("x")
    s.clear()
    s.clear()  # nothing left: no error
    assert _got(kind, s) in (None, [])
    assert backend.num_entries() == 3
    s.set_current_namespace("y")
    assert _got(kind, s) in (1, [1])
    backend.set_current_key("never")
    s.clear()  # a key group with no map yet
    assert backend.num_entries() == 3


@pytest.mark.parametrize("kind", [*KINDS, "value"])
def test_clear_takes_one_cleanup_step_and_checks_the_fields(kind: str) -> None:
    backend = _backend()
    s = _value(backend, _ttl(100)) if kind == "value" else _make(kind, backend, _ttl(100))
    table = s._t
    sweeps: list[int] = []
    table.run_cleanup = lambda: sweeps.append(table.ticks)
    backend.set_current_key("k")
    table.ticks = 2
    s.clear()
    assert (table.ticks, sweeps) == (1, [])
    s.clear()
    assert sweeps == [0]
    del table.maps
    with pytest.raises(AttributeError, match="maps"):
        s.clear()


# --------------------------------------------------------------------------- ListState add_all / update


@pytest.mark.parametrize("ttl", [False, True])
@pytest.mark.parametrize("call", ["add_all", "update"])
def test_list_bad_values_are_refused_before_anything_is_written(call: str, ttl: bool) -> None:
    backend = _backend()
    s = _list(backend, _ttl(10**9) if ttl else None)
    backend.set_current_key("k")
    s.add(0)
    fn = getattr(s, call)
    with pytest.raises(ValueError, match="must not be None"):
        fn(None)
    with pytest.raises(TypeError, match="iterable of values"):
        fn("abc")
    with pytest.raises(TypeError, match="iterable of values"):
        fn(b"abc")
    with pytest.raises(ValueError, match="cannot hold None"):
        fn([1, None, 2])
    with pytest.raises(TypeError):
        fn(5)  # not iterable
    assert s.get() == [0]


@pytest.mark.parametrize("ttl", [False, True])
def test_list_add_all_and_update_take_any_iterable(ttl: bool) -> None:
    now = [1_000]
    backend = _backend(lambda: now[0])
    s = _list(backend, _ttl(100) if ttl else None)
    with pytest.raises(RuntimeError, match="no current key"):
        s.update([1])
    s.add_all([])  # nothing to add: not even the key is needed
    backend.set_current_key("k")
    s.add_all(x for x in (1, 2))
    s.add_all((3,))
    s.add_all([])
    assert s.get() == [1, 2, 3]
    now[0] += 60
    s.add_all(range(4, 6))
    now[0] += 60  # with TTL: 1-3 expired, 4-5 live
    assert s.get() == ([4, 5] if ttl else [1, 2, 3, 4, 5])
    s.update(iter([7, 8]))
    assert s.get() == [7, 8]
    s.update([])
    assert s.get() == []
    assert backend.num_entries() == 0


@pytest.mark.parametrize("ttl", [False, True])
def test_list_add_all_and_update_leave_a_snapshot_as_it_was(ttl: bool) -> None:
    backend = _backend()
    s = _list(backend, _ttl(10**9) if ttl else None)
    backend.set_current_key("k")
    s.add_all([1, 2])
    given = [3, 4]
    with backend.snapshot() as snap:
        s.add_all(given)
        given.append(99)  # the caller's list is copied, not stored
        assert s.get() == [1, 2, 3, 4]
        ((_, _, values, _),) = list(snap.entries(s.name))
        assert values == [1, 2]
        s.update([5])
        ((_, _, values, _),) = list(snap.entries(s.name))
        assert values == [1, 2]
    assert s.get() == [5]
