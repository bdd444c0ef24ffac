"""Demand bookkeeping from XPUB subscription messages."""

from __future__ import annotations

import pytest

from candlewire.demand import Demand
from candlewire.topics import demanded_ticker


@pytest.mark.parametrize(
    ("subscription", "ticker"),
    [
        ("SIM:BTC/USDT|tick", "SIM:BTC/USDT"),
        ("SIM:BTC/USDT|ohlc:60", "SIM:BTC/USDT"),
        ("SIM:BTC/USDT|", "SIM:BTC/USDT"),
        ("SIM:BTC/USDT|error", None),
        ("SIM:BTC/USDT", None),
        ("RESPONSE:client-1", None),
        ("INGESTOR:SIM", None),
        ("sim:btc|tick", None),
        ("SIM:BTC/USDT|tickets", None),
    ],
)
def test_which_subscriptions_demand_a_ticker(subscription: str, ticker: str | None) -> None:
    assert demanded_ticker(subscription) == ticker


def test_a_ticker_is_watched_while_any_of_its_topics_is() -> None:
    d = Demand(grace_s=10)
    assert d.apply(b"\x01SIM:A/USDT|tick", 0) == ("SIM:A/USDT", True)
    assert d.apply(b"\x01SIM:A/USDT|ohlc:60", 1) is None
    assert d.apply(b"\x00SIM:A/USDT|tick", 2) is None
    assert d.watched("SIM:A/USDT")
    assert d.apply(b"\x00SIM:A/USDT|ohlc:60", 3) == ("SIM:A/USDT", False)
    assert d.expired(12) == [] and d.expired(13) == ["SIM:A/USDT"]
    assert d.expired(100) == [], "reported once"


def test_resubscribing_within_the_grace_cancels_the_expiry() -> None:
    d = Demand(grace_s=10)
    d.apply(b"\x01SIM:A/USDT|tick", 0)
    d.apply(b"\x00SIM:A/USDT|tick", 1)
    assert d.apply(b"\x01SIM:A/USDT|tick", 5) == ("SIM:A/USDT", True)
    assert d.expired(100) == []


def test_other_messages_are_ignored() -> None:
    d = Demand(grace_s=1)
    for msg in (b"", b"\x02SIM:A/USDT|tick", b"\x01RESPONSE:c", b"\x00SIM:A/USDT|tick"):
        assert d.apply(msg, 0) is None
    assert d.tickers() == [] and d.idle_since == {}
