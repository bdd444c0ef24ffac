"""What an ingestor lets into the ticks topic: positive prices, non-negative sizes, times
within the window of now (recordings exempt from its past bound)."""

from __future__ import annotations

import threading
import time

import pytest

from candlewire.kafka import TICKS
from ingest.jobs import run_stream, tick_problem
from proto import market_pb2
from tests.support import RecordingSink

NOW = time.time_ns()
S = 1_000_000_000


def tick(price: str = "1.5", size: str = "2", at: int = NOW) -> market_pb2.Tick:
    return market_pb2.Tick(ticker="SIM:BTC/USDT", price=price, size=size, exchange_time_ns=at)


@pytest.mark.parametrize(
    ("t", "problem"),
    [
        (tick(), None),
        (tick(size="0"), None),
        (tick(price="0"), "price"),
        (tick(price="-1"), "price"),
        (tick(price="NaN"), "price"),
        (tick(price="Infinity"), "price"),
        (tick(price="abc"), "not_decimal"),
        (tick(size="-0.1"), "size"),
        (tick(size="nan"), "size"),
        # Beyond a float's range, a decimal still: judged exactly, not as a float would be.
        (tick(price="1e-400"), None),
        (tick(price="1e400", size="1e999"), None),
        (tick(size="-1e-400"), "size"),
        (tick(size="-0"), None),
        (tick(price="0x10"), "not_decimal"),
        (tick(price="-inf"), "price"),
        (tick(at=NOW + 59 * S), None),
        (tick(at=NOW + 61 * S), "ahead"),
        (tick(at=NOW - 3599 * S), None),
        (tick(at=NOW - 3601 * S), "behind"),
        # The bounds themselves are in the window, a nanosecond past them is not.
        (tick(at=NOW + 60 * S), None),
        (tick(at=NOW + 60 * S + 1), "ahead"),
        (tick(at=NOW - 3600 * S), None),
        (tick(at=NOW - 3600 * S - 1), "behind"),
    ],
)
def test_tick_problem(t: market_pb2.Tick, problem: str | None) -> None:
    assert tick_problem(t, NOW, 60, 3600) == problem


def test_an_unbounded_window_lets_any_time_in() -> None:
    far = [tick(at=NOW + 10**18), tick(at=NOW - 10**18)]
    assert [tick_problem(t, NOW, float("inf"), float("inf")) for t in far] == [None, None]
    assert [tick_problem(t, NOW, 60, None) for t in far] == ["ahead", None]


class Listing:
    name = "SIM"

    def __init__(self, ticks: list[market_pb2.Tick], recorded: bool = False) -> None:
        self.ticks, self.recorded = ticks, recorded

    def trades(self, ticker: str, stop: threading.Event):
        yield from self.ticks


@pytest.mark.parametrize("recorded", [False, True])
def test_bad_trades_are_dropped_and_counted_good_ones_sent(recorded: bool) -> None:
    now = time.time_ns()
    good, old = tick(at=now), tick(at=now - 7 * 86_400 * S)
    ticks = [good, tick(price="-5", at=now), tick(at=now + 3600 * S), old, tick(size="-1")]
    sink, dropped = RecordingSink(), []
    sent = run_stream(
        "SIM:BTC/USDT", Listing(ticks, recorded), sink, threading.Event(), (60, 86_400),
        dropped.append,
    )  # fmt: skip
    kept = [good, old] if recorded else [good]
    assert sink.sent(TICKS.name) == kept and sent == len(kept)
    assert sorted(dropped) == sorted(["price", "ahead", "size", *([] if recorded else ["behind"])])
