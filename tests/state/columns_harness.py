"""Two backends fed the same steps: one through the columnar twins, one
through the per-record loop they must equal (``set_current_key(k); op`` per
row), for the differential tests of tests/state/test_columns_*.py.

Cleanup timing inside a batch is the batch's choice, so entries compare as
they are visible (unexpired at the time of the comparison), and a state that
returns expired values compares with background cleanup off.
"""

from __future__ import annotations

import importlib.util
from datetime import timedelta
from typing import Any

import numpy as np
from hypothesis import strategies as st

from cowmap import KeyedStateBackend, StateTtlConfig
from cowmap.state.ttl import StateVisibility, UpdateType, expired

MAX_PAR = 8

ints = st.integers(-(2**40), 2**40)
small_keys = st.integers(0, 12)
str_keys = st.sampled_from(["a", "b", "ccc", "d-d", "é", "𝄞x"])
mixed_keys = st.one_of(small_keys, str_keys, st.tuples(small_keys, str_keys))
namespaces = st.sampled_from(["w1", "w2", 7])


@st.composite
def ttl_configs(draw: Any) -> dict[str, Any] | None:
    """None (no TTL) or the settings of a StateTtlConfig."""
    if draw(st.booleans()):
        return None
    ret = draw(st.booleans())
    return {
        "ttl": draw(st.integers(1, 30)),
        "update": draw(st.sampled_from([UpdateType.OnCreateAndWrite, UpdateType.OnReadAndWrite])),
        "visibility": StateVisibility.ReturnExpiredIfNotCleanedUp if ret else StateVisibility.NeverReturnExpired,
        # cleanup timing inside a batch is free: a state that returns expired values has none
        "cleanup": "off" if ret else draw(st.sampled_from(["incremental", "every_record", "off"])),
    }


def ttl_config(cfg: dict[str, Any]) -> StateTtlConfig:
    b = (
        StateTtlConfig.new_builder(timedelta(milliseconds=cfg["ttl"]))
        .set_update_type(cfg["update"])
        .set_state_visibility(cfg["visibility"])
    )
    if cfg["cleanup"] == "incremental":
        b = b.cleanup_incrementally(2, False)
    elif cfg["cleanup"] == "every_record":
        b = b.cleanup_incrementally(2, True)
    else:
        b = b.disable_cleanup_in_background()
    return b.build()


class Pair:
    """Backend ``col`` takes the columnar calls, ``loop`` the per-record loop."""

    def __init__(self, make_descriptor: Any, cfg: dict[str, Any] | None, getter: str) -> None:
        self.now = 0
        self.cfg = cfg
        self.col = KeyedStateBackend(MAX_PAR, time_provider=lambda: self.now)
        self.loop = KeyedStateBackend(MAX_PAR, time_provider=lambda: self.now)
        self.states = []
        for b in (self.col, self.loop):
            d = make_descriptor()
            if cfg is not None:
                d.enable_time_to_live(ttl_config(cfg))
            self.states.append(getattr(b, getter)(d))
        self.col_state, self.loop_state = self.states
        self.snaps: list[tuple[Any, Any, int]] = []

    def loop_rows(self, keys: list[Any], fn: Any, namespace: Any = None) -> list[Any]:
        """``fn(i)`` for each row with its key current, in the loop backend."""
        s = self.loop_state
        old = s.get_current_namespace()
        if namespace is not None:
            s.set_current_namespace(namespace)
        out = []
        try:
            for i, k in enumerate(keys):
                self.loop.set_current_key(k)
                out.append(fn(i))
        finally:
            s.set_current_namespace(old)
        return out

    def take_snapshot(self) -> None:
        self.snaps.append((self.col.snapshot(), self.loop.snapshot(), self.now))

    def visible(self, ts: int, at: int) -> bool:
        if self.cfg is None or ts is None:
            return True
        return not expired(ts, self.cfg["ttl"], at)


def snapshot_entries(snap: Any, name: str, kind: str, pair: Pair, at: int) -> dict[Any, Any]:
    """The visible flat records of state ``name`` (of ``kind``) in a backend
    snapshot, with their timestamps: lists as their visible elements."""
    out: dict[Any, Any] = {}
    if kind == "list":
        for k, ns, vals, stamps in snap.entries(name):
            stamps = stamps if stamps is not None else [None] * len(vals)
            elems = [(v, ts) for v, ts in zip(vals, stamps) if pair.visible(ts, at)]
            if elems:
                out[(k, ns)] = elems
        return out
    for rec in snap.entries(name):
        *head, value, ts = rec
        if pair.visible(ts, at):
            out[tuple(head)] = (tuple(value) if isinstance(value, list) else value, ts)
    return out


def live_entries(pair: Pair, name: str, kind: str) -> tuple[dict[Any, Any], dict[Any, Any]]:
    """What each backend of ``pair`` holds visibly now, through a snapshot."""
    out = []
    for b in (pair.col, pair.loop):
        with b.snapshot() as s:
            out.append(snapshot_entries(s, name, kind, pair, pair.now))
    return out[0], out[1]


def as_input(keys: list[Any], form: str) -> Any:
    """``keys`` in one of the column forms the calls take."""
    if form == "list":
        return list(keys)
    if form == "tuple":
        return tuple(keys)
    if form == "numpy":
        if all(type(k) is int for k in keys):
            return np.array(keys, dtype=np.int64)
        return np.array(keys + [None], dtype=object)[:-1]  # an object array, tuples kept whole
    if form == "pandas":
        import pandas as pd

        if all(type(k) is int for k in keys):
            return pd.Series(keys, dtype="int64")
        return pd.Series(keys + [None], dtype=object).iloc[:-1]
    if form == "arrow":
        import pyarrow as pa

        if all(type(k) is int for k in keys):
            return pa.array(keys, type=pa.int64())
        if all(type(k) is str for k in keys):
            return pa.array(keys, type=pa.string())
        return list(keys)
    raise AssertionError(form)


#: the column forms a call takes; Arrow arrays only where pyarrow (the arrow extra) is installed,
#: as in CI (the test extra brings it), not in a wheel's own test run on the core's dependencies
forms = st.sampled_from(
    ["list", "tuple", "numpy", "pandas", *(["arrow"] if importlib.util.find_spec("pyarrow") else [])]
)


def shared_step(pair: Pair, step: tuple[Any, ...], name: str, kind: str) -> bool:
    """Run a step every differential program has (the clock, the namespace, taking
    and checking snapshots) on both backends; False for any other step."""
    op = step[0]
    if op == "tick":
        pair.now += step[1]
    elif op == "ns":
        for s in pair.states:
            s.set_current_namespace(step[1])
    elif op == "snap":
        pair.take_snapshot()
    elif op == "check":
        if pair.snaps:
            i = step[1] % len(pair.snaps)
            a, b, at = pair.snaps[i]
            assert snapshot_entries(a, name, kind, pair, at) == snapshot_entries(b, name, kind, pair, at)
            if step[2]:
                a.release()
                b.release()
                del pair.snaps[i]
    else:
        return False
    return True
