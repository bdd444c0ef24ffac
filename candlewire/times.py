"""Times as users write them, to the epoch milliseconds the wire carries.

Accepted: epoch milliseconds (an integer), ISO 8601 text (``"2024-01-01"``,
``"2024-01-01T12:00"``, ``"2024-01-01T12:00:00+02:00"``, ``"...Z"``), ``date`` (its
midnight), ``datetime``, pandas ``Timestamp`` and numpy ``datetime64``. A time without a
zone is UTC, never the machine's local time: a request means the same span wherever it is
sent from.
"""

from __future__ import annotations

import numbers
from datetime import UTC, date, datetime, time
from typing import Any

from candlewire.errors import BadTime

# What the clients accept wherever a time is asked for; see :func:`to_ms`.
TimeLike = int | str | date | datetime | Any
EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def to_ms(value: TimeLike, name: str = "time") -> int:
    """Milliseconds since the epoch, or :class:`BadTime` naming the argument ``name``."""
    if isinstance(value, bool):
        raise BadTime(name, value, "a bool is not a time")
    if value is None or str(value) == "NaT":
        raise BadTime(name, value, "a time is needed")
    if isinstance(value, numbers.Integral):
        return int(value)
    if isinstance(value, str):
        return _from_datetime(_parse_iso(value, name))
    if isinstance(value, datetime):  # pandas Timestamp too
        return _from_datetime(value)
    if isinstance(value, date):
        return _from_datetime(datetime.combine(value, time()))
    if type(value).__name__ == "datetime64":  # numpy, without importing it here
        return int(value.astype("datetime64[ms]").astype("int64"))
    raise BadTime(
        name,
        value,
        "give epoch milliseconds, ISO 8601 text, a date, a datetime, a pandas Timestamp or "
        "a numpy datetime64",
    )


def _parse_iso(text: str, name: str) -> datetime:
    try:
        return datetime.fromisoformat(text.strip())
    except ValueError:
        raise BadTime(name, text, "not ISO 8601, e.g. 2024-01-01 or 2024-01-01T12:00Z") from None


def _from_datetime(value: datetime) -> int:
    """Floored to the millisecond, in integers (a float timestamp rounds)."""
    if value.tzinfo is None:
        value = value.replace(tzinfo=UTC)
    delta = value - EPOCH
    return (delta.days * 86_400 + delta.seconds) * 1000 + delta.microseconds // 1000
