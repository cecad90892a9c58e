"""``CheckpointStorage``: save a backend's states durably and restore them."""

from __future__ import annotations

import json
import os
import threading
from concurrent.futures import Future
from typing import TYPE_CHECKING, Any

from cowmap.checkpoint.columns import PICKLE, Serializer, serializer_name
from cowmap.checkpoint.errors import CorruptCheckpointError
from cowmap.checkpoint.fileformat import PENDING_BLOCK, DataFileReader, DataFileWriter, Section
from cowmap.checkpoint.pending import decode_pending, encode_pending
from cowmap.checkpoint.states import (
    TOMBSTONE_COLUMNS,
    changed_timer_key_groups,
    changes_lost,
    check_compatible,
    clip_sections,
    column_serializers,
    encode_change_chunk,
    encode_full_group,
    full_rows,
    restore_blocks,
    state_headers,
)
from cowmap.checkpoint.storage import Store, data_id, data_name, manifest_name
from cowmap.state.backend import KeyedStateBackend
from cowmap.state.snapshot import KeyedStateSnapshot

if TYPE_CHECKING:
    import pyarrow.fs as pafs

__all__ = ["CheckpointStorage", "SaveHandle"]

#: rows (about) per block: key groups are gathered until a block holds this many
#: (an increment's key groups hold a few rows each: a block apiece would cost
#: more than their rows), and a restore of a few key groups reads at most this
#: many more rows than it needs
BLOCK_ROWS = 16384
#: key groups per block of an increment: their changes are read in one call per
#: state (a few milliseconds of holding the GIL at 1% of 10M entries changed)
CHANGE_CHUNK = 256


class SaveHandle:
    """A checkpoint being written by :meth:`CheckpointStorage.save_async`."""

    def __init__(self, future: Future[int]) -> None:
        self._future = future

    def done(self) -> bool:
        """True once the write has ended, committed or failed."""
        return self._future.done()

    def result(self, timeout: float | None = None) -> int:
        """The committed checkpoint's id, waiting up to ``timeout`` seconds (None:
        as long as it takes); the write's error if it failed; ``TimeoutError``."""
        return self._future.result(timeout)

    def __repr__(self) -> str:
        return f"<SaveHandle {'done' if self.done() else 'running'}>"


class CheckpointStorage:
    """Numbered checkpoints of keyed state backends in one directory, on the
    local disk or on any ``pyarrow.fs`` filesystem.

    ``uri``: a local path or ``file:///...`` URI (the local disk, nothing else
    needed), or a URI pyarrow knows (``s3://bucket/path``, ``hdfs://...``,
    ``gs://...``); or pass ``filesystem=`` (a ``pyarrow.fs.FileSystem``) and a
    path on it. pyarrow's filesystems need the ``arrow`` extra
    (``pip install "cowmap[arrow]"``).

    A checkpoint is committed atomically: it exists (in :meth:`checkpoints`)
    only once every byte of it is written, so a process killed mid-save leaves
    the previous checkpoints as they were. Anything damaged raises
    :class:`~cowmap.checkpoint.CorruptCheckpointError`, never a silent fallback.

    One writer per directory at a time (one storage object may be shared by
    threads: its saves run one after another). Restoring from any number of
    processes is fine. Call ``save``, ``save_async`` and ``restore`` from the
    backend's own thread (the snapshot and the restore use the backend); only
    the writing of ``save_async`` runs on another thread.
    """

    def __init__(
        self, uri: str | os.PathLike[str], *, filesystem: pafs.FileSystem | None = None, max_increments: int = 10
    ) -> None:
        if not isinstance(max_increments, int) or isinstance(max_increments, bool) or max_increments < 0:
            raise ValueError(f"max_increments must be an int >= 0, got {max_increments!r}")
        self._store = Store(uri, filesystem)
        self.uri = os.fspath(uri)
        #: increments chained to a full checkpoint before the next save is full again
        self.max_increments = max_increments
        # what backends remember their last checkpoint here by
        self._key = f"{self._store.files.kind}:{self._store.path}"

    # ------------------------------------------------------------ listing

    def checkpoints(self) -> list[int]:
        """The ids of the committed checkpoints, oldest first. O(files in the directory)."""
        return self._store.committed()

    def latest(self) -> int | None:
        """The newest committed checkpoint's id, or None."""
        ids = self.checkpoints()
        return ids[-1] if ids else None

    def manifest(self, checkpoint_id: int) -> dict[str, Any]:
        """The checked manifest of a committed checkpoint: its files, states and counts."""
        return self._store.manifest(checkpoint_id)

    # ------------------------------------------------------------ saving

    def save(
        self, backend: KeyedStateBackend, incremental: bool = True, *, controller: Any = None,
        checkpoint_id: int | None = None, metadata: dict[str, Any] | None = None, drop_later: bool = True,
    ) -> int:
        """Write the states of ``backend`` as a new checkpoint; returns its id
        (greater than every id in the directory). Consistent at the call (a
        copy-on-write snapshot).

        ``incremental``: write only what changed since this backend's last
        checkpoint in this storage (the entries written, and the keys removed
        as tombstones), chained to it: O(changes), not O(entries). The
        checkpoint is full (O(entries)) instead when there is no such
        checkpoint committed (the first save, after a failed one, or after a
        restore from elsewhere), when the chain already holds
        ``max_increments`` increments or outweighs its full base, or when the
        states' settings changed. A restore reads the base and the increments
        in order. Changes are found by the writes: a value changed in place
        counts only if it was read through the state (every read of a value
        that is not an immutable built-in counts as a change).

        With ``controller`` (the backend's ``AsyncExecutionController``), an
        unaligned-style checkpoint: the records holding a key are finished, the
        records waiting for a busy key are not started but written with the
        checkpoint as ``(key, record)`` pairs (each must be picklable:
        ``TypeError`` naming the key otherwise, before anything is written), and
        :meth:`restore` returns them. The waiting records then go on.

        ``checkpoint_id``: commit under this id (a version, e.g. a micro-batch's)
        instead of the next one. An id that is committed already is written
        again: every checkpoint after it is dropped first (a retried or
        restarted batch replaces the future it had written; later increments
        may chain to it; with ``drop_later=False`` they stay, for a caller
        that knows none can exist but a straggler's, such as a Spark task whose
        speculative twin already went on), and the new manifest replaces the
        old one in one rename, so the id stays readable throughout, even while
        two attempts write it at once.

        ``metadata``: a small JSON-able dict kept in the checkpoint's manifest
        (``manifest(id)["metadata"]``), for what the caller must restore with
        the state (a watermark, the time of the batch); ``TypeError`` before
        anything is written if it is not JSON-able."""
        _check_backend(backend)
        meta = _check_metadata(metadata)
        cid, snap, pending, parent = self._begin(backend, controller, incremental, checkpoint_id)
        try:
            return self._write(backend, snap, pending, cid, parent, meta, _rewrites(checkpoint_id, drop_later))
        finally:
            snap.release()

    def save_async(
        self, backend: KeyedStateBackend, incremental: bool = True, *, controller: Any = None,
        checkpoint_id: int | None = None, metadata: dict[str, Any] | None = None, drop_later: bool = True,
    ) -> SaveHandle:
        """Take the snapshot now (with ``controller``: as :meth:`save` says) and
        write it on a background thread while the caller goes on using
        ``backend``; the snapshot is released when the write ends. ``result()``
        of the handle gives the id or raises the write's error."""
        _check_backend(backend)
        meta = _check_metadata(metadata)
        cid, snap, pending, parent = self._begin(backend, controller, incremental, checkpoint_id)
        future: Future[int] = Future()

        def run() -> None:
            try:
                future.set_result(
                    self._write(backend, snap, pending, cid, parent, meta, _rewrites(checkpoint_id, drop_later))
                )
            except BaseException as e:  # noqa: BLE001 - handed to the caller through result()
                future.set_exception(e)
            finally:
                snap.release()

        try:
            threading.Thread(target=run, name="cowmap-checkpoint", daemon=True).start()
        except BaseException:
            snap.release()
            raise
        return SaveHandle(future)

    def _begin(
        self, backend: KeyedStateBackend, controller: Any, incremental: bool, checkpoint_id: int | None = None
    ) -> tuple[int, KeyedStateSnapshot, Section | None, int | None]:
        """The new checkpoint's id, the cut it writes, with a controller the
        encoded records waiting at it, and the checkpoint the cut's changes
        are relative to when it may be written as an increment of it."""
        if controller is not None and getattr(controller, "backend", None) is not backend:
            raise ValueError("controller must be the AsyncExecutionController of the backend being saved")
        if checkpoint_id is None:
            cid = self._store.reserve_id()
        elif not isinstance(checkpoint_id, int) or isinstance(checkpoint_id, bool):
            raise TypeError(f"checkpoint_id must be an int, not {type(checkpoint_id).__name__}")
        elif checkpoint_id < 1:
            raise ValueError(f"checkpoint_id must be at least 1, got {checkpoint_id}")
        else:
            cid = checkpoint_id
        chain = backend._chain
        parent = chain[1] if incremental and chain is not None and chain[0] == self._key else None
        if parent is not None and parent >= cid:
            parent = None  # (an explicit id at or before the backend's last checkpoint here)
        pending = None
        if controller is not None:
            waiting = controller.begin_unaligned_checkpoint()
        try:
            if controller is not None:
                pending = encode_pending(backend, waiting)
            snap = backend.snapshot(cut=True)  # (forgets the chain: a cut failing half-way breaks it)
        finally:
            if controller is not None:
                controller.end_unaligned_checkpoint()
        backend._chain = (self._key, cid)  # the maps now track the changes since this cut
        return cid, snap, pending, parent

    def _write(
        self, backend: KeyedStateBackend, snap: KeyedStateSnapshot, pending: Section | None, cid: int,
        parent: int | None, metadata: dict[str, Any] | None = None, drop_later: bool = True,
    ) -> int:
        store = self._store
        try:
            if store.writer == threading.get_ident():
                raise RuntimeError(
                    "a checkpoint save was called from inside a checkpoint write of the same storage "
                    "(from a serializer?): it would wait for itself"
                )
            with store.lock:
                store.writer = threading.get_ident()
                try:
                    return self._write_locked(snap, pending, cid, parent, metadata, drop_later)
                finally:
                    store.writer = None
        except BaseException:
            if backend._chain == (self._key, cid):
                backend._chain = None  # what changed since the cut is not saved anywhere: next save full
            raise

    def _chain_of(
        self, snap: KeyedStateSnapshot, parent: int | None, headers: list[dict[str, Any]]
    ) -> list[Any] | None:
        """The files of checkpoint ``parent``'s chain when ``snap`` may be
        written as an increment of it, else None (write a full checkpoint)."""
        if parent is None or changes_lost(snap):
            return None
        try:
            m = self._store.manifest(parent)
        except (FileNotFoundError, CorruptCheckpointError):
            return None  # failed, deleted or damaged: a new base is the way on
        files = m["files"]
        before = {h["name"]: h for h in m.get("state_headers", [])}
        now = {h["name"]: h for h in headers}
        if (
            len(files) > self.max_increments
            or sum(f["size"] for f in files[1:]) >= files[0]["size"]
            or m.get("key_group_range") != [snap.key_group_range.start, snap.key_group_range.end]
            or any(now.get(name) != h for name, h in before.items())
        ):
            return None
        return list(files)

    def _write_locked(
        self, snap: KeyedStateSnapshot, pending: Section | None, cid: int, parent: int | None,
        metadata: dict[str, Any] | None, drop_later: bool,
    ) -> int:
        """Write checkpoint ``cid``: the data file (full, or an increment of
        ``parent``'s chain), then the manifest that commits it."""
        store = self._store
        names = snap.state_names()
        headers = state_headers(snap)
        chain = self._chain_of(snap, parent, headers)
        kind = "full" if chain is None else "incremental"
        kg_range = [snap.key_group_range.start, snap.key_group_range.end]
        header = {
            "checkpoint_id": cid,
            "type": kind,
            "parent": None if chain is None else parent,
            "max_parallelism": snap.max_parallelism,
            "key_group_range": kg_range,
            "key_hash": snap.key_hash,
            "timestamp": snap.timestamp,
            "states": headers,
            "timer_services": snap.timer_service_names(),
        }
        if drop_later:
            self._drop_from(cid)
        kgs = {kg for name in names for kg in snap.key_groups(name)}
        kgs.update(kg for t in snap._timers.values() for kg in t.key_groups())
        if chain is not None:
            kgs.update(changed_timer_key_groups(snap))  # (a key group whose timers all went)
        rows = 0
        timer_base = 2 * len(names)
        name = data_name(cid)
        with store.atomic(name) as out:
            w = DataFileWriter(out, header)

            def put(first: int, last: int, sections: list[Section]) -> int:
                """Write a block; its rows of states and tombstones (a manifest's entries)."""
                if not sections:
                    return 0
                w.block(first, last, sections)
                return sum(n for i, n, _, _ in sections if i < timer_base)

            if chain is not None:  # an increment: a block per CHANGE_CHUNK key groups, read in one call per state
                ordered = sorted(kgs)
                for at in range(0, len(ordered), CHANGE_CHUNK):
                    chunk = ordered[at : at + CHANGE_CHUNK]
                    sections = encode_change_chunk(snap, chunk)
                    snap._release_key_groups(chunk)
                    rows += put(chunk[0], chunk[-1], sections)
            else:  # full: key groups gathered until a block holds BLOCK_ROWS rows, read in one call per state
                ordered = sorted(kgs)
                first = in_group = 0
                for i, n in enumerate(full_rows(snap, ordered)):
                    in_group += n
                    if in_group >= BLOCK_ROWS or i == len(ordered) - 1:
                        group = ordered[first : i + 1]
                        sections = encode_full_group(snap, group)
                        snap._release_key_groups(group)  # read out: the backend need not keep them for us
                        rows += put(group[0], group[-1], sections)
                        first, in_group = i + 1, 0
            if pending is not None:
                w.block(PENDING_BLOCK, PENDING_BLOCK, [pending])
            size = w.finish()
        store.write_manifest(
            cid,
            {
                "type": kind,
                "parent": header["parent"],
                "files": (chain or []) + [{"name": name, "size": size}],
                "entries": rows,
                "pending_records": pending[1] if pending is not None else 0,
                "timers": sum(t.count() for t in snap._timers.values()),
                "max_parallelism": snap.max_parallelism,
                "key_group_range": kg_range,
                "states": names,
                "state_headers": headers,
                "metadata": metadata,
            },
        )
        return cid

    def _drop_from(self, cid: int) -> None:
        """Before checkpoint ``cid`` is written under an id the caller chose (it
        may have been written before): drop every later one (uncommitted first,
        then their data). ``cid`` itself
        stays committed until the new manifest replaces its manifest in one
        rename: a writer killed meanwhile, or a second attempt writing the same
        version at once, leaves a whole checkpoint ``cid`` either way; the old
        data file is left to :meth:`retain`."""
        store = self._store
        committed = [i for i in store.committed() if i > cid]
        if committed:
            store.delete([manifest_name(i) for i in committed])
        stale = [name for name in store.names() if (i := data_id(name)) is not None and i > cid]
        if stale:
            store.delete(stale)

    # ------------------------------------------------------------ restoring

    def restore(self, backend: KeyedStateBackend, checkpoint_id: int | None = None) -> list[Any]:
        """Load the entries of checkpoint ``checkpoint_id`` (the latest committed
        when None) whose key groups ``backend`` owns; returns the records that
        were waiting when it was saved (an empty list without a controller).

        Every file the restore needs is read and checked before anything
        changes: ``CorruptCheckpointError`` (naming the file and block) for
        damage, ``FileNotFoundError`` without a committed checkpoint,
        ``ValueError`` for another ``max_parallelism`` or a state registered
        with another kind or TTL setting — and then ``backend`` is unchanged.
        Call it once per old checkpoint directory to merge several (rescaling).
        O(restored entries).
        """
        _check_backend(backend)
        ids = self.checkpoints()
        if not ids:
            raise FileNotFoundError(f"no committed checkpoint in {self.uri!r}")
        cid = ids[-1] if checkpoint_id is None else checkpoint_id
        manifest = self._store.manifest(cid)
        readers = [self._store.open_data(f["name"], f["size"]) for f in manifest["files"]]
        if readers[-1].header.get("checkpoint_id") != cid:
            raise CorruptCheckpointError(
                readers[-1].path, "header", f"holds checkpoint {readers[-1].header.get('checkpoint_id')}, not {cid}"
            )
        kc = backend.key_context
        decoded = _decode(backend, readers)
        last = readers[-1]
        pending = decode_pending(last, kc.lo, kc.hi) if PENDING_BLOCK in last.blocks else []
        fresh = backend.num_entries() == 0
        timers: dict[tuple[str, int, int], Any] = {}
        for states, sections, incremental, services in decoded:
            restore_blocks(backend, states, sections, incremental, services, timers)
        for (name, domain, kg), (ts, keys, nss) in timers.items():
            backend.get_timer_service(name).add_columns(kg, domain, ts, keys, nss)
        # from here the maps track changes against this checkpoint: an
        # incremental save may chain to it if the backend now holds exactly it
        backend.snapshot(cut=True).release()
        exact = fresh and manifest.get("key_group_range") == [kc.lo, kc.hi]
        backend._chain = (self._key, cid) if exact else None
        return pending

    def _catch_up(self, backend: KeyedStateBackend, checkpoint_id: int) -> bool:
        """Bring ``backend``, which holds exactly this storage's checkpoint ``v``
        (saved or restored here last, and not changed since: the caller's
        promise, not checked — cowmap.spark's warm backends), to checkpoint
        ``checkpoint_id`` by applying only the increments between them:
        O(their changes) instead of a restore's O(entries). Returns False, with
        nothing changed, when that is not possible: ``backend`` holds something
        else, or ``checkpoint_id`` is not an increment chain that extends ``v``.
        An increment's timers replace those of the key groups it holds timers
        for. Damage raises as :meth:`restore` does, before anything changes."""
        _check_backend(backend)
        chain = backend._chain
        if chain is None or chain[0] != self._key:
            return False
        held = chain[1]
        if held == checkpoint_id:
            return True
        try:
            before = self._store.manifest(held)["files"]
            manifest = self._store.manifest(checkpoint_id)
        except FileNotFoundError:
            return False
        files = manifest["files"]
        if held > checkpoint_id or files[: len(before)] != before or len(files) == len(before):
            return False
        readers = [self._store.open_data(f["name"], f["size"]) for f in files[len(before) :]]
        if any(r.header.get("type") != "incremental" for r in readers):
            return False
        decoded = _decode(backend, readers)
        timers: dict[tuple[str, int, int], Any] = {}
        for states, sections, _, services in decoded:
            restore_blocks(backend, states, sections, True, services, timers)
        for (name, domain, kg), (ts, keys, nss) in timers.items():
            backend.get_timer_service(name).replace_columns(kg, domain, ts, keys, nss)
        backend.snapshot(cut=True).release()  # the maps track changes against checkpoint_id from here
        backend._chain = (self._key, checkpoint_id)
        return True

    # ------------------------------------------------------------ housekeeping

    def retain(self, n: int) -> list[int]:
        """Keep the newest ``n`` committed checkpoints (and every file they
        need), delete the rest and what killed writers left; returns the
        deleted ids. ``n >= 1``."""
        if not isinstance(n, int) or isinstance(n, bool):
            raise TypeError(f"n must be an int, not {type(n).__name__}")
        if n < 1:
            raise ValueError(f"n must be at least 1, got {n}")
        store = self._store
        with store.lock:
            ids = store.committed()
            keep, drop = ids[-n:], ids[:-n]
            needed = {f["name"] for cid in keep for f in store.manifest(cid)["files"]}
            store.delete([manifest_name(cid) for cid in drop])  # uncommit first
            newest = max(keep, default=0)
            orphans = [
                name
                for name in store.names()
                # (not the newest id's: a second write of it may be about to commit its data)
                if (cid := data_id(name)) is not None and cid < newest and name not in needed
            ]
            store.delete(orphans + store.stale_temporaries(older_than_s=3600))
            return drop

    def __repr__(self) -> str:
        return f"<CheckpointStorage {self.uri!r}>"


def _check_backend(backend: Any) -> None:
    if not isinstance(backend, KeyedStateBackend):
        raise TypeError(f"expected a KeyedStateBackend, not {type(backend).__name__}")


def _decode(backend: KeyedStateBackend, readers: list[DataFileReader]) -> list[tuple[Any, Any, bool, Any]]:
    """Every block of ``readers`` that ``backend``'s key groups meet, decoded
    and checked (nothing changes yet): per file ``(states, sections cut to
    its key groups, incremental, timer services)``."""
    kc = backend.key_context
    decoded = []
    for r in readers:
        h = r.header
        _check_header(backend, r)
        states = h["states"]
        check_compatible(backend, states, r.path)
        sers = [column_serializers(meta["kind"], _serializer_for(backend, meta, r.path)) for meta in states]
        sers += [[PICKLE] * TOMBSTONE_COLUMNS for _ in states]
        sers += [[PICKLE] * 3 for _ in range(2 * len(h.get("timer_services", [])))]
        sections = []
        for first in sorted(r.blocks):
            if first <= kc.hi and r.last_of(first) >= kc.lo and first != PENDING_BLOCK:
                raw = r.block_bytes(first)
                sections += clip_sections(r.sections(first, raw, sers), kc.lo, kc.hi)
        decoded.append((states, sections, h.get("type") == "incremental", h.get("timer_services", [])))
    return decoded


def _check_metadata(metadata: dict[str, Any] | None) -> dict[str, Any] | None:
    if metadata is None:
        return None
    if not isinstance(metadata, dict):
        raise TypeError(f"metadata must be a dict, not {type(metadata).__name__}")
    try:
        return json.loads(json.dumps(metadata))  # a copy: the caller may change theirs meanwhile
    except (TypeError, ValueError) as e:
        raise TypeError(f"metadata must be JSON-able: {e}") from None


def _check_header(backend: KeyedStateBackend, r: DataFileReader) -> None:
    h = r.header
    if h.get("max_parallelism") != backend.max_parallelism:
        raise ValueError(
            f"checkpoint file {r.path!r} has max_parallelism {h.get('max_parallelism')}, this backend "
            f"{backend.max_parallelism}: key groups cannot be mapped"
        )
    if h.get("key_hash") != backend.key_hash:
        raise ValueError(
            f"checkpoint file {r.path!r} maps keys to key groups with {h.get('key_hash')!r}, "
            f"this backend with {backend.key_hash!r}"
        )


def _serializer_for(backend: KeyedStateBackend, meta: dict[str, Any], path: str) -> Serializer:
    """The serializer a state's values were written with: the registered
    descriptor's, or pickle for a state the backend does not know yet."""
    table = backend._tables.get(meta["name"])
    ser = getattr(table.descriptor, "serializer", None) if table is not None else None
    ser = ser or PICKLE
    if serializer_name(ser) != meta["serializer"]:
        raise ValueError(
            f"state {meta['name']!r} in {path!r} was written with serializer {meta['serializer']!r}; "
            f"register it with that serializer before restoring (have {serializer_name(ser)!r})"
        )
    return ser


def _rewrites(checkpoint_id: int | None, drop_later: bool) -> bool:
    """Whether a save drops the checkpoints after its id: only under an id the
    caller chose. A reserved id was above every id in the directory when it
    was taken, so a later one committed by the time it is written belongs to a
    save reserved after it (``save_async`` calls in a row, whose writes take
    the lock in any order) and must stay."""
    return drop_later and checkpoint_id is not None
