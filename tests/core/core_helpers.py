"""Shared helpers for the tests of ``cowmap.CopyOnWriteStateMap``.

Imported by the test modules of this directory as ``core_helpers`` (pytest's default
"prepend" import mode puts this directory on ``sys.path``).
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterable
from typing import Any

from hypothesis import strategies as st

from cowmap import CopyOnWriteStateMap, StateMapSnapshot

# Flink's rehash rule: a table of capacity c starts an incremental rehash on the put that
# finds size() > threshold, threshold = c/2 + c/4.


def threshold(capacity: int) -> int:
    """Flink's resize threshold (3/4 of the capacity)."""
    return (capacity >> 1) + (capacity >> 2)


class CountingCopier:
    """A copier (Flink's ``serializer.copy``) that counts its calls.

    ``copied`` keeps ``(original, copy)`` pairs so tests can check which object was copied.
    """

    def __init__(self, fn: Callable[[Any], Any] = copy.deepcopy) -> None:
        self.fn = fn
        self.calls = 0
        self.copied: list[tuple[Any, Any]] = []

    def __call__(self, state: Any) -> Any:
        self.calls += 1
        result = self.fn(state)
        self.copied.append((state, result))
        return result


class PlainStates:
    """State-machine hooks for immutable states (ints, strings, None) and no copier, for
    machines keeping their model as ``{(key, ns): (state, ts)}`` in ``self.model``."""

    STATES: Any = st.one_of(st.none(), st.integers(-5, 5), st.text(max_size=2))

    def make_copier(self):
        return None

    def new_state(self, drawn: Any) -> Any:
        """The object handed to the map for a drawn state."""
        return drawn

    def norm(self, state: Any) -> Any:
        """A value-only, immutable view of a map state, for comparisons and the model."""
        return state

    def expected_state(self, key: Any, ns: Any) -> Any:
        entry = self.model.get((key, ns))  # type: ignore[attr-defined]
        return None if entry is None else entry[0]


class ListStates:
    """State-machine hooks for list states with a copier: the map's states are lists that
    user code mutates in place, compared (and kept in the model) as tuples. Mixed in ahead
    of a machine that calls ``make_copier``/``new_state``/``norm``/``scribble``."""

    STATES = st.one_of(st.none(), st.lists(st.integers(0, 9), max_size=3))

    def make_copier(self):
        self.copier = CountingCopier(lambda s: None if s is None else list(s))
        return self.copier

    def new_state(self, drawn):
        return None if drawn is None else list(drawn)

    def norm(self, state):
        return None if state is None else tuple(state)

    def scribble(self, old_state):
        if old_state is not None:
            old_state.append("scribbled")  # must not reach the map or any snapshot


def as_dict(entries: Iterable[tuple[Any, ...]]) -> dict[tuple[Any, Any], Any]:
    """``{(key, ns): rest}`` from ``(key, ns, state[, ts])`` tuples, asserting no duplicates.

    ``rest`` is the state for 3-tuples and ``(state, ts)`` for 4-tuples.
    """
    out: dict[tuple[Any, Any], Any] = {}
    for entry in entries:
        assert isinstance(entry, tuple) and len(entry) in (3, 4), entry
        key, ns = entry[0], entry[1]
        assert (key, ns) not in out, f"duplicate entry {(key, ns)!r}"
        out[(key, ns)] = entry[2] if len(entry) == 3 else (entry[2], entry[3])
    return out


def map_contents(m: CopyOnWriteStateMap) -> dict[tuple[Any, Any], Any]:
    """The map's contents via ``iter(m)``: ``{(key, ns): state}`` (duplicates fail)."""
    return as_dict(iter(m))


def snapshot_contents(s: StateMapSnapshot) -> dict[tuple[Any, Any], Any]:
    """The snapshot's contents via ``iter(s)``: ``{(key, ns): state}`` (duplicates fail)."""
    return as_dict(iter(s))


def snapshot_contents_ts(s: StateMapSnapshot) -> dict[tuple[Any, Any], Any]:
    """The snapshot's contents with timestamps: ``{(key, ns): (state, ts)}``."""
    return as_dict(s.iter_with_timestamps())


def finish_rehash(m: CopyOnWriteStateMap, probe: tuple[Any, Any] = (object(), 0)) -> int:
    """Run lookups of an absent key until the map is no longer rehashing.

    Every operation performs one rehash step (at least 4 entries), so this ends after at most
    ``len(m) // 4 + 1`` lookups; returns the number of lookups made.
    """
    n = 0
    bound = len(m) // 4 + 2
    while m.is_rehashing:
        assert m.get(*probe) is None
        n += 1
        assert n <= bound, "rehash did not finish within len/4 + 2 operations"
    return n


def fill_until_rehashing(m: CopyOnWriteStateMap, ns: Any = 0, start: int = 0) -> int:
    """Put int keys ``start, start+1, ...`` (state = key) until a rehash starts.

    Returns the next unused key.
    """
    k = start
    while not m.is_rehashing:
        m.put(k, ns, k)
        k += 1
        assert k - start <= 10 * m.capacity + 10, "rehash never started"
    return k


class CollidingKey:
    """A key with a chosen hash, to force long bucket chains. Equal iff ``ident`` is equal."""

    __slots__ = ("ident", "h")

    def __init__(self, ident: Any, h: int = 0) -> None:
        self.ident = ident
        self.h = h

    def __hash__(self) -> int:
        return self.h

    def __eq__(self, other: object) -> bool:
        return isinstance(other, CollidingKey) and other.ident == self.ident

    def __repr__(self) -> str:
        return f"CollidingKey({self.ident!r}, h={self.h})"
