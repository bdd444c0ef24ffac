"""Live messages as Python values: Decimal prices, aware UTC times, frozen, and everything
else passed through as it came."""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime
from decimal import Decimal

import pytest

from candlewire.market import Candle, Tick, typed
from proto import market_pb2
from proto import requests_pb2 as rq

NS = 1_704_067_200_123_456_789  # 2024-01-01T00:00:00.123456789Z


def test_a_tick_keeps_exact_numbers_and_its_time() -> None:
    msg = market_pb2.Tick(
        ticker="X:A/B",
        trade_id="7",
        price="12972.750000",
        size="0.001",
        side=market_pb2.BUY,
        exchange_time_ns=NS,
        stream=market_pb2.StreamPosition(epoch=1, seq=9),
    )
    tick = typed(msg)
    assert isinstance(tick, Tick)
    assert (tick.price, tick.size, tick.side, tick.trade_id) == (
        Decimal("12972.75"),
        Decimal("0.001"),
        "buy",
        "7",
    )
    assert tick.time == datetime(2024, 1, 1, 0, 0, 0, 123456, tzinfo=UTC)
    assert tick.time_ns == NS and tick.stream.seq == 9
    with pytest.raises(dataclasses.FrozenInstanceError):
        tick.price = Decimal(1)  # type: ignore[misc]
    # Equal and hashable by content; where it stood in the stream is not part of it.
    again = typed(
        market_pb2.Tick(
            ticker="X:A/B",
            trade_id="7",
            price="12972.75",
            size="0.001",
            side=market_pb2.BUY,
            exchange_time_ns=NS,
        )
    )
    assert again == tick and hash(again) == hash(tick)


def test_a_candle_keeps_exact_numbers_and_its_open_time() -> None:
    msg = market_pb2.OHLC(
        ticker="X:A/B",
        period_s=3600,
        open_time_ms=1_704_067_200_000,
        open="1",
        high="2.5",
        low="0.75",
        close="2",
        volume="10.000",
        trade_count=4,
        closed=True,
    )
    candle = typed(msg)
    assert isinstance(candle, Candle)
    assert candle.open_time == datetime(2024, 1, 1, tzinfo=UTC)
    assert (candle.high, candle.low, candle.volume) == (Decimal("2.5"), Decimal("0.75"), 10)
    assert (candle.period_s, candle.trade_count, candle.closed) == (3600, 4, True)


def test_other_messages_pass_through_and_bad_numbers_raise() -> None:
    other = rq.SubscriptionError(ticker="X:A/B")
    assert typed(other) is other
    from decimal import InvalidOperation

    with pytest.raises(InvalidOperation):
        typed(market_pb2.Tick(ticker="X:A/B", price="1,5", size="1"))
