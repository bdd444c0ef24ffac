"""Client and AsyncClient are two shells over one core: their public APIs must not drift,
and both refuse what names no data before anything is sent or read."""

from __future__ import annotations

import asyncio
import inspect
import typing

import pytest

from candlewire import AsyncClient, CandlewireError, Client
from candlewire.config import Settings

# Blocking on both: closing frees sockets, subscribe returns an (async) iterator.
NOT_AWAITED = {"close", "subscribe"}


def public(cls: type) -> dict[str, object]:
    return {n: v for n, v in vars(cls).items() if not n.startswith("_")}


def shape(fn: object) -> list[tuple[str, object, object]]:
    """Parameters by name, kind and default; annotations differ (sync vs asyncio types)."""
    return [(p.name, p.kind, p.default) for p in inspect.signature(fn).parameters.values()]


def test_both_clients_offer_the_same_public_names() -> None:
    assert sorted(public(Client)) == sorted(public(AsyncClient))


def test_every_method_takes_the_same_parameters() -> None:
    for name, sync in public(Client).items():
        if callable(sync):
            assert shape(sync) == shape(getattr(AsyncClient, name)), name
    assert shape(Client.__init__) == shape(AsyncClient.__init__)


def test_history_overloads_match_in_both_shells() -> None:
    """A type checker sees a Book for ``period="book"`` and a table otherwise, on both."""
    for cls in (Client, AsyncClient):
        returns = [
            inspect.signature(f).return_annotation for f in typing.get_overloads(cls.history)
        ]
        assert returns == ["Book", "pa.Table"], cls
    sync = [shape(f) for f in typing.get_overloads(Client.history)]
    assert sync == [shape(f) for f in typing.get_overloads(AsyncClient.history)]


def test_async_methods_are_awaitable_and_sync_ones_are_not() -> None:
    for name, sync in public(Client).items():
        if not callable(sync):
            continue
        awaited = inspect.iscoroutinefunction(getattr(AsyncClient, name))
        assert awaited == (name not in NOT_AWAITED), name
        assert not inspect.iscoroutinefunction(sync), name


NAMES_NO_DATA = [
    ("BTCUSDT", "tick", "is not EXCHANGE:BASE/QUOTE"),
    ("BINANCE:BTC/USDT", "candles", "data type 'candles'"),
    ("BINANCE:BTC/USDT", "ohlc:61", "data type 'ohlc:61'"),
    ("BINANCE:BTC/USDT", "ohlc", "data type 'ohlc'"),
]


@pytest.mark.parametrize(("ticker", "data_type", "says"), NAMES_NO_DATA)
def test_a_subscription_to_what_names_no_data_is_refused_at_once(
    settings: Settings, ticker: str, data_type: str, says: str
) -> None:
    """It would wait for ever: nothing is published on such a topic."""
    with Client(settings) as client, pytest.raises(CandlewireError, match=says):
        client.subscribe(ticker, data_type)

    async def subscribe() -> None:
        async with AsyncClient(settings) as client:
            client.subscribe(ticker, data_type)

    with pytest.raises(CandlewireError, match=says):
        asyncio.run(subscribe())


@pytest.mark.parametrize(
    ("ticker", "period", "says"),
    [
        ("BTCUSDT", 60, "is not EXCHANGE:BASE/QUOTE"),
        ("BINANCE:BTC/USDT", 61, "period 61 is not one of"),
    ],
)
def test_a_history_read_of_what_names_no_data_is_refused_before_the_catalog(
    settings: Settings, ticker: str, period: int, says: str
) -> None:
    """Refused as such, not as the catalog's absence (nothing listens at ``settings``'s)."""
    with Client(settings) as client, pytest.raises(CandlewireError, match=says):
        client.history(ticker, period, "2024-01-01", "2024-01-02")
