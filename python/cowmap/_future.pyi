"""Type stub for src/cowmap/_future.pyx: futures and record contexts."""

from collections.abc import Callable, Iterable
from typing import Any, Generic, TypeVar

from typing_extensions import disjoint_base

_T = TypeVar("_T")
_U = TypeVar("_U")
_V = TypeVar("_V")

# The classes are extension types with their own instance layout: disjoint bases (PEP 800).
@disjoint_base
class StateFuture(Generic[_T]):
    """The result of an async state request, with Flink's ``then_*`` chaining."""

    def __init__(self, mailbox: Any = None, context: Any = None) -> None: ...
    # a request's future also carries the request (read by the states' _batch_<op> methods)
    _state: Any
    _op: str | None
    _args: tuple[Any, ...] | None
    _ns: Any
    _ctx: Any
    def is_done(self) -> bool: ...
    def get(self) -> _T: ...
    def complete(self, value: _T) -> None: ...
    def complete_exceptionally(self, exc: BaseException) -> None: ...
    def then_apply(self, fn: Callable[[_T], _U]) -> StateFuture[_U]: ...
    def then_accept(self, action: Callable[[_T], Any]) -> StateFuture[None]: ...
    def then_compose(self, fn: Callable[[_T], StateFuture[_U]]) -> StateFuture[_U]: ...
    def then_combine(self, other: StateFuture[_U], fn: Callable[[_T, _U], _V]) -> StateFuture[_V]: ...
    def then_conditionally_apply(
        self, condition: Callable[[_T], bool], if_true: Callable[[_T], _U], if_false: Callable[[_T], _V] | None = None
    ) -> StateFuture[tuple[bool, Any]]: ...
    def then_conditionally_accept(
        self, condition: Callable[[_T], bool], if_true: Callable[[_T], Any], if_false: Callable[[_T], Any] | None = None
    ) -> StateFuture[bool]: ...
    def then_conditionally_compose(
        self,
        condition: Callable[[_T], bool],
        if_true: Callable[[_T], StateFuture[_U]],
        if_false: Callable[[_T], StateFuture[_V]] | None = None,
    ) -> StateFuture[tuple[bool, Any]]: ...

class StateFutureUtils:
    @staticmethod
    def completed_future(value: _T) -> StateFuture[_T]: ...
    @staticmethod
    def completed_void_future() -> StateFuture[None]: ...
    @staticmethod
    def combine_all(futures: Iterable[StateFuture[_T]]) -> StateFuture[list[_T]]: ...
    @staticmethod
    def to_iterable(future: StateFuture[Any]) -> StateFuture[list[Any]]: ...

@disjoint_base
class RecordContext:
    record: Any
    key: Any
    key_group: Any
    epoch: Any
    priority: Any
    seq: int
    refs: int
    holds_key: bool
    def __init__(self, aec: Any, record: Any, key: Any, key_group: Any, epoch: Any, priority: Any = 0) -> None: ...
    def retain(self) -> None: ...
    def release(self) -> None: ...

@disjoint_base
class ControllerBase:
    """What futures and record contexts call on their controller (``AsyncExecutionController``
    implements it); it has no Python-visible methods."""

def gc_hiding() -> bool: ...
