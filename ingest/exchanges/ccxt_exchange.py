"""Any ccxt exchange: ``load_markets``, paginated ``fetch_ohlcv``, ``watch_trades``,
paginated ``fetch_trades`` to refetch a gap in the live stream, and the L2 book through
``watch_order_book`` (:class:`BookWatch`).

ccxt's own rate limiter stays on (``enableRateLimit``); our retries only wrap ccxt's
transient errors. ``urls`` and ``options`` pass straight to ccxt, which is how the tests
point the adapter at a local stand-in of the exchange's REST API.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import queue
import threading
import time
from collections import Counter
from collections.abc import Iterable, Iterator
from typing import Any

import ccxt

from candlewire.book import Verdict
from ingest.exchanges.base import (
    BookBroken,
    Exchange,
    ExchangeError,
    NoBook,
    Page,
    RangeUnavailable,
    UnknownSymbol,
    dec_str,
)
from proto import book_pb2, market_pb2

log = logging.getLogger("candlewire.ingest")
TIMEFRAMES = {60: "1m", 300: "5m", 900: "15m", 3600: "1h", 14400: "4h", 86400: "1d"}
# Venues whose trade ids are consecutive per symbol and whose REST trades page by
# ``fromId``, with the watch_trades params that make the stream carry the same ids: Binance's
# REST trades with time ranges are aggregate trades, so the stream watches aggTrade too.
SEQUENTIAL: dict[str, dict[str, str]] = {"binance": {"name": "aggTrade"}}
REFETCH_LIMIT = 1000
HOUR_MS = 3_600_000  # the widest time window Binance's aggTrades answers
BOOK_BACKLOG = 10_000  # book updates the stream has not taken; one more and the watch ends
FIRST_BOOK_S = 30.0  # for ccxt to sync the venue's REST snapshot with its stream


@functools.cache
def _pro_features(exchange_id: str) -> frozenset[str]:
    """What ccxt.pro's class for ``exchange_id`` has (building one takes about 80 ms)."""
    import ccxt.pro as ccxtpro

    pro = getattr(ccxtpro, exchange_id, None)
    return frozenset(k for k, v in pro().has.items() if v) if pro is not None else frozenset()


def _num(value: Any) -> str:
    return "" if value is None else dec_str(value)


def _decimal(value: Any) -> str:
    """A trade's number as text, or "" where ccxt could not read one (None, garbage): the
    stream's one rule (:func:`ingest.jobs.tick_checker`) refuses and counts that trade."""
    try:
        return dec_str(value)
    except (ArithmeticError, ValueError, TypeError):
        return ""


def _ms(value: Any) -> int | None:
    """A ccxt timestamp in whole milliseconds, or None where it holds none."""
    try:
        return int(value)
    except (TypeError, ValueError, OverflowError):
        return None


def _trade_id(trade: dict[str, Any]) -> str:
    """A ccxt trade's id as a Tick carries it: "" where the venue gives none (ccxt's None),
    which the stream's judge takes as no id. As the text "None" every later trade of the
    feed within the dedup horizon was judged a resend of the first, and dropped."""
    raw = trade.get("id")
    return "" if raw is None else str(raw)


class Since:
    """What is new in answers that each hold a venue's trades at or after ``ms``, read in
    time order: REST polls, and ``refetch``'s pages by time. Only the trades at ``ms`` itself
    can come again, so only those are remembered (every id ever seen grew without bound).
    A trade is known by its id, or by its fields where it has none, counted: two trades
    alike in every field at one millisecond are two trades, and a later answer that holds
    the pair again holds nothing new."""

    def __init__(self, ms: int) -> None:
        self.ms = ms
        self._seen: Counter[object] = Counter()

    def fresh(self, rows: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
        """The trades of ``rows`` not taken from an earlier answer, in time order. One
        without a time passes: the stream's rule refuses and counts it."""
        taken: list[dict[str, Any]] = []
        again: Counter[object] = Counter()  # this answer's trades at ``ms``, so far
        for t in sorted(rows, key=lambda t: _ms(t.get("timestamp")) or 0):
            at_ms = _ms(t.get("timestamp"))
            if at_ms is not None:
                if at_ms < self.ms:
                    continue
                if at_ms > self.ms:
                    self.ms, self._seen, again = at_ms, Counter(), Counter()
                key = _trade_key(t)
                again[key] += 1
                if again[key] <= self._seen[key]:
                    continue
                self._seen[key] += 1
            taken.append(t)
        return taken


def _trade_key(trade: dict[str, Any]) -> object:
    trade_id = trade.get("id")
    if trade_id is not None:
        return str(trade_id)
    return (trade.get("price"), trade.get("amount"), trade.get("side"))


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
        self._books: dict[str, BookWatch] = {}  # the live book watch of each ticker

    def pro_has(self, feature: str) -> bool:
        """Whether ccxt.pro streams ``feature`` (``watchTrades``...) for this exchange: the
        REST class does not say."""
        return feature in _pro_features(self.exchange_id)

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
            for row in rows:
                t = row[0]
                if t + period_s * 1000 > now_ms:
                    continue  # still forming
                try:
                    o, h, low, c, v = map(dec_str, row[1:6])
                except (ArithmeticError, ValueError, TypeError) as exc:
                    # Final: asking again gets the same row, and a candle cannot be dropped.
                    raise RangeUnavailable(
                        f"{ticker}: the venue sent a malformed candle {row!r}"
                    ) from exc
                out.append(
                    market_pb2.OHLC(
                        ticker=ticker,
                        period_s=period_s,
                        open_time_ms=int(t),
                        open=o,
                        high=h,
                        low=low,
                        close=c,
                        volume=v,
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
        seen: set[str] = set()  # by fromId: ids
        window = Since(cursor_ms)  # by time: what each page repeats of the one before
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
            if self.sequential_ids:
                fresh = [r for r in rows if str(r["id"]) not in seen]
                seen.update(str(r["id"]) for r in fresh)
            else:
                fresh = window.fresh(rows)
            if not fresh:
                if from_id is None and self.sequential_ids:
                    cursor_ms += HOUR_MS  # an hour without trades; look in the next
                    continue
                break
            for r in fresh:
                at_ms = _ms(r["timestamp"])
                if at_ms is not None and from_ns <= at_ms * 1_000_000 <= to_ns:
                    out.append(self._tick(ticker, r))
            last = fresh[-1]
            last_ms = _ms(last["timestamp"])
            if last_ms is None:
                raise ExchangeError(f"{ticker}: a refetched trade has no time: {last!r}")
            if last_ms > to_ms:
                break
            if self.sequential_ids:
                from_id = str(int(last["id"]) + 1)
            else:
                cursor_ms = last_ms
        return out

    def trades(self, ticker: str, stop: threading.Event) -> Iterator[market_pb2.Tick]:
        """Websocket trades through ccxt.pro when the exchange has them, else REST polling."""
        symbol = self.symbol(ticker)
        if self.pro_has("watchTrades"):
            yield from self._watch(symbol, ticker, stop)
            return
        # Each poll answers the trades at or after the last one's millisecond.
        window = Since(int(time.time() * 1000))
        while not stop.wait(1.0):
            for t in window.fresh(self._call(self.client.fetch_trades, symbol, window.ms)):
                yield self._tick(ticker, t)  # one without a time is refused and counted

    def _watch(self, symbol: str, ticker: str, stop: threading.Event) -> Iterator[market_pb2.Tick]:
        loop = asyncio.new_event_loop()
        client = self.pro_client()
        pending: asyncio.Task | None = None
        try:
            while not stop.is_set():
                if pending is None:
                    params = dict(self._watch_params)
                    pending = loop.create_task(client.watch_trades(symbol, params=params))
                if not loop.run_until_complete(within(pending, 1.0)):
                    continue  # still waiting: look at stop, and wait on the same call
                task, pending = pending, None
                try:
                    batch = task.result()
                except ccxt.BaseError as exc:
                    raise ExchangeError(str(exc)) from None
                for t in batch:
                    yield self._tick(ticker, t)
        finally:
            closed_loop(loop, client, pending)

    def pro_client(self) -> Any:
        """A ccxt.pro client of this exchange, given the markets the REST client loaded: one
        that loads them itself repeats that heavy request on every reconnect."""
        import ccxt.pro as ccxtpro

        client = getattr(ccxtpro, self.exchange_id)(dict(self.config))
        if self.client.markets:
            client.set_markets(self.client.markets, self.client.currencies)
        return client

    @staticmethod
    def _tick(ticker: str, t: dict[str, Any]) -> market_pb2.Tick:
        """A ccxt trade as a Tick. A field ccxt could not read (None) becomes a value the
        stream's rule refuses, so the trade is dropped and counted and the stream goes on;
        raising here ended the stream."""
        at_ms = _ms(t.get("timestamp"))
        at_ns = 0 if at_ms is None else at_ms * 1_000_000
        return market_pb2.Tick(
            ticker=ticker,
            trade_id=_trade_id(t),
            price=_decimal(t.get("price")),
            size=_decimal(t.get("amount")),
            side=market_pb2.BUY if t.get("side") == "buy" else market_pb2.SELL,
            exchange_time_ns=at_ns if 0 < at_ns < 1 << 63 else 0,
            ingest_time_ns=time.time_ns(),
        )

    # -- the order book (#38) ----------------------------------------------------------------

    def book_snapshot(self, ticker: str) -> book_pb2.BookSnapshot:
        """The book a live watch of ``ticker`` holds (its deltas follow on from it exactly);
        without one, the venue's REST snapshot."""
        watch = self._books.get(ticker)
        if watch is not None:  # even one that ended: its deltas still queued follow on
            return watch.snapshot()
        raw = self._call(self.client.fetch_order_book, self.symbol(ticker))
        bids, asks = _levels(raw["bids"]), _levels(raw["asks"])
        return book_message(ticker, raw["nonce"] or 0, raw.get("timestamp"), bids, asks)

    def book_deltas(self, ticker: str, stop: threading.Event) -> Iterator[book_pb2.BookDelta]:
        if not self.pro_has("watchOrderBook"):
            raise NoBook(f"{self.name}: ccxt streams no order book for {self.exchange_id}")
        old = self._books.pop(ticker, None)
        if old is not None:
            old.close()
        watch = self._books[ticker] = BookWatch(self, ticker, stop)
        return watch

    def close(self) -> None:
        watches = list(self._books.values())
        self._books.clear()
        for watch in watches:  # all asked to end first, then each waited for
            watch.close(wait=False)
        for watch in watches:
            watch.close()


Levels = dict[float, float]


async def within(task: asyncio.Task, seconds: float) -> bool:
    """Whether ``task`` finished within ``seconds``; it is never cancelled here, because a
    ccxt call cancelled part-way (loading markets, subscribing) starts from scratch the next
    time, so a step slower than the wait would never finish."""
    done, _ = await asyncio.wait({task}, timeout=seconds)
    return bool(done)


def closed_loop(loop: asyncio.AbstractEventLoop, client: Any, pending: asyncio.Task | None) -> None:
    """A ccxt.pro client and its loop closed, whatever is still running on them."""
    try:
        if pending is not None:
            pending.cancel()
        loop.run_until_complete(client.close())
    except Exception as exc:  # closing must not hide why the watch ended
        log.warning("closing the ccxt.pro client: %s", exc)
    finally:
        tasks = asyncio.all_tasks(loop)
        for task in tasks:
            task.cancel()
        if tasks:  # gather() of nothing would belong to another loop
            loop.run_until_complete(asyncio.gather(*tasks, return_exceptions=True))
        loop.close()


def _levels(raw: list[list[float]]) -> Levels:
    return {float(level[0]): float(level[1]) for level in raw}


def _book_levels(levels: Levels, bids: bool) -> list[book_pb2.BookLevel]:
    return [
        book_pb2.BookLevel(price=dec_str(p), size=dec_str(levels[p]))
        for p in sorted(levels, reverse=bids)
    ]


def _changes(old: Levels, new: Levels) -> list[book_pb2.BookLevel]:
    """The levels that differ from ``old`` to ``new``; size 0 for one that went."""
    out = [
        book_pb2.BookLevel(price=dec_str(p), size=dec_str(a))
        for p, a in new.items()
        if old.get(p) != a
    ]
    out += [book_pb2.BookLevel(price=dec_str(p), size="0") for p in old if p not in new]
    return out


def book_message(
    ticker: str, seq: int, timestamp_ms: int | None, bids: Levels, asks: Levels
) -> book_pb2.BookSnapshot:
    """A ccxt order book (price → amount a side) as a BookSnapshot, best levels first."""
    return book_pb2.BookSnapshot(
        ticker=ticker,
        venue_seq=seq,
        exchange_time_ns=int(timestamp_ms or 0) * 1_000_000,
        ingest_time_ns=time.time_ns(),
        bids=_book_levels(bids, True),
        asks=_book_levels(asks, False),
    )


class BookWatch:
    """One ticker's ``watch_order_book`` in a thread of its own, as BookDeltas.

    ccxt.pro follows the venue's own recipe: it buffers the stream, fetches the REST
    snapshot, applies what comes after it, and checks the sequence (and the checksum, where
    the venue sends one), failing when either breaks; that failure ends this iterator with
    :class:`BookBroken`. ccxt hands out its whole book, not the update, so each delta here is
    the levels that differ from the book it handed out before (size 0: gone), numbered by
    ccxt's nonce (the venue's update id; the ingest time in microseconds for a venue that
    numbers nothing) and chained by ``prev_seq``. :meth:`snapshot` is the book ccxt handed out
    last, taken under the same lock as the deltas are queued, so those after it follow on
    exactly: no seam between the snapshot and the stream."""

    def __init__(self, exchange: CcxtExchange, ticker: str, stop: threading.Event) -> None:
        self.ticker, self.stop = ticker, stop
        self._symbol = exchange.symbol(ticker)
        self._client = exchange.pro_client()
        self._broken = Verdict.CHECKSUM if exchange.book_checksum() else Verdict.GAP
        self._queue: queue.Queue[book_pb2.BookDelta] = queue.Queue(BOOK_BACKLOG)
        self._lock = threading.Lock()
        self._bids: Levels = {}
        self._asks: Levels = {}
        self._seq = 0  # of the book last handed out; 0: none yet
        self._time_ms: int | None = None
        self._error: Exception | None = None
        self._closed = threading.Event()
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"book:{ticker}", daemon=True)
        self._thread.start()

    def __iter__(self) -> BookWatch:
        return self

    def __next__(self) -> book_pb2.BookDelta:
        """The next delta; once the watch ends (stopped, or failed: its error), StopIteration
        after the deltas it queued before that."""
        while True:
            try:
                return self._queue.get(timeout=0.2)
            except queue.Empty:
                if self._done.is_set() and self._queue.empty():
                    self.close()
                    if self._error is not None:
                        raise self._error from None
                    raise StopIteration from None

    def snapshot(self) -> book_pb2.BookSnapshot:
        """The book ccxt handed out last, once it has synced one."""
        deadline = time.monotonic() + FIRST_BOOK_S
        while not self._seq:
            if self._done.is_set():
                raise self._error or ExchangeError(f"{self.ticker}: the book watch ended")
            if self.stop.is_set():
                raise ExchangeError(f"{self.ticker}: stopped before the venue's first book")
            if time.monotonic() > deadline:
                raise ExchangeError(f"{self.ticker}: no book from the venue in {FIRST_BOOK_S}s")
            self._done.wait(0.05)
        with self._lock:
            return book_message(self.ticker, self._seq, self._time_ms, self._bids, self._asks)

    def close(self, wait: bool = True) -> None:
        self._closed.set()
        if wait and threading.current_thread() is not self._thread:
            self._thread.join(5.0)

    def _run(self) -> None:
        loop = asyncio.new_event_loop()
        try:
            loop.run_until_complete(self._watch())
        except ccxt.ChecksumError as exc:  # ccxt's name for a broken sequence, too
            self._error = BookBroken(str(exc), self._broken)
        except ccxt.BadSymbol as exc:
            self._error = UnknownSymbol(str(exc))
        except ccxt.BaseError as exc:
            self._error = ExchangeError(f"{self.ticker}: {type(exc).__name__}: {exc}")
        except Exception as exc:  # handed to the stream's thread, which reports it
            self._error = exc
        finally:
            closed_loop(loop, self._client, None)
            self._done.set()  # after the client closed: the consumer may start another

    async def _watch(self) -> None:
        pending: asyncio.Task | None = None
        try:
            while not (self.stop.is_set() or self._closed.is_set()):
                if pending is None:
                    pending = asyncio.ensure_future(self._client.watch_order_book(self._symbol))
                if await within(pending, 1.0):
                    task, pending = pending, None
                    self._took(task.result())
        finally:
            if pending is not None:
                pending.cancel()

    def _took(self, book: dict[str, Any]) -> None:
        bids, asks = _levels(book["bids"]), _levels(book["asks"])
        nonce, stamp = book.get("nonce"), book.get("timestamp")
        with self._lock:
            seq = int(nonce) if nonce is not None else max(self._seq + 1, time.time_ns() // 1000)
            if seq == self._seq:
                return  # nothing new
            if seq < self._seq:  # numbered afresh: nothing says how it follows on
                raise BookBroken(
                    f"the venue's update id went back from {self._seq} to {seq}", Verdict.GAP
                )
            if self._seq:
                delta = book_pb2.BookDelta(
                    ticker=self.ticker,
                    venue_seq=seq,
                    prev_seq=self._seq,
                    exchange_time_ns=int(stamp or 0) * 1_000_000,
                    ingest_time_ns=time.time_ns(),
                    bids=_changes(self._bids, bids),
                    asks=_changes(self._asks, asks),
                )
                try:
                    self._queue.put_nowait(delta)
                except queue.Full:
                    raise ExchangeError(
                        f"{self.ticker}: the book stream fell {BOOK_BACKLOG} updates behind"
                    ) from None
            self._bids, self._asks, self._seq, self._time_ms = bids, asks, seq, stamp
