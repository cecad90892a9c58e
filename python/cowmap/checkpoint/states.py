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
from collections.abc import Iterable, Iterator
from typing import Any

import numpy as np

from cowmap._core import (
    NO_TIMESTAMP,
    ColumnReader,
    column_missing,
    column_put,
    column_remove,
    snapshot_changes,
    snapshot_changes_many,
    snapshot_columns_many,
    user_insert_many,
)
from cowmap._requests import replace_all
from cowmap.checkpoint.columns import PICKLE, Const, Serializer, column_list, encode_column, serializer_name
from cowmap.checkpoint.fileformat import Runs, Section
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
from cowmap.state.timers import TimeDomain
from cowmap.state.ttl import StateTtlConfig, StateVisibility, UpdateType
from cowmap.state.user_map import NONE_VALUE, NS_MARKER, make_ctx, split_ctx

__all__ = [
    "Clipped",
    "Piece",
    "clip_sections",
    "changes_lost",
    "column_serializers",
    "block_columns",
    "change_columns",
    "changed_timer_key_groups",
    "encode_change_chunk",
    "encode_full_group",
    "full_rows",
    "restore_blocks",
    "state_headers",
    "timer_section_base",
]



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


#: Tombstone sections (an incremental checkpoint's removals) of state i have
#: index ``len(states) + i``; their columns: key, namespace[, user key].
TOMBSTONE_COLUMNS = 3


#: a key group's rows of one section, not encoded yet: (section index, columns)
Piece = tuple[int, list[Any]]


def block_columns(snap: KeyedStateSnapshot, kg: int, states: Iterable[int] | None = None) -> list[Piece]:
    """Every state's rows of key group ``kg`` (a full checkpoint's), or only
    those of the states of indexes ``states``."""
    pieces: list[Piece] = []
    names = snap.state_names()
    for i in range(len(names)) if states is None else states:
        s = snap._state(names[i])
        if kg not in s.maps:
            continue
        snap._check()
        cols = _columns(s, kg)
        if cols and len(cols[0]):
            pieces.append((i, cols))
    return pieces


def changes_lost(snap: KeyedStateSnapshot) -> bool:
    """Whether a map of ``snap`` (a cut) lost track of some of its changes,
    so that an incremental checkpoint cannot be written from it."""
    return any(m.changes == "lost" for name in snap.state_names() for m in snap._state(name).maps.values())


def change_columns(snap: KeyedStateSnapshot, kg: int, states: Iterable[int] | None = None) -> list[Piece]:
    """What changed in key group ``kg`` between the previous cut and ``snap``
    (a cut none of whose maps ``changes_lost``): the removed keys of every
    state (of ``states``, indices, when given) as tombstone sections, then the
    entries written, as :func:`block_columns` gives them. A map made since the
    previous cut goes whole. O(changes)."""
    names = snap.state_names()
    nstates = len(names)
    tombs: list[Piece] = []
    upserts: list[Piece] = []
    for i in range(nstates) if states is None else states:
        s = snap._state(names[i])
        m = s.maps.get(kg)
        if m is None:
            continue
        snap._check()
        if m.changes != "known":  # "untracked": made since the previous cut
            cols = _columns(s, kg)
        else:
            keys, nss, states, ts, gone_keys, gone_nss = snapshot_changes(m, _namespace0(s.table.kind))
            if len(gone_keys):
                tombs.append((nstates + i, _tombstone_columns(s.table.kind, gone_keys, gone_nss)))
            cols = _columns(s, kg, (keys, nss, states, ts))
        if cols and len(cols[0]):
            upserts.append((i, cols))
    return tombs + upserts


def timer_section_base(nstates: int) -> int:
    """Timer sections follow the states' and their tombstones': service ``t``'s
    timers of domain ``d`` have index ``timer_section_base(S) + 2 * t + d``;
    their columns: timestamp (int64), key, namespace."""
    return 2 * nstates


def full_rows(snap: KeyedStateSnapshot, kgs: list[int]) -> list[int]:
    """Per key group of ``kgs``, its entries over every state (about the rows a
    full checkpoint writes for it: a list state's entry makes one row a value).
    One pass per state, not a call per key group."""
    rows = [0] * len(kgs)
    for name in snap.state_names():
        get = snap._state(name).maps.get
        for i, kg in enumerate(kgs):
            m = get(kg)
            if m is not None:
                rows[i] += len(m)
    return rows


def encode_full_group(snap: KeyedStateSnapshot, kgs: list[int]) -> list[Section]:
    """The sections of one block of a full checkpoint, key groups ``kgs``
    (increasing): each state's rows, read in one compiled call
    (``snapshot_columns_many``) where every entry is one row and the block's
    entries of the state are few enough for one call (one that may hold the
    GIL: a flat map's rows, or ones that need Python objects), else per key
    group, a slice at a time; then every timer of those key groups.
    O(rows), with O(1) calls per state rather than per key group."""
    names = snap.state_names()
    sections: list[Section] = []
    slow = []
    for i, s, present, maps in _block_states(snap, kgs):
        if not _rows_in_one_call(s) or sum(map(len, maps)) > 2 * READ_SLICE:
            slow.append(i)
            continue
        keys, nss, states, ts, counts = snapshot_columns_many(maps, _namespace0(s.table.kind))
        if len(ts):
            sections.append(_section(i, s, _columns(s, present[0], (keys, nss, states, ts)), _runs(present, counts)))
    if slow:
        sections += _piece_sections(snap, [(kg, block_columns(snap, kg, slow)) for kg in kgs])
    sections += _timer_sections(snap, kgs, False)
    return _in_block_order(sections, len(names))


def encode_change_chunk(snap: KeyedStateSnapshot, kgs: list[int]) -> list[Section]:
    """The sections of an increment's block of key groups ``kgs`` (increasing):
    the sections of their :func:`change_columns` (tombstones first) and of
    their changed timers (a run of 0 rows where none are left), with the
    changes of each state whose maps there were all cut before read in one
    compiled call (``snapshot_changes_many``) rather than one per key group:
    an increment's cost follows its changes, not its key groups. O(changes +
    key groups)."""
    nstates = len(snap.state_names())
    sections: list[Section] = []
    slow = []
    for i, s, present, maps in _block_states(snap, kgs):
        if not _rows_in_one_call(s) or any(m.changes != "known" for m in maps):
            slow.append(i)
            continue
        kind = s.table.kind
        keys, nss, states, ts, gone_keys, gone_nss, counts, gone_counts = snapshot_changes_many(maps, _namespace0(kind))
        if len(gone_keys):
            runs = _runs(present, gone_counts)
            cols = _tombstone_columns(kind, gone_keys, gone_nss)
            sections.append((nstates + i, len(gone_keys), [encode_column(c, PICKLE) for c in cols], runs))
        if len(ts):
            sections.append(_section(i, s, _columns(s, present[0], (keys, nss, states, ts)), _runs(present, counts)))
    if slow:
        sections += _piece_sections(snap, [(kg, change_columns(snap, kg, slow)) for kg in kgs])
    sections += _timer_sections(snap, kgs, True)
    return _in_block_order(sections, nstates)


def _block_states(snap: KeyedStateSnapshot, kgs: list[int]) -> Iterator[tuple[int, Any, list[int], list[Any]]]:
    """Per state with maps in key groups ``kgs``: its index, the state, those
    key groups and their maps (the snapshot checked as each state comes)."""
    for i, name in enumerate(snap.state_names()):
        s = snap._state(name)
        present = [kg for kg in kgs if kg in s.maps]
        if present:
            snap._check()
            yield i, s, present, [s.maps[kg] for kg in present]


def _rows_in_one_call(s: Any) -> bool:
    """Whether a state's rows (or changes) of several key groups may be read in
    one call: each entry is one row (not a list state's, whose export makes the
    rows) and none is left out (no expired rows dropped at full snapshots)."""
    return s.cleanup_now is None and (s.table.kind == "map" or type(s.table).export is StateTable.export)


def _runs(kgs: list[int], counts: np.ndarray) -> Runs:
    """The runs of the key groups with rows."""
    keep = counts > 0
    return np.asarray(kgs, dtype=np.int64)[keep].tolist(), counts[keep].tolist()


def _piece_sections(snap: KeyedStateSnapshot, group: list[tuple[int, list[Piece]]]) -> list[Section]:
    """The pieces of key groups (``(kg, pieces)`` in increasing order) gathered
    into a section per section index, each run of rows tagged with its key group."""
    nstates = len(snap.state_names())
    by_index: dict[int, list[tuple[int, list[Any]]]] = {}
    for kg, pieces in group:
        for index, cols in pieces:
            by_index.setdefault(index, []).append((kg, cols))
    sections: list[Section] = []
    for index, parts in by_index.items():
        runs = ([kg for kg, _ in parts], [len(cols[0]) for _, cols in parts])
        cols = _concat([cols for _, cols in parts])
        if index < nstates:
            sections.append(_section(index, snap._state(snap.state_names()[index]), cols, runs))
        else:
            sections.append((index, sum(runs[1]), [encode_column(c, PICKLE) for c in cols], runs))
    return sections


def _in_block_order(sections: list[Section], nstates: int) -> list[Section]:
    """Tombstones (indices S..2S-1) first, then the states' rows, then timers:
    a key group's removals are applied before its writes."""
    return sorted(sections, key=lambda sec: (0 if nstates <= sec[0] < 2 * nstates else 1, sec[0]))


def _timer_sections(snap: KeyedStateSnapshot, kgs: list[int], changes_only: bool) -> list[Section]:
    """Every timer service's timers of key groups ``kgs``, a section per
    service and domain: all of them (a full checkpoint), or with
    ``changes_only`` those of the key groups whose timers changed since the
    previous cut, a run of 0 rows where none are left. A restore takes, per
    service, domain and key group, the newest file's run."""
    base = timer_section_base(len(snap.state_names()))
    out: list[Section] = []
    for t, name in enumerate(snap.timer_service_names()):
        timers = snap._timers[name]
        for d in TimeDomain:
            changed = timers.changed(d) if changes_only else None
            changed_set = set(changed) if changed is not None else None
            run_kgs: list[int] = []
            counts: list[int] = []
            stamps: list[np.ndarray] = []
            keys: list[Any] = []
            nss: list[Any] = []
            for kg in kgs:
                if changed_set is not None and kg not in changed_set:
                    continue
                ts, k, ns = timers.columns(kg, d)
                if not k and not changes_only:
                    continue
                run_kgs.append(kg)
                counts.append(len(k))
                stamps.append(np.frombuffer(ts, dtype=np.int64))
                keys += k
                nss += ns
            if run_kgs:
                cols = [np.concatenate(stamps), keys, nss]
                out.append((base + 2 * t + d, len(keys), [encode_column(c, PICKLE) for c in cols], (run_kgs, counts)))
    return out


def changed_timer_key_groups(snap: KeyedStateSnapshot) -> set[int]:
    """The key groups where a timer service's timers changed since the previous cut."""
    out: set[int] = set()
    for timers in snap._timers.values():
        for d in TimeDomain:
            out.update(timers.changed(d) or ())
    return out


def _namespace0(kind: str) -> Any:
    """The namespace the core exports leave out when every entry has it."""
    return NS_MARKER if kind == "map" else VOID_NAMESPACE


def _section(i: int, s: Any, columns: list[Any], runs: Runs) -> Section:
    if not s.ttl:
        columns.pop()  # timestamps: NO_TIMESTAMP (value, map) or None (list) throughout
    sers = column_serializers(s.table.kind, serializer_of(s.live_descriptor))
    try:
        return (i, len(columns[0]), [encode_column(c, ser) for c, ser in zip(columns, sers)], runs)
    except Exception as e:
        if hasattr(e, "add_note"):  # (Python 3.11+; the error keeps its type: a caller may look for it)
            try:
                note = _unwritable(s, columns, sers)
            except Exception:  # noqa: BLE001 - (a repr that fails too): the serializer's error goes on as it is
                note = f"while checkpointing state {s.live_descriptor.name!r}"
            e.add_note(note)
        raise


def _unwritable(s: Any, columns: list[Any], sers: list[Serializer]) -> str:
    """Where a section failed to encode: the first row that a serializer fails
    on alone (the slow way: only after a failure)."""
    name = s.live_descriptor.name
    keys = columns[0]
    for col, ser in zip(columns, sers):
        if isinstance(col, np.ndarray):
            continue
        values = [col.value] * len(keys) if isinstance(col, Const) else col
        for row, value in enumerate(values):
            try:
                ok = isinstance(ser.dumps(value), bytes)
            except Exception:  # noqa: BLE001 - any failure of the serializer's is the one looked for
                ok = False
            if not ok:
                return (
                    f"while checkpointing state {name!r}: serializer {serializer_name(ser)!r} cannot write "
                    f"{type(value).__name__} {_short(value)} of key {_short(keys[row])}"
                )
    return f"while checkpointing state {name!r}"


def _short(x: Any) -> str:
    text = repr(x)
    return text if len(text) <= 80 else text[:77] + "..."


def _tombstone_columns(kind: str, keys: Any, nss: Any) -> list[Any]:
    """The tombstone columns of removed ``(key, namespace)`` (user entries of a
    MapState: ``(user key, context)``) as ``snapshot_changes`` gives them."""
    if kind == "map":
        ctx_keys, ns = _split_contexts(nss)
        return [ctx_keys, ns, keys]
    return [keys, Const(VOID_NAMESPACE) if nss is None else nss]


def _concat(tables: list[list[Any]]) -> list[Any]:
    """Columns of several key groups' rows, one after another: arrays stay
    arrays, a constant shared by all stays one constant, anything else a list."""
    if len(tables) == 1:
        return list(tables[0])
    out: list[Any] = []
    for parts in zip(*tables):
        first = parts[0]
        if all(p is None for p in parts):  # (timestamps of a state without TTL)
            out.append(None)
        elif isinstance(first, Const) and all(isinstance(p, Const) and p.value is first.value for p in parts):
            out.append(first)
        elif all(isinstance(p, np.ndarray) for p in parts) and len({p.dtype for p in parts}) == 1:
            out.append(np.concatenate(parts))
        else:
            joined: list[Any] = []
            for p, cols in zip(parts, tables):
                if isinstance(p, Const) or p is None:  # (None: timestamps a state without TTL drops)
                    joined += [None if p is None else p.value] * len(cols[0])
                else:
                    joined += p.tolist() if isinstance(p, np.ndarray) else p
            out.append(joined)
    return out


class _Rows:
    """Core columns ``(keys, namespaces, states, timestamps)`` as a snapshot
    that ``StateTable.export`` reads (``iter_with_timestamps``)."""

    def __init__(self, raw: tuple[Any, Any, Any, Any]) -> None:
        self.raw = raw

    def iter_with_timestamps(self) -> Iterable[tuple[Any, ...]]:
        keys, nss, states, ts = self.raw
        n = len(ts)
        ns = [VOID_NAMESPACE] * n if nss is None else column_list(nss, n)
        return zip(column_list(keys, n), ns, column_list(states, n), ts.tolist())


def _columns(s: Any, kg: int, raw: tuple[Any, Any, Any, Any] | None = None) -> list[Any]:
    """The columns of state ``s``'s rows in key group ``kg`` (timestamps last):
    of the whole snapshot, or of the core columns ``raw`` (its changes)."""
    kind = s.table.kind
    if kind == "map":
        return _map_columns(s, raw or _read_out(s.maps[kg], NS_MARKER, bool(s.ttl)))
    if type(s.table).export is StateTable.export:
        return _entry_columns(s, raw or _read_out(s.maps[kg], VOID_NAMESPACE, bool(s.ttl)))
    source = s.maps[kg] if raw is None else _Rows(raw)
    return list(zip(*s.table.export(source, s.cleanup_now, s.ttl)))


#: Rows read out of a map per call: a few milliseconds' work at most, so that a
#: checkpoint written on a thread holds up the thread processing records (which
#: takes the GIL between two calls) that long, however big a key group is.
READ_SLICE = 16384


def _read_out(snap: Any, namespace: Any, timestamps: bool) -> tuple[Any, Any, Any, Any]:
    """``snapshot_columns(snap, namespace, timestamps)``, a slice a call."""
    r = ColumnReader(snap, namespace, timestamps)
    while not r.read(READ_SLICE):
        pass
    return r.columns()


def _entry_columns(s: Any, raw: tuple[Any, Any, Any, Any]) -> list[Any]:
    """``[keys, namespaces, values, timestamps]`` of a state stored one entry per
    key and namespace, from core columns ``raw`` (numbers as arrays, the
    common namespace once), expired entries left out under full-snapshot cleanup."""
    keys, nss, values, ts = raw
    ns: Any = Const(VOID_NAMESPACE) if nss is None else nss
    return _unexpired(s, [keys, ns, values, ts])


def _map_columns(s: Any, raw: tuple[Any, Any, Any, Any]) -> list[Any]:
    """``[keys, namespaces, user keys, values, timestamps]`` of a MapState's user
    entries (in insertion order when read whole), from core columns ``raw``
    (see ``user_map``: a user entry's namespace in the core is the key itself
    in the void namespace, else ``(key, namespace, NS_MARKER)``)."""
    ukeys, ctxs, values, ts = raw
    keys, ns = _split_contexts(ctxs)
    if isinstance(values, list):
        values = replace_all(values, NONE_VALUE, None)
    return _unexpired(s, [keys, ns, ukeys, values, ts])


def _split_contexts(ctxs: Any) -> tuple[Any, Any]:
    """The key and namespace columns of user entries' contexts."""
    if ctxs is None:  # no entries (no context is the marker itself)
        ctxs = []
    if isinstance(ctxs, np.ndarray) or not any(type(c) is tuple for c in ctxs):
        return ctxs, Const(VOID_NAMESPACE)
    pairs = [split_ctx(c) for c in ctxs]
    return [k for k, _ in pairs], [n for _, n in pairs]


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


#: a decoded section cut to a key-group range: (state index, rows, columns, key groups, rows of each)
Clipped = tuple[int, int, list[Any], np.ndarray, np.ndarray]


def clip_sections(
    sections: Iterable[tuple[int, int, list[Any], tuple[np.ndarray, np.ndarray]]], lo: int, hi: int
) -> list[Clipped]:
    """A decoded block's sections cut to their rows of key groups ``lo..hi``
    (runs of 0 rows kept: a key group whose timers all went)."""
    out = []
    for index, n, cols, (kgs, counts) in sections:
        a = int(np.searchsorted(kgs, lo))
        b = int(np.searchsorted(kgs, hi, side="right"))
        if a == 0 and b == len(kgs):
            out.append((index, n, cols, kgs, counts))
        elif a < b:
            ends = np.cumsum(counts)
            start, end = (int(ends[a - 1]) if a else 0), int(ends[b - 1])
            out.append((index, end - start, [_rows(c, start, end) for c in cols], kgs[a:b], counts[a:b]))
    return out


def _run_rows(kgs: np.ndarray, counts: np.ndarray) -> Iterator[tuple[int, int, int]]:
    """``(key group, first row, end row)`` of each run of a section."""
    start = 0
    for kg, c in zip(kgs.tolist(), counts.tolist()):
        yield kg, start, start + c
        start += c


def _rows(col: Any, start: int, end: int) -> Any:
    """Rows ``start:end`` of a decoded column (a constant stays itself)."""
    return col if isinstance(col, tuple) else col[start:end]


def restore_blocks(
    backend: KeyedStateBackend,
    states: list[dict[str, Any]],
    sections: Iterable[Clipped],
    incremental: bool = False,
    timer_services: list[str] | None = None,
    timers: dict[tuple[str, int, int], tuple[Any, list[Any], list[Any]]] | None = None,
) -> None:
    """Write decoded sections (checked already, cut by :func:`clip_sections`)
    into ``backend``, each in one compiled call where its shape allows. Of an
    ``incremental`` checkpoint: tombstone sections remove, and a ListState's
    rows replace its lists (elsewhere they are appended, which merges key
    groups restored from several checkpoints). Timer sections of the services
    named ``timer_services`` go to ``timers`` by (service, domain, key group),
    a later file's replacing an earlier one's: the caller adds them once every
    file is read. Sections are applied in the file's order, so each key group
    sees its rows in the order they were written."""
    tables = []
    for meta in states:
        table = backend._tables.get(meta["name"])
        if table is None:
            table = backend._tables[meta["name"]] = _TABLES[meta["kind"]](backend, placeholder_descriptor(meta))
        tables.append(table)
    tbase = timer_section_base(len(tables))
    for i, n, cols, kgs, counts in sections:
        if i >= tbase:
            if timer_services is not None and timers is not None:
                name = timer_services[(i - tbase) // 2]
                for kg, a, b in _run_rows(kgs, counts):
                    ts, keys, nss = (_rows(c, a, b) for c in cols)
                    timers[(name, (i - tbase) % 2, kg)] = (ts, column_list(keys, b - a), column_list(nss, b - a))
            continue
        if not n:
            continue
        if i >= len(tables):
            _remove_rows(tables[i - len(tables)], n, cols, kgs, counts)
            continue
        table = tables[i]
        if incremental and table.kind == "list":
            _remove_rows(table, n, cols, kgs, counts)
        if not table.ttl:
            cols.append(None)
        if _put_values(table, n, cols, kgs, counts) or _put_user_entries(table, n, cols, kgs, counts):
            continue
        for kg, a, b in _run_rows(kgs, counts):
            fields = [
                column_list(_rows(c, a, b), b - a) if c is not None else _no_stamps(table.kind, b - a) for c in cols
            ]
            table.import_records(kg, zip(*fields))
    for table in tables:
        table.entries_restored()


def _row_groups(kgs: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """Each row's key group (int32, as the column calls take them)."""
    return np.repeat(kgs.astype(np.int32), counts)


def _key_column(col: Any, n: int) -> Any:
    """A decoded key column as the column calls take it: an int64 array or a tuple."""
    if isinstance(col, np.ndarray) and col.dtype == np.int64:
        return col
    return tuple(column_list(col, n))


def _make_maps(table: Any, rows: np.ndarray, kgs: np.ndarray, counts: np.ndarray) -> None:
    """The map of every row's key group (``rows``: :func:`_row_groups`), made
    with room for its rows where it has none (found in one C pass)."""
    missing = column_missing(table.maps, rows)
    if missing:
        per_group = dict(zip(kgs.tolist(), counts.tolist()))
        for kg in missing:
            table.map_for_write(kg, per_group[kg])


def _remove_rows(table: Any, n: int, cols: list[Any], kgs: np.ndarray, counts: np.ndarray) -> None:
    """Remove the rows' ``(key, namespace)`` (of a MapState: ``(key,
    namespace, user key)``) from ``table``."""
    if table.kind != "map" and isinstance(cols[1], tuple):  # one namespace: one compiled call
        column_remove(table.maps, _row_groups(kgs, counts), _key_column(cols[0], n), cols[1][0])
        return
    for kg, a, b in _run_rows(kgs, counts):
        if table.maps[kg] is None:  # (nothing there: a key added and removed since the last checkpoint)
            continue
        keys, nss = column_list(_rows(cols[0], a, b), b - a), column_list(_rows(cols[1], a, b), b - a)
        if table.kind == "map":
            users = table.users[kg]
            for key, ns, ukey in zip(keys, nss, column_list(_rows(cols[2], a, b), b - a)):
                users.remove(make_ctx(key, ns), ukey)
            continue
        m = table.maps[kg]
        for key, ns in zip(keys, nss):
            m.remove(key, ns)


def _no_stamps(kind: str, n: int) -> list[Any]:
    return [None] * n if kind == "list" else [NO_TIMESTAMP] * n


def _put_user_entries(table: Any, n: int, cols: list[Any], kgs: np.ndarray, counts: np.ndarray) -> bool:
    """A MapState's rows in one namespace: one compiled call that inserts (or
    overwrites, keeping the place) each user entry with its timestamp. False
    for another kind, or rows in several namespaces."""
    if table.kind != "map":
        return False
    keys, ns, ukeys, values, ts = cols
    if not isinstance(ns, tuple):
        return False
    rows = _row_groups(kgs, counts)
    _make_maps(table, rows, kgs, counts)
    keys = column_list(keys, n)
    ctxs = keys if ns[0] is VOID_NAMESPACE else [make_ctx(k, ns[0]) for k in keys]
    stamps = column_list(ts, n) if ts is not None else NO_TIMESTAMP
    user_insert_many(
        table.users, rows.tolist(), ctxs, keys, ns[0], column_list(ukeys, n),
        column_list(values, n), range(n), NONE_VALUE, stamps,
    )
    return True


def _put_values(table: Any, n: int, cols: list[Any], kgs: np.ndarray, counts: np.ndarray) -> bool:
    """A value-like state's rows in one namespace: one compiled call (with each
    row's timestamp under TTL). Numbers are written as numbers, other values
    as decoded, or as copies where a column repeats one object, so that no two
    keys share one. False for another kind, or several namespaces."""
    if table.kind == "list" or table.kind == "map":
        return False
    keys, ns, values, ts = cols
    if not isinstance(ns, tuple):
        return False
    rows = _row_groups(kgs, counts)
    _make_maps(table, rows, kgs, counts)
    if not (isinstance(values, np.ndarray) and values.dtype in (np.int64, np.float64)):
        objs = column_list(values, n)
        if isinstance(values, tuple) or len(set(map(id, objs))) < n:
            objs = list(map(table.copy_value, objs))  # (else each is fresh from the file, held by nothing else)
        values = tuple(objs)
    if ts is None:
        ts = NO_TIMESTAMP
    elif isinstance(ts, tuple):
        ts = ts[0]
    column_put(table.maps, rows, _key_column(keys, n), ns[0], values, ts)
    return True
