"""The ccxt adapter against a local Binance stand-in (urls overridden)."""

from __future__ import annotations

from decimal import Decimal

from ingest.exchanges.base import Page
from ingest.exchanges.ccxt_exchange import CcxtExchange
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
