"""Demand bookkeeping from XPUB subscription messages."""

from __future__ import annotations

import pytest
import zmq

from candlewire.demand import Demand
from candlewire.testing import wait_for
from candlewire.topics import demanded_ticker
from candlewire.zmqutil import subscription, subscriptions


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
    assert d.apply(True, "SIM:A/USDT|tick", 0) == ("SIM:A/USDT", True)
    assert d.apply(True, "SIM:A/USDT|ohlc:60", 1) is None
    assert d.apply(False, "SIM:A/USDT|tick", 2) is None
    assert d.watched("SIM:A/USDT")
    assert d.apply(False, "SIM:A/USDT|ohlc:60", 3) == ("SIM:A/USDT", False)
    assert d.expired(12) == [] and d.expired(13) == ["SIM:A/USDT"]
    assert d.expired(100) == [], "reported once"


def test_resubscribing_within_the_grace_cancels_the_expiry() -> None:
    d = Demand(grace_s=10)
    d.apply(True, "SIM:A/USDT|tick", 0)
    d.apply(False, "SIM:A/USDT|tick", 1)
    assert d.apply(True, "SIM:A/USDT|tick", 5) == ("SIM:A/USDT", True)
    assert d.expired(100) == []


def test_other_messages_are_ignored() -> None:
    assert subscription(b"") is None and subscription(b"\x02SIM:A/USDT|tick") is None
    d = Demand(grace_s=1)
    for subscribed, topic in ((True, "RESPONSE:c"), (False, "SIM:A/USDT|tick")):
        assert d.apply(subscribed, topic, 0) is None
    assert d.tickers() == [] and d.idle_since == {}


def test_subscriptions_yields_each_change_waiting_on_an_xpub() -> None:
    ctx = zmq.Context()
    xpub, sub = ctx.socket(zmq.XPUB), ctx.socket(zmq.SUB)
    try:
        port = xpub.bind_to_random_port("tcp://127.0.0.1")
        sub.connect(f"tcp://127.0.0.1:{port}")
        sub.subscribe("SIM:A/USDT|tick")
        assert xpub.poll(5000)
        sub.unsubscribe("SIM:A/USDT|tick")
        # The unsubscribe follows on the same connection, whenever it arrives.
        changes: list[tuple[bool, str]] = []

        def both_arrived() -> bool:
            changes.extend(subscriptions(xpub))
            return len(changes) >= 2

        wait_for(both_arrived)
        assert changes == [(True, "SIM:A/USDT|tick"), (False, "SIM:A/USDT|tick")]
        assert list(subscriptions(xpub)) == [], "nothing left, and it does not block"
    finally:
        sub.close(linger=0)
        xpub.close(linger=0)
        ctx.term()
