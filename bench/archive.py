"""The journal's archive: a ``since`` older than the journal, served from Iceberg.

``--days`` days of ``--per-day`` trades of one ticker are appended to ``ticks`` (a file a
day, as compaction leaves them), then read back from 1970 chunk by chunk, as the journal
service serves a late joiner (:func:`journal.archive.archive_chunk`), and timed.

- ``archive_rows_per_s``: rows served a second, each a protobuf Tick in a FetchReply;
- ``first_vs_last_chunks``: the mean time of the first five chunks ÷ the last five. A chunk
  reads a window of the history, not all that is left of it, so this stays near 1 (it grew
  with the history: each chunk read everything up to the journal again);
- ``lost`` and ``duplicated``: trades served against those appended (both 0).

    python -m bench.archive [--days 10] [--per-day 40000]

The last line is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections import Counter

import pyarrow as pa
import pyarrow.compute as pc

from bench.stack import private_postgres
from candlewire.lake import ensure_tables, load_table
from journal.archive import archive_chunk
from proto import journal_pb2 as jr

DAY_MS = 86_400_000
TICKER = "SIM:ARCHIVE/USDT"


def day_of_ticks(first_ms: int, n: int) -> pa.Table:
    """``n`` trades a few milliseconds apart from ``first_ms``, ids their times."""
    ms = pa.array(range(first_ms, first_ms + 3 * n, 3), pa.int64())
    return pa.table(
        {
            "ticker": pa.array([TICKER] * n),
            "trade_id": pc.cast(ms, pa.string()),
            "price": pa.array([f"{100 + i % 97}.25" for i in range(n)]).cast(pa.decimal128(38, 18)),
            "size": pa.array(["0.001"] * n).cast(pa.decimal128(38, 18)),
            "side": pa.array(["BUY", "SELL"] * (n // 2) + ["BUY"] * (n % 2)),
            "exchange_time": pc.cast(pc.multiply(ms, 1000), pa.timestamp("us", tz="UTC")),
            "ingest_time": pa.nulls(n, pa.timestamp("us", tz="UTC")),
            "exchange_time_ns": pc.multiply(ms, 1_000_000),
        }
    )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--days", type=int, default=10)
    parser.add_argument("--per-day", type=int, default=40_000)
    args = parser.parse_args()
    with private_postgres() as settings:
        ensure_tables(settings)
        table = load_table(settings, "ticks")
        first = (int(time.time() * 1000) // DAY_MS - args.days - 2) * DAY_MS
        for day in range(args.days):
            rows = day_of_ticks(first + day * DAY_MS, args.per_day)
            table.append(rows.cast(table.schema().as_arrow()))
        print(f"appended {args.days} days of {args.per_day:,} trades", flush=True)
        boundary = first + (args.days + 1) * DAY_MS
        served: Counter[str] = Counter()
        chunk_s: list[float] = []
        since, t0 = 1, time.perf_counter()
        while since < boundary:
            reply = jr.FetchReply()
            t1 = time.perf_counter()
            req = jr.FetchRequest(topic=f"{TICKER}|tick", since_ms=since)
            archive_chunk(settings, req, boundary, reply)
            chunk_s.append(time.perf_counter() - t1)
            served.update(t.trade_id for run in reply.runs for t in run.ticks)
            since = reply.archive_until_ms
        elapsed = time.perf_counter() - t0
        total = args.days * args.per_day
        edge = min(5, len(chunk_s) // 2) or 1
        result = {
            "rows": sum(served.values()),
            "chunks": len(chunk_s),
            "archive_rows_per_s": round(sum(served.values()) / elapsed),
            "chunk_ms_median": round(statistics.median(chunk_s) * 1000, 1),
            "first_vs_last_chunks": round(
                statistics.mean(chunk_s[:edge]) / statistics.mean(chunk_s[-edge:]), 2
            ),
            "lost": total - len(served),
            "duplicated": sum(served.values()) - len(served),
        }
        print(
            f"{result['rows']:,} rows in {result['chunks']} chunks, {elapsed:.2f} s: "
            f"{result['archive_rows_per_s']:,} rows/s",
            flush=True,
        )
        print(json.dumps(result))


if __name__ == "__main__":
    main()
