"""Live messages as Python values: what :meth:`Client.subscribe` yields.

On the wire prices are decimal strings and times epoch nanoseconds or milliseconds (the
protobuf contract in ``proto/market.proto``); here they are :class:`~decimal.Decimal` and
timezone-aware UTC :class:`~datetime.datetime`. ``stream`` is the message's place in its
live stream: pass it as ``since=`` to resume right after it. ``subscribe(..., raw=True)``
yields the protobuf messages instead.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta
from decimal import Decimal

from google.protobuf.message import Message

from candlewire.times import EPOCH
from proto import market_pb2

SIDES = {market_pb2.BUY: "buy", market_pb2.SELL: "sell"}


def plain(value: Decimal) -> str:
    """A decimal as people write it: no exponent, no trailing zeros, zero as ``0``."""
    text = format(value.normalize(), "f")
    return "0" if text in ("-0", "0") else text


def utc(ns: int = 0, ms: int = 0) -> datetime:
    """Epoch nanoseconds or milliseconds as an aware datetime (to the microsecond)."""
    return EPOCH + timedelta(microseconds=ns // 1000 if ns else ms * 1000)


@dataclass(frozen=True, slots=True)
class Tick:
    ticker: str
    price: Decimal
    size: Decimal
    side: str  # "buy", "sell", or "" when the venue does not say
    trade_id: str
    time: datetime  # when the exchange matched it, UTC
    time_ns: int  # the same, exactly
    stream: market_pb2.StreamPosition = field(compare=False, hash=False, repr=False)

    @classmethod
    def from_proto(cls, m: market_pb2.Tick) -> Tick:
        return cls(
            ticker=m.ticker,
            price=Decimal(m.price),
            size=Decimal(m.size),
            side=SIDES.get(m.side, ""),
            trade_id=m.trade_id,
            time=utc(ns=m.exchange_time_ns),
            time_ns=m.exchange_time_ns,
            stream=m.stream,
        )


@dataclass(frozen=True, slots=True)
class Candle:
    ticker: str
    period_s: int
    open_time: datetime  # the interval's inclusive start, UTC
    open: Decimal
    high: Decimal
    low: Decimal
    close: Decimal
    volume: Decimal
    trade_count: int
    closed: bool  # False while the interval is still forming
    stream: market_pb2.StreamPosition = field(compare=False, hash=False, repr=False)

    @classmethod
    def from_proto(cls, m: market_pb2.OHLC) -> Candle:
        return cls(
            ticker=m.ticker,
            period_s=m.period_s,
            open_time=utc(ms=m.open_time_ms),
            open=Decimal(m.open),
            high=Decimal(m.high),
            low=Decimal(m.low),
            close=Decimal(m.close),
            volume=Decimal(m.volume),
            trade_count=m.trade_count,
            closed=m.closed,
            stream=m.stream,
        )


def typed(msg: Message) -> Tick | Candle | Message:
    """A Tick or OHLC message as its dataclass; anything else as it is."""
    if isinstance(msg, market_pb2.Tick):
        return Tick.from_proto(msg)
    if isinstance(msg, market_pb2.OHLC):
        return Candle.from_proto(msg)
    return msg
