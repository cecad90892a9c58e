"""Type stub for the compiled async layer (src/cowmap/_async.pyx): futures, contexts, the controller."""

from typing import Any, Callable, Generic, Iterable, TypeVar

T = TypeVar("T")
U = TypeVar("U")
V = TypeVar("V")

class StateFuture(Generic[T]):
    """The result of an async state request, with Flink's ``then_*`` chaining."""

    def __init__(self, mailbox: Any = None, context: Any = None) -> None: ...
    def is_done(self) -> bool: ...
    def get(self) -> T: ...
    def complete(self, value: T) -> None: ...
    def complete_exceptionally(self, exc: BaseException) -> None: ...
    def then_apply(self, fn: Callable[[T], U]) -> StateFuture[U]: ...
    def then_accept(self, action: Callable[[T], Any]) -> StateFuture[None]: ...
    def then_compose(self, fn: Callable[[T], StateFuture[U]]) -> StateFuture[U]: ...
    def then_combine(self, other: StateFuture[U], fn: Callable[[T, U], V]) -> StateFuture[V]: ...
    def then_conditionally_apply(
        self, condition: Callable[[T], bool], if_true: Callable[[T], U], if_false: Callable[[T], V] | None = None
    ) -> StateFuture[tuple[bool, Any]]: ...
    def then_conditionally_accept(
        self, condition: Callable[[T], bool], if_true: Callable[[T], Any], if_false: Callable[[T], Any] | None = None
    ) -> StateFuture[bool]: ...
    def then_conditionally_compose(
        self,
        condition: Callable[[T], bool],
        if_true: Callable[[T], StateFuture[U]],
        if_false: Callable[[T], StateFuture[V]] | None = None,
    ) -> StateFuture[tuple[bool, Any]]: ...

class StateFutureUtils:
    @staticmethod
    def completed_future(value: T) -> StateFuture[T]: ...
    @staticmethod
    def completed_void_future() -> StateFuture[None]: ...
    @staticmethod
    def combine_all(futures: Iterable[StateFuture[T]]) -> StateFuture[list[T]]: ...
    @staticmethod
    def to_iterable(future: StateFuture[Any]) -> StateFuture[list[Any]]: ...

class RecordContext:
    record: Any
    key: Any
    key_group: Any
    epoch: Any
    priority: Any
    refs: int
    holds_key: bool
    def __init__(self, aec: Any, record: Any, key: Any, key_group: Any, epoch: Any, priority: Any = 0) -> None: ...
    def retain(self) -> None: ...
    def release(self) -> None: ...

class Request:
    state: Any
    op: str
    args: tuple[Any, ...]
    ns: Any
    future: StateFuture[Any]
    ctx: RecordContext
    def __init__(
        self, state: Any, op: str, args: tuple[Any, ...], ns: Any, future: StateFuture[Any], ctx: RecordContext
    ) -> None: ...

import enum

class EpochMode(enum.Enum):
    SERIAL_BETWEEN_EPOCH = 0
    PARALLEL_BETWEEN_EPOCH = 1

class AsyncExecutionController:
    """Key-ordered, batched execution of async state requests (see cowmap.asyncstate)."""

    backend: Any
    batch_size: int
    buffer_timeout_ms: float
    max_in_flight_records: int
    epoch_mode: EpochMode
    mailbox: Any
    batches_run: int
    requests_run: int
    core_calls: int
    def __init__(
        self,
        backend: Any,
        batch_size: int = 1000,
        buffer_timeout_ms: float = 1000,
        max_in_flight_records: int = 6000,
        epoch_mode: EpochMode = ...,
        mailbox: Any = None,
    ) -> None: ...
    @property
    def in_flight_records(self) -> int: ...
    @property
    def active_size(self) -> int: ...
    @property
    def blocking_size(self) -> int: ...
    @property
    def blocked_keys(self) -> int: ...
    @property
    def occupied_keys(self) -> int: ...
    @property
    def current_context(self) -> RecordContext | None: ...
    def process(self, key: Any, fn: Callable[[Any], Any], record: Any = None, priority: int = 0) -> None: ...
    def handle_request(self, state: Any, op: str, *args: Any) -> StateFuture[Any]: ...
    def sync_point(self, callback: Callable[[], Any]) -> StateFuture[None]: ...
    def trigger(self) -> int: ...
    def drain(self, timeout: float | None = None) -> None: ...
    def process_non_record(
        self,
        trigger_action: Callable[[], Any] | None = None,
        final_action: Callable[[], Any] | None = None,
        mode: EpochMode | None = None,
    ) -> None: ...
