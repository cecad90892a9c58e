"""``CheckpointStorage``: numbered, atomically committed checkpoints in one directory.

A checkpoint ``N`` is two files in the storage's directory:

- ``chk-<N>-<tag>.data``: the states (see :mod:`cowmap.checkpoint.fileformat`),
  under a name unique to the write;
- ``chk-<N>.manifest``: a small checksummed JSON document naming the data
  files to read (one, or a full base and increments), their sizes, and what
  the checkpoint holds.

Both are written under a temporary name, closed (and on a local disk
fsynced), then renamed; the manifest goes last, so a checkpoint exists
exactly when its manifest does. A writer killed at any point leaves at most
temporary files and an unreferenced data file, which :meth:`retain` removes.
"""

from __future__ import annotations

import json
import os
import re
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from typing import Any

from cowmap.checkpoint.errors import CorruptCheckpointError
from cowmap.checkpoint.fileformat import FORMAT_VERSION, DataFileReader, checksum
from cowmap.checkpoint.files import ArrowFiles, LocalFiles, open_files

__all__ = ["Store"]

_MANIFEST = re.compile(r"^chk-(\d{10})\.manifest$")
_DATA = re.compile(r"^chk-(\d{10})-[0-9a-f]{12}\.data$")
TMP_PREFIX = ".tmp-"


def data_name(cid: int) -> str:
    """A new data file's name for checkpoint ``cid``: unique per write, so that
    writing ``cid`` again (a retried batch, a speculative attempt) never touches
    the data the committed manifest names; the new manifest replaces the old in
    one rename."""
    return f"chk-{cid:010d}-{uuid.uuid4().hex[:12]}.data"


def data_id(name: str) -> int | None:
    """The checkpoint id of a data file's name, None for any other file."""
    m = _DATA.match(name)
    return int(m.group(1)) if m else None


def manifest_name(cid: int) -> str:
    return f"chk-{cid:010d}.manifest"


class Store:
    """The files of one checkpoint directory (see :mod:`cowmap.checkpoint.files`)."""

    def __init__(self, uri: str | os.PathLike[str], filesystem: Any = None) -> None:
        files, path = open_files(uri, filesystem)
        self.files: LocalFiles | ArrowFiles = files
        self.path: str = path.rstrip("/") or "/"
        self.local = files.local
        #: held while a checkpoint is written or files are deleted: one at a time
        self.lock = threading.Lock()
        self.id_lock = threading.Lock()
        self.writer: int | None = None  # the thread holding `lock` to write, if any
        self.last_reserved = 0
        files.create_dir(self.path)

    def join(self, name: str) -> str:
        return f"{self.path}/{name}"

    def names(self) -> list[str]:
        return [name for name, _ in self.files.list_files(self.path)]

    def committed(self) -> list[int]:
        return sorted(int(m.group(1)) for n in self.names() if (m := _MANIFEST.match(n)))

    def reserve_id(self) -> int:
        """A new checkpoint id, above every id in the directory and every id this
        object reserved before: taken when the snapshot is, so ids follow the
        order of the snapshots even when their writes overlap."""
        with self.id_lock:  # not `lock`: a save_async call must not wait for a write in progress
            ids = [int(m.group(1)) for n in self.names() if (m := _MANIFEST.match(n) or _DATA.match(n))]
            self.last_reserved = max(max(ids, default=0), self.last_reserved) + 1
            return self.last_reserved

    # ------------------------------------------------------------ writing

    @contextmanager
    def atomic(self, name: str) -> Iterator[Any]:
        """An output stream whose bytes appear under ``name`` only when the block
        ends without an error (written to a temporary name, closed, synced, renamed)."""
        tmp = self.join(f"{TMP_PREFIX}{uuid.uuid4().hex}-{name}")
        out = self.files.open_output_stream(tmp)
        try:
            yield out
            out.close()
            if self.local:
                _fsync(tmp)
            self.files.move(tmp, self.join(name))
            if self.local:
                _fsync(self.path)
        except BaseException:
            if not out.closed:
                out.close()
            with suppress(OSError):
                self.files.delete_file(tmp)
            raise

    def write_manifest(self, cid: int, manifest: dict[str, Any]) -> None:
        body = dict(manifest, format=FORMAT_VERSION, id=cid)
        text = json.dumps(body, sort_keys=True)
        doc = json.dumps({"checksum": checksum(text.encode()), "manifest": text}).encode()
        with self.atomic(manifest_name(cid)) as out:
            out.write(doc)

    # ------------------------------------------------------------ reading

    def manifest(self, cid: int) -> dict[str, Any]:
        name = manifest_name(cid)
        path = self.join(name)
        try:
            with self.files.open_input_stream(path) as f:
                raw = f.read()
        except FileNotFoundError:
            raise FileNotFoundError(f"no committed checkpoint {cid} in {self.path!r}") from None
        try:
            doc = json.loads(raw)
            text = doc["manifest"]
            ok = isinstance(text, str) and checksum(text.encode()) == doc["checksum"]
        except (ValueError, KeyError, TypeError, UnicodeError):
            ok = False
        if not ok:
            raise CorruptCheckpointError(path, "manifest", "checksum mismatch or not a manifest")
        body: dict[str, Any] = json.loads(text)
        if body.get("format") != FORMAT_VERSION or body.get("id") != cid:
            raise CorruptCheckpointError(path, "manifest", f"format {body.get('format')}, id {body.get('id')}")
        files = body.get("files")
        # (a checksum that matches is no proof against a hand-made manifest: its files are data
        # files of this directory, by their own names)
        if not isinstance(files, list) or not files or not all(
            isinstance(f, dict) and isinstance(f.get("name"), str) and _DATA.fullmatch(f["name"])
            and type(f.get("size")) is int for f in files
        ):
            raise CorruptCheckpointError(path, "manifest", "its list of data files is missing or malformed")
        return body

    def open_data(self, name: str, size: int) -> DataFileReader:
        """A checked reader of data file ``name``, which the manifest says has ``size`` bytes."""
        path = self.join(name)
        try:
            f = self.files.open_input_file(path)
        except FileNotFoundError:
            raise CorruptCheckpointError(path, "file", "missing (a committed checkpoint names it)") from None
        if f.size() != size:
            raise CorruptCheckpointError(path, "file", f"{f.size()} bytes, the manifest says {size}")
        return DataFileReader(path, f, size)

    # ------------------------------------------------------------ removing

    def delete(self, names: list[str]) -> None:
        for n in names:
            with suppress(FileNotFoundError):
                self.files.delete_file(self.join(n))

    def stale_temporaries(self, older_than_s: float) -> list[str]:
        """Temporary files not changed for ``older_than_s`` seconds (a killed writer's)."""
        cutoff = time.time() - older_than_s
        return [
            name
            for name, mtime in self.files.list_files(self.path)
            if name.startswith(TMP_PREFIX) and (mtime is None or mtime < cutoff)
        ]


def _fsync(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
