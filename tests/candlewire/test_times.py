"""Times as users write them: every accepted form gives the same epoch milliseconds, and
anything else names the argument it came in."""

from __future__ import annotations

from datetime import UTC, date, datetime, timedelta, timezone

import numpy as np
import pandas as pd
import pytest

from candlewire import BadTime, CandlewireError
from candlewire._protocol import HistoryCall
from candlewire.times import to_ms

JAN_1 = 1_704_067_200_000  # 2024-01-01T00:00:00Z
NOON = JAN_1 + 12 * 3_600_000


@pytest.mark.parametrize(
    "value, expected",
    [
        (JAN_1, JAN_1),
        (np.int64(JAN_1), JAN_1),
        ("2024-01-01", JAN_1),
        ("2024-01-01T12:00", NOON),
        ("2024-01-01T12:00:00Z", NOON),
        ("2024-01-01T14:00:00+02:00", NOON),
        (" 2024-01-01T12:00:00.123 ", NOON + 123),
        (date(2024, 1, 1), JAN_1),
        (datetime(2024, 1, 1, 12), NOON),  # naive: UTC, not local time
        (datetime(2024, 1, 1, 12, tzinfo=UTC), NOON),
        (datetime(2024, 1, 1, 7, tzinfo=timezone(timedelta(hours=-5))), NOON),
        (datetime(2024, 1, 1, 12, 0, 0, 999_999), NOON + 999),  # floored, no float rounding
        (pd.Timestamp("2024-01-01T12:00:00.5"), NOON + 500),
        (pd.Timestamp("2024-01-01T13:00", tz="Europe/Paris"), NOON),
        (np.datetime64("2024-01-01T12:00:00.250"), NOON + 250),
        (np.datetime64("2024-01-01"), JAN_1),
    ],
)
def test_every_accepted_form_is_the_same_instant(value, expected) -> None:
    assert to_ms(value) == expected


@pytest.mark.parametrize(
    "value", ["2024-13-01", "yesterday", "", 1.5, True, None, pd.NaT, np.datetime64("NaT"), []]
)
def test_anything_else_names_the_argument(value) -> None:
    with pytest.raises(BadTime) as err:
        to_ms(value, "start")
    assert err.value.argument == "start"
    assert str(err.value).startswith("start=")
    assert isinstance(err.value, CandlewireError) and isinstance(err.value, ValueError)


def test_a_history_request_takes_iso_text_and_says_which_end_is_wrong() -> None:
    call = HistoryCall.build("c1", "BINANCE:BTC/USDT", 3600, "2024-01-01", "2024-01-03", "client")
    assert (call.request.start_ms, call.request.end_ms) == (JAN_1, JAN_1 + 2 * 86_400_000)
    with pytest.raises(BadTime, match=r"^end="):
        HistoryCall.build("c1", "BINANCE:BTC/USDT", 3600, "2024-01-01", "2024-01-3x", "client")
