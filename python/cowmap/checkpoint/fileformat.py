"""The layout of one checkpoint data file (see docs/checkpoint-format.md).

::

    magic      8 bytes   b"CMCKPT\\r\\n"
    version    u32       FORMAT_VERSION
    length     u32       of the header
    checksum   u64       xxh3-64 of the header
    header     JSON      max parallelism, key-group range, states (name, kind, TTL, serializer), ...
    blocks               one per range of key groups: every state's rows of them, by key group
    index                per block: first and last key group, offset, length, xxh3-64, rows
    footer     32 bytes  index offset (u64), index length (u64), index xxh3-64 (u64), b"CMEND\\0\\0\\0"

Every byte is covered by a check: the header and index by their checksums, the
blocks by theirs, and the blocks must tile the space between header and
index exactly. A reader seeks straight to the blocks of the key groups it
owns. A block gathers consecutive key groups (a key group's rows are never
split across blocks) so that an increment of many small key groups costs
its rows, not a block per key group; each section says how many of its rows
belong to each key group (its runs). Integers are little-endian.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import numpy as np
import xxhash

from cowmap.checkpoint.columns import ColumnError, Serializer, decode_column, skip_column
from cowmap.checkpoint.errors import CorruptCheckpointError

__all__ = ["FORMAT_VERSION", "PENDING_BLOCK", "DataFileReader", "DataFileWriter", "Runs", "Section"]

FORMAT_VERSION = 2
MAGIC = b"CMCKPT\r\n"
END = b"CMEND\0\0\0"
_PREAMBLE = struct.Struct("<8sIIQ")
_FOOTER = struct.Struct("<QQQ8s")
_INDEX = struct.Struct("<IIQQQQ")  # first key group, last key group, offset, length, checksum, rows
_BLOCK = struct.Struct("<4sIII")  # b"CMBK", first key group, last key group, sections
_SECTION = struct.Struct("<IQII")  # state index, rows, columns, runs
BLOCK_MAGIC = b"CMBK"
#: the "key group" of the block of records waiting at an unaligned checkpoint
PENDING_BLOCK = 0xFFFFFFFF

#: a section's rows by key group, in increasing key-group order: (key groups,
#: rows of each); a count may be 0 (a timer section: none left there)
Runs = tuple[Sequence[int], Sequence[int]]
#: one state's rows in a block: (state index, rows, encoded columns, runs)
Section = tuple[int, int, list[list[bytes]], Runs]

checksum = xxhash.xxh3_64_intdigest
_FLUSH_BYTES = 1 << 20


class DataFileWriter:
    """Writes a data file to ``out`` (any object with ``write(bytes)``): the
    header at once, then :meth:`block` per key group, then :meth:`finish`."""

    def __init__(self, out: Any, header: dict[str, Any]) -> None:
        self.out = out
        head = json.dumps(header, sort_keys=True).encode()
        self.pos = 0
        self._pending: list[bytes] = []
        self._pending_size = 0
        self._write([_PREAMBLE.pack(MAGIC, FORMAT_VERSION, len(head), checksum(head)), head])
        self.index: list[tuple[int, int, int, int, int, int]] = []

    def _write(self, parts: list[bytes]) -> int:
        data = b"".join(parts)
        self._put(data)
        return len(data)

    def _put(self, data: bytes) -> None:
        # small blocks are gathered and written a megabyte at a time: a call of
        # the output stream per block would cost more than most blocks' encoding
        self._pending.append(data)
        self._pending_size += len(data)
        self.pos += len(data)
        if self._pending_size >= _FLUSH_BYTES:
            self._flush()

    def _flush(self) -> None:
        if self._pending:
            self.out.write(b"".join(self._pending))
            self._pending.clear()
            self._pending_size = 0

    def block(self, first: int, last: int, sections: list[Section]) -> int:
        """Write the block of key groups ``first..last``; returns its size in
        bytes. O(1) calls of the output stream and the checksum per block."""
        parts = [_BLOCK.pack(BLOCK_MAGIC, first, last, len(sections))]
        rows = 0
        for state, n, columns, (kgs, counts) in sections:
            parts.append(_SECTION.pack(state, n, len(columns), len(kgs)))
            if len(kgs):
                parts.append(np.asarray(kgs, dtype="<u4").tobytes())
                parts.append(np.asarray(counts, dtype="<u8").tobytes())
            for col in columns:
                parts.extend(col)
            rows += n
        data = b"".join(parts)
        start = self.pos
        self._put(data)
        self.index.append((first, last, start, len(data), checksum(data), rows))
        return len(data)

    def finish(self) -> int:
        """Write the index and footer; returns the file's size."""
        index = b"".join(_INDEX.pack(*e) for e in self.index)
        at = self.pos
        self._write([index, _FOOTER.pack(at, len(index), checksum(index), END)])
        self._flush()
        return self.pos


class DataFileReader:
    """A data file opened for reading: header and index checked at open,
    each block checked when read. ``CorruptCheckpointError`` names the file and
    part that failed."""

    def __init__(self, path: str, data: Any, size: int) -> None:
        """``data``: a random-access file (``read_at(n, offset)``) of ``size`` bytes."""
        self.path = path
        self.data = data
        self.size = size
        if size < _PREAMBLE.size + _FOOTER.size:
            self._fail("footer", f"file of {size} bytes is too short")
        at, length, digest, end = _FOOTER.unpack(self._read(size - _FOOTER.size, _FOOTER.size))
        if end != END:
            self._fail("footer", "end marker missing (truncated or overwritten?)")
        if at + length + _FOOTER.size != size:
            self._fail("footer", f"index at {at} of {length} bytes does not end where the footer starts")
        index = self._read(at, length)
        if checksum(index) != digest:
            self._fail("index", "checksum mismatch")
        if length % _INDEX.size:
            self._fail("index", f"length {length} is not a whole number of entries")
        magic, version, hlen, hsum = _PREAMBLE.unpack(self._read(0, _PREAMBLE.size))
        if magic != MAGIC:
            self._fail("header", "not a cowmap checkpoint file (bad magic)")
        if version != FORMAT_VERSION:
            self._fail("header", f"format version {version}; this cowmap reads version {FORMAT_VERSION}")
        head = self._read(_PREAMBLE.size, hlen) if _PREAMBLE.size + hlen <= at else b""
        if len(head) != hlen or checksum(head) != hsum:
            self._fail("header", "checksum mismatch")
        try:
            self.header: dict[str, Any] = json.loads(head)
        except ValueError as e:  # checksummed: only a writer bug gets here
            self._fail("header", f"not JSON: {e}")
        #: first key group -> (offset, length, checksum, rows, last key group)
        self.blocks: dict[int, tuple[int, int, int, int, int]] = {}
        pos = _PREAMBLE.size + hlen
        prev = -1
        for first, last, off, n, dig, rows in _INDEX.iter_unpack(index):
            if off != pos or first <= prev or last < first:
                self._fail("index", f"block of key groups {first}..{last} at {off}: blocks must tile the file in order")
            self.blocks[first] = (off, n, dig, rows, last)
            pos = off + n
            prev = last
        if pos != at:
            self._fail("index", f"blocks end at {pos}, the index starts at {at}")

    def _fail(self, block: str, problem: str) -> None:
        raise CorruptCheckpointError(self.path, block, problem)

    def _read(self, offset: int, n: int) -> bytes:
        b = self.data.read_at(n, offset)
        if len(b) != n:
            self._fail("file", f"short read at byte {offset}")
        return bytes(b)

    def last_of(self, first: int) -> int:
        """The last key group of the block that starts at ``first``."""
        return self.blocks[first][4]

    def _where(self, first: int) -> str:
        last = self.blocks[first][4] if first in self.blocks else first
        return f"key group {first}" if last == first else f"key group {first}..{last}"

    def block_bytes(self, first: int) -> bytes:
        """The checked bytes of the block that starts at key group ``first``."""
        off, n, dig, _, _ = self.blocks[first]
        b = self._read(off, n)
        if checksum(b) != dig:
            self._fail(self._where(first), "checksum mismatch")
        return b

    def section_sizes(self, first: int, raw: bytes) -> list[tuple[int, int, int]]:
        """``(state index, rows, bytes)`` of each section of a checked block, its
        structure walked without decoding a value."""
        return [(state, n, size) for state, n, size, _, _ in self._walk(first, raw, None)]

    def sections(
        self, first: int, raw: bytes, serializers: Sequence[Sequence[Serializer]] | Mapping[int, Sequence[Serializer]]
    ) -> Iterator[tuple[int, int, list[Any], tuple[np.ndarray, np.ndarray]]]:
        """Decode a block read by :meth:`block_bytes`: ``(state index, rows,
        columns, runs)``; ``serializers[state][i]`` reads column ``i`` of a
        state; runs are (key groups, rows of each), checked to be increasing,
        inside the block's range and to add up to the rows."""
        for state, n, _, cols, runs in self._walk(first, raw, serializers):
            assert cols is not None  # decoded: serializers were given
            yield state, n, cols, runs

    def _walk(
        self,
        first: int,
        raw: bytes,
        serializers: Sequence[Sequence[Serializer]] | Mapping[int, Sequence[Serializer]] | None,
    ) -> Iterator[tuple[int, int, int, list[Any] | None, tuple[np.ndarray, np.ndarray]]]:
        """``(state index, rows, bytes, columns, runs)`` of each section; the
        columns decoded with ``serializers``, or skipped (None) without them."""
        buf = memoryview(raw)
        where = self._where(first)
        last = self.blocks[first][4] if first in self.blocks else first
        try:
            magic, bfirst, blast, nsec = _BLOCK.unpack_from(buf, 0)
            if magic != BLOCK_MAGIC or bfirst != first or blast != last:
                self._fail(where, "bad block marker")
            pos = _BLOCK.size
            for _ in range(nsec):
                start = pos
                state, n, ncols, nruns = _SECTION.unpack_from(buf, pos)
                pos += _SECTION.size
                if pos + 12 * nruns > len(buf):
                    self._fail(where, f"{nruns} runs past the end of the block")
                kgs = np.frombuffer(buf, "<u4", nruns, pos).astype(np.int64)
                counts = np.frombuffer(buf, "<u8", nruns, pos + 4 * nruns).astype(np.int64)
                pos += 12 * nruns
                if nruns and (
                    int(counts.sum()) != n or kgs[0] < first or kgs[-1] > last or (np.diff(kgs) <= 0).any()
                ):
                    self._fail(where, "section runs do not match its rows or the block's key groups")
                if serializers is None:
                    for _ in range(ncols):
                        pos = skip_column(buf, pos)
                    yield state, n, pos - start, None, (kgs, counts)
                    continue
                try:
                    sers = serializers[state]
                except (IndexError, KeyError):
                    self._fail(where, f"state index {state} out of range")
                if ncols > len(sers):
                    self._fail(where, f"{ncols} columns for a state of {len(sers)}")
                cols = []
                for i in range(ncols):
                    col, pos = decode_column(buf, pos, n, sers[i])
                    cols.append(col)
                yield state, n, pos - start, cols, (kgs, counts)
            if pos != len(buf):
                self._fail(where, f"{len(buf) - pos} bytes after the last section")
        except (struct.error, ColumnError) as e:
            self._fail(where, str(e))
