"""Type stub for src/cowmap/_groups.pyx: a micro-batch's rows by key, each key made current in C."""

from collections.abc import Callable
from typing import Any, final, overload

import numpy as np
import pandas as pd

from cowmap._context import KeyContext

@overload
def group_int64(keys: np.ndarray, key_groups: None = None) -> tuple[list[int], np.ndarray, np.ndarray]:
    """An int64 key column's distinct keys in order of first appearance, its rows by key, their bounds."""

@overload
def group_int64(
    keys: np.ndarray, key_groups: Callable[[np.ndarray], np.ndarray]
) -> tuple[list[int], np.ndarray, np.ndarray, np.ndarray]:
    """... in key-group order (``key_groups`` gives those of the distinct keys), and their key groups."""

@final
class OrderedBatch:
    """A batch and its rows' order by key; columns and per-group aggregates made on first use."""

    @property
    def frame(self) -> pd.DataFrame: ...
    @property
    def order(self) -> np.ndarray: ...
    @property
    def bounds(self) -> np.ndarray: ...
    def __init__(self, frame: pd.DataFrame, order: np.ndarray, bounds: np.ndarray) -> None: ...
    def column(self, name: Any) -> np.ndarray: ...
    def aggregate(self, how: str, name: Any) -> list[Any]: ...

@final
class Rows:
    """The rows of one key in a micro-batch."""

    @property
    def group(self) -> int: ...
    @property
    def start(self) -> int: ...
    @property
    def stop(self) -> int: ...
    def __init__(self, *args: Any, **kwargs: Any) -> None: ...
    def sum(self, name: Any) -> Any: ...
    def min(self, name: Any) -> Any: ...
    def max(self, name: Any) -> Any: ...
    def __len__(self) -> int: ...
    def __getitem__(self, key: Any, /) -> np.ndarray: ...
    @property
    def index(self) -> np.ndarray: ...
    def to_pandas(self) -> pd.DataFrame: ...

@final
class Groups:
    """The iterator of ``(key, rows)`` over an :class:`OrderedBatch`, each key made current first."""

    def __init__(
        self,
        ordered: OrderedBatch,
        keys: list[Any],
        target: KeyContext | Callable[[Any], object],
        key_groups: np.ndarray | None = None,
    ) -> None: ...
    def __iter__(self) -> Groups: ...
    def __next__(self) -> tuple[Any, Rows]: ...
