"""What the journal no longer holds, from Iceberg: ticks from ``ticks``, candles from
``ohlc``.

A late joiner whose ``since`` is older than the journal's oldest record (the boundary) gets
the archive's rows with event times in [since, boundary) first, then the journal from the
boundary on. Archived rows carry no position (they were never published with one): the
seam is by time, the archive's event time against the journal's publish time, so a trade
that arrived late around the boundary may be served by both, or by neither. Candles older
than a day are closed.
"""

from __future__ import annotations

from decimal import Decimal

import pyarrow as pa

from candlewire.config import Settings
from candlewire.history import read_history, read_ticks
from candlewire.topics import book_type
from proto import journal_pb2 as jr
from proto import market_pb2

ARCHIVE_CHUNK = 20_000


def _dec(value: Decimal | None) -> str:
    return "" if value is None else format(value.normalize(), "f")


def archive_chunk(
    settings: Settings, req: jr.FetchRequest, boundary_ms: int, reply: jr.FetchReply
) -> None:
    """Fill ``reply`` with the archive's next chunk from ``req.since_ms``; its
    ``archive_until_ms`` says where the next request starts (the boundary: the journal)."""
    ticker, _, data_type = req.topic.partition("|")
    if data_type == book_type():
        # A book before the journal is rebuilt from its own tables (Client.book_at), not
        # replayed: the caller goes on from the journal's first snapshot.
        reply.archive_until_ms = boundary_ms
        return
    run = reply.runs.add(topic=req.topic)
    if data_type == "tick":
        rows = read_ticks(settings, ticker, req.since_ms, boundary_ms)
        rows, until = _cut(rows, "exchange_time_ns", 1_000_000, boundary_ms)
        for r in rows.to_pylist():
            run.ticks.add(
                ticker=r["ticker"],
                trade_id=r["trade_id"],
                price=_dec(r["price"]),
                size=_dec(r["size"]),
                side=market_pb2.Side.Value(r["side"]) if r["side"] else 0,
                exchange_time_ns=r["exchange_time_ns"],
                ingest_time_ns=int(r["ingest_time"].timestamp() * 1e9) if r["ingest_time"] else 0,
            )
    else:
        period = int(data_type.removeprefix("ohlc:"))
        rows = read_history(settings, ticker, period, req.since_ms, boundary_ms)
        ms = pa.array([int(t.timestamp() * 1000) for t in rows.column("open_time").to_pylist()])
        rows, until = _cut(rows.append_column("open_ms", ms), "open_ms", 1, boundary_ms)
        for r in rows.to_pylist():
            run.candles.add(
                ticker=r["ticker"],
                period_s=r["period_s"],
                open_time_ms=r["open_ms"],
                open=_dec(r["open"]),
                high=_dec(r["high"]),
                low=_dec(r["low"]),
                close=_dec(r["close"]),
                volume=_dec(r["volume"]),
                trade_count=r["trade_count"] or 0,
                closed=True,
            )
    reply.archive_until_ms = until


def _cut(rows: pa.Table, column: str, per_ms: int, boundary_ms: int) -> tuple[pa.Table, int]:
    """At most about ARCHIVE_CHUNK rows, ending at a whole millisecond (rows of the same
    millisecond stay together), and the millisecond the next chunk starts at."""
    if rows.num_rows <= ARCHIVE_CHUNK:
        return rows, boundary_ms
    times = rows.column(column).to_pylist()
    last_ms = times[ARCHIVE_CHUNK - 1] // per_ms
    end = ARCHIVE_CHUNK
    while end < len(times) and times[end] // per_ms == last_ms:
        end += 1
    return rows.slice(0, end), last_ms + 1
