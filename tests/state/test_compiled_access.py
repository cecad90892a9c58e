"""``ValueState.value``/``update`` and ``MapState.get``/``contains``/``put``/``remove`` are
compiled (cowmap._core): what they must keep doing that a Python method did for
free — a failing or re-entrant time provider, mutable defaults, None values,
namespaces, expired values, the cleanup counter, re-entrant user keys, deleted
fields, reference counts."""

from __future__ import annotations

import gc
import subprocess
import sys
from datetime import timedelta
from typing import Any

import pytest

from cowmap.state import (
    KeyedStateBackend,
    MapStateDescriptor,
    StateTtlConfig,
    StateVisibility,
    UpdateType,
    ValueState,
    ValueStateDescriptor,
)


class Boom(Exception):
    pass


def _ttl(ms: int = 100, **kw: Any) -> StateTtlConfig:
    b = StateTtlConfig.new_builder(timedelta(milliseconds=ms))
    if kw.get("on_read"):
        b = b.set_update_type(UpdateType.OnReadAndWrite)
    if kw.get("return_expired"):
        b = b.set_state_visibility(StateVisibility.ReturnExpiredIfNotCleanedUp)
    if kw.get("cleanup"):
        b = b.cleanup_incrementally(kw["cleanup"], False)
    return b.build()


def _state(ttl: StateTtlConfig | None = None, default: Any = None, provider: Any = None) -> tuple[Any, ValueState]:
    backend = KeyedStateBackend(128, time_provider=provider) if provider else KeyedStateBackend(128)
    d = ValueStateDescriptor("v", default_value=default)
    if ttl is not None:
        d.enable_time_to_live(ttl)
    return backend, backend.get_state(d)


@pytest.mark.parametrize("ttl", [False, True])
def test_no_current_key_is_a_runtime_error(ttl: bool) -> None:
    _, s = _state(_ttl() if ttl else None)
    with pytest.raises(RuntimeError, match="no current key"):
        s.value()
    with pytest.raises(RuntimeError, match="no current key"):
        s.update(1)


class _FailingClock:
    """A time provider that raises while ``fail`` is set."""

    def __init__(self) -> None:
        self.fail = False

    def __call__(self) -> int:
        if self.fail:
            raise Boom("clock")
        return 1_000


def test_a_failing_time_provider_fails_the_access_and_changes_nothing() -> None:
    clock = _FailingClock()
    backend, s = _state(_ttl(), provider=clock)
    backend.set_current_key("k")
    s.update(1)
    clock.fail = True
    with pytest.raises(Boom):
        s.update(2)
    with pytest.raises(Boom):
        s.value()
    clock.fail = False
    assert s.value() == 1


def test_a_time_provider_returning_no_int_is_a_type_error() -> None:
    now: list[Any] = [1_000]
    backend, s = _state(_ttl(), provider=lambda: now[0])
    backend.set_current_key("k")
    now[0] = 1.5
    with pytest.raises(TypeError, match="int milliseconds"):
        s.update(1)
    with pytest.raises(TypeError, match="int milliseconds"):
        s.value()


def test_a_time_provider_that_switches_the_key_writes_the_key_of_the_call() -> None:
    """The key is the one current when the call starts, as the Python method read it."""
    holder: list[Any] = []

    def clock() -> int:
        if holder:
            holder[0].set_current_key("other")
        return 1_000

    backend, s = _state(_ttl(), provider=clock)
    backend.set_current_key("k")
    holder.append(backend)
    s.update(7)
    holder.clear()
    backend.set_current_key("k")
    assert s.value() == 7
    backend.set_current_key("other")
    assert s.value() is None


@pytest.mark.parametrize("ttl", [False, True])
def test_a_mutable_default_is_a_fresh_copy_per_read(ttl: bool) -> None:
    backend, s = _state(_ttl() if ttl else None, default=[])
    backend.set_current_key("k")
    a = s.value()
    a.append(1)
    assert s.value() == []
    assert s.value() is not s.value()


@pytest.mark.parametrize("ttl", [False, True])
def test_update_none_clears(ttl: bool) -> None:
    backend, s = _state(_ttl() if ttl else None, default=0)
    backend.set_current_key("k")
    s.update(5)
    s.update(None)
    assert s.value() == 0
    assert backend.num_entries() == 0


@pytest.mark.parametrize("return_expired", [False, True])
def test_an_expired_value_is_removed_on_read(return_expired: bool) -> None:
    now = [1_000]
    backend, s = _state(_ttl(100, return_expired=return_expired), default="d", provider=lambda: now[0])
    backend.set_current_key("k")
    s.update("x")
    now[0] += 100
    assert s.value() == ("x" if return_expired else "d")
    assert backend.num_entries() == 0
    assert s.value() == "d"


@pytest.mark.parametrize("on_read", [False, True])
def test_a_read_refreshes_the_timestamp_only_on_read_and_write(on_read: bool) -> None:
    now = [1_000]
    backend, s = _state(_ttl(100, on_read=on_read), provider=lambda: now[0])
    backend.set_current_key("k")
    s.update("x")
    now[0] += 60
    assert s.value() == "x"
    now[0] += 60  # 120 after the write, 60 after the read
    assert s.value() == ("x" if on_read else None)


def test_each_access_takes_one_cleanup_step() -> None:
    backend, s = _state(_ttl(100, cleanup=5))
    table = s._t
    sweeps: list[int] = []
    table.run_cleanup = lambda: sweeps.append(table.ticks)  # (an instance attribute: what the access calls)
    backend.set_current_key("k")
    table.ticks = 3
    s.update(1)
    s.value()
    assert (table.ticks, sweeps) == (1, [])
    s.value()  # the step that reaches 0 sweeps
    assert sweeps == [0]


@pytest.mark.parametrize("ttl", [False, True])
def test_no_reference_is_leaked_or_lost(ttl: bool) -> None:
    backend, s = _state(_ttl(10**9) if ttl else None, default=None)
    value = object()
    key = ("a", "key", 1)
    backend.set_current_key(key)
    s.update(value)
    gc.collect()
    before_v, before_k = sys.getrefcount(value), sys.getrefcount(key)
    for _ in range(10_000):
        assert s.value() is value
        s.update(value)
    assert sys.getrefcount(value) == before_v
    assert sys.getrefcount(key) == before_k
    backend.set_current_key("miss")
    for _ in range(1_000):
        assert s.value() is None
    assert sys.getrefcount(value) == before_v


@pytest.mark.parametrize("field", ["maps", "ttl", "update_on_read", "return_expired", "cleanup_size", "ticks"])
@pytest.mark.parametrize("ttl", [False, True])
def test_a_deleted_table_field_is_an_attribute_error_not_a_crash(field: str, ttl: bool) -> None:
    backend, s = _state(_ttl() if ttl else None)
    backend.set_current_key("k")
    s.update(1)
    delattr(s._t, field)
    with pytest.raises(AttributeError, match=field):
        s.value()
    with pytest.raises(AttributeError, match=field):
        s.update(2)


def test_a_deleted_default_is_an_attribute_error_not_a_crash() -> None:
    backend, s = _state()
    backend.set_current_key("k")
    del s._default
    with pytest.raises(AttributeError, match="_default"):
        s.value()



# --------------------------------------------------------------------------- MapState


def _map(ttl: StateTtlConfig | None = None, provider: Any = None) -> tuple[Any, Any]:
    backend = KeyedStateBackend(128, time_provider=provider) if provider else KeyedStateBackend(128)
    d = MapStateDescriptor("m")
    if ttl is not None:
        d.enable_time_to_live(ttl)
    return backend, backend.get_map_state(d)


@pytest.mark.parametrize("ttl", [False, True])
def test_map_no_current_key_is_a_runtime_error(ttl: bool) -> None:
    _, m = _map(_ttl() if ttl else None)
    for call in (lambda: m.get("u"), lambda: m.contains("u"), lambda: m.put("u", 1), lambda: m.remove("u")):
        with pytest.raises(RuntimeError, match="no current key"):
            call()


@pytest.mark.parametrize("ttl", [False, True])
def test_map_none_values_and_none_user_keys(ttl: bool) -> None:
    backend, m = _map(_ttl(10**9) if ttl else None)
    backend.set_current_key("k")
    m.put("u", None)
    assert m.contains("u") and m.get("u") is None
    assert m.items() == [("u", None)]
    with pytest.raises(TypeError, match="must not be None"):
        m.put(None, 1)
    assert not m.contains("absent") and m.get("absent") is None
    with pytest.raises(TypeError):
        m.get([])  # unhashable


def test_map_namespaces_and_key_switches_use_their_own_entries() -> None:
    backend, m = _map(_ttl(10**9))
    for key in ("a", "b", 7, (1, "x")):
        backend.set_current_key(key)
        for ns in ("n1", "n2"):
            m.set_current_namespace(ns)
            m.put("u", (key, ns))
    for key in ("a", "b", 7, (1, "x")):
        backend.set_current_key(key)
        for ns in ("n1", "n2"):
            m.set_current_namespace(ns)
            assert m.get("u") == (key, ns)
            assert m.items() == [("u", (key, ns))]
    backend.set_current_key(7)
    m.set_current_namespace("n3")
    assert not m.contains("u")


def test_map_equal_key_objects_read_the_same_entries() -> None:
    backend, m = _map()
    big = 10**20
    backend.set_current_key(big)
    m.put("u", 1)
    backend.set_current_key(int(str(big)))  # equal, another object: the cached namespace is not reused blindly
    assert m.get("u") == 1
    m.put("v", 2)
    assert m.items() == [("u", 1), ("v", 2)]


@pytest.mark.parametrize("return_expired", [False, True])
def test_map_an_expired_entry_found_by_a_read_is_removed_and_unlinked(return_expired: bool) -> None:
    now = [1_000]
    backend, m = _map(_ttl(100, return_expired=return_expired), provider=lambda: now[0])
    backend.set_current_key("k")
    m.put("old", 1)
    now[0] += 60
    m.put("new", 2)
    now[0] += 60
    assert m.get("old") == (1 if return_expired else None)
    assert m.items() == [("new", 2)]
    m.put("old", 3)  # a new user key again: linked last
    assert m.items() == [("new", 2), ("old", 3)]
    m._t._check()


def test_map_a_failing_time_provider_changes_nothing() -> None:
    clock = _FailingClock()
    backend, m = _map(_ttl(), provider=clock)
    backend.set_current_key("k")
    m.put("u", 1)
    clock.fail = True
    for call in (lambda: m.put("v", 2), lambda: m.put("u", 2), lambda: m.get("u")):
        with pytest.raises(Boom):
            call()
    clock.fail = False
    assert m.items() == [("u", 1)]
    m._t._check()


class _ReentrantKey:
    """A user key whose hash calls back into the state."""

    def __init__(self, state: Any) -> None:
        self.state = state

    def __hash__(self) -> int:
        self.state.get("other")
        return 1

    def __eq__(self, other: object) -> bool:
        return self is other


@pytest.mark.parametrize("ttl", [False, True])
def test_map_a_user_key_calling_back_into_the_state_is_refused(ttl: bool) -> None:
    backend, m = _map(_ttl(10**9) if ttl else None)
    backend.set_current_key("k")
    m.put("other", 0)
    bad = _ReentrantKey(m)
    with pytest.raises(RuntimeError):
        m.put(bad, 1)
    with pytest.raises(RuntimeError):
        m.get(bad)
    assert m.items() == [("other", 0)]
    m._t._check()


@pytest.mark.parametrize("field", ["_c", "_c_key"])
def test_map_a_deleted_view_field_is_an_attribute_error_not_a_crash(field: str) -> None:
    backend, m = _map()
    backend.set_current_key("k")
    m.put("u", 1)
    delattr(m, field)
    with pytest.raises(AttributeError, match=field):
        m.get("u")
    with pytest.raises(AttributeError, match=field):
        m.put("u", 2)
    with pytest.raises(AttributeError, match=field):
        m.remove("u")


@pytest.mark.parametrize("ttl", [False, True])
def test_map_no_reference_is_leaked_or_lost(ttl: bool) -> None:
    backend, m = _map(_ttl(10**9) if ttl else None)
    value, ukey, key = object(), ("user", 1), ("a", "key")
    backend.set_current_key(key)
    m.put(ukey, value)
    gc.collect()
    before = [sys.getrefcount(o) for o in (value, ukey, key)]
    for _ in range(10_000):
        assert m.get(ukey) is value
        assert m.contains(ukey)
        m.put(ukey, value)
    assert [sys.getrefcount(o) for o in (value, ukey, key)] == before
    for _ in range(1_000):
        m.remove(ukey)
        m.put(ukey, value)
    assert [sys.getrefcount(o) for o in (value, ukey, key)] == before


@pytest.mark.parametrize("ttl", [False, True])
@pytest.mark.parametrize("namespace", [None, "w"])
def test_map_remove_at_every_place_keeps_the_order(ttl: bool, namespace: Any) -> None:
    """Removing the head, a middle entry, the tail and the last one left: the
    others keep their order, and the list's invariants hold after each."""
    backend, m = _map(_ttl(10**9) if ttl else None)
    backend.set_current_key("k")
    if namespace is not None:
        m.set_current_namespace(namespace)
    for u in "abcde":
        m.put(u, u.upper())
    left = list("abcde")
    for u in ["a", "c", "e", "zz", "b", "d"]:  # head, middle, tail, absent, head, the last one
        m.remove(u)
        if u in left:
            left.remove(u)
        assert m.items() == [(x, x.upper()) for x in left]
        m._t._check()
    assert m.is_empty()
    m.put("f", "F")  # the list starts again
    assert m.items() == [("f", "F")]
    m._t._check()


def test_map_remove_of_a_broken_list_is_a_runtime_error_not_a_crash() -> None:
    backend, m = _map()
    backend.set_current_key("k")
    m.put("a", 1)
    m.put("b", 2)
    m._t.users[backend.key_context.key_group].links.remove("b", "k")  # damage the list by hand
    with pytest.raises(RuntimeError, match="broken"):
        m.remove("b")


def test_map_markers_are_read_even_when_python_made_the_namespace_first() -> None:
    """The compiled accesses learn cowmap.state's markers at their first use; a
    namespace cached by the Python side before that must not skip it."""
    code = (
        "from cowmap.state import KeyedStateBackend, MapStateDescriptor\n"
        "b = KeyedStateBackend(8)\n"
        "m = b.get_map_state(MapStateDescriptor('m'))\n"
        "b.set_current_key('k')\n"
        "m.put_all({'u': None})\n"  # Python: caches the namespace, stores None as the marker
        "assert m.get('u') is None and m.contains('u'), (m.get('u'), m.contains('u'))\n"
        "assert m.items() == [('u', None)]\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


@pytest.mark.parametrize("kind", ["value", "map"])
def test_fields_deleted_by_code_run_during_an_access_do_not_crash_it(kind: str) -> None:
    """The clock is a call out to Python: what it deletes must not be read by the
    access in progress (read before the call, or checked after it), and the next
    access reports it."""
    now = [1_000]
    victim: list[Any] = []

    def clock() -> int:
        for obj, name in victim:
            if hasattr(obj, name):
                delattr(obj, name)
        return now[0]

    ttl = _ttl(100, return_expired=True, on_read=True)
    backend, s = _state(ttl, provider=clock) if kind == "value" else _map(ttl, provider=clock)
    backend.set_current_key("k")
    write = s.update if kind == "value" else (lambda v: s.put("u", v))
    read = s.value if kind == "value" else (lambda: s.get("u"))
    write("x")
    now[0] += 200  # expired: the read takes the expired branch after calling the clock
    victim[:] = [(s._t, "return_expired"), (s._t, "update_on_read"), (s, "_default"), (s, "_c"), (s, "_c_key")]
    assert read() == "x"  # returned once under ReturnExpiredIfNotCleanedUp, as decided before the call
    with pytest.raises(AttributeError):
        read()
    with pytest.raises(AttributeError):
        write("y")
