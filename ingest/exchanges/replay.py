"""REPLAY: Binance Vision downloads, read as Binance publishes them.

    <root>/spot/{daily,monthly}/klines/<SYMBOL>/<interval>/<SYMBOL>-<interval>-<date>.zip
    <root>/spot/{daily,monthly}/trades/<SYMBOL>/<SYMBOL>-trades-<date>.zip
    <root>/spot/{daily,monthly}/aggTrades/<SYMBOL>/<SYMBOL>-aggTrades-<date>.zip

``<date>`` is ``YYYY-MM-DD`` (daily) or ``YYYY-MM`` (monthly); an archive may have its
``<name>.zip.CHECKSUM`` (sha256) beside it, and ``.csv`` files (unpacked) are read too.

- **One index, no full scans.** The file names say what each file covers, so one walk of the
  root builds the index (file → time range), and a page opens only the files it overlaps.
  The last files read are kept parsed, so consecutive pages of a monthly file parse it once.
- **Nothing twice.** A daily file whose day a monthly file of the same series covers is left
  out, and so is a ``.csv`` beside its own ``.zip``.
- **Checked.** A CHECKSUM that does not match, a corrupt archive or a malformed row is a
  :class:`ReplayFileError` naming the file (and line): a history page that needs that file
  fails with it, the trade stream skips that file; no other file's rows are lost.
- **Both timestamp units**: milliseconds, and the microseconds of files from 2025 on.

klines: open_time, open, high, low, close, volume, close_time, quote_volume, count, ...
trades: id, price, qty, quote_qty, time, is_buyer_maker, is_best_match.
aggTrades: id, price, qty, first_id, last_id, time, is_buyer_maker, is_best_match.

History always keeps the recorded times. The trade stream has two clocks: ``original``
keeps them (a replayed day lands in Iceberg exactly as it happened); ``live`` shifts them
to now (the first trade's time becomes the start). Either way trades come at ``speed``
times the recorded pace (``inf``: as fast as they can be sent).
``python -m ingest.exchanges.replay OUT_DIR`` writes a small sample recorded from SIM.
"""

from __future__ import annotations

import bisect
import calendar
import csv
import functools
import hashlib
import io
import itertools
import logging
import re
import sys
import threading
import time
import zipfile
from collections import OrderedDict
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from ingest.exchanges.base import Exchange, Page, RangeUnavailable, TradeRun, one_by_one
from proto import market_pb2

log = logging.getLogger("candlewire.ingest.replay")
SAMPLE = Path(__file__).resolve().parent.parent / "samples" / "binance-vision"
INTERVALS = {60: "1m", 300: "5m", 900: "15m", 3600: "1h", 14400: "4h", 86400: "1d"}
QUOTES = ("USDT", "USDC", "FDUSD", "BUSD", "BTC", "ETH", "EUR", "TRY")
KINDS = ("klines", "trades", "aggTrades")
Clock = Literal["original", "live"]
NAME = re.compile(r"(?P<symbol>[A-Z0-9]+)-(?P<what>[A-Za-z0-9]+)-(?P<date>\d{4}-\d{2}(?:-\d{2})?)")
NUMBER = re.compile(r"[0-9]+(?:\.[0-9]*)?(?:[eE][+-]?[0-9]+)?")
PARSED_FILES_KEPT = 4
DAY_MS = 86_400_000
RUN_ROWS = 8192  # rows a trade run holds at most: a stop is heard between runs
INF = float("inf")


class ReplayFileError(RangeUnavailable):
    """A file that cannot be read as Binance Vision publishes it. Final: retrying reads the
    same bytes."""


def split_symbol(symbol: str) -> tuple[str, str]:
    for quote in QUOTES:
        if symbol.endswith(quote) and len(symbol) > len(quote):
            return symbol[: -len(quote)], quote
    raise ValueError(f"cannot split {symbol} into base and quote")


def parse_speed(text: str) -> float:
    """``10x``, ``10``, ``0.5x`` or ``max`` (as fast as trades can be sent)."""
    if text.strip().lower() in ("max", "inf"):
        return float("inf")
    value = float(text.strip().lower().removesuffix("x"))
    if value <= 0:
        raise ValueError(f"speed {text!r} must be above 0")
    return value


@dataclass(frozen=True, order=True)
class Recorded:
    """One downloaded file and the time it covers, from its name."""

    start_ms: int
    end_ms: int
    path: Path = field(compare=False)
    monthly: bool = field(compare=False)


def _span(date: str) -> tuple[int, int, bool]:
    parts = [int(p) for p in date.split("-")]
    if len(parts) == 3:
        start = calendar.timegm((*parts, 0, 0, 0)) * 1000
        return start, start + DAY_MS, False
    year, month = parts
    start = calendar.timegm((year, month, 1, 0, 0, 0)) * 1000
    end = calendar.timegm((year + month // 12, month % 12 + 1, 1, 0, 0, 0)) * 1000
    return start, end, True


def build_index(root: Path) -> dict[tuple[str, str, str], list[Recorded]]:
    """(kind, SYMBOL, interval or "") → its files in time order, without overlaps."""
    found: dict[tuple[str, str, str], dict[str, Recorded]] = {}
    for granularity in ("daily", "monthly"):
        for kind in KINDS:
            folder = root / "spot" / granularity / kind
            if not folder.is_dir():
                continue
            for path in sorted(folder.rglob("*")):
                if path.suffix not in (".zip", ".csv"):
                    continue
                m = NAME.fullmatch(path.stem)
                if m is None:
                    log.warning("replay: %s is not named as Binance Vision names files", path)
                    continue
                interval = m["what"] if kind == "klines" else ""
                start, end, monthly = _span(m["date"])
                series = found.setdefault((kind, m["symbol"], interval), {})
                held = series.get(path.stem)
                if held is None or path.suffix == ".zip":  # a .csv beside its .zip: once
                    series[path.stem] = Recorded(start, end, path, monthly)
    index = {}
    for key, files in found.items():
        months = [f for f in files.values() if f.monthly]
        kept = [
            f
            for f in files.values()
            if f.monthly or not any(m.start_ms <= f.start_ms < m.end_ms for m in months)
        ]
        index[key] = sorted(kept)
    return index


@dataclass(frozen=True)
class Recording:
    """A file's data rows in time order, and their times in microseconds."""

    rows: Sequence[Sequence[str]]
    times: list[int]

    def between(self, start_ms: int, end_ms: int) -> tuple[list[int], Sequence[Sequence[str]]]:
        lo = bisect.bisect_left(self.times, start_ms * 1000)
        hi = bisect.bisect_left(self.times, end_ms * 1000)
        return self.times[lo:hi], self.rows[lo:hi]


class RecordedRows:
    """Files' rows, checked: the CHECKSUM beside each, the archive, each row's shape."""

    def __init__(self) -> None:
        self._verified: set[tuple[Path, int, int]] = set()
        self._parsed: OrderedDict[Path, Recording] = OrderedDict()
        self._lock = threading.Lock()

    def rows(self, path: Path, columns: int, time_col: int) -> Recording:
        """Every data row (the header newer files carry is skipped), kept parsed for the
        next pages."""
        with self._lock:
            if path in self._parsed:
                self._parsed.move_to_end(path)
                return self._parsed[path]
        recording = self._read(path, columns, time_col)
        with self._lock:
            self._parsed[path] = recording
            while len(self._parsed) > PARSED_FILES_KEPT:
                self._parsed.popitem(last=False)
        return recording

    def _read(self, path: Path, columns: int, time_col: int) -> Recording:
        self._verify(path)
        try:
            if path.suffix == ".zip":
                with zipfile.ZipFile(path) as archive:
                    members = [n for n in archive.namelist() if n.endswith(".csv")]
                    if len(members) != 1:
                        raise ReplayFileError(f"{path}: holds {len(members)} .csv files, not 1")
                    data = archive.read(members[0])
            else:
                data = path.read_bytes()
            recording = _read_as_table(data, columns, time_col)
            if recording is not None:
                return recording
            text = io.TextIOWrapper(io.BytesIO(data), "utf-8", newline="")
            return _checked(text, path, columns, time_col)
        except (zipfile.BadZipFile, EOFError, UnicodeDecodeError, OSError) as exc:
            raise ReplayFileError(f"{path}: not readable ({exc})") from None

    def _verify(self, path: Path) -> None:
        check = path.with_name(path.name + ".CHECKSUM")
        if not check.exists():
            return
        stat = path.stat()
        key = (path, stat.st_size, stat.st_mtime_ns)
        if key in self._verified:
            return
        words = check.read_text().split()
        expected = words[0].lower() if words else ""
        digest = hashlib.sha256()
        with path.open("rb") as f:
            while chunk := f.read(1 << 20):
                digest.update(chunk)
        if digest.hexdigest() != expected:
            raise ReplayFileError(
                f"{path}: sha256 {digest.hexdigest()} does not match its CHECKSUM {expected}"
            )
        self._verified.add(key)


@functools.cache
def _row_pattern(columns: int) -> re.Pattern[str]:
    """A data line whose first ``columns`` fields are numbers (one match per line, not one
    per field: most of a page's time was the check)."""
    return re.compile(",".join([NUMBER.pattern] * columns) + r"(?:,[^\r\n]*)?")


def _read_as_table(data: bytes, columns: int, time_col: int) -> Recording | None:
    """What :func:`_checked` makes of a file, read whole by Arrow's CSV reader and checked by
    one match a column (a file line by line spent about 3.4 µs a row, most of REPLAY's time
    at ``--speed max``), or None for any file not plainly of that shape: ragged rows, a
    bad field, a time not an integer. :func:`_checked` then reads it and names the line."""
    import pyarrow as pa  # only REPLAY reads files: no ingestor of another venue loads it
    import pyarrow.compute as pc
    import pyarrow.csv as csv

    if data[:1] and not data[:1].isdigit():  # the header of newer files
        data = data[data.find(b"\n") + 1 :] if b"\n" in data else b""
    if not data.strip():
        return None
    try:
        table = csv.read_csv(
            pa.py_buffer(data),
            read_options=csv.ReadOptions(autogenerate_column_names=True),
            # Binance quotes nothing: a quote is a bad field, as it is to _checked.
            parse_options=csv.ParseOptions(quote_char=False, escape_char=False),
            convert_options=csv.ConvertOptions(
                column_types=dict.fromkeys([f"f{i}" for i in range(64)], pa.string()),
                strings_can_be_null=False,
            ),
        )
    except (pa.ArrowInvalid, pa.ArrowTypeError):
        return None
    if table.num_columns < columns:
        return None
    number = f"^(?:{NUMBER.pattern})$"
    if not all(
        pc.all(pc.match_substring_regex(table.column(i), number)).as_py() for i in range(columns)
    ):
        return None
    try:
        raw = pc.cast(table.column(time_col), pa.int64())
    except (pa.ArrowInvalid, pa.ArrowTypeError):
        return None
    # µs in files from 2025 on, else ms; in Python, since an Arrow scalar of a Python int
    # and Arrow's to_numpy each load pandas
    times = [t if t > 10**14 else t * 1000 for t in raw.to_pylist()]
    rows: Sequence[Sequence[str]] = list(zip(*(c.to_pylist() for c in table.columns), strict=True))
    if any(a > b for a, b in itertools.pairwise(times)):
        order = sorted(range(len(times)), key=times.__getitem__)
        rows, times = [rows[i] for i in order], [times[i] for i in order]
    return Recording(rows, times)


def _checked(lines: Iterator[str], path: Path, columns: int, time_col: int) -> Recording:
    """Rows with a numeric time and decimal numbers where the layout has them, in time
    order (files are; a stable sort otherwise). Binance's files quote nothing, so a line
    splits on commas."""
    pattern = _row_pattern(columns)
    rows, times = [], []
    for line_no, raw in enumerate(lines, start=1):
        line = raw.rstrip("\r\n")
        if not line or (line_no == 1 and not line[:1].isdigit()):
            continue  # a blank line; the header of newer files
        if pattern.fullmatch(line) is None:
            raise ReplayFileError(f"{path}:{line_no}: malformed row {line[:200]!r}")
        row = line.split(",")
        try:
            t = int(row[time_col])
        except ValueError:  # a number, but not a whole one
            raise ReplayFileError(
                f"{path}:{line_no}: time {row[time_col]!r} is not an integer"
            ) from None
        times.append(t if t > 10**14 else t * 1000)  # µs in files from 2025 on, else ms
        rows.append(row)
    if any(a > b for a, b in itertools.pairwise(times)):
        order = sorted(range(len(times)), key=times.__getitem__)
        rows, times = [rows[i] for i in order], [times[i] for i in order]
    return Recording(rows, times)


class ReplayExchange(Exchange):
    def __init__(
        self,
        name: str = "REPLAY",
        root: Path = SAMPLE,
        speed: float = 1.0,
        clock: Clock = "original",
    ) -> None:
        if clock not in ("original", "live"):
            raise ValueError(f"clock must be 'original' or 'live', not {clock!r}")
        self.name, self.root, self.speed, self.clock = name, Path(root), speed, clock
        self.recorded = clock == "original"
        if not (self.root / "spot").is_dir():
            raise ValueError(f"replay root {self.root} has no spot/ folder (Binance Vision layout)")
        self.files = RecordedRows()
        self.index = build_index(self.root)
        self._symbols = {}
        for _kind, symbol, _interval in self.index:
            base, quote = split_symbol(symbol)
            self._symbols[f"{name}:{base}/{quote}"] = symbol
        self.errors = 0  # files the trade stream skipped

    def markets(self) -> list[market_pb2.Market]:
        now_ms = int(time.time() * 1000)
        return [
            market_pb2.Market(
                ticker=ticker,
                exchange=self.name,
                base=split_symbol(symbol)[0],
                quote=split_symbol(symbol)[1],
                status=market_pb2.TRADING,
                exchange_symbol=symbol,
                update_time_ms=now_ms,
            )
            for ticker, symbol in sorted(self._symbols.items())
        ]

    def _klines(self, ticker: str, period_s: int) -> list[Recorded]:
        interval = INTERVALS.get(period_s, "")
        files = self.index.get(("klines", self.symbol(ticker), interval))
        if not files:
            raise RangeUnavailable(f"no {interval or period_s}s klines recorded for {ticker}")
        return files

    def ohlc_page(self, ticker: str, period_s: int, page: Page) -> list[market_pb2.OHLC]:
        files = self._klines(ticker, period_s)
        first = bisect.bisect_right([f.end_ms for f in files], page.start_ms)
        candles: dict[int, market_pb2.OHLC] = {}
        for f in files[first:]:
            if f.start_ms >= page.end_ms:
                break
            times, rows = self.files.rows(f.path, 9, 0).between(page.start_ms, page.end_ms)
            for t_us, r in zip(times, rows, strict=True):
                t = t_us // 1000
                if not r[8].isdigit():  # a number by the file's check, but not a count
                    raise ReplayFileError(f"{f.path}: trade count {r[8]!r} is not an integer")
                candles[t] = market_pb2.OHLC(
                    ticker=ticker,
                    period_s=period_s,
                    open_time_ms=t,
                    open=r[1],
                    high=r[2],
                    low=r[3],
                    close=r[4],
                    volume=r[5],
                    trade_count=int(r[8]),
                    closed=True,
                )
        return [candles[t] for t in sorted(candles)]

    def recorded_range(self, ticker: str, period_s: int) -> tuple[int, int]:
        """First open time and end of the recorded klines, for tests and demos."""
        files = self._klines(ticker, period_s)
        first = self.files.rows(files[0].path, 9, 0).times[0] // 1000
        last = self.files.rows(files[-1].path, 9, 0).times[-1] // 1000
        return first, last + period_s * 1000

    def trade_runs(
        self, ticker: str, stop: threading.Event
    ) -> Iterator[market_pb2.Tick | TradeRun]:
        """Trades (aggTrades where no trades were downloaded), file by file in time order:
        each time the stream wakes, the rows due by then (at most ``RUN_ROWS``) as one run."""
        symbol = self.symbol(ticker)
        kind = "trades" if ("trades", symbol, "") in self.index else "aggTrades"
        time_col = 4 if kind == "trades" else 5
        prefix = "" if kind == "trades" else "a"
        speed, live_clock = self.speed, self.clock == "live"
        t0_rec: int | None = None
        t0_wall = time.time()
        for f in self.index.get((kind, symbol, ""), []):
            try:
                recording = self.files.rows(f.path, time_col + 1, time_col)
            except ReplayFileError as exc:
                self.errors += 1
                log.error("replay: %s skipped: %s", ticker, exc)
                continue
            times, rows, i = recording.times, recording.rows, 0
            t0_rec = times[0] if t0_rec is None and times else t0_rec
            while i < len(rows):
                due = t0_wall + (times[i] - t0_rec) / 1e6 / speed
                while (wait := due - time.time()) > 0:
                    if stop.wait(min(wait, 0.5)):
                        return
                if stop.is_set():
                    return
                # Every row due by now: recorded at or before t0 + the wall time since, sped up.
                ran_us = (time.time() - t0_wall) * speed * 1e6 if speed < INF else INF
                j = min(max(i + 1, bisect.bisect_right(times, t0_rec + ran_us, i)), i + RUN_ROWS)
                recorded_us, batch = times[i:j], rows[i:j]
                shown_ns = (
                    [int((t0_wall + (t - t0_rec) / 1e6 / speed) * 1e9) for t in recorded_us]
                    if live_clock
                    else [t * 1000 for t in recorded_us]
                )
                sides = [
                    market_pb2.SELL
                    if len(r) > time_col + 1 and r[time_col + 1].lower() == "true"
                    else market_pb2.BUY
                    for r in batch
                ]
                yield TradeRun(
                    ticker,
                    [prefix + r[0] for r in batch],
                    [r[1] for r in batch],
                    [r[2] for r in batch],
                    sides,
                    shown_ns,
                    time.time_ns(),
                )
                i = j

    def trades(self, ticker: str, stop: threading.Event) -> Iterator[market_pb2.Tick]:
        return one_by_one(self.trade_runs(ticker, stop), stop)


def kline_row(c: market_pb2.OHLC, period_s: int) -> list:
    """A candle in Binance's 12-column kline layout (files and REST answers alike)."""
    close_time = c.open_time_ms + period_s * 1000 - 1
    return [
        c.open_time_ms,
        c.open,
        c.high,
        c.low,
        c.close,
        c.volume,
        close_time,
        "0",
        c.trade_count,
        "0",
        "0",
        "0",
    ]


def write_sample(out: Path, day_ms: int = 1_735_689_600_000) -> None:
    """Record one day of SIM klines (1m, 1h) and 30 minutes of trades per symbol."""
    from ingest.exchanges.base import pages
    from ingest.exchanges.sim import GENESIS_MS, MINUTE_MS, SimExchange

    sim = SimExchange(name="SIM", symbols={"BTC/USDT": 30_000.0, "ETH/USDT": 2_000.0})
    day = time.strftime("%Y-%m-%d", time.gmtime(day_ms / 1000))
    for ticker in ("SIM:BTC/USDT", "SIM:ETH/USDT"):
        symbol = ticker.split(":")[1].replace("/", "")
        for period in (60, 3600):
            folder = out / "spot" / "daily" / "klines" / symbol / INTERVALS[period]
            folder.mkdir(parents=True, exist_ok=True)
            with (folder / f"{symbol}-{INTERVALS[period]}-{day}.csv").open("w", newline="") as f:
                w = csv.writer(f)
                for page in pages(day_ms, day_ms + 86_400_000, period, 1440):
                    for c in sim.ohlc_page(ticker, period, page):
                        w.writerow(kline_row(c, period))
        folder = out / "spot" / "daily" / "trades" / symbol
        folder.mkdir(parents=True, exist_ok=True)
        m0 = (day_ms - GENESIS_MS) // MINUTE_MS
        with (folder / f"{symbol}-trades-{day}.csv").open("w", newline="") as f:
            w = csv.writer(f)
            for t in sim.trade_batch(ticker, m0, m0 + 30):
                w.writerow(
                    [
                        t.trade_id,
                        t.price,
                        t.size,
                        "0",
                        t.exchange_time_ns // 1_000_000,
                        t.side == market_pb2.SELL,
                        True,
                    ]
                )


if __name__ == "__main__":
    write_sample(Path(sys.argv[1]) if len(sys.argv) > 1 else SAMPLE)
