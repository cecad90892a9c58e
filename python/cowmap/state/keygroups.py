"""Key groups exactly as Flink assigns them (``KeyGroupRangeAssignment``).

A key's group is ``murmur_hash(key_hash(key)) % max_parallelism``; key groups are split
into contiguous, inclusive ranges, one per parallel operator, so state can be rescaled
by moving whole key groups. ``key_hash`` follows Java's ``hashCode`` rules (see
``src/cowmap/keyhash.h``), so it is stable across processes and machines — unlike
``hash()``, which is salted for str and bytes — and matches Flink for int and str keys.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from cowmap._keygroups import key_group_for, key_groups_for, key_hash, murmur_hash

__all__ = [
    "FLINK_KEY_HASH",
    "UPPER_BOUND_MAX_PARALLELISM",
    "KeyGroupRange",
    "default_max_parallelism",
    "key_group_for",
    "key_group_range_for_operator",
    "key_groups_for",
    "key_hash",
    "murmur_hash",
    "operator_index_for_key_group",
    "spark_key_hash",
]

#: the name checkpoints record for this key-to-key-group function (a backend made with
#: ``spark_key_types`` records Spark's instead)
FLINK_KEY_HASH = "cowmap-murmur-v1"

def spark_key_hash(spark_key_types: Iterable[str]) -> str:
    """The name checkpoints record for Spark's key-to-key-group function over key
    columns of these Spark SQL types (``pmod(hash(columns), max_parallelism)``)."""
    return "spark-murmur3-42:" + ",".join(str(t).lower() for t in spark_key_types)


#: Flink's upper bound for (max) parallelism: 2**15.
UPPER_BOUND_MAX_PARALLELISM = 1 << 15
_DEFAULT_LOWER_BOUND_MAX_PARALLELISM = 1 << 7


def _check_parallelism(name: str, value: int) -> None:
    if not isinstance(value, int) or isinstance(value, bool):
        raise TypeError(f"{name} must be an int, not {type(value).__name__}")
    if not 0 < value <= UPPER_BOUND_MAX_PARALLELISM:
        raise ValueError(f"{name} must be within 1..{UPPER_BOUND_MAX_PARALLELISM}, got {value}")


@dataclass(frozen=True)
class KeyGroupRange:
    """An inclusive range ``[start, end]`` of key groups (empty when ``end < start``)."""

    start: int
    end: int

    def __post_init__(self) -> None:
        if self.start < 0 or self.end < self.start - 1:
            raise ValueError(f"invalid key group range [{self.start}, {self.end}]")

    @classmethod
    def of(cls, start: int, end: int) -> KeyGroupRange:
        return cls(start, end)

    def __len__(self) -> int:
        return self.end - self.start + 1

    def __contains__(self, key_group: object) -> bool:
        return isinstance(key_group, int) and self.start <= key_group <= self.end

    def __iter__(self) -> Iterator[int]:
        return iter(range(self.start, self.end + 1))

    def intersection(self, other: KeyGroupRange) -> KeyGroupRange:
        start, end = max(self.start, other.start), min(self.end, other.end)
        return KeyGroupRange(start, end) if start <= end else KeyGroupRange(0, -1)


def _check_parallelisms(max_parallelism: int, parallelism: int) -> None:
    _check_parallelism("max_parallelism", max_parallelism)
    _check_parallelism("parallelism", parallelism)
    if parallelism > max_parallelism:
        raise ValueError(f"parallelism {parallelism} exceeds max_parallelism {max_parallelism}")


def operator_index_for_key_group(max_parallelism: int, parallelism: int, key_group: int) -> int:
    """The parallel operator that owns ``key_group``: ``key_group * parallelism // max_parallelism``."""
    _check_parallelisms(max_parallelism, parallelism)
    if not 0 <= key_group < max_parallelism:
        raise ValueError(f"key_group must be within 0..{max_parallelism - 1}, got {key_group}")
    return key_group * parallelism // max_parallelism


def key_group_range_for_operator(max_parallelism: int, parallelism: int, index: int) -> KeyGroupRange:
    """The inclusive key-group range of operator ``index`` (Flink's formula)."""
    _check_parallelisms(max_parallelism, parallelism)
    if not 0 <= index < parallelism:
        raise ValueError(f"operator index must be within 0..{parallelism - 1}, got {index}")
    start = (index * max_parallelism + parallelism - 1) // parallelism
    end = ((index + 1) * max_parallelism - 1) // parallelism
    return KeyGroupRange(start, end)


def default_max_parallelism(parallelism: int) -> int:
    """Flink's default: ``min(max(round_up_pow2(p + p // 2), 128), 32768)``."""
    _check_parallelism("parallelism", parallelism)
    x = parallelism + parallelism // 2
    pow2 = 1 << (x - 1).bit_length()
    return min(max(pow2, _DEFAULT_LOWER_BOUND_MAX_PARALLELISM), UPPER_BOUND_MAX_PARALLELISM)
