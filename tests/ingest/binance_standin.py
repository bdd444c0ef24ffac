"""A local HTTP server answering the Binance REST endpoints ccxt calls for markets, klines
and aggregate trades.

It checks our ccxt adapter (pagination, symbol mapping, rate-limit-friendly use), not ccxt.
Klines and trades come from SIM so the expected values are known; like Binance, aggTrades
answers either a time window under an hour or ``fromId``, never both.
"""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit

from ingest.exchanges.base import Page
from ingest.exchanges.replay import kline_row
from ingest.exchanges.sim import GENESIS_MS, MINUTE_MS, SimExchange
from proto import market_pb2

SYMBOLS = {"BTCUSDT": ("BTC", "USDT"), "ETHUSDT": ("ETH", "USDT")}
INTERVAL_S = {"1m": 60, "5m": 300, "1h": 3600}
HOUR_MS = 3_600_000


class BadRequest(Exception):
    """Answered as Binance's HTTP 400 with an error code."""


def exchange_info() -> dict:
    return {
        "timezone": "UTC",
        "serverTime": 0,
        "rateLimits": [],
        "symbols": [
            {
                "symbol": sym,
                "status": "TRADING",
                "baseAsset": base,
                "baseAssetPrecision": 8,
                "quoteAsset": quote,
                "quotePrecision": 8,
                "quoteAssetPrecision": 8,
                "orderTypes": ["LIMIT", "MARKET"],
                "isSpotTradingAllowed": True,
                "isMarginTradingAllowed": False,
                "permissions": ["SPOT"],
                "permissionSets": [["SPOT"]],
                "filters": [
                    {
                        "filterType": "PRICE_FILTER",
                        "minPrice": "0.01",
                        "maxPrice": "1000000.00",
                        "tickSize": "0.01",
                    },
                    {
                        "filterType": "LOT_SIZE",
                        "minQty": "0.00001",
                        "maxQty": "9000.0",
                        "stepSize": "0.00001",
                    },
                    {"filterType": "NOTIONAL", "minNotional": "5.00", "maxNotional": "9000000.00"},
                ],
            }
            for sym, (base, quote) in SYMBOLS.items()
        ],
    }


class BinanceStandIn:
    def __init__(self, page_limit: int = 500) -> None:
        self.sim = SimExchange(name="BINANCE", symbols={"BTC/USDT": 30_000.0, "ETH/USDT": 2_000.0})
        self.page_limit = page_limit
        self.requests: list[str] = []
        self.errors: list[str] = []
        standin = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None:
                pass

            def do_GET(self) -> None:
                url = urlsplit(self.path)
                standin.requests.append(url.path)
                q = {k: v[0] for k, v in parse_qs(url.query).items()}
                if url.path.endswith("/exchangeInfo"):
                    body = exchange_info()
                elif url.path.endswith("/klines"):
                    body = standin.klines(q)
                elif url.path.endswith("/time"):
                    body = {"serverTime": 0}
                elif url.path.endswith("/aggTrades"):
                    try:
                        body = standin.agg_trades(q)
                    except BadRequest as exc:
                        standin.errors.append(str(exc))
                        self.answer(400, {"code": -1128, "msg": str(exc)})
                        return
                else:
                    self.send_response(404)
                    self.end_headers()
                    return
                self.answer(200, body)

            def answer(self, status: int, body: object) -> None:
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def klines(self, q: dict[str, str]) -> list[list]:
        base, quote = SYMBOLS[q["symbol"]]
        period = INTERVAL_S[q["interval"]]
        start = int(q["startTime"])
        limit = min(int(q.get("limit", 500)), self.page_limit)
        candles = self.sim.ohlc_page(
            f"BINANCE:{base}/{quote}", period, Page(0, start, start + limit * period * 1000)
        )
        return [kline_row(c, period) for c in candles[:limit]]

    def agg_trades(self, q: dict[str, str]) -> list[dict]:
        """SIM's trades that have happened, as Binance's aggTrades rows (ids are SIM's)."""
        base, quote = SYMBOLS[q["symbol"]]
        ticker, n = f"BINANCE:{base}/{quote}", self.sim.per_minute
        limit = min(int(q.get("limit", 500)), self.page_limit)
        if "fromId" in q:
            if "startTime" in q or "endTime" in q:
                raise BadRequest("fromId with startTime or endTime")
            first = int(q["fromId"])
            m0 = first // n
            ticks = self.sim.trade_batch(ticker, m0, m0 + limit // n + 2)
            ticks = [t for t in ticks if int(t.trade_id) >= first]
        else:
            start, end = int(q["startTime"]), int(q["endTime"])
            if not 0 <= end - start < HOUR_MS:
                raise BadRequest("startTime and endTime must be under an hour apart")
            m0, m1 = ((t - GENESIS_MS) // MINUTE_MS for t in (start, end))
            ticks = self.sim.trade_batch(ticker, m0, m1 + 1)
            ticks = [t for t in ticks if start <= t.exchange_time_ns // 1_000_000 <= end]
        now = time.time_ns()
        return [
            {
                "a": int(t.trade_id),
                "p": t.price,
                "q": t.size,
                "f": int(t.trade_id),
                "l": int(t.trade_id),
                "T": t.exchange_time_ns // 1_000_000,
                "m": t.side == market_pb2.SELL,  # the buyer made the market: a sell
                "M": True,
            }
            for t in ticks[:limit]
            if t.exchange_time_ns <= now
        ]

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_port}"

    def __enter__(self) -> BinanceStandIn:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()
