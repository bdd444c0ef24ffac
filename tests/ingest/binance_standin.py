"""A local stand-in of Binance: the REST endpoints ccxt calls for markets, klines, aggregate
trades and the depth snapshot, and the market-streams WebSocket's aggregate trades and
diff-depth stream.

It checks our ccxt adapter (pagination, symbol mapping, rate-limit-friendly use, the book's
seam), not ccxt. Klines, trades and the book come from SIM so the expected values are known;
like Binance, aggTrades answers either a time window under an hour or ``fromId``, never
both, and ``<symbol>@depth@100ms`` sends every 100 ms the levels that changed, numbered
``U`` (first update) to ``u`` (last), whose sizes are the levels' final ones.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit

import websockets

from ingest.exchanges.base import Page
from ingest.exchanges.replay import kline_row
from ingest.exchanges.sim import GENESIS_MS, MINUTE_MS, SimExchange
from proto import market_pb2

SYMBOLS = {"BTCUSDT": ("BTC", "USDT"), "ETHUSDT": ("ETH", "USDT")}
INTERVAL_S = {"1m": 60, "5m": 300, "1h": 3600}
HOUR_MS = 3_600_000
DEPTH_EVERY_S = 0.1  # the stream's @100ms


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


def agg_row(t: market_pb2.Tick) -> dict:
    """A SIM trade as Binance's aggregate trade (its id is SIM's)."""
    return {
        "a": int(t.trade_id),
        "p": t.price,
        "q": t.size,
        "f": int(t.trade_id),
        "l": int(t.trade_id),
        "T": t.exchange_time_ns // 1_000_000,
        "m": t.side == market_pb2.SELL,  # the buyer made the market: a sell
        "M": True,
    }


def _feed(items: Iterator, got: asyncio.Queue, loop: asyncio.AbstractEventLoop) -> None:
    """A blocking iterator (SIM's, paced in real time) into ``got``, from a thread."""
    for item in items:
        loop.call_soon_threadsafe(got.put_nowait, item)


class BinanceStandIn:
    def __init__(self, page_limit: int = 500, rate: float = 1.0, markets_s: float = 0.0) -> None:
        self.sim = SimExchange(
            name="BINANCE", symbols={"BTC/USDT": 30_000.0, "ETH/USDT": 2_000.0}, rate=rate
        )
        self.page_limit = page_limit
        self.markets_s = markets_s  # how long exchangeInfo takes to answer
        self.requests: list[str] = []
        self.errors: list[str] = []
        self.skip_events = 0  # depth events to leave out: a sequence jump for the client
        # The next REST requests answered as an overloaded venue: (HTTP status, Binance code).
        self.refusals: list[tuple[int, int]] = []
        self.depth_sent = 0
        self.trades_sent = 0
        self._loop = asyncio.new_event_loop()
        self._ws: websockets.Server | None = None
        standin = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None:
                pass

            def do_GET(self) -> None:
                url = urlsplit(self.path)
                standin.requests.append(url.path)
                q = {k: v[0] for k, v in parse_qs(url.query).items()}
                if standin.refusals and not url.path.endswith("/exchangeInfo"):
                    status, code = standin.refusals.pop(0)
                    self.answer(status, {"code": code, "msg": "Service unavailable."})
                    return
                if url.path.endswith("/exchangeInfo"):
                    time.sleep(standin.markets_s)
                    body = exchange_info()
                elif url.path.endswith("/klines"):
                    body = standin.klines(q)
                elif url.path.endswith("/time"):
                    body = {"serverTime": 0}
                elif url.path.endswith("/depth"):
                    body = standin.depth(q)
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
        return [agg_row(t) for t in ticks[:limit] if t.exchange_time_ns <= now]

    def depth(self, q: dict[str, str]) -> dict:
        """SIM's book now, as ``GET /api/v3/depth`` (``lastUpdateId``: its last update)."""
        base, quote = SYMBOLS[q["symbol"]]
        book = self.sim.book_snapshot(f"BINANCE:{base}/{quote}")
        limit = int(q.get("limit", 100))
        return {
            "lastUpdateId": book.venue_seq,
            "bids": [[lv.price, lv.size] for lv in book.bids[:limit]],
            "asks": [[lv.price, lv.size] for lv in book.asks[:limit]],
        }

    async def _session(self, ws: websockets.ServerConnection) -> None:
        """One market-streams connection: ``SUBSCRIBE`` answered, then each stream it names."""
        streams: list[asyncio.Task] = []
        try:
            async for raw in ws:
                msg = json.loads(raw)
                if msg.get("method") != "SUBSCRIBE":
                    continue
                await ws.send(json.dumps({"result": None, "id": msg["id"]}))
                for name in msg["params"]:
                    symbol, kind, *_ = name.split("@")
                    stream = {"depth": self._depth, "aggTrade": self._agg_trades}[kind]
                    streams.append(asyncio.create_task(stream(ws, symbol.upper())))
        except websockets.ConnectionClosed:
            pass
        finally:
            for task in streams:
                task.cancel()

    async def _depth(self, ws: websockets.ServerConnection, symbol: str) -> None:
        """SIM's deltas from now, gathered into one ``depthUpdate`` every 100 ms."""
        base, quote = SYMBOLS[symbol]
        stop, got = threading.Event(), asyncio.Queue()
        deltas = self.sim.book_deltas(f"BINANCE:{base}/{quote}", stop)
        loop = asyncio.get_running_loop()
        threading.Thread(target=_feed, args=(deltas, got, loop), daemon=True).start()
        try:
            while True:
                await asyncio.sleep(DEPTH_EVERY_S)
                batch = [got.get_nowait() for _ in range(got.qsize())]
                if not batch:
                    continue
                if self.skip_events:
                    self.skip_events -= 1
                    continue
                bids = {lv.price: lv.size for d in batch for lv in d.bids}
                asks = {lv.price: lv.size for d in batch for lv in d.asks}
                event = {
                    "e": "depthUpdate",
                    "E": batch[-1].exchange_time_ns // 1_000_000,
                    "s": symbol,
                    "U": batch[0].venue_seq,
                    "u": batch[-1].venue_seq,
                    "b": [list(level) for level in bids.items()],
                    "a": [list(level) for level in asks.items()],
                }
                await ws.send(json.dumps(event))
                self.depth_sent += 1
        finally:
            stop.set()

    async def _agg_trades(self, ws: websockets.ServerConnection, symbol: str) -> None:
        """SIM's trades as they happen, one ``aggTrade`` event each."""
        base, quote = SYMBOLS[symbol]
        stop, got = threading.Event(), asyncio.Queue()
        trades = self.sim.trades(f"BINANCE:{base}/{quote}", stop)
        threading.Thread(
            target=_feed, args=(trades, got, asyncio.get_running_loop()), daemon=True
        ).start()
        try:
            while True:
                t = await got.get()
                event = {"e": "aggTrade", "E": t.exchange_time_ns // 1_000_000, "s": symbol}
                await ws.send(json.dumps({**event, **agg_row(t)}))
                self.trades_sent += 1
        finally:
            stop.set()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_port}"

    @property
    def ws_url(self) -> str:
        """Where ccxt's ``urls.api.ws.spot`` points (ccxt tells spot by ``/stream``)."""
        assert self._ws is not None
        port = next(iter(self._ws.sockets)).getsockname()[1]
        return f"ws://127.0.0.1:{port}/stream"

    def __enter__(self) -> BinanceStandIn:
        self.thread.start()
        self._loop_thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._loop_thread.start()

        async def serve() -> websockets.Server:
            return await websockets.serve(self._session, "127.0.0.1", 0)

        self._ws = asyncio.run_coroutine_threadsafe(serve(), self._loop).result(5)
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()
        with contextlib.suppress(Exception):
            asyncio.run_coroutine_threadsafe(self._close_ws(), self._loop).result(5)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._loop_thread.join(5)
        self._loop.close()

    async def _close_ws(self) -> None:
        """On the server's own loop: its connections closed and their streams ended."""
        if self._ws is not None:
            self._ws.close()
            await self._ws.wait_closed()
        others = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        for task in others:
            task.cancel()
        await asyncio.gather(*others, return_exceptions=True)
