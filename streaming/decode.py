"""Kafka values (the wire envelope) to rows.

Ticks are decoded where Spark runs Python (``mapInArrow``), batch by batch; the low-volume
history pages and market records are decoded on the driver. Undecodable records are never
fatal: they come out as ``valid = false`` rows that the job counts and drops.
"""

from __future__ import annotations

from collections.abc import Iterator
from decimal import Decimal, InvalidOperation

import pyarrow as pa

from proto import market_pb2
from proto.envelope import EnvelopeError, from_record

TICK_ROWS = pa.schema(
    [
        ("valid", pa.bool_()),
        ("ticker", pa.string()),
        ("trade_id", pa.string()),
        ("price", pa.string()),
        ("size", pa.string()),
        ("side", pa.string()),
        ("exchange_time_ns", pa.int64()),
        ("ingest_time_ns", pa.int64()),
        ("record", pa.binary()),
    ]
)
KAFKA_POSITION = [("partition", pa.int32()), ("offset", pa.int64())]
# mapInArrow's output schema: the input must carry ``partition`` and ``offset`` too.
TICK_DDL = (
    "valid boolean, ticker string, trade_id string, price string, size string, side string, "
    "exchange_time_ns bigint, ingest_time_ns bigint, record binary, partition int, offset bigint"
)
SIDES = {market_pb2.BUY: "BUY", market_pb2.SELL: "SELL"}


def decode_ticks(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """mapInArrow function: Kafka ``value`` column to TICK_ROWS, plus each record's Kafka
    ``partition`` and ``offset`` when the input has them (where the job has got to)."""
    for batch in batches:
        cols: dict[str, list] = {name: [] for name in TICK_ROWS.names}
        for value in batch.column("value").to_pylist():
            try:
                t = from_record(value or b"")
                ok = isinstance(t, market_pb2.Tick) and bool(t.ticker) and _decimals(t)
            except EnvelopeError:
                ok = False
            cols["valid"].append(ok)
            if ok:
                cols["ticker"].append(t.ticker)
                cols["trade_id"].append(t.trade_id)
                cols["price"].append(t.price)
                cols["size"].append(t.size)
                cols["side"].append(SIDES.get(t.side))
                cols["exchange_time_ns"].append(t.exchange_time_ns)
                cols["ingest_time_ns"].append(t.ingest_time_ns or None)
                cols["record"].append(value)
            else:
                for name in TICK_ROWS.names[1:]:
                    cols[name].append(None)
        out = pa.RecordBatch.from_pydict(cols, schema=TICK_ROWS)
        if "offset" in batch.schema.names:
            out = pa.RecordBatch.from_arrays(
                [*out.columns, batch.column("partition"), batch.column("offset")],
                schema=pa.schema([*TICK_ROWS, *KAFKA_POSITION]),
            )
        yield out


def _decimals(t: market_pb2.Tick) -> bool:
    """Price and size are finite decimal strings: anything else is a malformed tick."""
    try:
        return Decimal(t.price).is_finite() and Decimal(t.size).is_finite()
    except InvalidOperation:
        return False


def decode_records(values: list[bytes], cls: type) -> tuple[list, int]:
    """Driver-side decode of one message type; returns (messages, undecodable count)."""
    out, bad = [], 0
    for value in values:
        try:
            msg = from_record(value or b"")
        except EnvelopeError:
            bad += 1
            continue
        if isinstance(msg, cls):
            out.append(msg)
        else:
            bad += 1
    return out, bad


def candles_table(candles: list[market_pb2.OHLC], source: str) -> pa.Table:
    """OHLC messages as an Arrow table; decimals stay strings until Spark casts them."""
    return pa.table(
        {
            "ticker": [c.ticker for c in candles],
            "period_s": pa.array([c.period_s for c in candles], pa.int32()),
            "open_time_ms": pa.array([c.open_time_ms for c in candles], pa.int64()),
            "open": [c.open for c in candles],
            "high": [c.high for c in candles],
            "low": [c.low for c in candles],
            "close": [c.close for c in candles],
            "volume": [c.volume for c in candles],
            "trade_count": pa.array([c.trade_count for c in candles], pa.int64()),
            "closed": [c.closed for c in candles],
            "source": [source] * len(candles),
        }
    )
