"""``StateIterator``: what the async list and map reads complete with (Flink's ``StateIterator``)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any, Generic, TypeVar

from cowmap.asyncstate.future import StateFuture, StateFutureUtils

__all__ = ["StateIterator"]

T = TypeVar("T")


class StateIterator(Generic[T]):
    """The elements of a list state, or the entries/keys/values of a map state."""

    __slots__ = ("_items",)

    def __init__(self, items: list[T]) -> None:
        self._items = items

    def on_next(self, fn: Callable[[T], Any]) -> StateFuture[list[Any]]:
        """Call ``fn`` on every element; a future of the results, in order, once
        every future ``fn`` returned is complete (None results are left out, so a
        consumer gives an empty list)."""
        if not callable(fn):
            raise TypeError(f"on_next needs a callable, not {type(fn).__name__}")
        results = [fn(x) for x in self._items]
        futures = [r if isinstance(r, StateFuture) else StateFutureUtils.completed_future(r) for r in results]
        return StateFutureUtils.combine_all(futures).then_apply(lambda rs: [r for r in rs if r is not None])

    def is_empty(self) -> bool:
        return not self._items

    def __iter__(self) -> Iterator[T]:
        return iter(self._items)

    def __len__(self) -> int:
        return len(self._items)
