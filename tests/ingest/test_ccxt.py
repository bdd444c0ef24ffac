"""The ccxt adapter against a local Binance stand-in (urls overridden)."""

from __future__ import annotations

from decimal import Decimal

from ingest.exchanges.base import Page
from ingest.exchanges.ccxt_exchange import CcxtExchange
from ingest.exchanges.sim import GENESIS_MS, MINUTE_MS
from tests.ingest.binance_standin import BinanceStandIn

T0 = 1_700_006_400_000


def adapter(standin: BinanceStandIn) -> CcxtExchange:
    api = f"{standin.url}/api/v3"
    return CcxtExchange(
        "binance",
        urls={"api": {"public": api, "private": api, "v3": api}},
        options={"fetchMarkets": {"types": ["spot"]}, "fetchCurrencies": False},
    )


def test_markets_and_paginated_klines() -> None:
    with BinanceStandIn(page_limit=500) as standin:
        ex = adapter(standin)
        markets = {m.ticker: m for m in ex.markets()}
        assert set(markets) == {"BINANCE:BTC/USDT", "BINANCE:ETH/USDT"}
        btc = markets["BINANCE:BTC/USDT"]
        assert (btc.base, btc.quote, btc.tick_size, btc.lot_size, btc.min_notional) == (
            "BTC",
            "USDT",
            "0.01",
            "0.00001",
            "5",
        )
        assert btc.exchange_symbol == "BTCUSDT"
        page = Page(0, T0, T0 + 1200 * 60_000)  # 1200 candles: three requests of 500
        got = ex.ohlc_page("BINANCE:BTC/USDT", 60, page)
        want = standin.sim.ohlc_page("BINANCE:BTC/USDT", 60, page)

        # ccxt hands OHLCV over as floats; the decimal values must still be equal.
        def key(c):
            return (
                c.open_time_ms,
                *(Decimal(x) for x in (c.open, c.high, c.low, c.close, c.volume)),
            )

        assert [key(c) for c in got] == [key(c) for c in want]
        assert len(got) == 1200
        assert standin.requests.count("/api/v3/klines") == 3


def test_refetch_pages_binance_aggregate_trades_by_id() -> None:
    """A gap's range fetched again through ccxt: the first page by time window, the rest by
    ``fromId`` (Binance refuses both at once); the trades equal SIM's, to the millisecond."""
    with BinanceStandIn(page_limit=50) as standin:
        ex = adapter(standin)
        assert ex.sequential_ids
        ticker = "BINANCE:BTC/USDT"
        want = standin.sim.trade_batch(ticker, *minutes(T0, T0 + 3 * 60_000))
        # Binance stamps trades in milliseconds, so a gap's bounds are whole milliseconds.
        from_ns, to_ns = (trade(want[i])[-1] * 1_000_000 for i in (10, 150))
        for after_id in (None, want[10].trade_id):
            standin.requests.clear()
            got = ex.refetch(ticker, from_ns, to_ns, after_id)
            assert [trade(t) for t in got] == [trade(t) for t in want[10:151]]
            assert standin.requests.count("/api/v3/aggTrades") >= 3  # pages of 50
        assert standin.errors == []


def minutes(start_ms: int, end_ms: int) -> tuple[int, int]:
    return (start_ms - GENESIS_MS) // MINUTE_MS, (end_ms - GENESIS_MS) // MINUTE_MS


def trade(t) -> tuple:
    """A trade as Binance tells it: times in milliseconds, decimals as numbers."""
    ms = t.exchange_time_ns // 1_000_000
    return (t.trade_id, Decimal(t.price), Decimal(t.size), t.side, ms)
