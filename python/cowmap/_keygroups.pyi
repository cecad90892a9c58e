"""Type stub for the compiled key-hash module (src/cowmap/_keygroups.pyx)."""

from collections.abc import Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

def key_hash(key: Any) -> int: ...
def murmur_hash(code: int) -> int: ...
def key_group_for(key: Any, max_parallelism: int) -> int: ...
def key_groups_for(
    keys: Sequence[Any] | npt.NDArray[np.integer], max_parallelism: int
) -> npt.NDArray[np.int32]: ...
def column_key_groups(
    keys: npt.NDArray[np.int64] | tuple[Any, ...], max_parallelism: int, lo: int, hi: int
) -> npt.NDArray[np.int32]: ...
