"""A backend's states to checkpoint blocks and back.

Each state kind has a fixed row shape (the records ``KeyedStateSnapshot.entries``
yields), stored column by column:

- value, reducing, aggregating: key, namespace, value[, timestamp];
- map: key, namespace, user key, value[, timestamp];
- list: key, namespace, values[, timestamps].

The timestamp column exists exactly when the state has TTL.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from typing import Any

import numpy as np

from cowmap._core import NO_TIMESTAMP, column_put, snapshot_columns, user_insert_many
from cowmap._requests import replace_all
from cowmap.checkpoint.columns import PICKLE, Const, Serializer, column_list, encode_column, serializer_name
from cowmap.checkpoint.fileformat import Section
from cowmap.state.backend import _TABLES, KeyedStateBackend
from cowmap.state.descriptors import (
    AggregateFunction,
    AggregatingStateDescriptor,
    ListStateDescriptor,
    MapStateDescriptor,
    ReducingStateDescriptor,
    StateDescriptor,
    ValueStateDescriptor,
)
from cowmap.state.snapshot import KeyedStateSnapshot
from cowmap.state.table import VOID_NAMESPACE, StateTable
from cowmap.state.ttl import StateTtlConfig, StateVisibility, UpdateType
from cowmap.state.user_map import NONE_VALUE, NS_MARKER, make_ctx, split_ctx

__all__ = ["column_serializers", "encode_block", "restore_blocks", "state_headers"]

#: how a backend maps keys to key groups (recorded so a restore under another function fails)
KEY_HASH = "cowmap-murmur-v1"


def serializer_of(descriptor: StateDescriptor) -> Serializer:
    return getattr(descriptor, "serializer", None) or PICKLE


def column_serializers(kind: str, value_serializer: Serializer) -> list[Serializer]:
    """The serializer of each column of a state's rows: the state's own for its
    values, pickle for keys, namespaces, user keys and timestamps."""
    values_at = 3 if kind == "map" else 2
    return [value_serializer if i == values_at else PICKLE for i in range(5)]


def ttl_to_json(cfg: StateTtlConfig | None) -> dict[str, Any] | None:
    if cfg is None:
        return None
    out = dataclasses.asdict(cfg)
    out["update_type"] = cfg.update_type.name
    out["state_visibility"] = cfg.state_visibility.name
    return out


def ttl_from_json(d: dict[str, Any] | None) -> StateTtlConfig | None:
    if d is None:
        return None
    d = dict(d)
    d["update_type"] = UpdateType[d["update_type"]]
    d["state_visibility"] = StateVisibility[d["state_visibility"]]
    return StateTtlConfig(**d)


def state_headers(snap: KeyedStateSnapshot) -> list[dict[str, Any]]:
    """The header's description of every state in ``snap``, in block order."""
    out = []
    for name in snap.state_names():
        d = snap.descriptor(name)
        out.append(
            {
                "name": name,
                "kind": d.kind,
                "ttl": ttl_to_json(d.ttl_config),
                "serializer": serializer_name(serializer_of(d)),
            }
        )
    return out


def encode_block(snap: KeyedStateSnapshot, kg: int) -> list[Section]:
    """Every state's rows of key group ``kg`` as encoded sections."""
    sections: list[Section] = []
    for i, name in enumerate(snap.state_names()):
        s = snap._state(name)
        if kg not in s.maps:
            continue
        snap._check()
        kind = s.table.kind
        columns = (
            _map_columns(s, kg)
            if kind == "map"
            else _entry_columns(s, kg) if type(s.table).export is StateTable.export else None
        )
        if columns is None:
            rows = list(snap._entries_of(s, kg))
            columns = list(zip(*rows))
        n = len(columns[0]) if columns else 0
        if not n:
            continue
        if not s.ttl:
            columns.pop()  # timestamps: NO_TIMESTAMP (value, map) or None (list) throughout
        sers = column_serializers(kind, serializer_of(s.live_descriptor))
        sections.append((i, n, [encode_column(c, ser) for c, ser in zip(columns, sers)]))
    return sections


def _entry_columns(s: Any, kg: int) -> list[Any]:
    """``[keys, namespaces, values, timestamps]`` of a state stored one entry per
    key and namespace, read out by the core in one call (numbers as arrays, the
    common namespace once), expired entries left out under full-snapshot cleanup."""
    keys, nss, values, ts = snapshot_columns(s.maps[kg], VOID_NAMESPACE)
    ns: Any = Const(VOID_NAMESPACE) if nss is None else nss
    return _unexpired(s, [keys, ns, values, ts])


def _map_columns(s: Any, kg: int) -> list[Any]:
    """``[keys, namespaces, user keys, values, timestamps]`` of a MapState's user
    entries in insertion order, read out by the core in one call (see
    ``user_map``: a user entry's namespace in the core is the key itself in the
    void namespace, else ``(key, namespace, NS_MARKER)``)."""
    ukeys, ctxs, values, ts = snapshot_columns(s.maps[kg], NS_MARKER)
    keys: Any
    ns: Any
    if ctxs is None:  # no entries (no context is the marker itself)
        ctxs = []
    if isinstance(ctxs, np.ndarray) or not any(type(c) is tuple for c in ctxs):
        keys, ns = ctxs, Const(VOID_NAMESPACE)
    else:
        pairs = [split_ctx(c) for c in ctxs]
        keys, ns = [k for k, _ in pairs], [n for _, n in pairs]
    if isinstance(values, list):
        values = replace_all(values, NONE_VALUE, None)
    return _unexpired(s, [keys, ns, ukeys, values, ts])


def _unexpired(s: Any, columns: list[Any]) -> list[Any]:
    """``columns`` (timestamps last) without the rows expired at the snapshot,
    when the state cleans up on full snapshots; as they are otherwise."""
    if s.cleanup_now is None:
        return columns
    keep = columns[-1] > s.cleanup_now - s.ttl  # not expired: ts + ttl > now (saturating: ts <= MAX)
    if keep.all():
        return columns
    return [c if isinstance(c, Const) else _take(c, keep) for c in columns]


def _take(col: Any, keep: np.ndarray) -> Any:
    if isinstance(col, np.ndarray):
        return col[keep]
    return [x for x, k in zip(col, keep.tolist()) if k]


class _Unregistered:
    """The function of a reducing or aggregating state made by a restore, until
    the state is registered with its descriptor."""

    def __init__(self, name: str) -> None:
        self.name = name

    def _fail(self, *_: Any) -> Any:
        raise RuntimeError(
            f"state {self.name!r} was restored from a checkpoint: register it with its descriptor "
            f"(get_reducing_state / get_aggregating_state) before adding to it"
        )

    __call__ = create_accumulator = add = get_result = merge = _fail


def placeholder_descriptor(meta: dict[str, Any]) -> StateDescriptor:
    """A descriptor for a state a restore makes that the backend has not registered."""
    name, kind = meta["name"], meta["kind"]
    d: StateDescriptor
    if kind == "value":
        d = ValueStateDescriptor(name)
    elif kind == "list":
        d = ListStateDescriptor(name)
    elif kind == "map":
        d = MapStateDescriptor(name)
    elif kind == "reducing":
        d = ReducingStateDescriptor(name, _Unregistered(name))
    elif kind == "aggregating":
        agg: AggregateFunction = _Unregistered(name)  # type: ignore[assignment]
        d = AggregatingStateDescriptor(name, agg)
    else:
        raise ValueError(f"state {name!r} has unknown kind {kind!r}")
    cfg = ttl_from_json(meta["ttl"])
    if cfg is not None:
        d.enable_time_to_live(cfg)
    return d


def check_compatible(backend: KeyedStateBackend, states: list[dict[str, Any]], where: str) -> None:
    """ValueError, before anything changes, if a state registered in ``backend``
    has another kind or TTL setting than the checkpoint's."""
    for meta in states:
        table = backend._tables.get(meta["name"])
        if table is None:
            continue
        if table.kind != meta["kind"]:
            raise ValueError(f"state {meta['name']!r} is {table.kind} state here but {meta['kind']} state in {where}")
        if bool(table.ttl) != (meta["ttl"] is not None):
            here, there = ("with", "without") if table.ttl else ("without", "with")
            raise ValueError(
                f"state {meta['name']!r} is registered here {here} TTL but was checkpointed {there} TTL "
                f"in {where}: its entries cannot be restored into it"
            )


def restore_blocks(
    backend: KeyedStateBackend,
    states: list[dict[str, Any]],
    blocks: Iterable[tuple[int, Iterable[tuple[int, int, list[Any]]]]],
) -> None:
    """Write decoded blocks ``(kg, sections)`` into ``backend`` (checked already)."""
    tables = []
    for meta in states:
        table = backend._tables.get(meta["name"])
        if table is None:
            table = backend._tables[meta["name"]] = _TABLES[meta["kind"]](backend, placeholder_descriptor(meta))
        tables.append(table)
    for kg, sections in blocks:
        for i, n, cols in sections:
            table = tables[i]
            if not table.ttl:
                cols.append(None)
            if _put_numbers(table, kg, n, cols) or (table.kind == "map" and _put_user_entries(table, kg, n, cols)):
                continue
            fields = [column_list(c, n) if c is not None else _no_stamps(table.kind, n) for c in cols]
            table.import_records(kg, zip(*fields))


def _no_stamps(kind: str, n: int) -> list[Any]:
    return [None] * n if kind == "list" else [NO_TIMESTAMP] * n


def _put_user_entries(table: Any, kg: int, n: int, cols: list[Any]) -> bool:
    """A MapState's rows in one namespace: one compiled call that inserts (or
    overwrites, keeping the place) each user entry with its timestamp. False
    for rows in several namespaces."""
    keys, ns, ukeys, values, ts = cols
    if not isinstance(ns, tuple):
        return False
    table.map_for_write(kg)
    keys = column_list(keys, n)
    ctxs = keys if ns[0] is VOID_NAMESPACE else [make_ctx(k, ns[0]) for k in keys]
    stamps = ts.tolist() if ts is not None else NO_TIMESTAMP
    user_insert_many(
        table.users, [kg] * n, ctxs, keys, ns[0], column_list(ukeys, n), column_list(values, n),
        range(n), NONE_VALUE, stamps,
    )
    return True


def _put_numbers(table: Any, kg: int, n: int, cols: list[Any]) -> bool:
    """A value-like state whose keys and values are numbers in one namespace:
    one compiled call (with each row's timestamp under TTL). False when the
    rows are not of that shape."""
    if table.kind == "list" or table.kind == "map":
        return False
    keys, ns, values, ts = cols
    if not (isinstance(keys, np.ndarray) and isinstance(ns, tuple) and isinstance(values, np.ndarray)):
        return False
    table.map_for_write(kg, n)
    kgs = np.full(n, kg, dtype=np.int32)
    column_put(table.maps, kgs, keys, ns[0], values, NO_TIMESTAMP if ts is None else ts)
    return True
