"""SIM: a deterministic simulated exchange.

Trades are a pure function of (seed, ticker, minute, index): prices follow a seeded random
walk of log-price in integer micro-units from a genesis time, and each minute holds
``rate * 60`` trades whose prices bridge that minute's anchor to the next. History is computed
from exactly the trades the live stream emits, vectorised with numpy, so candles asked for
later always equal what was streamed. Prices and sizes are integer ticks and lots, so every
decimal string is exact.

SIM can also fail on purpose (:func:`parse_faults`), so the ingestor's gap detection and
repair (:mod:`ingest.gaps`) can be watched at work: trades silently dropped, a stream that
disconnects, a REST API that serves nothing, trade ids that are not numbers.
"""

from __future__ import annotations

import hashlib
import re
import threading
import time
from bisect import bisect_left, bisect_right
from collections import OrderedDict
from collections.abc import Iterator
from dataclasses import dataclass, field

import numpy as np

from ingest.exchanges import sim_book
from ingest.exchanges.base import (
    Exchange,
    ExchangeError,
    Page,
    RangeUnavailable,
    TradeRun,
    fmt_fixed,
    one_by_one,
)
from proto import book_pb2, market_pb2

GENESIS_MS = 1_577_836_800_000  # 2020-01-01T00:00:00Z
MINUTE_MS = 60_000
BLOCK = 1 << 16  # minutes of anchors computed at a time
# Blocks of anchors kept per symbol: a walk from 2020 to now is 55 blocks of 512 KiB, and a
# stream, a page of history or a repair reads one or two of them (#36: two streamed symbols
# held 58 MiB of the ingestor's RSS when every block was kept).
KEPT_BLOCKS = 4
DEFAULT_SYMBOLS = {"BTC/USDT": 30_000.0, "ETH/USDT": 2_000.0, "SOL/USDT": 100.0}
PRICE_DECIMALS, SIZE_DECIMALS = 2, 4
SIGMA_MICRO = 800  # per-minute log-price step, in 1e-6 units (about 0.08 %)


def _mix(x: np.ndarray) -> np.ndarray:
    """splitmix64 finaliser, elementwise on uint64."""
    with np.errstate(over="ignore"):
        x = x + np.uint64(0x9E3779B97F4A7C15)
        x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return x ^ (x >> np.uint64(31))


def _uniform(key: np.uint64, a: np.ndarray, b: np.ndarray | int, stream: int) -> np.ndarray:
    with np.errstate(over="ignore"):
        x = (
            key
            ^ (a.astype(np.uint64) * np.uint64(0xD1B54A32D192ED03))
            ^ (np.asarray(b, dtype=np.uint64) * np.uint64(0xABC98388FB8FAC03))
            ^ np.uint64(stream * 0x8CB92BA72F3D8DD7 & (2**64 - 1))
        )
    return (_mix(x) >> np.uint64(11)).astype(np.float64) / float(1 << 53)


def fmt_fixed_column(values: np.ndarray, decimals: int) -> list[str]:
    """``fmt_fixed`` for a whole integer column: each distinct value formatted once (the
    division in numpy, then one %-format), handed out by index. A minute's trades repeat
    their prices and sizes (SIM's sizes take 2,000 values), so this is a third of the cost
    of formatting every value, the ingestor's largest per-trade step after making the Tick
    (#35). Without pyarrow, which loads pandas: 40 MiB of every SIM ingestor (#36)."""
    distinct, index = np.unique(np.asarray(values, dtype=np.int64), return_inverse=True)
    magnitude = np.abs(distinct)
    if decimals:
        unit, pattern = 10**decimals, f"%d.%0{decimals}d"
        parts = zip((magnitude // unit).tolist(), (magnitude % unit).tolist(), strict=True)
        text = [pattern % p for p in parts]
    else:
        text = list(map(str, magnitude.tolist()))
    for i in np.flatnonzero(distinct < 0).tolist():  # prices and sizes: none
        text[i] = "-" + text[i]
    return list(map(text.__getitem__, index.ravel().tolist()))


FAULT_SYNTAX = (
    "drop:DURs@ATs, disconnect:DURs@ATs, rest:off, ids:opaque, book:checksum@ATs, "
    "book:skip@ATs, book:malformed@ATs (e.g. drop:20s@60s)"
)
_SECONDS = r"(\d+(?:\.\d+)?)s"
_OUTAGE = re.compile(rf"(drop|disconnect):{_SECONDS}@{_SECONDS}")
_BOOK_FAULT = re.compile(rf"book:(checksum|skip|malformed)@{_SECONDS}")


@dataclass(frozen=True)
class Outage:
    """``for_s`` seconds of trades from ``at_s`` after a ticker's stream first started are
    not delivered; a disconnect also raises ExchangeError at its first, as a dropped
    WebSocket would."""

    kind: str  # "drop" or "disconnect"
    at_s: float
    for_s: float

    def covers(self, offset_s: float) -> bool:
        return self.at_s <= offset_s < self.at_s + self.for_s


@dataclass(frozen=True)
class Faults:
    """What a SIM exchange gets wrong on purpose; parsed once by :func:`parse_faults`."""

    outages: tuple[Outage, ...] = ()
    rest_off: bool = False  # refetch serves nothing (RangeUnavailable)
    opaque_ids: bool = False  # trade ids are hashes, not sequential numbers
    # Book deltas gone wrong, (kind, at_s): the first delta from at_s after the book stream
    # started loses a level change under the true checksum ("checksum"), or is not sent.
    book: tuple[tuple[str, float], ...] = ()


def parse_faults(spec: str) -> Faults:
    """``drop:20s@60s,disconnect:5s@120s,rest:off,ids:opaque,book:skip@30s``: comma-separated
    faults; durations and times in seconds, decimals allowed (``drop:1.5s@0.5s``)."""
    outages: list[Outage] = []
    book: list[tuple[str, float]] = []
    rest_off = opaque_ids = False
    for item in (part.strip() for part in spec.split(",")):
        if not item:
            continue
        if m := _OUTAGE.fullmatch(item):
            kind, for_s, at_s = m.group(1), float(m.group(2)), float(m.group(3))
            if for_s <= 0:
                raise ValueError(f"SIM fault {item!r}: the duration must be above 0 s")
            outages.append(Outage(kind, at_s, for_s))
        elif m := _BOOK_FAULT.fullmatch(item):
            book.append((m.group(1), float(m.group(2))))
        elif item == "rest:off":
            rest_off = True
        elif item == "ids:opaque":
            opaque_ids = True
        else:
            raise ValueError(f"SIM fault {item!r} is not one of: {FAULT_SYNTAX}")
    return Faults(
        tuple(sorted(outages, key=lambda o: o.at_s)),
        rest_off,
        opaque_ids,
        tuple(sorted(book, key=lambda f: f[1])),
    )


def opaque_id(seed: int, ticker: str, index: int) -> str:
    """A trade id with no order in it, as some venues hand out (``ids:opaque``)."""
    return hashlib.blake2b(f"{seed}:{ticker}:{index}".encode(), digest_size=8).hexdigest()


@dataclass
class _Symbol:
    ticker: str
    base: str
    quote: str
    p0: float
    key: np.uint64
    # Cumulative log-price (micro units) at the last minute of each block walked so far, and
    # the whole walk of the blocks read last, most recent last.
    ends: list[np.int64]
    kept: OrderedDict[int, np.ndarray] = field(default_factory=OrderedDict)
    started: float | None = None  # when its live stream first started: faults count from it
    disconnected: set[Outage] = field(default_factory=set)  # disconnects already raised
    book_started: float | None = None  # when its book stream first started: book faults
    # count from it. Each is made once: at its time, or, when the stream was starting again
    # then (after the fault before it), at the first delta of the new stream.
    book_faults_made: int = 0


class SimExchange(Exchange):
    checksum_as = "SIM"  # its deltas carry the OKX-formula checksum, whatever its name

    def __init__(
        self,
        name: str = "SIM",
        symbols: dict[str, float] | None = None,
        rate: float = 1.0,
        seed: int = 42,
        genesis_ms: int = GENESIS_MS,
        rows_per_page: int = 1000,
        faults: str | Faults = "",
    ) -> None:
        self.name = name
        self.seed = seed
        self.faults = parse_faults(faults) if isinstance(faults, str) else faults
        self.sequential_ids = not self.faults.opaque_ids
        self.per_minute = max(1, round(rate * 60))
        self.genesis_ms = genesis_ms
        self.rows_per_page = rows_per_page
        self._lock = threading.Lock()
        self._symbols: dict[str, _Symbol] = {}
        for pair, p0 in (symbols or DEFAULT_SYMBOLS).items():
            base, quote = pair.split("/")
            ticker = f"{name}:{pair}"
            digest = hashlib.blake2b(f"{seed}:{ticker}".encode(), digest_size=8).digest()
            key = np.uint64(int.from_bytes(digest, "little"))
            self._symbols[ticker] = _Symbol(ticker, base, quote, p0, key, [])

    # -- the price path ---------------------------------------------------------------------

    def _anchors(self, sym: _Symbol, first: int, last: int) -> np.ndarray:
        """Cumulative log-price at minutes first..last inclusive (minute 0 = genesis)."""
        with self._lock:
            whole = np.concatenate(
                [self._block(sym, b) for b in range(first // BLOCK, last // BLOCK + 1)]
            )
        offset = (first // BLOCK) * BLOCK
        return whole[first - offset : last - offset + 1]

    def _block(self, sym: _Symbol, b: int) -> np.ndarray:
        """Block ``b`` of the walk, from the end of the block before it (walked first when
        it never was); the last ``KEPT_BLOCKS`` read are kept. Under ``_lock``."""
        if (path := sym.kept.get(b)) is not None:
            sym.kept.move_to_end(b)
            return path
        while len(sym.ends) < b:
            self._walk(sym, len(sym.ends))
        path = self._walk(sym, b)
        sym.kept[b] = path
        if len(sym.kept) > KEPT_BLOCKS:
            sym.kept.popitem(last=False)
        return path

    @staticmethod
    def _walk(sym: _Symbol, b: int) -> np.ndarray:
        minutes = np.arange(b * BLOCK, (b + 1) * BLOCK, dtype=np.int64)
        u1 = _uniform(sym.key, minutes, 0, 1)
        u2 = _uniform(sym.key, minutes, 0, 2)
        z = np.sqrt(-2.0 * np.log(u1 + 1e-300)) * np.cos(2 * np.pi * u2)
        steps = np.rint(z * SIGMA_MICRO).astype(np.int64)
        start = sym.ends[b - 1] if b else np.int64(0)
        path = start + np.cumsum(steps)  # exact: integer sums
        if b == len(sym.ends):
            sym.ends.append(path[-1])
        return path

    def _minutes(
        self, sym: _Symbol, m0: int, m1: int, *, timed: bool = True
    ) -> dict[str, np.ndarray]:
        """Every trade of minutes m0..m1-1 (minute index since genesis), as arrays; candles
        need no ``timed`` (trade time and side)."""
        n = self.per_minute
        minutes = np.repeat(np.arange(m0, m1, dtype=np.int64), n)
        j = np.tile(np.arange(n, dtype=np.int64), m1 - m0)
        anchors = self._anchors(sym, m0, m1)  # includes the next minute's anchor
        lo = np.repeat(anchors[:-1], n).astype(np.float64)
        hi = np.repeat(anchors[1:], n).astype(np.float64)
        frac = (j + 1) / n
        noise = (_uniform(sym.key, minutes, j, 3) - 0.5) * SIGMA_MICRO * 0.5
        log_price = (lo + (hi - lo) * frac + noise) * 1e-6
        price = np.rint(sym.p0 * np.exp(log_price) * 10**PRICE_DECIMALS).astype(np.int64)
        size = 1 + np.floor(_uniform(sym.key, minutes, j, 4) * 2000).astype(np.int64)
        trades = {"minute": minutes, "j": j, "price": np.maximum(price, 1), "size": size}
        if not timed:
            return trades
        offset = np.floor((j + 0.9 * _uniform(sym.key, minutes, j, 5)) * (MINUTE_MS * 1000 // n))
        time_us = (self.genesis_ms + minutes * MINUTE_MS) * 1000 + offset.astype(np.int64)
        buy = _uniform(sym.key, minutes, j, 6) < 0.5
        return {**trades, "time_us": time_us, "buy": buy}

    # -- Exchange ---------------------------------------------------------------------------

    def markets(self) -> list[market_pb2.Market]:
        now = int(time.time() * 1000)
        return [
            market_pb2.Market(
                ticker=s.ticker,
                exchange=self.name,
                base=s.base,
                quote=s.quote,
                tick_size=fmt_fixed(1, PRICE_DECIMALS),
                lot_size=fmt_fixed(1, SIZE_DECIMALS),
                min_notional="10",
                status=market_pb2.TRADING,
                update_time_ms=now,
                exchange_symbol=f"{s.base}{s.quote}",
            )
            for s in self._symbols.values()
        ]

    def ohlc_page(self, ticker: str, period_s: int, page: Page) -> list[market_pb2.OHLC]:
        sym = self.symbol(ticker)
        if page.start_ms < self.genesis_ms:
            raise RangeUnavailable(f"{self.name} history starts at {self.genesis_ms} ms")
        period_ms = period_s * 1000
        first_open = page.start_ms - page.start_ms % period_ms
        if first_open < page.start_ms:
            first_open += period_ms
        now_ms = int(time.time() * 1000)
        # Candles opening in [page.start, page.end) that have closed by now.
        count = min(-(-(page.end_ms - first_open) // period_ms), (now_ms - first_open) // period_ms)
        if count <= 0:
            return []
        m0 = (first_open - self.genesis_ms) // MINUTE_MS
        m1 = m0 + count * (period_s // 60)
        t = self._minutes(sym, m0, m1, timed=False)
        n = self.per_minute
        per_candle = n * (period_s // 60)
        price = t["price"].reshape(-1, per_candle)
        size = t["size"].reshape(-1, per_candle)
        opens = (first_open + np.arange(price.shape[0], dtype=np.int64) * period_ms).tolist()
        d, v = PRICE_DECIMALS, SIZE_DECIMALS
        cols = zip(
            opens,
            fmt_fixed_column(price[:, 0], d),
            fmt_fixed_column(price.max(axis=1), d),
            fmt_fixed_column(price.min(axis=1), d),
            fmt_fixed_column(price[:, -1], d),
            fmt_fixed_column(size.sum(axis=1), v),
            strict=True,
        )
        return [
            market_pb2.OHLC(
                ticker=ticker,
                period_s=period_s,
                open_time_ms=t,
                open=o,
                high=h,
                low=lo,
                close=c,
                volume=vol,
                trade_count=per_candle,
                closed=True,
                update_time_ms=now_ms,
            )
            for t, o, h, lo, c, vol in cols
        ]

    def trade_batch(self, ticker: str, m0: int, m1: int) -> list[market_pb2.Tick]:
        """The trades of minutes [m0, m1) since genesis; what `trades` streams."""
        return list(self.iter_trades(ticker, m0, m1))

    def trade_run(self, ticker: str, m0: int, m1: int) -> TradeRun:
        """:meth:`trade_batch` as columns, no Tick made (``ingest_time_ns`` 0)."""
        sym = self.symbol(ticker)
        t = self._minutes(sym, m0, m1)
        n = self.per_minute
        ids = (t["minute"] * n + t["j"]).tolist()  # columns as lists: no numpy scalars per tick
        if self.faults.opaque_ids:
            trade_ids = [opaque_id(self.seed, ticker, i) for i in ids]
        else:
            trade_ids = list(map(str, ids))
        return TradeRun(
            ticker,
            trade_ids,
            fmt_fixed_column(t["price"], PRICE_DECIMALS),
            fmt_fixed_column(t["size"], SIZE_DECIMALS),
            np.where(t["buy"], market_pb2.BUY, market_pb2.SELL).tolist(),
            (t["time_us"] * 1000).tolist(),
        )

    def iter_trades(self, ticker: str, m0: int, m1: int) -> Iterator[market_pb2.Tick]:
        """:meth:`trade_batch` one Tick at a time, each made as it is taken: a stream that
        held a batch's Ticks at once spent about a microsecond more on each (36,000 messages
        of a 10-minute flood, each its own allocation, cold again by the time it is sent)."""
        run = self.trade_run(ticker, m0, m1)
        return map(run.tick, range(len(run)))

    def trade_runs(
        self, ticker: str, stop: threading.Event
    ) -> Iterator[market_pb2.Tick | TradeRun]:
        """Live trades, each when it is due: every time the stream wakes, the trades due by
        then as one run. With outages set (``faults``), one Tick at a time, each judged
        alone as it falls due."""
        sym = self.symbol(ticker)
        now_ms = int(time.time() * 1000)
        with self._lock:
            if sym.started is None:
                sym.started = now_ms / 1000
        minute = (now_ms - self.genesis_ms) // MINUTE_MS
        alone = bool(self.faults.outages)
        while not stop.is_set():
            run = self.trade_run(ticker, minute, minute + 1)
            times, end = run.times_ns, len(run)
            i = bisect_left(times, now_ms * 1_000_000)  # those already past when it started
            while i < end:
                while (wait_ns := times[i] - time.time_ns()) > 0:  # in whole ns: exact
                    if stop.wait(min(wait_ns / 1e9, 0.5)):
                        return
                if alone:
                    if not self._lost(sym, times[i] / 1e9):
                        tick = run.tick(i)
                        tick.ingest_time_ns = time.time_ns()
                        yield tick
                    i += 1
                    continue
                now_ns = time.time_ns()
                due = bisect_right(times, now_ns, i)  # past i: times[i] <= now_ns
                yield run.slice(i, due, now_ns)
                i = due
            minute += 1

    def trades(self, ticker: str, stop: threading.Event) -> Iterator[market_pb2.Tick]:
        return one_by_one(self.trade_runs(ticker, stop), stop)

    def _lost(self, sym: _Symbol, due_s: float) -> bool:
        """Whether a fault swallows the trade due at ``due_s``; a disconnect's first raises."""
        offset = due_s - (sym.started or due_s)
        outage = next((o for o in self.faults.outages if o.covers(offset)), None)
        if outage is None:
            return False
        if outage.kind == "disconnect" and outage not in sym.disconnected:
            sym.disconnected.add(outage)
            raise ExchangeError(f"{self.name}: simulated disconnect for {outage.for_s:g} s")
        return True

    def refetch(
        self, ticker: str, from_ns: int, to_ns: int, after_id: str | None = None
    ) -> list[market_pb2.Tick]:
        """Every trade of the walk in the range that has happened by now, exactly as streamed."""
        self.symbol(ticker)
        if self.faults.rest_off:
            raise RangeUnavailable(f"{self.name}: the REST API serves no trades (rest:off)")
        to_ns = min(to_ns, time.time_ns())
        if from_ns < self.genesis_ms * 1_000_000:
            raise RangeUnavailable(f"{self.name} history starts at {self.genesis_ms} ms")
        return self.trades_between(ticker, from_ns, to_ns)

    def trades_between(self, ticker: str, from_ns: int, to_ns: int) -> list[market_pb2.Tick]:
        """Every trade of the walk with from_ns <= time <= to_ns, whatever a fault did to the
        stream: what the REST API serves, and the tests' and benches' oracle."""
        if to_ns < from_ns:
            return []
        m0 = (from_ns // 1_000_000 - self.genesis_ms) // MINUTE_MS
        m1 = (to_ns // 1_000_000 - self.genesis_ms) // MINUTE_MS + 1
        return [
            t for t in self.trade_batch(ticker, m0, m1) if from_ns <= t.exchange_time_ns <= to_ns
        ]

    # -- the order book (#38, ingest.exchanges.sim_book) ------------------------------------

    def _book_states(
        self, sym: _Symbol, n0: int, n1: int
    ) -> list[tuple[int, int, tuple[sim_book.Side, sim_book.Side]]]:
        """(n, time in ns, (bids, asks)) of updates n0 <= n < n1; update n follows trade n."""
        per = self.per_minute
        m0 = n0 // per
        t = self._minutes(sym, m0, n1 // per + 1)  # through trade n1, the last one's next
        price, size = t["price"].tolist(), t["size"].tolist()
        buy, time_us = t["buy"].tolist(), t["time_us"].tolist()
        key, base = int(sym.key), m0 * per
        grid = sim_book.grid_ticks(round(sym.p0 * 10**PRICE_DECIMALS))
        return [
            (
                n,
                time_us[n - base] * 1000,
                sim_book.levels(key, grid, n, price[k], buy[k], size[k]),
            )
            for n in range(n0, n1)
            for k in (n + 1 - base,)
        ]

    def _book_text(self, ticker: str) -> sim_book.BookText:
        return sim_book.BookText(ticker, PRICE_DECIMALS, SIZE_DECIMALS)

    def book_at(self, ticker: str, n: int) -> book_pb2.BookSnapshot:
        """The book right after update ``n``: the oracle a client's book is held to."""
        (book,) = self.books(ticker, n, n + 1)
        return book

    def books(self, ticker: str, n0: int, n1: int) -> list[book_pb2.BookSnapshot]:
        """:meth:`book_at` of each update n0 <= n < n1, made in one pass over their minutes
        (each call of :meth:`book_at` makes its minute's trades again)."""
        text = self._book_text(ticker)
        return [
            text.snapshot(n, time_ns, bids, asks, book_pb2.SNAPSHOT_START)
            for n, time_ns, (bids, asks) in self._book_states(self.symbol(ticker), n0, n1)
        ]

    def book_seq_at(self, ticker: str, time_ns: int) -> int:
        """The last update at or before ``time_ns``."""
        sym = self.symbol(ticker)
        minute = (time_ns // 1_000_000 - self.genesis_ms) // MINUTE_MS
        times = self._minutes(sym, minute, minute + 1)["time_us"] * 1000
        return minute * self.per_minute + int(np.searchsorted(times, time_ns, "right")) - 1

    def book_snapshot(self, ticker: str) -> book_pb2.BookSnapshot:
        return self.book_at(ticker, self.book_seq_at(ticker, time.time_ns()))

    def book_deltas(self, ticker: str, stop: threading.Event) -> Iterator[book_pb2.BookDelta]:
        sym = self.symbol(ticker)
        start_ns = time.time_ns()
        with self._lock:
            if sym.book_started is None:
                sym.book_started = start_ns / 1e9
        return self._book_stream(sym, start_ns, stop)

    def _book_stream(
        self, sym: _Symbol, start_ns: int, stop: threading.Event
    ) -> Iterator[book_pb2.BookDelta]:
        text, per = self._book_text(sym.ticker), self.per_minute
        faults = list(self.faults.book[sym.book_faults_made :])
        n = self.book_seq_at(sym.ticker, start_ns) + 1
        prev = self._book_states(sym, n - 1, n)[0][2]
        while not stop.is_set():
            states = self._book_states(sym, n, (n // per + 1) * per)
            for n, time_ns, book in states:
                while (wait := (time_ns - time.time_ns()) / 1e9) > 0:
                    if stop.wait(min(wait, 0.5)):
                        return
                delta = text.delta(n, time_ns, prev, book)
                prev = book
                offset = time_ns / 1e9 - (sym.book_started or 0)
                if faults and offset >= faults[0][1]:
                    kind, _ = faults.pop(0)
                    sym.book_faults_made += 1
                    if kind == "skip":
                        continue
                    delta = (sim_book.corrupt if kind == "checksum" else sim_book.malformed)(delta)
                delta.ingest_time_ns = time.time_ns()
                yield delta
            n += 1
