"""``candlewire watch --since``: durations and ISO times."""

from __future__ import annotations

import argparse
from datetime import UTC, datetime, timedelta

import pytest

from launcher.cli import parse_since

NOW = datetime(2026, 11, 23, 12, 0, tzinfo=UTC)


def test_durations_count_back_from_now() -> None:
    assert parse_since("10m", NOW) == NOW - timedelta(minutes=10)
    assert parse_since("90s", NOW) == NOW - timedelta(seconds=90)
    assert parse_since("2h", NOW) == NOW - timedelta(hours=2)


def test_iso_times_are_utc_unless_they_say() -> None:
    assert parse_since("2026-11-23T10:00") == datetime(2026, 11, 23, 10, 0, tzinfo=UTC)
    assert parse_since("2026-11-23T10:00+01:00").utcoffset() == timedelta(hours=1)


def test_anything_else_is_a_clear_error() -> None:
    with pytest.raises(argparse.ArgumentTypeError, match="duration"):
        parse_since("yesterday")
