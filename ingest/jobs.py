"""The work an ingestor does for one request: history pages, metadata, a live stream.

History: the first record carries ``__metadata`` (the request, its notification topic and the
page count, known up front because pages are fixed time windows). If the ticker is unknown,
the range is not held, or the exchange keeps failing after retries, an error marker record
(also carrying the metadata) tells the stream processor to publish HistoryReady ERROR.
"""

from __future__ import annotations

import logging
import math
import re
import threading
import time
from collections.abc import Callable, Iterable
from decimal import Decimal, InvalidOperation
from typing import TYPE_CHECKING, Any, TypeVar

from candlewire.amounts import DECIMAL_TEXT, PLAIN_CHARS, held
from candlewire.kafka import OHLC_BATCHES, SYMBOL_METADATA, TICKS
from ingest.exchanges.base import (
    Exchange,
    ExchangeError,
    NoBook,
    RangeUnavailable,
    TradeRun,
    UnknownSymbol,
    pages,
)
from ingest.sink import KafkaSink
from proto import market_pb2
from proto import requests_pb2 as rq
from proto.envelope import derive, fitted

if TYPE_CHECKING:
    from ingest.gaps import GapWatch

T = TypeVar("T")
_DIGITS = re.compile(r"[0-9.]*")  # a run's texts together, when each is plain
log = logging.getLogger("candlewire.ingest")
RETRIES = 3
BACKOFF_S = 0.5


def retry(fn: Callable[..., T], *args: Any) -> T:
    """``fn(*args)``, tried again after transient exchange errors; final ones raise at once."""
    for attempt in range(RETRIES):
        try:
            return fn(*args)
        except (UnknownSymbol, RangeUnavailable, NoBook):
            raise
        except ExchangeError:
            if attempt == RETRIES - 1:
                raise
            time.sleep(BACKOFF_S * 2**attempt)
    raise AssertionError("unreachable")


def run_history(req: rq.DataRequest, exchange: Exchange, sink: KafkaSink, ingestor_id: str) -> int:
    """Write the request's pages (or an error marker); return the rows written."""
    windows = pages(req.start_ms, req.end_ms, req.period_s, exchange.rows_per_page)
    meta = history_metadata(req, len(windows), ingestor_id)
    rows, mark = 0, sink.failures
    try:
        exchange.symbol(req.ticker)  # UnknownSymbol before any page is fetched
        for w in windows:
            candles = retry(exchange.ohlc_page, req.ticker, req.period_s, w)
            batch = market_pb2.OHLCBatch(request_id=req.request_id, page=w.index, rows=candles)
            if w.index == 0:
                batch.metadata.CopyFrom(meta)
            sink.send(OHLC_BATCHES.name, req.request_id, batch)
            rows += len(candles)
    except Exception as exc:  # every request gets its answer, even from a bug
        if isinstance(exc, ExchangeError):
            log.warning("history %s failed: %s", req.request_id, exc)
        else:
            log.exception("history %s failed on what %s sent", req.request_id, exchange.name)
        send_history_error(sink, meta, str(exc) or type(exc).__name__)
    sink.flush(since=mark)
    return rows


def history_metadata(
    req: rq.DataRequest, expected_pages: int, ingestor_id: str
) -> market_pb2.HistoryRequestMetadata:
    return derive(
        market_pb2.HistoryRequestMetadata,
        req,
        expected_pages=expected_pages,
        ingestor_id=ingestor_id,
    )


def send_history_error(sink: KafkaSink, meta: market_pb2.HistoryRequestMetadata, text: str) -> None:
    """The error marker: the stream processor answers the request with HistoryReady ERROR."""
    marker = market_pb2.OHLCBatch(request_id=meta.request_id, metadata=meta, error=fitted(text))
    sink.send(OHLC_BATCHES.name, meta.request_id, marker)


def run_metadata(req: rq.DataRequest, exchange: Exchange, sink: KafkaSink) -> int:
    mark, markets = sink.failures, retry(exchange.markets)
    for m in markets:
        m.request_id = req.request_id
        m.snapshot_size = len(markets)
        sink.send(SYMBOL_METADATA.name, m.ticker, m)
    sink.flush(since=mark)
    return len(markets)


def tick_problem(
    tick: market_pb2.Tick, now_ns: int, ahead_s: float, behind_s: float | None
) -> str | None:
    """Why a trade from an exchange is not fit for the ticks topic, or None."""
    return tick_checker(ahead_s, behind_s)(tick, now_ns)


def tick_checker(
    ahead_s: float, behind_s: float | None
) -> Callable[[market_pb2.Tick, int], str | None]:
    """:func:`tick_problem` for one window, its bounds in whole nanoseconds once: a stream
    judges every trade by it, and a float product and an int-to-float comparison per trade
    held about a quarter of the judgement's samples under py-spy (#35)."""
    ahead_ns, behind_ns = _bound_ns(ahead_s), None if behind_s is None else _bound_ns(behind_s)

    def problem(tick: market_pb2.Tick, now_ns: int) -> str | None:
        price_text, size_text, at_ns = tick.price, tick.size, tick.exchange_time_ns
        # A venue's texts: under 20 characters, only digits and points, each a float, the
        # price above zero: so digits with one point at most, which the tables hold (a
        # strip and a float each: a regex took twice as long). Anything else is judged
        # exactly.
        try:
            plain = (
                len(price_text) < 20 > len(size_text)
                and not price_text.strip(PLAIN_CHARS)
                and not size_text.strip(PLAIN_CHARS)
                and float(price_text) > 0.0 <= float(size_text)
            )
        except ValueError:  # "1.2.3", ".", ""
            plain = False
        if not plain:
            try:
                price, size = Decimal(price_text), Decimal(size_text)
            except (InvalidOperation, ValueError):
                return "not_decimal"
            if not price.is_finite() or price <= 0:
                return "price"
            if not size.is_finite() or size < 0:
                return "size"
            if not (DECIMAL_TEXT.fullmatch(price_text) and DECIMAL_TEXT.fullmatch(size_text)):
                return "not_decimal"  # "1_000", " 1": Decimal reads them, the stream not
            if not (held(price_text) and held(size_text)):
                return "range"  # past DECIMAL(38,18): the stream would count it bad
        if at_ns <= 0:  # no time: a venue's trade without one, not a trade of 1970
            return "time"
        if at_ns - now_ns > ahead_ns:
            return "ahead"
        if behind_ns is not None and now_ns - at_ns > behind_ns:
            return "behind"
        return None

    return problem


def run_checker(ahead_s: float, behind_s: float | None) -> Callable[[TradeRun, int], bool]:
    """Whether :func:`tick_checker` would let every trade of a run in at ``now_ns``, proven
    in a few passes over its columns. True only then; False tells nothing about any one
    trade (the caller judges each by :func:`tick_checker`, the one rule)."""
    ahead_ns, behind_ns = _bound_ns(ahead_s), None if behind_s is None else _bound_ns(behind_s)

    def proven(run: TradeRun, now_ns: int) -> bool:
        times = run.times_ns
        if not times:
            return True
        if max(times) - now_ns > ahead_ns:
            return False
        earliest = min(times)
        if earliest <= 0 or (behind_ns is not None and now_ns - earliest > behind_ns):
            return False
        # Plain texts (tick_checker's first judgement): only digits and points in all of
        # them together, none longer than 19 characters (so 19 digits before the point and
        # 18 after at most); each then reads as a float only where it has one point at most
        # and a digit, as the wire's grammar spells it.
        texts = (run.prices, run.sizes)
        if any(max(map(len, t)) > 19 or not _DIGITS.fullmatch("".join(t)) for t in texts):
            return False
        try:
            prices, sizes = list(map(float, run.prices)), list(map(float, run.sizes))
        except ValueError:
            return False
        return min(prices) > 0.0 and min(sizes) > 0.0

    return proven


def _bound_ns(seconds: float) -> int:
    """A window's bound in whole nanoseconds: an integer passes a bound as it passes its
    floor. An infinite one is past every int64 time."""
    return math.floor(seconds * 1e9) if math.isfinite(seconds) else 1 << 64


def run_stream(
    ticker: str,
    exchange: Exchange,
    sink: KafkaSink,
    stop: threading.Event,
    window: tuple[float, float | None] = (60.0, None),
    dropped: Callable[[str], None] = lambda _reason: None,
    gaps: GapWatch | None = None,
    clock: Callable[[], int] = time.time_ns,
) -> int:
    """Produce live trades keyed by ticker until ``stop``, or until the exchange has no more
    (a replay at its end); reconnect on exchange errors. A trade with a price not above
    zero, a negative size, no time or a time outside ``window`` (seconds ahead of and behind
    ``clock``'s now) is dropped and ``dropped(reason)`` told. ``gaps`` hears every trade
    received and every reconnect, to find the trades the stream missed (:mod:`ingest.gaps`)."""
    ahead_s, behind_s = window
    if exchange.recorded:
        behind_s = None
    problem_of, fits, send, send_trades, topic = (
        tick_checker(ahead_s, behind_s),
        run_checker(ahead_s, behind_s),
        sink.send,
        sink.send_trades,
        TICKS.name,
    )
    observe = gaps.observe if gaps is not None else None
    observe_run = gaps.observe_run if gaps is not None else None
    sent = 0
    while not stop.is_set():
        try:
            for item in exchange.trade_runs(ticker, stop):
                if isinstance(item, TradeRun):
                    if not item:
                        continue
                    # A run wholly fit that continues the stream goes at once; any other is
                    # taken trade by trade, as a venue yielding Ticks would have given it.
                    if fits(item, clock()) and (observe_run is None or observe_run(item)):
                        send_trades(topic, ticker, item)
                        sent += len(item)
                        continue
                    trades: Iterable[market_pb2.Tick] = item.ticks()
                else:
                    trades = (item,)
                for tick in trades:
                    # A trade without a time places nothing: as the stream's last, it would
                    # start a gap (and its repair) at 1970.
                    if observe is not None and tick.exchange_time_ns > 0:
                        observe(tick)
                    problem = problem_of(tick, clock())
                    if problem is not None:
                        dropped(problem)
                        continue
                    send(topic, ticker, tick)
                    sent += 1
            if not stop.is_set():
                log.info("stream %s ended after %d trades: the exchange has no more", ticker, sent)
                break
        except UnknownSymbol:
            raise
        except ExchangeError as exc:
            log.warning("stream %s: %s; reconnecting", ticker, exc)
            if gaps is not None:
                gaps.reconnected()
            stop.wait(1.0)
    return sent
