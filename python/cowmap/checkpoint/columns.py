"""How one column of a block is stored: raw numbers, packed strings, or serialized.

A column holds one field (keys, namespaces, values, ...) of every row of one
state in one key group. Ints that fit in int64, floats and strs take a fast
path with no per-row serializer call, and so do tuples of them (a count and a
sum, say: one numeric column per position) unless the state names a
serializer of its own; a column whose rows are all one object (the void
namespace, mostly) is stored once; anything else goes through the state's
serializer (pickle protocol 5 by default) as one list.

A column is ``tag (u8) | length (u64) | payload``, little-endian. A column of
tuples is ``arity (u8)`` then one numeric column per position.
"""

from __future__ import annotations

import pickle
import struct
import types
from collections.abc import Sequence
from typing import Any, Protocol

import numpy as np

from cowmap._core import tuple_columns

__all__ = [
    "PICKLE",
    "Const",
    "Serializer",
    "decode_column",
    "encode_column",
    "serializer_name",
]

T_INT64 = 1
T_FLOAT64 = 2
T_STR = 3
T_SERIALIZED = 4
T_CONST = 5
T_NONE = 6  # a column of None (ListState without TTL has no timestamps)
T_INT32 = 7  # ints that fit in int32, stored in 4 bytes each
T_TUPLES = 8  # tuples of one length, each position all ints (int64) or all floats

_COL = struct.Struct("<BQ")


class Serializer(Protocol):
    """What a state's values are written with: ``dumps(obj) -> bytes`` and
    ``loads(bytes) -> obj`` (the ``pickle`` module is one)."""

    def dumps(self, obj: Any) -> bytes: ...
    def loads(self, data: bytes) -> Any: ...


class _Pickle5:
    """pickle, protocol 5: the default serializer."""

    name = "pickle5"

    @staticmethod
    def dumps(obj: Any) -> bytes:
        return pickle.dumps(obj, protocol=5)

    @staticmethod
    def loads(data: bytes) -> Any:
        return pickle.loads(data)


PICKLE = _Pickle5()


def serializer_name(s: Any) -> str:
    """The name a checkpoint records for serializer ``s``."""
    name = getattr(s, "name", None)
    if isinstance(name, str):
        return name
    if isinstance(s, types.ModuleType):  # e.g. the pickle module itself
        return s.__name__
    return f"{getattr(s, '__module__', '?')}.{getattr(s, '__qualname__', type(s).__qualname__)}"


class Const:
    """A column whose every row is ``value`` (a hashable object)."""

    __slots__ = ("value",)

    def __init__(self, value: Any) -> None:
        self.value = value


def encode_column(col: Any, serializer: Serializer) -> list[bytes]:
    """The parts of column ``col``: a list or tuple, an int64/float64 numpy
    array, or a :class:`Const`."""
    if isinstance(col, np.ndarray):
        if col.dtype.kind == "i":
            # a short column stays int64: the two reductions that would narrow it cost
            # more than the 16 KB at most saved (an increment's many small key groups:
            # 13% of its time)
            narrow = len(col) >= 4096 and col.min() >= -(2**31) and col.max() < 2**31
            return _raw(T_INT32, col) if narrow else _raw(T_INT64, col)
        return _raw(T_FLOAT64, col)
    if isinstance(col, Const):
        data = _dumps(serializer, col.value)
        return [_COL.pack(T_CONST, len(data)), data]
    n = len(col)
    if n:
        first = col[0]
        t = type(first)
        if t is int:
            if all(type(x) is int for x in col):
                try:
                    return _raw(T_INT64, np.fromiter(col, np.int64, n))
                except OverflowError:
                    pass
        elif t is float:
            if all(type(x) is float for x in col):
                return _raw(T_FLOAT64, np.fromiter(col, np.float64, n))
        elif t is str:
            if all(type(x) is str for x in col):
                return _strings(col)
        elif t is tuple and serializer is PICKLE:
            # (a serializer of the state's own sees its tuples: it may map them, e.g. migrate a schema)
            parts = tuple_columns(col if type(col) is list else list(col))
            if parts is not None:
                return _tuples(parts)
        elif first is None and all(x is None for x in col):
            return [_COL.pack(T_NONE, 0)]
        if _hashable(first) and all(x is first for x in col):
            data = _dumps(serializer, first)
            return [_COL.pack(T_CONST, len(data)), data]
    data = _dumps(serializer, list(col))
    return [_COL.pack(T_SERIALIZED, len(data)), data]


def _dumps(serializer: Serializer, obj: Any) -> bytes:
    data = serializer.dumps(obj)
    if not isinstance(data, bytes):
        raise TypeError(
            f"serializer {serializer_name(serializer)!r} returned {type(data).__name__}, not bytes"
        )
    return data


def _hashable(x: Any) -> bool:
    """Only a hashable (immutable, by contract) object is stored once for a whole
    column: rows sharing a mutable object would come back sharing it."""
    try:
        hash(x)
    except TypeError:
        return False
    return True


_RAW = {T_INT64: "<i8", T_FLOAT64: "<f8", T_INT32: "<i4"}


def _raw(tag: int, arr: np.ndarray) -> list[bytes]:
    data = arr.astype(_RAW[tag], copy=False).tobytes()
    return [_COL.pack(tag, len(data)), data]


def _tuples(parts: list[np.ndarray]) -> list[bytes]:
    out = [bytes((len(parts),))]
    for p in parts:
        out += encode_column(p, PICKLE)
    return [_COL.pack(T_TUPLES, sum(map(len, out))), *out]


def _strings(col: Sequence[str]) -> list[bytes]:
    encoded = [s.encode("utf-8", "surrogatepass") for s in col]
    ends = np.cumsum(np.fromiter(map(len, encoded), np.int64, len(encoded)), dtype=np.int64)
    offsets = ends.astype("<i8").tobytes()
    data = b"".join(encoded)
    return [_COL.pack(T_STR, len(offsets) + len(data)), offsets, data]


class ColumnError(ValueError):
    """A column that cannot be read (the caller names the file and block)."""


def skip_column(buf: memoryview, pos: int) -> int:
    """The position after the column at ``buf[pos:]``."""
    if pos + _COL.size > len(buf):
        raise ColumnError(f"column header at byte {pos} runs past the block")
    tag, size = _COL.unpack_from(buf, pos)
    end = pos + _COL.size + size
    if end > len(buf) or not T_INT64 <= tag <= T_TUPLES:
        raise ColumnError(f"bad column at byte {pos}")
    return end


def decode_column(buf: memoryview, pos: int, n: int, serializer: Serializer) -> tuple[Any, int]:
    """The column of ``n`` rows at ``buf[pos:]`` and the position after it: an
    int64/float64 array (numbers), a list, or ``(value,)`` for a constant column."""
    if pos + _COL.size > len(buf):
        raise ColumnError(f"column header at byte {pos} runs past the block")
    tag, size = _COL.unpack_from(buf, pos)
    pos += _COL.size
    end = pos + size
    if end > len(buf):
        raise ColumnError(f"column of {size} bytes at byte {pos} runs past the block")
    data = buf[pos:end]
    if tag in _RAW:
        width = 4 if tag == T_INT32 else 8
        if size != width * n:
            raise ColumnError(f"numeric column of {size} bytes for {n} rows")
        return np.frombuffer(data, _RAW[tag]).astype(np.float64 if tag == T_FLOAT64 else np.int64), end
    if tag == T_STR:
        if size < 8 * n:
            raise ColumnError(f"string column of {size} bytes for {n} rows")
        ends = np.frombuffer(data[: 8 * n], "<i8")
        text = bytes(data[8 * n :])
        if n and (ends[-1] != len(text) or (np.diff(ends) < 0).any() or ends[0] < 0):
            raise ColumnError("string column offsets do not match its data")
        out, start = [], 0
        for stop in ends.tolist():
            out.append(text[start:stop].decode("utf-8", "surrogatepass"))
            start = stop
        return out, end
    if tag == T_NONE:
        return [None] * n, end
    if tag == T_TUPLES:
        if size < 1 or data[0] == 0:
            raise ColumnError("tuple column without its arity")
        parts, at = [], 1
        for _ in range(data[0]):
            if at + _COL.size <= size and data[at] not in _RAW:  # (checked first: no nesting to recurse into)
                raise ColumnError("a tuple column's position is not numeric")
            part, at = decode_column(data, at, n, serializer)
            parts.append(part.tolist())
        if at != size:
            raise ColumnError(f"tuple column of {size} bytes holds {at}")
        return list(zip(*parts, strict=True)), end
    if tag == T_CONST:
        return (serializer.loads(bytes(data)),), end
    if tag == T_SERIALIZED:
        values = serializer.loads(bytes(data))
        if not isinstance(values, list) or len(values) != n:
            raise ColumnError(f"serialized column is not a list of {n} values")
        return values, end
    raise ColumnError(f"unknown column type {tag}")


def column_list(col: Any, n: int) -> list[Any]:
    """A decoded column as a list of Python objects."""
    if isinstance(col, np.ndarray):
        return col.tolist()
    if isinstance(col, tuple):
        return [col[0]] * n
    return col
