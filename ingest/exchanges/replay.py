"""REPLAY: recorded files in the public Binance-Vision CSV layouts.

    <root>/spot/daily/klines/<SYMBOL>/<interval>/<SYMBOL>-<interval>-<YYYY-MM-DD>.csv
    <root>/spot/daily/trades/<SYMBOL>/<SYMBOL>-trades-<YYYY-MM-DD>.csv

klines: open_time, open, high, low, close, volume, close_time, quote_volume, count,
taker_buy_volume, taker_buy_quote_volume, ignore. trades: id, price, qty, quote_qty, time,
is_buyer_maker, is_best_match. Times are ms, or µs in files from 2025 on; both are read.
History comes from klines; the live stream replays trades at ``speed`` times real time, with
exchange times shifted to now (the recorded time of the first trade becomes the start).
``python -m ingest.exchanges.replay OUT_DIR`` writes a small sample recorded from SIM.
"""

from __future__ import annotations

import csv
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

from ingest.exchanges.base import Exchange, Page, RangeUnavailable
from proto import market_pb2

SAMPLE = Path(__file__).resolve().parent.parent / "samples" / "binance-vision"
INTERVALS = {60: "1m", 300: "5m", 900: "15m", 3600: "1h", 14400: "4h", 86400: "1d"}
QUOTES = ("USDT", "USDC", "FDUSD", "BUSD", "BTC", "ETH", "EUR", "TRY")


def _ms(value: str) -> int:
    t = int(value)
    return t // 1000 if t > 10**14 else t  # µs since 2025


def _rows(path: Path) -> Iterator[list[str]]:
    with path.open(newline="") as f:
        for row in csv.reader(f):
            if row and row[0][:1].isdigit():  # skip the header newer files carry
                yield row


def split_symbol(symbol: str) -> tuple[str, str]:
    for quote in QUOTES:
        if symbol.endswith(quote) and len(symbol) > len(quote):
            return symbol[: -len(quote)], quote
    raise ValueError(f"cannot split {symbol} into base and quote")


class ReplayExchange(Exchange):
    def __init__(self, name: str = "REPLAY", root: Path = SAMPLE, speed: float = 1.0) -> None:
        self.name = name
        self.root = Path(root)
        self.speed = speed
        self._symbols = {}
        for d in sorted((self.root / "spot" / "daily").glob("*/*")):
            if d.is_dir():
                base, quote = split_symbol(d.name)
                self._symbols[f"{name}:{base}/{quote}"] = d.name

    def markets(self) -> list[market_pb2.Market]:
        out = []
        for ticker, symbol in self._symbols.items():
            base, quote = split_symbol(symbol)
            out.append(
                market_pb2.Market(
                    ticker=ticker,
                    exchange=self.name,
                    base=base,
                    quote=quote,
                    status=market_pb2.TRADING,
                    exchange_symbol=symbol,
                    update_time_ms=int(time.time() * 1000),
                )
            )
        return out

    def ohlc_page(self, ticker: str, period_s: int, page: Page) -> list[market_pb2.OHLC]:
        symbol = self.symbol(ticker)
        interval = INTERVALS.get(period_s)
        files = sorted(
            (self.root / "spot" / "daily" / "klines" / symbol / str(interval)).glob("*.csv")
        )
        if interval is None or not files:
            raise RangeUnavailable(f"no {interval or period_s}s klines recorded for {ticker}")
        out = []
        for path in files:
            for r in _rows(path):
                t = _ms(r[0])
                if page.start_ms <= t < page.end_ms:
                    out.append(
                        market_pb2.OHLC(
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
                    )
        return sorted(out, key=lambda c: c.open_time_ms)

    def recorded_range(self, ticker: str, period_s: int) -> tuple[int, int]:
        """First open time and end of the recorded klines, for tests and demos."""
        symbol = self.symbol(ticker)
        folder = self.root / "spot" / "daily" / "klines" / symbol / INTERVALS[period_s]
        times = [_ms(r[0]) for p in sorted(folder.glob("*.csv")) for r in _rows(p)]
        return min(times), max(times) + period_s * 1000

    def trades(self, ticker: str, stop: threading.Event) -> Iterator[market_pb2.Tick]:
        symbol = self.symbol(ticker)
        files = sorted((self.root / "spot" / "daily" / "trades" / symbol).glob("*.csv"))
        t0_rec: int | None = None
        t0_wall = time.time()
        for path in files:
            for r in _rows(path):
                rec_ms = _ms(r[4])
                t0_rec = rec_ms if t0_rec is None else t0_rec
                due = t0_wall + (rec_ms - t0_rec) / 1000 / self.speed
                while (wait := due - time.time()) > 0:
                    if stop.wait(min(wait, 0.5)):
                        return
                if stop.is_set():
                    return
                yield market_pb2.Tick(
                    ticker=ticker,
                    trade_id=r[0],
                    price=r[1],
                    size=r[2],
                    side=market_pb2.SELL if r[5].lower() == "true" else market_pb2.BUY,
                    exchange_time_ns=int(due * 1e9),
                    ingest_time_ns=time.time_ns(),
                )


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
