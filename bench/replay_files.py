"""REPLAY of Binance Vision downloads into Kafka (#20), against ``bench.ingest``'s SIM rate
measured in the same run on the same private broker.

- ``klines_per_s``: one month of 1-minute klines (a monthly zip of 44,640 rows, with its
  CHECKSUM) fetched as one history request (every page into ``candlewire.ohlc-batches``).
- ``trades_per_s``: one day of trades (a daily zip, ``--trades`` rows, microsecond times as
  in 2025 files) streamed as fast as the sink takes them.
- ``ingest_ticks_per_s``: ``bench.ingest``'s SIM stream; the targets are half of it.
- ``first_page_s``: from opening a 12-month root (12 monthly zips) to its first page: the
  index comes from the file names, the page opens one file.

    python -m bench.replay_files [--trades N] [--seconds S]
"""

from __future__ import annotations

import argparse
import csv
import hashlib
import io
import json
import random
import tempfile
import threading
import time
import zipfile
from pathlib import Path

from bench.ingest import sim_ticks_per_s, topic_size
from bench.stack import private_broker, sigterm_unwinds
from candlewire.kafka import ensure_topics
from ingest.exchanges.base import Page
from ingest.exchanges.replay import ReplayExchange
from ingest.jobs import run_history, run_stream
from ingest.sink import KafkaSink
from proto import requests_pb2 as rq

SYMBOL, TICKER = "BTCUSDT", "REPLAY:BTC/USDT"
JAN_2024 = 1_704_067_200_000
MINUTE_MS = 60_000


def write_zip(folder: Path, name: str, rows: list[list]) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    text = io.StringIO()
    csv.writer(text).writerows(rows)
    path = folder / f"{name}.zip"
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as z:
        z.writestr(f"{name}.csv", text.getvalue())
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    (folder / f"{name}.zip.CHECKSUM").write_text(f"{digest}  {name}.zip\n")


def month_of_klines(year: int, month: int, start_ms: int, rng: random.Random) -> list[list]:
    days = (
        29
        if month == 2 and year % 4 == 0
        else (31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31)[month - 1]
    )
    price, rows = 42_000.0, []
    for i in range(days * 1440):
        t = start_ms + i * MINUTE_MS
        o, price = price, max(1.0, price + rng.gauss(0, 15))
        hi, lo = max(o, price) + 3.5, min(o, price) - 2.25
        rows.append(
            [
                t,
                f"{o:.2f}",
                f"{hi:.2f}",
                f"{lo:.2f}",
                f"{price:.2f}",
                f"{rng.random() * 20:.5f}",
                t + MINUTE_MS - 1,
                "0",
                rng.randint(1, 900),
                "0",
                "0",
                "0",
            ]
        )
    return rows


def write_root(root: Path, months: int, trades: int) -> None:
    rng = random.Random(7)
    start = JAN_2024
    for m in range(months):
        year, month = 2024 + m // 12, m % 12 + 1
        rows = month_of_klines(year, month, start, rng)
        folder = root / "spot/monthly/klines" / SYMBOL / "1m"
        write_zip(folder, f"{SYMBOL}-1m-{year}-{month:02d}", rows)
        start = rows[-1][0] + MINUTE_MS
    if trades:
        t_us, price, rows = JAN_2024 * 1000, 42_000.0, []
        for i in range(trades):
            t_us += rng.randint(1, 2 * 86_400_000_000 // trades)
            price = max(1.0, price + rng.gauss(0, 0.5))
            qty = f"{rng.random():.5f}"
            rows.append([i, f"{price:.2f}", qty, "0", t_us, rng.random() < 0.5, True])
        write_zip(root / "spot/daily/trades" / SYMBOL, f"{SYMBOL}-trades-2024-01-01", rows)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--trades", type=int, default=1_000_000)
    parser.add_argument("--seconds", type=float, default=10.0, help="bench.ingest's window")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as base:
        one, twelve = Path(base) / "one-month", Path(base) / "twelve-months"
        started = time.perf_counter()
        write_root(one, 1, args.trades)
        write_root(twelve, 12, 0)
        print(f"wrote the roots in {time.perf_counter() - started:.1f}s", flush=True)

        t0 = time.perf_counter()
        big = ReplayExchange("REPLAY", twelve)
        first = big.ohlc_page(TICKER, 60, Page(0, JAN_2024, JAN_2024 + 1000 * MINUTE_MS))
        first_page_s = time.perf_counter() - t0
        assert len(first) == 1000, len(first)
        print(f"first page of a 12-month root in {first_page_s:.3f}s", flush=True)

        with private_broker() as settings:
            ensure_topics(settings)
            ingest_rate = sim_ticks_per_s(settings, args.seconds)
            sink = KafkaSink(settings)
            replay = ReplayExchange("REPLAY", one, speed=float("inf"))
            end = JAN_2024 + 31 * 1440 * MINUTE_MS
            req = rq.DataRequest(
                request_id="bench-month", ticker=TICKER, period_s=60, start_ms=JAN_2024, end_ms=end
            )
            t0 = time.perf_counter()
            klines = run_history(req, replay, sink, "bench")  # flushed before it returns
            klines_per_s = klines / (time.perf_counter() - t0)
            print(f"{klines:,} klines into Kafka: {klines_per_s:,.0f}/s", flush=True)

            before = topic_size(settings)
            t0 = time.perf_counter()
            sent = run_stream(TICKER, replay, sink, threading.Event())
            sink.flush()
            trades_per_s = sent / (time.perf_counter() - t0)
            assert topic_size(settings) - before == sent == args.trades
            print(f"{sent:,} trades into Kafka: {trades_per_s:,.0f}/s", flush=True)
    print(
        json.dumps(
            {
                "klines": klines,
                "klines_per_s": round(klines_per_s),
                "trades": sent,
                "trades_per_s": round(trades_per_s),
                "ingest_ticks_per_s": round(ingest_rate),
                "klines_ratio": round(klines_per_s / ingest_rate, 2),
                "trades_ratio": round(trades_per_s / ingest_rate, 2),
                "first_page_s": round(first_page_s, 3),
            }
        )
    )


if __name__ == "__main__":
    with sigterm_unwinds():  # its brokers and services stop on a kill too
        main()
