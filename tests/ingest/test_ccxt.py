"""The ccxt adapter against a local Binance stand-in (urls overridden)."""

from __future__ import annotations

import threading
import time
import tracemalloc
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from decimal import Decimal
from unittest.mock import patch

import pytest

from candlewire.kafka import BOOKS, GAPS, OHLC_BATCHES
from candlewire.testing import wait_for
from ingest.books import BookStream
from ingest.exchanges.base import NoBook, Page
from ingest.exchanges.ccxt_exchange import CcxtExchange
from ingest.exchanges.sim import GENESIS_MS, MINUTE_MS
from ingest.gaps import GapRepairer, new_gap
from ingest.jobs import run_history, run_stream, tick_problem
from proto import book_pb2, market_pb2
from proto.requests_pb2 import StreamTail
from tests.ingest.binance_standin import BinanceStandIn
from tests.ingest.test_books import check_against_sim
from tests.support import RecordingSink, history_work

T0 = 1_700_006_400_000


def adapter(standin: BinanceStandIn) -> CcxtExchange:
    api = f"{standin.url}/api/v3"
    return CcxtExchange(
        "binance",
        urls={"api": {"public": api, "private": api, "v3": api, "ws": {"spot": standin.ws_url}}},
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


def test_a_venue_briefly_overloaded_is_asked_again_and_the_history_is_whole() -> None:
    """Binance answering 503 and then 429 (rate limited) to a page: ccxt's errors become
    transient exchange errors, the page is asked again after a back-off, and every candle
    of the request arrives once, equal to the venue's."""
    with BinanceStandIn(page_limit=500) as standin:
        ex = adapter(standin)
        ex.markets()
        standin.refusals = [(503, -1008), (429, -1003)]
        req = history_work("BINANCE:BTC/USDT", 60, T0, T0 + 600 * 60_000)
        sink = RecordingSink()
        assert run_history(req, ex, sink, "ing-test") == 600  # type: ignore[arg-type]
        batches = sink.sent(OHLC_BATCHES.name)
        assert [b.error for b in batches] == [""] * len(batches)
        assert [b.page for b in batches] == list(range(len(batches)))
        got = [c.open_time_ms for b in batches for c in b.rows]
        want = standin.sim.ohlc_page("BINANCE:BTC/USDT", 60, Page(0, T0, T0 + 600 * 60_000))
        assert got == [c.open_time_ms for c in want]
        # 600 candles in requests of at most 500, and the two refused
        assert standin.requests.count("/api/v3/klines") == 2 + 2


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


def test_live_trades_come_over_the_websocket_through_watch_trades() -> None:
    """``trades`` streams through ccxt.pro (Binance's aggTrade stream, whose ids match the
    REST refetch's), not REST polling: the trades equal SIM's, to the millisecond."""
    ticker = "BINANCE:BTC/USDT"
    with BinanceStandIn(rate=20) as standin:
        ex = adapter(standin)
        stop = threading.Event()
        got = []
        for tick in ex.trades(ticker, stop):
            got.append(tick)
            if len(got) == 20:
                stop.set()
        # Binance stamps trades in whole milliseconds.
        first, last = got[0].exchange_time_ns, got[-1].exchange_time_ns + 999_999
        want = standin.sim.trades_between(ticker, first, last)
        assert [trade(t) for t in got] == [trade(t) for t in want]
        assert standin.trades_sent >= 20
        assert "/api/v3/aggTrades" not in standin.requests  # no REST polling


def test_a_venue_ccxt_streams_no_book_for_has_none() -> None:
    """bitFlyer has no ccxt.pro class: its book is NoBook (final: the ingestor answers
    ``NO_BOOK`` to the subscription), decided before any request to the venue."""
    ex = CcxtExchange("bitflyer")
    with pytest.raises(NoBook):
        ex.book_deltas("BITFLYER:BTC/JPY", threading.Event())
    assert not ex.pro_has("watchTrades")


def minutes(start_ms: int, end_ms: int) -> tuple[int, int]:
    return (start_ms - GENESIS_MS) // MINUTE_MS, (end_ms - GENESIS_MS) // MINUTE_MS


def trade(t) -> tuple:
    """A trade as Binance tells it: times in milliseconds, decimals as numbers."""
    ms = t.exchange_time_ns // 1_000_000
    return (t.trade_id, Decimal(t.price), Decimal(t.size), t.side, ms)


def test_the_book_through_watch_order_book_follows_the_venue_and_heals_a_jump() -> None:
    """ccxt.pro's ``watch_order_book`` against Binance's own protocol (the REST depth
    snapshot, then the diff-depth stream): every book the stream writes equals the venue's
    (SIM's) at its update id. One depth event left out is a sequence jump: ccxt fails the
    book, the stream counts a gap and goes on from a fresh REST snapshot, right again. The
    venue takes longer to list its markets than the watch waits at a time (1 s)."""
    ticker = "BINANCE:BTC/USDT"
    with BinanceStandIn(rate=20, markets_s=1.3) as standin:
        ex = adapter(standin)
        sink, events = RecordingSink(), []
        stream = BookStream(ticker, ex, sink, events.append)
        stop = threading.Event()
        thread = threading.Thread(target=stream.run, args=(stop,), daemon=True)
        thread.start()
        try:
            wait_for(lambda: len(sink.sent(BOOKS.name)) > 15, 20)
            depth_calls = standin.requests.count("/api/v3/depth")
            standin.skip_events = 1
            wait_for(lambda: "gap" in events, 20)
            after = len(sink.sent(BOOKS.name))
            wait_for(lambda: len(sink.sent(BOOKS.name)) > after + 15, 20)
        finally:
            stop.set()
            thread.join(10)
            ex.close()
        assert not thread.is_alive()
        assert set(events) == {"gap"}
        records = sink.sent(BOOKS.name)
        compared, reasons = check_against_sim(standin.sim, records, ticker)
        assert reasons[:2] == [book_pb2.SNAPSHOT_START, book_pb2.SNAPSHOT_SEQUENCE], reasons
        assert compared > 30
        # ccxt started each book from the venue's REST snapshot: once, then once more.
        assert depth_calls >= 1
        assert standin.requests.count("/api/v3/depth") > depth_calls
        # Deltas, not snapshots, carried the book between the two.
        kinds = [isinstance(r, book_pb2.BookDelta) for r in records]
        assert kinds.count(True) > 25
        # The markets were listed once, by the REST client; the pro clients were handed them.
        assert standin.requests.count("/api/v3/exchangeInfo") == 1
        assert standin.errors == []


class Venue:
    """A venue's REST ``fetch_trades`` as ccxt answers it: the trades at or after ``since``,
    in time order. Between two polls it trades on, three trades to a millisecond (so a
    millisecond's trades straddle two polls), and every ``bad_every``-th trade comes with
    what ccxt could not read (None)."""

    def __init__(self, per_poll: int, bad_every: int = 0, ids: bool = True) -> None:
        """``ids=False``: a venue whose trades carry no id (ccxt's None), their amounts
        ``n // 2`` for the n-th trade, so some trades are alike in every field at one
        millisecond."""
        self.per_poll, self.bad_every, self.trades, self.next_id = per_poll, bad_every, [], 0
        self.ids = ids
        # Ahead of the poller's first ``since`` (now, when it starts), however late it starts.
        self.now_ms = int(time.time() * 1000) + 5_000

    def fetch_trades(self, symbol: str, since: int) -> list[dict]:
        for _ in range(self.per_poll):
            self.next_id += 1
            self.now_ms += self.next_id % 3 == 0
            bad = self.bad_every and self.next_id % self.bad_every == 0
            self.trades.append(
                {
                    "id": self.next_id if self.ids else None,
                    "price": None if bad else 1.5,
                    "amount": 2 if self.ids else self.next_id // 2,
                    "timestamp": self.now_ms,
                    "side": "buy",
                }
            )
        self.trades = self.trades[-3 * self.per_poll :]  # what a poll can answer
        return [t for t in self.trades if t["timestamp"] >= since]


class Polled(CcxtExchange):
    """The adapter with REST polling alone, over :class:`Venue`."""

    def __init__(self, venue: Venue) -> None:
        self.name, self.exchange_id, self.client = "X", "x", venue
        self._symbols = {"X:A/B": "A/B"}

    def pro_has(self, feature: str) -> bool:
        return False


class NoWait(threading.Event):
    def wait(self, timeout: float | None = None) -> bool:
        return self.is_set()


def test_rest_polling_sends_each_trade_once_and_keeps_only_the_last_millisecond() -> None:
    # Polls overlap (each answers everything since the last trade's millisecond), so ids are
    # remembered: only those of that millisecond, not every id ever seen (a growing set).
    venue, stop = Venue(per_poll=1000), NoWait()
    trades = Polled(venue).trades("X:A/B", stop)

    def out_of_turn(ids: range) -> int:
        """Trades not the next id, checked as they come: the test holds none of them."""
        return sum(next(trades).trade_id != str(i) for i in ids)

    tracemalloc.start()
    assert out_of_turn(range(1, 20_001)) == 0
    held = tracemalloc.get_traced_memory()[0]
    assert out_of_turn(range(20_001, 120_001)) == 0
    grew = tracemalloc.get_traced_memory()[0] - held
    tracemalloc.stop()
    assert grew < 1_000_000  # it held every id: 100,000 more came to about 10 MB


def test_a_venue_without_trade_ids_has_each_trade_sent_once_and_none_judged_a_resend() -> None:
    # Its trades were sent as trade_id "None", so the stream job dropped every later trade of
    # the feed as a resend of the first. Trades alike in every field at one millisecond are
    # told apart by count, however the polls cut the millisecond.
    venue, stop = Venue(per_poll=7, ids=False), NoWait()
    trades = Polled(venue).trades("X:A/B", stop)
    got = [next(trades) for _ in range(3_000)]
    assert {t.trade_id for t in got} == {""}
    assert [int(t.size) for t in got] == [n // 2 for n in range(1, 3_001)]


def test_a_gap_refetched_from_a_venue_without_trade_ids_is_left_unrepaired() -> None:
    # Which refetched trades the stream already sent, nothing tells: sending them all would
    # count some twice in every candle. The gap is recorded as unrepairable and nothing sent.
    venue = Venue(per_poll=0, ids=False)
    venue.per_poll = 30
    venue.fetch_trades("A/B", 0)  # thirty trades, ten milliseconds
    first_ms, last_ms = venue.trades[0]["timestamp"], venue.trades[-1]["timestamp"]

    class Paged(Polled):
        def __init__(self) -> None:
            super().__init__(venue)
            self.sequential_ids = False

    class Pages:
        """fetch_trades by time, four trades a page: pages end inside a millisecond."""

        has = {"fetchTrades": True}

        def fetch_trades(self, symbol: str, since: int, limit: int) -> list[dict]:
            return [t for t in venue.trades if t["timestamp"] >= since][:4]

    ex = Paged()
    ex.client = Pages()  # type: ignore[assignment]
    got = ex.refetch("X:A/B", first_ms * 1_000_000, last_ms * 1_000_000)
    assert [int(t.size) for t in got] == [n // 2 for n in range(1, 31)]
    assert {t.trade_id for t in got} == {""}

    sink = RecordingSink()
    before = StreamTail(ticker="X:A/B", trade_id="", time_ns=first_ms * 1_000_000)
    after = StreamTail(ticker="X:A/B", trade_id="", time_ns=last_ms * 1_000_000)
    gap = new_gap("X:A/B", market_pb2.RECONNECT, before, after, "ing-test")
    with ThreadPoolExecutor(1) as pool:
        done = GapRepairer(sink, pool).repair(ex, gap, None)  # type: ignore[arg-type]
    assert done.status == market_pb2.GAP_UNREPAIRABLE
    assert "without an id" in done.reason
    assert [topic for topic, _, _ in sink.records] == [GAPS.name]


def test_a_trade_ccxt_could_not_read_is_dropped_and_counted_and_the_stream_goes_on() -> None:
    venue, stop, dropped = Venue(per_poll=500, bad_every=97), NoWait(), Counter()
    sink = RecordingSink()

    def count(reason: str) -> None:
        dropped[reason] += 1
        if sum(dropped.values()) == 20:
            stop.set()

    run_stream("X:A/B", Polled(venue), sink, stop, dropped=count)  # type: ignore[arg-type]
    sent = [int(t.trade_id) for _, _, t in sink.records]
    assert dropped == {"not_decimal": 20}
    assert sent == [i for i in range(1, sent[-1] + 1) if i % 97]
    timeless = CcxtExchange._tick("X:A/B", {"id": 1, "price": 1, "amount": 1, "timestamp": None})
    assert tick_problem(timeless, time.time_ns(), 60, None) == "time"


def test_a_malformed_candle_fails_the_history_request_with_an_answer() -> None:
    class Candles:
        def fetch_ohlcv(self, symbol: str, timeframe: str, since: int, limit: int) -> list:
            return [[since, 1, 2, 0.5, 1.5, 10], [since + 60_000, 1, None, 0.5, 1.5, 10]]

    ex = Polled(Venue(0))
    ex.client = Candles()  # type: ignore[assignment]
    req = history_work("X:A/B", 60, GENESIS_MS, GENESIS_MS + 2 * MINUTE_MS)
    sink = RecordingSink()
    assert run_history(req, ex, sink, "ing-test") == 0  # type: ignore[arg-type]
    ((_, _, marker),) = sink.records
    assert "the venue sent a malformed candle" in marker.error


def test_a_venue_error_with_a_whole_page_in_it_still_answers_the_history_request() -> None:
    """ccxt puts the HTTP body in its error: a 503's HTML page made a marker past a string's
    limit, which the stream job refused as oversized, and the request was never answered."""
    import ccxt

    from proto.envelope import MAX_STRING_BYTES, from_record, to_record

    page = "<html>" + "maintenance ünder way " * 400 + "</html>"

    class Down:
        def fetch_ohlcv(self, symbol: str, timeframe: str, since: int, limit: int) -> list:
            raise ccxt.ExchangeNotAvailable(f"x 503 Service Unavailable {page}")

    ex = Polled(Venue(0))
    ex.client = Down()  # type: ignore[assignment]
    req = history_work("X:A/B", 60, GENESIS_MS, GENESIS_MS + 2 * MINUTE_MS)
    sink = RecordingSink()
    with patch("ingest.jobs.retry", lambda fn, *args: fn(*args)):  # no back-off waits
        assert run_history(req, ex, sink, "ing-test") == 0  # type: ignore[arg-type]
    ((_, _, marker),) = sink.records
    got = from_record(to_record(marker))  # as the stream job reads it: accepted
    assert got.error.startswith("x: ExchangeNotAvailable: x 503 Service Unavailable <html>")
    assert got.error.endswith("…") and len(got.error.encode()) <= MAX_STRING_BYTES
