"""Type stub for src/cowmap/_controller.pyx: the AsyncExecutionController."""

import enum
from collections.abc import Callable
from typing import Any

from typing_extensions import disjoint_base

from cowmap._future import ControllerBase, RecordContext, StateFuture

class EpochMode(enum.Enum):
    SERIAL_BETWEEN_EPOCH = 0
    PARALLEL_BETWEEN_EPOCH = 1

@disjoint_base
class AsyncExecutionController(ControllerBase):
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
    def begin_unaligned_checkpoint(self, timeout: float | None = None) -> list[tuple[Any, Any]]: ...
    def end_unaligned_checkpoint(self) -> None: ...
    def process_non_record(
        self,
        trigger_action: Callable[[], Any] | None = None,
        final_action: Callable[[], Any] | None = None,
        mode: EpochMode | None = None,
    ) -> None: ...
