"""Key groups match Flink's (golden vectors computed with Flink 2.3.0) and are stable across processes."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cowmap import (
    KeyGroupRange,
    default_max_parallelism,
    key_group_for,
    key_group_range_for_operator,
    operator_index_for_key_group,
)
from cowmap.state.keygroups import key_groups_for, key_hash, murmur_hash

MURMUR_GOLDEN = {
    0: 593689054, 1: 68075478, 2: 1085422463, 42: 1134849565, -1: 1982413648,
    123456789: 1088346449, 2147483647: 1653689534, -2147483648: 1718298732,
}
INT_KEY_GROUPS_128 = [94, 86, 127, 113, 7, 126, 18, 113, 15, 51, 67, 102, 50, 1, 27, 70]
STR_KEY_GROUPS_128 = {"": 94, "a": 81, "key1": 41, "hello": 35, "defaultKey": 59}


def test_murmur_hash_matches_flink() -> None:
    assert {code: murmur_hash(code) for code in MURMUR_GOLDEN} == MURMUR_GOLDEN


def test_int_and_str_keys_land_in_flinks_key_groups() -> None:
    assert [key_group_for(k, 128) for k in range(16)] == INT_KEY_GROUPS_128
    assert key_groups_for(np.arange(16, dtype=np.int64), 128).tolist() == INT_KEY_GROUPS_128
    assert {s: key_group_for(s, 128) for s in STR_KEY_GROUPS_128} == STR_KEY_GROUPS_128


def test_java_hashcode_rules() -> None:
    assert key_hash("a") == 97 and key_hash("ab") == 97 * 31 + 98
    assert key_hash("\U0001F600") == 1772899  # Java hashes UTF-16 code units (a surrogate pair)
    assert key_hash(2**40) == (2**40 ^ (2**40 >> 32)) & 0xFFFFFFFF  # Long.hashCode
    assert key_hash(2**70) == 61504  # BigInteger.hashCode
    assert key_hash(-(2**70)) == -61504
    assert key_hash(b"ab") == (31 * (31 * 1 + 97) + 98)  # Arrays.hashCode(byte[])
    assert key_hash((3, "a")) == 31 * 3 + 97  # Flink's Tuple2.hashCode


def test_default_max_parallelism_and_ranges() -> None:
    assert [default_max_parallelism(p) for p in (1, 86, 1000, 20000)] == [128, 256, 2048, 32768]
    assert [key_group_range_for_operator(128, 3, i) for i in range(3)] == [
        KeyGroupRange(0, 42), KeyGroupRange(43, 85), KeyGroupRange(86, 127)]


@settings(max_examples=200)
@given(st.integers(1, 4096).flatmap(lambda mp: st.tuples(st.just(mp), st.integers(1, mp))))
def test_ranges_partition_key_groups_and_agree_with_operator_index(mp_p) -> None:
    max_par, par = mp_p
    ranges = [key_group_range_for_operator(max_par, par, i) for i in range(par)]
    assert [kg for r in ranges for kg in r] == list(range(max_par))
    for index, r in enumerate(ranges):
        for kg in (r.start, r.end):
            if len(r):
                assert operator_index_for_key_group(max_par, par, kg) == index


keys = st.recursive(
    st.integers() | st.floats(allow_nan=False) | st.text(max_size=8) | st.binary(max_size=8) | st.booleans(),
    lambda inner: st.tuples(inner, inner) | st.tuples(inner),
    max_leaves=6,
)


@settings(max_examples=300)
@given(keys, keys)
def test_equal_keys_have_equal_hashes(a, b) -> None:
    if a == b:
        assert key_hash(a) == key_hash(b)
    assert key_hash(a) == key_hash(a)
    for equal in ([a] + ([int(a)] if isinstance(a, float) and a.is_integer() else [])):
        assert key_hash(equal) == key_hash(a)


@given(st.lists(st.integers(-(2**63), 2**63 - 1), max_size=50), st.integers(1, 32768))
def test_batch_key_groups_equal_single(ints, max_par) -> None:
    arr = np.array(ints, dtype=np.int64)
    expected = [key_group_for(k, max_par) for k in ints]
    assert key_groups_for(arr, max_par).tolist() == expected
    assert key_groups_for(ints, max_par).tolist() == expected


def test_stable_across_processes_with_different_hash_seeds() -> None:
    probe = ["", "a", "key1", "héllo", "\U0001F600", b"bytes", (1, "x"), ("nested", (2, b"y")), 2**70, -5, 1.5]
    code = (
        "import json, sys; from cowmap.state.keygroups import key_group_for, key_hash; "
        "from ast import literal_eval; keys = literal_eval(sys.argv[1]); "
        "print(json.dumps([[key_hash(k), key_group_for(k, 32768)] for k in keys]))"
    )
    results = []
    for seed in ("0", "1", "12345"):
        env = dict(os.environ, PYTHONHASHSEED=seed)
        out = subprocess.run([sys.executable, "-c", code, repr(probe)], env=env, capture_output=True,
                             text=True, check=True).stdout
        results.append(json.loads(out))
    assert results[0] == results[1] == results[2]
    assert results[0] == [[key_hash(k), key_group_for(k, 32768)] for k in probe]
    # the salted builtin hash really differs between those processes, so the test can fail
    salted = [subprocess.run([sys.executable, "-c", "print(hash('key1'))"], capture_output=True, text=True,
                             env=dict(os.environ, PYTHONHASHSEED=s), check=True).stdout for s in ("1", "2")]
    assert salted[0] != salted[1]


def test_bad_input() -> None:
    with pytest.raises(TypeError, match="None"):
        key_group_for(None, 128)
    with pytest.raises(TypeError, match="stable key hash"):
        key_group_for(object(), 128)
    with pytest.raises(ValueError, match="max_parallelism"):
        key_group_for(1, 0)
    with pytest.raises(ValueError, match="max_parallelism"):
        key_group_for(1, 32769)
    with pytest.raises(ValueError):
        key_group_range_for_operator(128, 3, 3)
    with pytest.raises(ValueError):
        key_group_range_for_operator(2, 3, 0)
    with pytest.raises(ValueError):
        KeyGroupRange(5, 2)


def test_custom_key_hash_hook() -> None:
    class Account:
        def __init__(self, number: int) -> None:
            self.number = number

        def __cowmap_hash__(self) -> int:
            return self.number

    assert key_group_for(Account(7), 128) == key_group_for(7, 128)


@given(st.one_of(st.integers(-(2**63), 2**63 - 1), st.sampled_from(
    [s * (2**b + d) for b in (30, 60, 63) for d in (-1, 0, 1) for s in (1, -1) if -(2**63) <= s * (2**b + d) < 2**63])))
def test_int_key_hash_is_javas_hashcode(v) -> None:
    """Ints are read without the C API where they fit (src/cowmap/fastint.h): the hash
    must be Java's Integer.hashCode in int32 range and Long.hashCode beyond, for every
    int64, digit boundaries included."""
    if -(2**31) <= v < 2**31:
        assert key_hash(v) == v
        return
    u = v & 0xFFFFFFFFFFFFFFFF
    h = (u ^ (u >> 32)) & 0xFFFFFFFF
    assert key_hash(v) == (h - 2**32 if h >= 2**31 else h)


def _java_string_hash(s: str) -> int:
    """Java's String.hashCode, over UTF-16 code units: the model."""
    units = s.encode("utf-16-be", "surrogatepass")
    h = 0
    for i in range(0, len(units), 2):
        h = (31 * h + int.from_bytes(units[i : i + 2], "big")) & 0xFFFFFFFF
    return h - (1 << 32) if h >= 1 << 31 else h


@settings(max_examples=300)
@given(st.one_of(st.text(st.characters(max_codepoint=0xFF), max_size=40), st.text(max_size=20)))
def test_str_key_hash_is_javas_string_hashcode(s: str) -> None:
    """Latin-1 strings take an unrolled loop (four units a step): it must give
    String.hashCode for every length and remainder, as the general loop does."""
    assert key_hash(s) == _java_string_hash(s)


@settings(max_examples=100)
@given(st.lists(st.one_of(st.integers(-(2**63), 2**63 - 1), st.text(max_size=25)), max_size=50),
       st.sampled_from([1, 7, 128, 4096]))
def test_column_key_groups_equal_single(keys: list, max_par: int) -> None:
    """A column's key groups (tuple and int64 paths) are the per-key ones."""
    from cowmap._keygroups import column_key_groups

    want = [key_group_for(k, max_par) for k in keys]
    assert column_key_groups(tuple(keys), max_par, 0, max_par - 1).tolist() == want
    ints = [k for k in keys if isinstance(k, int)]
    arr = np.array(ints, dtype=np.int64)
    assert column_key_groups(arr, max_par, 0, max_par - 1).tolist() == [key_group_for(k, max_par) for k in ints]
