"""Any ccxt exchange: ``load_markets``, paginated ``fetch_ohlcv``, ``watch_trades``, and
paginated ``fetch_trades`` to refetch a gap in the live stream.

ccxt's own rate limiter stays on (``enableRateLimit``); our retries only wrap ccxt's
transient errors. ``urls`` and ``options`` pass straight to ccxt, which is how the tests
point the adapter at a local stand-in of the exchange's REST API.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from typing import Any

import ccxt

from ingest.exchanges.base import (
    Exchange,
    ExchangeError,
    Page,
    RangeUnavailable,
    UnknownSymbol,
    dec_str,
)
from proto import market_pb2

TIMEFRAMES = {60: "1m", 300: "5m", 900: "15m", 3600: "1h", 14400: "4h", 86400: "1d"}
# Venues whose trade ids are consecutive per symbol and whose REST trades page by
# ``fromId``, with the watch_trades params that make the stream carry the same ids: Binance's
# REST trades with time ranges are aggregate trades, so the stream watches aggTrade too.
SEQUENTIAL: dict[str, dict[str, str]] = {"binance": {"name": "aggTrade"}}
REFETCH_LIMIT = 1000
HOUR_MS = 3_600_000  # the widest time window Binance's aggTrades answers


def _num(value: Any) -> str:
    return "" if value is None else dec_str(value)


class CcxtExchange(Exchange):
    def __init__(self, exchange_id: str, name: str | None = None, **config: Any) -> None:
        self.exchange_id = exchange_id
        self.name = name or exchange_id.upper()
        self.config = {"enableRateLimit": True, **config}
        self.client = getattr(ccxt, exchange_id)(self.config)
        self.sequential_ids = exchange_id in SEQUENTIAL
        self._watch_params = SEQUENTIAL.get(exchange_id, {})
        self._markets: list[market_pb2.Market] | None = None
        self._symbols: dict[str, str] = {}

    def _call(self, fn: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except ccxt.BadSymbol as exc:
            raise UnknownSymbol(str(exc)) from None
        except ccxt.BaseError as exc:  # NetworkError, ExchangeNotAvailable, RateLimitExceeded...
            raise ExchangeError(f"{self.exchange_id}: {type(exc).__name__}: {exc}") from None

    def markets(self) -> list[market_pb2.Market]:
        raw = self._call(self.client.load_markets, True)
        out = []
        for m in raw.values():
            if not m.get("spot", True):
                continue
            ticker = f"{self.name}:{m['base']}/{m['quote']}"
            self._symbols[ticker] = m["symbol"]
            precision, limits = m.get("precision") or {}, m.get("limits") or {}
            out.append(
                market_pb2.Market(
                    ticker=ticker,
                    exchange=self.name,
                    base=m["base"],
                    quote=m["quote"],
                    tick_size=_num(precision.get("price")),
                    lot_size=_num(precision.get("amount")),
                    min_notional=_num((limits.get("cost") or {}).get("min")),
                    status=market_pb2.TRADING if m.get("active", True) else market_pb2.HALTED,
                    update_time_ms=int(time.time() * 1000),
                    exchange_symbol=m.get("id", ""),
                )
            )
        self._markets = out
        return out

    def refresh_symbols(self) -> None:
        self.markets()

    def ohlc_page(self, ticker: str, period_s: int, page: Page) -> list[market_pb2.OHLC]:
        symbol = self.symbol(ticker)
        timeframe = TIMEFRAMES[period_s]
        now_ms = int(time.time() * 1000)
        out: list[market_pb2.OHLC] = []
        since = page.start_ms
        while since < page.end_ms:
            rows = self._call(self.client.fetch_ohlcv, symbol, timeframe, since, 1000)
            rows = [r for r in rows if since <= r[0] < page.end_ms]
            if not rows:
                break
            for t, o, h, low, c, v in rows:
                if t + period_s * 1000 > now_ms:
                    continue  # still forming
                out.append(
                    market_pb2.OHLC(
                        ticker=ticker,
                        period_s=period_s,
                        open_time_ms=int(t),
                        open=dec_str(o),
                        high=dec_str(h),
                        low=dec_str(low),
                        close=dec_str(c),
                        volume=dec_str(v),
                        closed=True,
                    )
                )
            since = int(rows[-1][0]) + period_s * 1000
        return out

    def refetch(
        self, ticker: str, from_ns: int, to_ns: int, after_id: str | None = None
    ) -> list[market_pb2.Tick]:
        """``fetch_trades`` page by page until past ``to_ns``: by ``fromId`` on venues with
        sequential ids (from ``after_id``, else from the first trade of the time window),
        by ``since`` elsewhere."""
        symbol = self.symbol(ticker)
        if not self.client.has.get("fetchTrades"):
            raise RangeUnavailable(f"{self.exchange_id} does not serve past trades")
        to_ms = to_ns // 1_000_000
        cursor_ms = from_ns // 1_000_000
        from_id = after_id if self.sequential_ids and after_id else None
        seen: set[str] = set()
        out: list[market_pb2.Tick] = []
        while cursor_ms <= to_ms:
            if from_id is not None:
                params = {"fromId": int(from_id)}
                rows = self._call(self.client.fetch_trades, symbol, None, REFETCH_LIMIT, params)
            elif self.sequential_ids:
                until = {"until": min(to_ms, cursor_ms + HOUR_MS - 1)}
                rows = self._call(self.client.fetch_trades, symbol, cursor_ms, REFETCH_LIMIT, until)
            else:
                rows = self._call(self.client.fetch_trades, symbol, cursor_ms, REFETCH_LIMIT)
            fresh = [r for r in rows if str(r["id"]) not in seen]
            if not fresh:
                if from_id is None and self.sequential_ids:
                    cursor_ms += HOUR_MS  # an hour without trades; look in the next
                    continue
                break
            for r in fresh:
                seen.add(str(r["id"]))
                if from_ns <= int(r["timestamp"]) * 1_000_000 <= to_ns:
                    out.append(self._tick(ticker, r))
            last = fresh[-1]
            if int(last["timestamp"]) > to_ms:
                break
            if self.sequential_ids:
                from_id = str(int(last["id"]) + 1)
            else:
                cursor_ms = int(last["timestamp"])
        return out

    def trades(self, ticker: str, stop: threading.Event) -> Iterator[market_pb2.Tick]:
        """Websocket trades through ccxt.pro when the exchange has them, else REST polling."""
        symbol = self.symbol(ticker)
        import ccxt.pro as ccxtpro

        if self.client.has.get("watchTrades") and hasattr(ccxtpro, self.exchange_id):
            yield from self._watch(ccxtpro, symbol, ticker, stop)
            return
        since = int(time.time() * 1000)
        seen: set[str] = set()
        while not stop.wait(1.0):
            for t in self._call(self.client.fetch_trades, symbol, since):
                if str(t["id"]) not in seen:
                    seen.add(str(t["id"]))
                    since = max(since, int(t["timestamp"]))
                    yield self._tick(ticker, t)

    def _watch(
        self, ccxtpro: Any, symbol: str, ticker: str, stop: threading.Event
    ) -> Iterator[market_pb2.Tick]:
        loop = asyncio.new_event_loop()
        client = getattr(ccxtpro, self.exchange_id)(self.config)
        try:
            while not stop.is_set():
                try:
                    batch = loop.run_until_complete(
                        asyncio.wait_for(
                            client.watch_trades(symbol, params=dict(self._watch_params)), 1.0
                        )
                    )
                except TimeoutError:
                    continue
                except ccxt.BaseError as exc:
                    raise ExchangeError(str(exc)) from None
                for t in batch:
                    yield self._tick(ticker, t)
        finally:
            loop.run_until_complete(client.close())
            loop.close()

    @staticmethod
    def _tick(ticker: str, t: dict[str, Any]) -> market_pb2.Tick:
        return market_pb2.Tick(
            ticker=ticker,
            trade_id=str(t["id"]),
            price=dec_str(t["price"]),
            size=dec_str(t["amount"]),
            side=market_pb2.BUY if t.get("side") == "buy" else market_pb2.SELL,
            exchange_time_ns=int(t["timestamp"]) * 1_000_000,
            ingest_time_ns=time.time_ns(),
        )
