"""cowmap's compiled copy of Spark SQL's hash() against Spark itself.

The key group a cowmap backend inside a pandas UDF gives a row must equal
``pmod(hash(keys), max_parallelism)`` as Spark computed it before routing the row:
checked here on a real local SparkSession over ints, longs, strings (UTF-8, the
non-standard tail of 1-3 bytes), binary, booleans, floats, doubles and keys of
several columns.
"""

from __future__ import annotations

import random

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cowmap._keygroups import spark_hash, spark_key_group, spark_key_groups, spark_type_codes


def _rows(seed: int, n: int) -> list[tuple]:
    r = random.Random(seed)
    words = ["", "a", "ab", "abc", "abcd", "abcde", "ümlaut", "日本語", "😀x", "key-0001", "x" * 37]
    rows = []
    for _ in range(n):
        rows.append(
            (
                r.choice([0, 1, -1, 2**31 - 1, -(2**31), r.randint(-(2**31), 2**31 - 1)]),
                r.choice([0, -1, 2**63 - 1, -(2**63), r.randint(-(2**63), 2**63 - 1), r.randint(-1000, 1000)]),
                r.choice(words) + str(r.randint(0, 10 ** r.randint(0, 6))) * r.randint(0, 1),
                bytes(r.randint(0, 255) for _ in range(r.randint(0, 9))),
                r.random() < 0.5,
                r.choice([0.0, -0.0, 1.5, -2.25, float("inf"), r.uniform(-1e6, 1e6)]),
                r.choice([0.0, -0.0, 1e300, -3.5, float("nan"), r.uniform(-1e9, 1e9)]),
            )
        )
    return rows


SCHEMA = "i int, l bigint, s string, b binary, z boolean, f float, d double"
COLS = ["i", "l", "s", "b", "z", "f", "d"]
TYPES = ["int", "bigint", "string", "binary", "boolean", "float", "double"]


def test_hash_and_key_groups_equal_sparks(spark) -> None:
    from pyspark.sql import functions as F

    rows = _rows(7, 400)
    df = spark.createDataFrame(rows, SCHEMA)
    exprs = [F.hash(F.col(c)).alias(f"h_{c}") for c in COLS]
    exprs += [F.hash(F.col("l"), F.col("s")).alias("h_ls"), F.hash(F.col("i"), F.col("s"), F.col("d")).alias("h_isd")]
    exprs += [F.pmod(F.hash(F.col("l"), F.col("s")), F.lit(4096)).alias("kg_ls")]
    got = df.select(*COLS, *exprs).collect()
    for row in got:
        for c, t in zip(COLS, TYPES):
            assert spark_hash(row[c], spark_type_codes([t])) == row[f"h_{c}"], (c, row[c])
        assert spark_hash((row["l"], row["s"]), spark_type_codes(["bigint", "string"])) == row["h_ls"]
        codes = spark_type_codes(["int", "string", "double"])
        assert spark_hash((row["i"], row["s"], row["d"]), codes) == row["h_isd"]
        assert spark_key_group((row["l"], row["s"]), spark_type_codes(["bigint", "string"]), 4096) == row["kg_ls"]
    # the column form, over numpy and Python columns, gives the same key groups
    longs = np.array([r["l"] for r in got], dtype=np.int64)
    strs = [r["s"] for r in got]
    kgs = spark_key_groups([longs, strs], spark_type_codes(["bigint", "string"]), 4096)
    assert kgs.tolist() == [r["kg_ls"] for r in got]
    import pandas as pd
    import pyarrow as pa

    for cols in ([pd.Series(longs), pd.Series(strs)], [pa.array(longs), pa.array(strs)]):
        assert spark_key_groups(cols, spark_type_codes(["bigint", "string"]), 4096).tolist() == kgs.tolist()
    ints = np.array([r["i"] for r in got], dtype=np.int32)
    assert spark_key_groups([ints], spark_type_codes(["int"]), 97).tolist() == [
        spark_key_group(r["i"], spark_type_codes(["int"]), 97) for r in got
    ]


@settings(max_examples=100, deadline=None)
@given(
    values=st.lists(st.integers(-(2**31), 2**31 - 1) | st.integers(0, 300), max_size=50),
    dtype=st.sampled_from(["int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64"]),
)
def test_an_int_keys_column_of_any_integer_dtype_hashes_as_its_values(values: list[int], dtype: str) -> None:
    """Spark ``int`` keys in a numpy column of any integer type (the distinct
    keys of one are int64): the key groups of the values one by one, and an
    OverflowError naming the row for a value no int holds."""
    info = np.iinfo(dtype)
    fits = [v for v in values if info.min <= v <= info.max]
    col = np.array(fits, dtype=dtype)
    codes = spark_type_codes(["int"])
    assert spark_key_groups([col], codes, 97).tolist() == [spark_key_group(v, codes, 97) for v in fits]
    if info.max >= 2**31:
        with pytest.raises(OverflowError, match=f"row {len(fits)}: "):
            spark_key_groups([np.array([*fits, 2**31], dtype=dtype)], codes, 97)


def test_known_values_without_spark() -> None:
    # Spark 4.1: SELECT hash(1), hash(0), hash('a'), hash(1L)
    assert spark_hash(1, spark_type_codes(["int"])) == -559580957
    assert spark_hash(0, spark_type_codes(["int"])) == 933211791


def test_bad_keys_are_clear_errors() -> None:
    codes = spark_type_codes(["bigint", "string"])
    with pytest.raises(ValueError, match="null"):
        spark_hash((None, "a"), codes)
    with pytest.raises(ValueError, match="row 1: .*null"):
        spark_key_groups([np.array([1, 2]), ["a", None]], codes, 16)
    with pytest.raises(TypeError, match="string"):
        spark_hash((1, 2), codes)
    with pytest.raises(OverflowError):
        spark_hash(2**31, spark_type_codes(["int"]))
    with pytest.raises(ValueError, match="not supported"):
        spark_type_codes(["decimal(10,2)"])
    with pytest.raises(ValueError, match="tuple of 2"):
        spark_hash(1, codes)
    with pytest.raises(ValueError, match="differ in length"):
        spark_key_groups([np.array([1, 2]), ["a"]], codes, 16)


def test_a_backend_with_sparks_key_groups(tmp_path) -> None:
    """Rows routed by Spark's key groups land in the same key groups in the backend:
    per record, per column, in snapshots and checkpoints; a checkpoint or snapshot
    of another key-group function is refused."""
    from cowmap import KeyedStateBackend, KeyGroupRange, ValueStateDescriptor
    from cowmap.checkpoint import CheckpointStorage

    codes = spark_type_codes(["bigint"])
    b = KeyedStateBackend(max_parallelism=64, spark_key_types=["bigint"])
    assert b.key_hash == "spark-murmur3-42:bigint"
    v = b.get_state(ValueStateDescriptor("v"))
    keys = np.arange(-500, 500, dtype=np.int64)
    for k in keys.tolist()[:50]:
        b.set_current_key(k)
        assert b.get_current_key_group() == spark_key_group(k, codes, 64) == b.key_group_of(k)
        v.update(k)
    v.update_many(keys, keys * 2)  # the columnar path: Spark's key groups too
    per_kg = {kg: set() for kg in range(64)}
    with b.snapshot() as snap:
        for k, _, val, _ in snap.entries("v"):
            assert val == 2 * k
        for kg in snap.key_groups("v"):
            per_kg[kg] = {k for k, *_ in b._tables["v"].export(snap._states["v"].maps[kg], None, 0)}
    assert all(spark_key_group(k, codes, 64) == kg for kg, ks in per_kg.items() for k in ks)
    assert sum(map(len, per_kg.values())) == 1000
    # a backend owning part of the range refuses keys Spark routes elsewhere
    part = KeyedStateBackend(max_parallelism=64, key_group_range=KeyGroupRange(0, 31), spark_key_types=["bigint"])
    outside = next(k for k in keys.tolist() if spark_key_group(k, codes, 64) > 31)
    with pytest.raises(ValueError, match="outside"):
        part.set_current_key(outside)
    with pytest.raises(ValueError, match="outside"):
        part.get_state(ValueStateDescriptor("v")).update_many(keys, keys)
    # keys of several columns are tuples
    two = KeyedStateBackend(max_parallelism=64, spark_key_types=["string", "int"])
    two.set_current_key(("user-7", 3))
    assert two.get_current_key_group() == spark_key_group(("user-7", 3), spark_type_codes(["string", "int"]), 64)
    with pytest.raises(ValueError, match="null"):
        two.set_current_key((None, 3))
    # checkpoints and snapshots record the function: another one is refused
    storage = CheckpointStorage(tmp_path / "ck")
    storage.save(b)
    flink = KeyedStateBackend(max_parallelism=64)
    with pytest.raises(ValueError, match="spark-murmur3-42:bigint"):
        storage.restore(flink)
    with pytest.raises(ValueError, match="spark-murmur3-42:bigint"):
        flink.restore(b.snapshot())
    same = KeyedStateBackend(max_parallelism=64, spark_key_types=["bigint"])
    storage.restore(same)
    same.set_current_key(7)
    assert same.get_state(ValueStateDescriptor("v")).value() == 14
    with pytest.raises(ValueError, match="not supported"):
        KeyedStateBackend(spark_key_types=["map<string,int>"])
    with pytest.raises(TypeError, match="sequence"):
        KeyedStateBackend(spark_key_types="bigint")
