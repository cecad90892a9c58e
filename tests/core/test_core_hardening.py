"""The compiled core's Python surface under hostile use.

Every argument of a compiled class or function that the C code reads through is checked
before it is read: wrong types are ``TypeError``, bad values ``ValueError``, misuse
``RuntimeError``, each naming what was wrong; nothing crashes.
"""

from __future__ import annotations

from typing import Any, Callable

import pytest

from cowmap import CopyOnWriteStateMap, StateIncrementalVisitor
from cowmap import _async, _core
from cowmap._core import FlatStateMap

# --------------------------------------------------------------------------- typed arguments


def _flat_snapshot() -> Any:
    return FlatStateMap().snapshot()


@pytest.mark.parametrize(
    ("make", "argument"),
    [
        (lambda: StateIncrementalVisitor(None, 4), "m"),
        (lambda: _core._MapIterator(None), "m"),
        (lambda: _core._SnapshotIterator(None, False), "snap"),
        (lambda: _core._FlatSnapshotIterator(None, True), "snap"),
        (lambda: _async._post_step(None, None, None), "f"),
        (lambda: _async._post_step(None, _async.StateFuture(), None), "src"),
    ],
    ids=["visitor", "map-iterator", "snapshot-iterator", "flat-snapshot-iterator", "post-step-f", "post-step-src"],
)
def test_typed_arguments_reject_none(make: Callable[[], Any], argument: str) -> None:
    with pytest.raises(TypeError, match=f"'{argument}'"):
        make()


@pytest.mark.parametrize(
    ("make", "argument"),
    [
        (lambda: StateIncrementalVisitor(FlatStateMap(), 4), "m"),
        (lambda: _core._MapIterator(FlatStateMap()), "m"),
        (lambda: _core._SnapshotIterator(_flat_snapshot(), False), "snap"),
        (lambda: _core._FlatSnapshotIterator(CopyOnWriteStateMap().snapshot(), False), "snap"),
    ],
    ids=["visitor", "map-iterator", "snapshot-iterator", "flat-snapshot-iterator"],
)
def test_typed_arguments_reject_other_types(make: Callable[[], Any], argument: str) -> None:
    with pytest.raises(TypeError, match=f"'{argument}'"):
        make()


def test_visitor_bound_is_checked_wherever_the_visitor_is_made() -> None:
    m = CopyOnWriteStateMap()
    m.put(1, 0, "one")
    for make in (lambda n: StateIncrementalVisitor(m, n), m.incremental_visitor):
        for bad in (0, -1, 2**32, 2**70):
            with pytest.raises(ValueError, match="max_empty_buckets"):
                make(bad)
        for bad in (1.5, "3", None):
            with pytest.raises(TypeError, match="max_empty_buckets"):
                make(bad)
        v = make(2**32 - 1)
        assert v.next_entries() == [(1, 0, "one")]
        assert v.next_entries() is None


# --------------------------------------------------------------------------- TTL arguments

MAP_KINDS = [CopyOnWriteStateMap, FlatStateMap]
BAD_TTLS = [0, -1, -(2**63)]


def _ttl_calls(m: Any) -> dict[str, Callable[[int], Any]]:
    """Every TTL-taking entry point of map ``m``, as a function of the ttl."""
    return {
        "get_unexpired": lambda ttl: m.get_unexpired(1, 0, 10, ttl),
        "get_unexpired-refresh": lambda ttl: m.get_unexpired(1, 0, 10, ttl, refresh=True),
        "sweep_expired": lambda ttl: m.sweep_expired(10, ttl),
        "sweep_expired-full": lambda ttl: m.sweep_expired(10, ttl, None),
        "multi_get": lambda ttl: _core.multi_get([m], [0], [1], [0], 10, ttl),
        "multi_get-missing-map": lambda ttl: _core.multi_get([None], [0], [1], [0], 10, ttl),
    }


@pytest.mark.parametrize("kind", MAP_KINDS, ids=lambda k: k.__name__)
@pytest.mark.parametrize("ttl", BAD_TTLS)
def test_ttl_must_be_positive_at_every_entry_point(kind: type, ttl: int) -> None:
    m = kind()
    m.put(1, 0, "v", 5)
    calls = _ttl_calls(m)
    if ttl == 0:
        del calls["multi_get"], calls["multi_get-missing-map"]  # there 0 means: no TTL
    for name, call in calls.items():
        with pytest.raises(ValueError, match=rf"ttl must be > 0 \(milliseconds\), got {ttl}$"):
            call(ttl)
    assert m.get_with_timestamp(1, 0) == ("v", 5) if kind is CopyOnWriteStateMap else m.timestamp(1, 0) == 5
    assert len(m) == 1


@pytest.mark.parametrize("kind", MAP_KINDS, ids=lambda k: k.__name__)
def test_ttl_of_wrong_type_is_a_type_error(kind: type) -> None:
    m = kind()
    for name, call in _ttl_calls(m).items():
        for bad in (1.5, "5", None):
            with pytest.raises(TypeError, match="ttl"):
                call(bad)


@pytest.mark.parametrize("kind", MAP_KINDS, ids=lambda k: k.__name__)
def test_good_ttls_behave_alike_in_both_maps(kind: type) -> None:
    m = kind()
    m.put(1, 0, "v", 5)
    assert m.get_unexpired(1, 0, 10, 2**63 - 1) == "v"  # the sum saturates: never expires
    assert m.get_unexpired(1, 0, 10, 6) == "v"
    assert m.get_unexpired(1, 0, 10, 5) is _core.EXPIRED  # inclusive: ts + ttl <= now
    assert _core.multi_get([m], [0], [1], [0], 10, 0) == ["v"]  # ttl 0: a plain read
    assert _core.multi_get([m], [0], [1], [0], 10, 5) == [_core.EXPIRED]
    assert m.sweep_expired(10, 5, None) == 1 and len(m) == 0
