"""A block's columns: what is encoded reads back as the very same objects (types,
float bits, tuples versus lists), whichever path a column takes; a damaged
column of tuples is refused with a ColumnError."""

from __future__ import annotations

import math
import struct
from collections import namedtuple
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cowmap._core import TUPLE_COLUMNS_MAX, tuple_columns
from cowmap.checkpoint.columns import _COL, PICKLE, T_TUPLES, ColumnError, decode_column, encode_column

Pair = namedtuple("Pair", "a b")


def same(a: Any, b: Any) -> bool:
    """Equal, of the same types all the way down, floats bit for bit."""
    if type(a) is not type(b):
        return False
    if isinstance(a, float):
        return struct.pack("<d", a) == struct.pack("<d", b)
    if isinstance(a, (tuple, list)):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    return bool(a == b)


def roundtrip(col: list[Any]) -> tuple[int, list[Any]]:
    parts = encode_column(col, PICKLE)
    buf = b"".join(bytes(p) for p in parts)
    back, end = decode_column(memoryview(buf), 0, len(col), PICKLE)
    assert end == len(buf)
    if isinstance(back, np.ndarray):
        back = back.tolist()
    elif isinstance(back, tuple):  # a constant column
        back = [back[0]] * len(col)
    return _COL.unpack(bytes(parts[0]))[0], back


NUMBER = st.one_of(
    st.integers(-(2**63), 2**63 - 1),
    st.integers(-(2**70), 2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.booleans(),
)


@settings(max_examples=300, deadline=None)
@given(
    st.integers(1, 4).flatmap(
        lambda k: st.lists(st.one_of(st.tuples(*[NUMBER] * k), st.tuples(*[NUMBER] * (k + 1)),
                                     st.builds(Pair, NUMBER, NUMBER), st.integers()), min_size=1, max_size=40)
    )
)
def test_any_column_of_tuples_reads_back_as_the_same_objects(col: list[Any]) -> None:
    tag, back = roundtrip(col)
    assert same(back, col)
    # the typed path is taken exactly when tuple_columns takes the rows apart
    assert (tag == T_TUPLES) == (tuple_columns(col) is not None)


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(st.integers(-(2**63), 2**63 - 1), st.floats()), min_size=1, max_size=200))
def test_tuples_of_ints_and_floats_take_the_typed_path(col: list[tuple[int, float]]) -> None:
    tag, back = roundtrip(col)
    assert tag == T_TUPLES and same(back, col)


def test_what_tuple_columns_refuses() -> None:
    assert tuple_columns([]) is None
    assert tuple_columns([()]) is None  # no positions
    assert tuple_columns([(1,) * (TUPLE_COLUMNS_MAX + 1)]) is None
    assert tuple_columns([(1,) * TUPLE_COLUMNS_MAX]) is not None
    for bad in ([(1, True)], [(1, 2), (1,)], [(1, 2), [1, 2]], [(2**63,)], [(1,), (1.0,)], [(1.0,), (1,)],
                [Pair(1, 2)], [(1, "a")], [(1, None)], [1, (1,)]):
        assert tuple_columns(bad) is None, bad
        tag, back = roundtrip(bad)
        assert tag != T_TUPLES and same(back, bad)
    ints, floats = tuple_columns([(1, -0.0), (-(2**63), math.inf)])  # type: ignore[misc]
    assert ints.dtype == np.int64 and ints.tolist() == [1, -(2**63)]
    assert floats.dtype == np.float64 and same(floats.tolist(), [-0.0, math.inf])


def test_long_tuple_columns_narrow_their_int_positions() -> None:
    col = [(i, i * 2**40, float(i)) for i in range(5_000)]
    parts = encode_column(col, PICKLE)
    assert sum(map(len, parts)) < 5_000 * (4 + 8 + 8) + 100  # the first position in 4 bytes a row
    assert roundtrip(col) == (T_TUPLES, col)


def _tuple_column(arity: int, parts: list[bytes]) -> bytes:
    payload = bytes((arity,)) + b"".join(parts)
    return _COL.pack(T_TUPLES, len(payload)) + payload


@pytest.mark.parametrize(
    "buf, problem",
    [
        (_tuple_column(0, []), "arity"),
        (_COL.pack(T_TUPLES, 0), "arity"),
        (_tuple_column(2, [b"".join(encode_column(np.arange(3), PICKLE))]), "past the block|runs past"),
        (_tuple_column(1, [b"".join(encode_column(["a", "b", "c"], PICKLE))]), "not numeric"),
        (_tuple_column(1, [b"".join(encode_column([(1,), (2,), (3,)], PICKLE))]), "not numeric"),
        (_tuple_column(1, [b"".join(encode_column(np.arange(3), PICKLE)) + b"x"]), "holds"),
        (_tuple_column(1, [b"".join(encode_column(np.arange(4), PICKLE))]), "bytes for 3 rows"),
        (_tuple_column(1, [_tuple_column(1, [b""])]), "not numeric"),
    ],
)
def test_a_damaged_tuple_column_is_a_column_error(buf: bytes, problem: str) -> None:
    with pytest.raises(ColumnError, match=problem):
        decode_column(memoryview(buf), 0, 3, PICKLE)


def test_tuple_columns_nested_deeper_than_the_stack_are_a_column_error() -> None:
    buf = b""
    for _ in range(5_000):  # a crafted block: each level a tuple column holding the next
        buf = _tuple_column(1, [buf])
    with pytest.raises(ColumnError, match="not numeric"):
        decode_column(memoryview(buf), 0, 3, PICKLE)


def test_rebinding_the_tuple_bound_changes_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    """The bound is a C constant (the Python name only shows it): a hostile
    rebinding cannot make the C pass write past its per-position flags."""
    import cowmap._core as core

    monkeypatch.setattr(core, "TUPLE_COLUMNS_MAX", 10_000)
    assert tuple_columns([(1,) * 1_000]) is None
    assert tuple_columns([(1,) * 64]) is not None


def test_a_state_s_own_serializer_sees_its_tuples(tmp_path: Any) -> None:
    """Tuples skip pickle, not a serializer the state names: that one may map what
    it reads (here it upgrades old 2-field records to 3 fields, a schema change)."""
    import pickle

    from cowmap.checkpoint import CheckpointStorage
    from cowmap.state import KeyedStateBackend, ValueStateDescriptor

    class Upgrading:
        name = "upgrading"

        @staticmethod
        def dumps(obj: Any) -> bytes:
            return pickle.dumps(obj)

        @staticmethod
        def loads(data: bytes) -> Any:
            def up(v: Any) -> Any:
                return (*v, 0) if isinstance(v, tuple) and len(v) == 2 else v

            obj = pickle.loads(data)  # a column's list of values, or one value every row shares
            return [up(v) for v in obj] if isinstance(obj, list) else up(obj)

    def backend(serializer: Any) -> tuple[KeyedStateBackend, Any]:
        b = KeyedStateBackend(max_parallelism=1)
        d = ValueStateDescriptor("v", serializer=serializer) if serializer else ValueStateDescriptor("v")
        return b, b.get_state(d)

    for serializer, want in ((Upgrading(), (1, 20, 0)), (None, (1, 20))):
        src, v = backend(serializer)
        for k in range(3):
            src.set_current_key(k)
            v.update((k, 20))
        storage = CheckpointStorage(tmp_path / str(serializer is None))
        storage.save(src)
        dst, w = backend(serializer)
        storage.restore(dst)
        dst.set_current_key(1)
        assert w.value() == want


@pytest.mark.parametrize("kind", ["value", "map", "list"])
@pytest.mark.parametrize("incremental", [False, True])
def test_a_value_the_serializer_cannot_write_is_named_with_its_state_and_key(
    tmp_path: Any, kind: str, incremental: bool
) -> None:
    """The serializer's own error, with a note naming the state, the value and its key (the
    error keeps its type: a caller may look for it)."""
    import sys
    import threading

    from cowmap.checkpoint import CheckpointStorage
    from cowmap.state import KeyedStateBackend, ListStateDescriptor, MapStateDescriptor, ValueStateDescriptor

    b = KeyedStateBackend(max_parallelism=8)
    if kind == "value":
        st = b.get_state(ValueStateDescriptor("s"))
        write = st.update
    elif kind == "map":
        st = b.get_map_state(MapStateDescriptor("s"))
        write = lambda v: st.put("u", v)  # noqa: E731
    else:
        st = b.get_list_state(ListStateDescriptor("s"))
        write = st.add
    storage = CheckpointStorage(tmp_path)
    for k in range(20):
        b.set_current_key(f"key{k}")
        write(k)
    if incremental:
        storage.save(b)
    b.set_current_key("key7")
    write(threading.Lock())
    with pytest.raises(TypeError, match="cannot pickle") as err:
        storage.save(b, incremental=incremental)
    if sys.version_info >= (3, 11):
        (note,) = err.value.__notes__
        assert note.startswith("while checkpointing state 's': serializer 'pickle5' cannot write ")
        assert note.endswith(" of key 'key7'") and "_thread.lock" in note
    assert len(storage.checkpoints()) == (1 if incremental else 0)


def test_a_value_whose_repr_fails_too_keeps_the_serializers_error(tmp_path: Any) -> None:
    import sys

    from cowmap.checkpoint import CheckpointStorage
    from cowmap.state import KeyedStateBackend, ValueStateDescriptor

    class Hostile:
        def __reduce__(self):
            raise TypeError("no pickling this")

        def __repr__(self) -> str:
            raise RuntimeError("no repr either")

    b = KeyedStateBackend(max_parallelism=8)
    b.set_current_key("k")
    b.get_state(ValueStateDescriptor("s")).update(Hostile())
    with pytest.raises(TypeError, match="no pickling this") as err:
        CheckpointStorage(tmp_path).save(b)
    if sys.version_info >= (3, 11):
        assert err.value.__notes__ == ["while checkpointing state 's'"]
