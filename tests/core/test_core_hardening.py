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
