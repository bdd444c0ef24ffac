"""A local HTTP server answering the Binance REST endpoints ccxt calls for markets and klines.

It checks our ccxt adapter (pagination, symbol mapping, rate-limit-friendly use), not ccxt.
Klines come from SIM so the expected values are known.
"""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit

from ingest.exchanges.base import Page
from ingest.exchanges.replay import kline_row
from ingest.exchanges.sim import SimExchange

SYMBOLS = {"BTCUSDT": ("BTC", "USDT"), "ETHUSDT": ("ETH", "USDT")}
INTERVAL_S = {"1m": 60, "5m": 300, "1h": 3600}


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
                else:
                    self.send_response(404)
                    self.end_headers()
                    return
                data = json.dumps(body).encode()
                self.send_response(200)
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

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_port}"

    def __enter__(self) -> BinanceStandIn:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()
