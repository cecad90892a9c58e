"""State time-to-live configuration, with Flink 2.3's names and semantics.

A value written at ``ts`` (milliseconds from the backend's ``time_provider``) is
expired at ``now`` when ``ts + ttl <= now``; the sum saturates at 2**63 - 1 as in
Flink's ``TtlUtils``, so ``timedelta.max`` never expires.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, replace
from datetime import timedelta

__all__ = [
    "MAX_CLEANUP_SIZE",
    "MAX_TIMESTAMP",
    "StateTtlConfig",
    "StateVisibility",
    "TtlTimeCharacteristic",
    "UpdateType",
    "expired",
]

#: Java's Long.MAX_VALUE: the saturation point of ``ts + ttl``.
MAX_TIMESTAMP = (1 << 63) - 1
#: Java's Integer.MAX_VALUE: the largest incremental cleanup size (Flink's is an int).
MAX_CLEANUP_SIZE = (1 << 31) - 1
#: the longest TTL a ``timedelta`` can express, in ms
_TIMEDELTA_MAX_MS = timedelta.max // timedelta(milliseconds=1)


class UpdateType(enum.Enum):
    """When the last-access timestamp of a value is refreshed."""

    #: TTL is disabled: values never expire.
    Disabled = 0
    #: Refreshed when the value is created or written (Flink's default).
    OnCreateAndWrite = 1
    #: Refreshed on reads as well as writes.
    OnReadAndWrite = 2


class StateVisibility(enum.Enum):
    """Whether an expired value that cleanup has not removed yet may be returned."""

    #: Returned once, and removed by that same access.
    ReturnExpiredIfNotCleanedUp = 0
    #: Never returned (Flink's default).
    NeverReturnExpired = 1


class TtlTimeCharacteristic(enum.Enum):
    """Only processing time is supported, as in Flink."""

    ProcessingTime = 0


def expired(ts: int, ttl: int, now: int) -> bool:
    """``ts + ttl <= now`` with the sum saturating at ``MAX_TIMESTAMP``."""
    end = ts + ttl
    return (end if end < MAX_TIMESTAMP else MAX_TIMESTAMP) <= now


def _ttl_millis(ttl: object) -> int:
    """``ttl`` (a timedelta or int ms) in ms, at most ``MAX_TIMESTAMP``: a longer
    TTL never expires either, and the clamp keeps it a 64-bit integer."""
    if isinstance(ttl, timedelta):
        ms = ttl // timedelta(milliseconds=1)
    elif isinstance(ttl, int) and not isinstance(ttl, bool):
        ms = ttl
    else:
        raise TypeError(f"ttl must be a datetime.timedelta (or int milliseconds), not {type(ttl).__name__}")
    if ms <= 0:
        raise ValueError(f"ttl must be at least 1 ms, got {ttl!r}")
    return min(ms, MAX_TIMESTAMP)


def _cleanup_size(size: object) -> int:
    if not isinstance(size, int) or isinstance(size, bool):
        raise TypeError(f"cleanup_size must be an int, not {type(size).__name__}")
    if size <= 0:
        raise ValueError(f"cleanup_size must be positive, got {size!r}")
    return min(size, MAX_CLEANUP_SIZE)


# the enums under names the class body does not shadow (it re-exports them as attributes)
_UpdateType = UpdateType
_StateVisibility = StateVisibility


@dataclass(frozen=True)
class StateTtlConfig:
    """Time-to-live settings for one state (see ``StateDescriptor.enable_time_to_live``).

    Build one with :meth:`new_builder`::

        StateTtlConfig.new_builder(timedelta(hours=1)) \\
            .set_update_type(UpdateType.OnReadAndWrite) \\
            .cleanup_full_snapshot() \\
            .build()

    Background cleanup is incremental by default (5 entries per state access), as in
    Flink; ``cleanup_in_background=False`` turns it off, ``cleanup_size`` and
    ``run_cleanup_for_every_record`` tune it, and ``cleanup_full_snapshot`` leaves
    expired values out of snapshots.

    Every way of making a config (the constructor, the builder,
    ``dataclasses.replace``) checks and normalises the fields alike: ``ttl_ms``
    is int milliseconds or a ``timedelta`` (stored as ms), at least 1 ms, and
    clamped to ``MAX_TIMESTAMP`` (Java's Long.MAX_VALUE: never expires);
    ``cleanup_size`` is a positive int clamped to ``MAX_CLEANUP_SIZE``; the flags
    are bools. TypeError for a wrong type (bool is no int here), ValueError for
    a value out of range.
    """

    ttl_ms: int
    update_type: UpdateType = UpdateType.OnCreateAndWrite
    state_visibility: StateVisibility = StateVisibility.NeverReturnExpired
    cleanup_in_background: bool = True
    #: set by ``cleanup_incrementally``: on even with background cleanup disabled
    incremental_cleanup: bool = False
    cleanup_size: int = 5
    run_cleanup_for_every_record: bool = False
    cleanup_full_snapshot: bool = False

    UpdateType = UpdateType
    StateVisibility = StateVisibility
    TtlTimeCharacteristic = TtlTimeCharacteristic

    def __post_init__(self) -> None:
        # frozen: normalise through object.__setattr__ (replace() comes here too)
        object.__setattr__(self, "ttl_ms", _ttl_millis(self.ttl_ms))
        object.__setattr__(self, "cleanup_size", _cleanup_size(self.cleanup_size))
        for flag in ("cleanup_in_background", "incremental_cleanup", "run_cleanup_for_every_record",
                     "cleanup_full_snapshot"):
            if not isinstance(getattr(self, flag), bool):
                raise TypeError(f"{flag} must be a bool, not {type(getattr(self, flag)).__name__}")
        if not isinstance(self.update_type, UpdateType):
            raise TypeError(f"update_type must be an UpdateType, not {type(self.update_type).__name__}")
        if not isinstance(self.state_visibility, StateVisibility):
            raise TypeError(
                f"state_visibility must be a StateVisibility, not {type(self.state_visibility).__name__}"
            )

    @staticmethod
    def new_builder(ttl: timedelta) -> StateTtlConfig.Builder:
        """A builder for a config with time-to-live ``ttl`` (a positive ``timedelta``)."""
        return StateTtlConfig.Builder(ttl)

    @property
    def ttl(self) -> timedelta:
        """The TTL as a timedelta; ``timedelta.max`` for a longer one (it never expires)."""
        return timedelta(milliseconds=self.ttl_ms) if self.ttl_ms <= _TIMEDELTA_MAX_MS else timedelta.max

    def is_enabled(self) -> bool:
        return self.update_type is not UpdateType.Disabled

    def get_ttl(self) -> timedelta:
        return self.ttl

    def get_update_type(self) -> _UpdateType:
        return self.update_type

    def get_state_visibility(self) -> _StateVisibility:
        return self.state_visibility

    @property
    def incremental_cleanup_size(self) -> int:
        """Entries checked per state access by incremental cleanup; 0 when off.

        As in Flink, an explicit ``cleanup_incrementally`` wins over
        ``disable_cleanup_in_background`` whatever the call order, and background
        cleanup (on by default) means incremental cleanup with the defaults.
        """
        return self.cleanup_size if self.incremental_cleanup or self.cleanup_in_background else 0

    class Builder:
        """Fluent builder with PyFlink's method names."""

        def __init__(self, ttl: timedelta) -> None:
            self._cfg = StateTtlConfig(ttl)  # type: ignore[arg-type]  # normalised to ms

        def _set(self, **changes: object) -> StateTtlConfig.Builder:
            self._cfg = replace(self._cfg, **changes)  # type: ignore[arg-type]
            return self

        def set_ttl(self, ttl: timedelta) -> StateTtlConfig.Builder:
            return self._set(ttl_ms=ttl)

        def set_update_type(self, update_type: UpdateType) -> StateTtlConfig.Builder:
            return self._set(update_type=update_type)

        def update_ttl_on_create_and_write(self) -> StateTtlConfig.Builder:
            return self._set(update_type=UpdateType.OnCreateAndWrite)

        def update_ttl_on_read_and_write(self) -> StateTtlConfig.Builder:
            return self._set(update_type=UpdateType.OnReadAndWrite)

        def set_state_visibility(self, visibility: StateVisibility) -> StateTtlConfig.Builder:
            return self._set(state_visibility=visibility)

        def return_expired_if_not_cleaned_up(self) -> StateTtlConfig.Builder:
            return self._set(state_visibility=StateVisibility.ReturnExpiredIfNotCleanedUp)

        def never_return_expired(self) -> StateTtlConfig.Builder:
            return self._set(state_visibility=StateVisibility.NeverReturnExpired)

        def set_ttl_time_characteristic(self, characteristic: TtlTimeCharacteristic) -> StateTtlConfig.Builder:
            if not isinstance(characteristic, TtlTimeCharacteristic):
                raise TypeError(f"characteristic must be a TtlTimeCharacteristic, not {type(characteristic).__name__}")
            if characteristic is not TtlTimeCharacteristic.ProcessingTime:
                raise ValueError("only TtlTimeCharacteristic.ProcessingTime is supported")
            return self

        def use_processing_time(self) -> StateTtlConfig.Builder:
            return self

        def cleanup_full_snapshot(self) -> StateTtlConfig.Builder:
            """Leave expired values out of full snapshots."""
            return self._set(cleanup_full_snapshot=True)

        def cleanup_incrementally(
            self, cleanup_size: int = 5, run_cleanup_for_every_record: bool = False
        ) -> StateTtlConfig.Builder:
            """Check ``cleanup_size`` entries (a positive int, clamped to
            ``MAX_CLEANUP_SIZE``) on every access of the state (and on every
            ``set_current_key`` if ``run_cleanup_for_every_record``)."""
            return self._set(
                incremental_cleanup=True,
                cleanup_size=cleanup_size,
                run_cleanup_for_every_record=run_cleanup_for_every_record,
            )

        def disable_cleanup_in_background(self) -> StateTtlConfig.Builder:
            """No default background cleanup: expired values go only when accessed
            (unless ``cleanup_incrementally`` is also called, in any order)."""
            return self._set(cleanup_in_background=False)

        def build(self) -> StateTtlConfig:
            return self._cfg
