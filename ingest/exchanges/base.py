"""The one small interface every exchange adapter implements.

An adapter answers three questions: which markets exist, what candles a range holds (in
pages), and what trades happen now; where the venue can, a fourth: which trades a past range
held (:meth:`Exchange.refetch`, how a gap in a live stream is repaired). Everything else (Kafka, work queues, retries of whole
requests) belongs to the ingestor, so an adapter is one file.
"""

from __future__ import annotations

import threading
from abc import ABC, abstractmethod
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from candlewire.book import CHECKSUMS, Checksum, Verdict
from proto import book_pb2, market_pb2


class ExchangeError(Exception):
    """The exchange failed; retrying the same call may succeed."""


class UnknownSymbol(ExchangeError):
    """The exchange does not list this ticker. Final."""


class RangeUnavailable(ExchangeError):
    """The exchange holds no data for (part of) the range. Final."""


class NoBook(ExchangeError):
    """The adapter serves no order book for this ticker. Final."""


class BookBroken(ExchangeError):
    """The venue's book stream broke its sequence or its checksum, found by the adapter's
    library rather than by :class:`candlewire.book.BookSync`. The stream starts again from a
    fresh snapshot, and the event is counted as ``kind`` (``Verdict.GAP`` or
    ``Verdict.CHECKSUM``)."""

    def __init__(self, message: str, kind: Verdict) -> None:
        super().__init__(message)
        self.kind = kind


@dataclass(frozen=True)
class Page:
    """One window of a history request; pages are numbered from 0 in time order."""

    index: int
    start_ms: int
    end_ms: int


@dataclass(frozen=True, slots=True)
class TradeRun:
    """Trades of one ticker that came together, in stream order, as columns.

    A venue that hands over many trades at once (SIM, whose trades are made as columns; a
    stream that woke to several due) yields these from :meth:`Exchange.trade_runs`. The
    ingestor checks and writes a run without making a Tick object for each trade: making,
    checking and serializing each one held about half of its time a trade (#35)."""

    ticker: str
    trade_ids: Sequence[str]
    prices: Sequence[str]
    sizes: Sequence[str]
    sides: Sequence[int]
    times_ns: Sequence[int]  # exchange_time_ns
    ingest_time_ns: int = 0

    def __post_init__(self) -> None:
        n = len(self.trade_ids)
        columns = (self.prices, self.sizes, self.sides, self.times_ns)
        if any(len(c) != n for c in columns):
            raise ValueError(f"a trade run's columns differ in length: {[n, *map(len, columns)]}")

    def __len__(self) -> int:
        return len(self.trade_ids)

    def tick(self, i: int) -> market_pb2.Tick:
        """Trade ``i`` as the Tick a venue streaming one at a time would have yielded."""
        return market_pb2.Tick(
            ticker=self.ticker,
            trade_id=self.trade_ids[i],
            price=self.prices[i],
            size=self.sizes[i],
            side=self.sides[i],  # type: ignore[arg-type]
            exchange_time_ns=self.times_ns[i],
            ingest_time_ns=self.ingest_time_ns,
        )

    def ticks(self) -> list[market_pb2.Tick]:
        return [self.tick(i) for i in range(len(self))]

    def slice(self, start: int, stop: int, ingest_time_ns: int) -> TradeRun:
        """Trades ``start`` to ``stop`` (exclusive), received at ``ingest_time_ns``."""
        return TradeRun(
            self.ticker,
            self.trade_ids[start:stop],
            self.prices[start:stop],
            self.sizes[start:stop],
            self.sides[start:stop],
            self.times_ns[start:stop],
            ingest_time_ns,
        )


def one_by_one(
    items: Iterable[market_pb2.Tick | TradeRun], stop: threading.Event
) -> Iterator[market_pb2.Tick]:
    """A stream of Ticks and runs as Ticks only: :meth:`Exchange.trades` of an adapter that
    streams in runs. Nothing more once ``stop`` is set, not even the rest of a run."""
    for item in items:
        for tick in map(item.tick, range(len(item))) if isinstance(item, TradeRun) else (item,):
            if stop.is_set():
                return
            yield tick


def pages(start_ms: int, end_ms: int, period_s: int, rows_per_page: int) -> list[Page]:
    """Fixed windows, so the page count is known before fetching (it goes in __metadata)."""
    span = period_s * 1000 * rows_per_page
    first = start_ms - start_ms % (period_s * 1000)
    out, t = [], first
    while t < end_ms:
        out.append(Page(len(out), max(t, start_ms), min(t + span, end_ms)))
        t += span
    return out


def fmt_fixed(value: int, decimals: int) -> str:
    """Integer units of 10**-decimals as an exact decimal string."""
    sign, value = ("-", -value) if value < 0 else ("", value)
    if decimals == 0:
        return f"{sign}{value}"
    unit = 10**decimals
    return f"{sign}{value // unit}.{value % unit:0{decimals}d}"


def dec_str(value: Decimal | float | str) -> str:
    """An exchange's number as a plain decimal string (no exponent)."""
    d = value if isinstance(value, Decimal) else Decimal(str(value))
    return format(d.normalize(), "f") if d == d.to_integral() else format(d, "f")


class Exchange(ABC):
    name: str
    # Whose checksum formula its book deltas carry (``candlewire.book.CHECKSUMS``), when that
    # is not its name: a SIM venue under another name still checksums as SIM.
    checksum_as: str | None = None

    def book_checksum(self) -> Checksum | None:
        """The formula its book deltas' checksums follow; None when they carry none."""
        return CHECKSUMS.get(self.checksum_as or self.name)

    @abstractmethod
    def markets(self) -> list[market_pb2.Market]:
        """Every market the exchange lists, with precision and status."""

    @abstractmethod
    def ohlc_page(self, ticker: str, period_s: int, page: Page) -> list[market_pb2.OHLC]:
        """Closed candles whose open time lies in the page. Raise ExchangeError to retry."""

    @abstractmethod
    def trades(self, ticker: str, stop: threading.Event) -> Iterator[market_pb2.Tick]:
        """Live trades until ``stop`` is set."""

    def trade_runs(
        self, ticker: str, stop: threading.Event
    ) -> Iterator[market_pb2.Tick | TradeRun]:
        """The same trades as :meth:`trades`, what the ingestor streams: an adapter whose venue
        delivers many trades at once may yield them as :class:`TradeRun` columns, each run
        in order and after the trades before it. By default, one Tick at a time."""
        return self.trades(ticker, stop)

    def refetch(
        self, ticker: str, from_ns: int, to_ns: int, after_id: str | None = None
    ) -> list[market_pb2.Tick]:
        """The venue's trades with ``from_ns <= exchange_time_ns <= to_ns``, in time order,
        fetched again over REST; the caller drops what its stream already sent.

        ``after_id`` is the id of the trade at ``from_ns``, a hint for venues that page by
        id. RangeUnavailable when the venue does not serve past trades (the default)."""
        raise RangeUnavailable(f"{self.name} does not serve past trades")

    def book_snapshot(self, ticker: str) -> book_pb2.BookSnapshot:
        """The venue's whole L2 book now (its REST snapshot), best levels first."""
        raise NoBook(f"{self.name} serves no order book")

    def book_deltas(self, ticker: str, stop: threading.Event) -> Iterator[book_pb2.BookDelta]:
        """Live L2 updates until ``stop`` is set, from the moment of the call: a snapshot
        fetched after it overlaps them, and :class:`candlewire.book.BookSync` drops the
        overlap."""
        raise NoBook(f"{self.name} serves no order book")

    rows_per_page: int = 1000
    recorded: bool = False  # trades carry recorded times, not now's: exempt from "behind"
    # Trade ids are consecutive integers per ticker, so a skipped number is a lost trade.
    sequential_ids: bool = False
    _symbols: dict[str, Any]  # ticker → the adapter's own handle (symbol, recording, state)

    def symbol(self, ticker: str) -> Any:
        """The adapter's handle of a listed ticker; UnknownSymbol when it is not listed.

        An adapter whose list is loaded lazily refreshes it once first (:meth:`refresh_symbols`)."""
        if ticker not in self._symbols:
            self.refresh_symbols()
        try:
            return self._symbols[ticker]
        except KeyError:
            raise UnknownSymbol(f"{self.name} does not list {ticker}") from None

    def refresh_symbols(self) -> None:  # noqa: B027 - optional hook
        """Reload the listed tickers, for adapters that learn them from the exchange."""

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release connections."""
