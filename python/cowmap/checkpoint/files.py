"""Where a checkpoint directory's files live: the local disk, through ``os`` (no
extra needed), or any ``pyarrow.fs`` filesystem (S3, GCS, HDFS, ...: the
``arrow`` extra, imported only when asked for).

Both offer the few calls :class:`cowmap.checkpoint.storage.Store` makes.
"""

from __future__ import annotations

import os
import shutil
from contextlib import suppress
from typing import Any

__all__ = ["ArrowFiles", "LocalFiles", "open_files"]

_ARROW_MISSING = (
    "checkpoints on {what} need pyarrow's filesystems: pip install \"cowmap[arrow]\" (or pyarrow); "
    "local paths and file:// URIs need nothing more"
)


class LocalFile:
    """A local file opened for reading at any offset (``read_at``), as a data file
    reader wants it."""

    _fd = -1  # until open succeeds (__del__ then has nothing to close)

    def __init__(self, path: str) -> None:
        self._fd = os.open(path, os.O_RDONLY | getattr(os, "O_BINARY", 0))
        self._size = os.fstat(self._fd).st_size

    def size(self) -> int:
        return self._size

    def read_at(self, n: int, offset: int) -> bytes:
        """Up to ``n`` bytes from ``offset`` (fewer only at the end of the file)."""
        parts = []
        while n > 0:
            b = os.pread(self._fd, n, offset)
            if not b:
                break
            parts.append(b)
            n -= len(b)
            offset += len(b)
        return parts[0] if len(parts) == 1 else b"".join(parts)

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    def __del__(self) -> None:
        self.close()


class LocalFiles:
    """The local disk. Writes can be fsynced (``local``), renames replace atomically."""

    local = True
    kind = "local"

    def create_dir(self, path: str) -> None:
        os.makedirs(path, exist_ok=True)

    def list_files(self, path: str) -> list[tuple[str, float | None]]:
        """``(name, mtime)`` of each regular file in ``path``."""
        out: list[tuple[str, float | None]] = []
        with os.scandir(path) as it:
            for e in it:
                try:
                    if e.is_file(follow_symlinks=False):
                        out.append((e.name, e.stat(follow_symlinks=False).st_mtime))
                except FileNotFoundError:  # removed while listed
                    continue
        return out

    def open_output_stream(self, path: str) -> Any:
        return open(path, "xb", buffering=1 << 20)

    def open_input_stream(self, path: str) -> Any:
        return open(path, "rb")

    def open_input_file(self, path: str) -> LocalFile:
        return LocalFile(path)

    def move(self, src: str, dst: str) -> None:
        os.replace(src, dst)

    def delete_file(self, path: str) -> None:
        os.remove(path)

    def delete_dir(self, path: str) -> None:
        """``path`` and everything under it; nothing if it is not there."""
        with suppress(FileNotFoundError):
            shutil.rmtree(path)


class ArrowFiles:
    """A ``pyarrow.fs.FileSystem``, with the calls named as :class:`LocalFiles` names them."""

    def __init__(self, fs: Any) -> None:
        import pyarrow.fs as pafs

        self.fs = fs
        self._pafs = pafs
        self.local = isinstance(fs, pafs.LocalFileSystem)
        self.kind = type(fs).__name__

    def create_dir(self, path: str) -> None:
        self.fs.create_dir(path, recursive=True)

    def list_files(self, path: str) -> list[tuple[str, float | None]]:
        infos = self.fs.get_file_info(self._pafs.FileSelector(path, recursive=False))
        return [
            (i.base_name, None if i.mtime is None else i.mtime.timestamp())
            for i in infos
            if i.type == self._pafs.FileType.File
        ]

    def open_output_stream(self, path: str) -> Any:
        return self.fs.open_output_stream(path, buffer_size=1 << 20)

    def open_input_stream(self, path: str) -> Any:
        return self.fs.open_input_stream(path)

    def open_input_file(self, path: str) -> Any:
        return self.fs.open_input_file(path)

    def move(self, src: str, dst: str) -> None:
        self.fs.move(src, dst)

    def delete_file(self, path: str) -> None:
        self.fs.delete_file(path)

    def delete_dir(self, path: str) -> None:
        with suppress(FileNotFoundError):
            self.fs.delete_dir(path)


def _pyarrow_fs(what: str) -> Any:
    """``pyarrow.fs``, or an ImportError saying how to install it for checkpoints on ``what``."""
    try:
        import pyarrow.fs as pafs
    except ImportError:
        raise ImportError(_ARROW_MISSING.format(what=what)) from None
    return pafs


def open_files(uri: str | os.PathLike[str], filesystem: Any = None) -> tuple[LocalFiles | ArrowFiles, str]:
    """The files of ``uri`` and its path on them: a local path or ``file://`` URI on the
    local disk, any other URI (``s3://...``) or any ``filesystem=`` through pyarrow."""
    if filesystem is not None:
        pafs = _pyarrow_fs("a filesystem object")
        if not isinstance(filesystem, pafs.FileSystem):
            raise TypeError(f"filesystem must be a pyarrow.fs.FileSystem, got {type(filesystem).__name__}")
        return ArrowFiles(filesystem), os.fspath(uri)
    text = os.fspath(uri)
    if not isinstance(text, str):
        raise TypeError(f"a checkpoint location must be a str or path, got {type(text).__name__}")
    if text.startswith("file://"):
        return LocalFiles(), os.path.abspath(text[len("file://"):])
    if "://" in text:
        fs, path = _pyarrow_fs(repr(text)).FileSystem.from_uri(text)
        return ArrowFiles(fs), path
    return LocalFiles(), os.path.abspath(text)
