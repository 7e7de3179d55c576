"""Event times as people read them: ``gpucost query`` shows the records' nanosecond timestamps as ISO-8601 UTC.

Why: every record's times are integer nanoseconds since the epoch (exact, and what a consumer joins on), but
``1736121600000000000`` is not a time anyone reads. Which columns are times is derived from the record schemas
(every field named ``…_ns`` is an event time, but for a length of time marked ``Duration``: a kernel line's
``busy_ns``), so a column the query computes under another name (a length ``… AS span_ns``) is not mistaken for
one. Raw integers stay one flag away (``--raw-times``, or the environment).
"""

from __future__ import annotations

import datetime as dt
import os
from collections.abc import Sequence
from typing import Any

from gpucost.schemas.records import OUTPUT_KINDS, Duration

__all__ = ["EVENT_TIME_COLUMNS", "RAW_TIMES_ENV", "iso_ns", "raw_times_env", "readable_times"]

#: the output columns that hold event times: every record field whose name ends in ``_ns``, but for durations
EVENT_TIME_COLUMNS = frozenset(
    name
    for model in OUTPUT_KINDS.values()
    for name, field in model.model_fields.items()
    if name.endswith("_ns") and Duration not in field.metadata
)
#: set to a true value (1, true, yes, on), query prints these columns as the integers stored
RAW_TIMES_ENV = "GPUCOST_QUERY_RAW_TIMES"
_SWITCH = {
    "1": True,
    "true": True,
    "yes": True,
    "on": True,
    "0": False,
    "false": False,
    "no": False,
    "off": False,
    "": False,
}


def iso_ns(ns: int) -> str:
    """``ns`` (nanoseconds since the epoch) as ISO-8601 UTC, ``2025-01-06T00:00:00Z``, with the nanoseconds when
    there are any (``…T00:00:00.000000250Z``): exact, never through a float. Raises ValueError or OverflowError
    beyond the years 1-9999."""
    seconds, nanos = divmod(ns, 10**9)
    text = (dt.datetime(1970, 1, 1, tzinfo=dt.UTC) + dt.timedelta(seconds=seconds)).strftime("%Y-%m-%dT%H:%M:%S")
    return f"{text}.{nanos:09d}Z" if nanos else f"{text}Z"


def _readable(value: Any) -> Any:
    if not isinstance(value, int) or isinstance(value, bool):
        return value  # NULL, or a column computed as something else
    try:
        return iso_ns(value)
    except (OverflowError, ValueError):
        return value  # no calendar date: shown as stored rather than refused


def readable_times(columns: Sequence[str], rows: Sequence[Sequence[Any]]) -> list[tuple[Any, ...]]:
    """``rows`` with each event-time column's integers as ISO-8601 UTC text, the other columns as they are."""
    times = [c in EVENT_TIME_COLUMNS for c in columns]
    if not any(times):
        return [tuple(r) for r in rows]
    return [tuple(_readable(v) if t else v for v, t in zip(r, times)) for r in rows]


def raw_times_env() -> bool:
    """Whether ``GPUCOST_QUERY_RAW_TIMES`` asks for raw integers; a value that is no yes or no is a ValueError."""
    value = os.environ.get(RAW_TIMES_ENV, "").strip().lower()
    if value not in _SWITCH:
        raise ValueError(f"{RAW_TIMES_ENV}={value!r} is not a yes or no (1, true, yes, on; 0, false, no, off)")
    return _SWITCH[value]
