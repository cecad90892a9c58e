"""Event time in a Spark task: a column's latest time in epoch ms, and the
session time zone that PySpark's timestamps are wall-clock times of."""

from __future__ import annotations

import re
from datetime import timedelta, timezone, tzinfo

import pandas as pd

from cowmap.state import NO_WATERMARK

__all__ = ["event_time_ms", "session_zone"]


def event_time_ms(col: pd.Series, zone: tzinfo | str) -> int:
    """The latest event time of a column, in epoch ms (NO_WATERMARK if all null).
    PySpark hands a timestamp column over as wall-clock times of the session's
    time zone ``zone``, without a zone: they are placed in it first (the earlier
    instant of a wall-clock time that a change to winter time repeats)."""
    latest = col.max()
    if pd.isna(latest):
        return NO_WATERMARK
    if isinstance(latest, pd.Timestamp):
        if latest.tzinfo is None:
            latest = latest.tz_localize(zone, ambiguous=True, nonexistent="shift_forward")
        return int(latest.value // 1_000_000)
    return int(latest)


_OFFSET = re.compile(r"^(?:UTC|GMT|UT)?([+-])(\d{1,2})(?::?(\d{2}))?(?::?(\d{2}))?$")


def session_zone(name: str) -> tzinfo | str:
    """A Spark session time zone (a region such as ``America/New_York``, ``UTC``,
    ``Z``, or an offset such as ``+05:30``, ``-08`` or ``GMT+01:00``) as pandas
    takes it; ``ValueError`` naming it when it is none of these (such as Java's
    short names, ``PST``: PySpark cannot hand over timestamps in them either)."""
    if name in ("Z", "UTC", "GMT", "UT"):
        return timezone.utc
    m = _OFFSET.match(name)
    if m:
        sign = -1 if m.group(1) == "-" else 1
        h, mi, se = (int(g or 0) for g in m.group(2, 3, 4))
        return timezone(sign * timedelta(hours=h, minutes=mi, seconds=se))
    try:
        pd.Timestamp(0).tz_localize(name)
    except Exception as e:  # noqa: BLE001 - zoneinfo's and pandas' several errors alike
        raise ValueError(f"the session time zone {name!r} is not one pandas knows: {e}") from None
    return name
