"""Kafka values (the wire envelope) to rows.

Ticks are decoded in the JVM (``jvm/decoder``'s ``DecodeTick``): the committing query where
it judges them, the live path as it reads them, and :func:`decode_ticks_in_jvm` as a UDF.
:func:`decode_ticks` is the same decoder in Python (``mapInArrow``), the reference a test holds
the JVM one to. The low-volume history pages and market records are decoded on the driver. Undecodable records are never fatal: they come out as
``valid = false`` rows that the job counts and drops.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable, Iterable, Iterator, Sequence
from datetime import UTC, datetime
from decimal import Context, Decimal, InvalidOperation
from types import UnionType
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.pandas.types import from_arrow_schema

from candlewire.amounts import DECIMAL_TEXT
from candlewire.config import PERIODS_S
from candlewire.lake import OHLC_SCHEMA
from candlewire.market import cast_decimals
from candlewire.topics import valid
from proto import book_pb2, envelope_pb2, market_pb2
from proto.envelope import EnvelopeError, Names, from_record
from streaming.progress import INT32_MAX

# ``idle`` rows are FeedIdle marks (a quiet feed's clock, in ``exchange_time_ns``): neither
# a valid tick nor a bad record.
TICK_ROWS = pa.schema(
    [
        ("valid", pa.bool_()),
        ("idle", pa.bool_()),
        ("ticker", pa.string()),
        ("trade_id", pa.string()),
        ("price", pa.string()),
        ("size", pa.string()),
        ("side", pa.string()),
        ("exchange_time_ns", pa.int64()),
        ("ingest_time_ns", pa.int64()),
    ]
)
KAFKA_POSITION = [("partition", pa.int32()), ("offset", pa.int64())]
# mapInArrow's output schema: the input must carry ``partition`` and ``offset`` too.
TICK_STRUCT = from_arrow_schema(pa.schema([*TICK_ROWS, *KAFKA_POSITION]))
# A trigger registration read with the trades (#19): the committing query carries the raw
# record of each beside the ticks, where the tick decoder sees a record that is not a tick.
CONTROL = pa.field("control", pa.binary())
CONTROL_SQL = (
    f"CASE WHEN substring(value, 2, 1) = X'{envelope_pb2.CEP_TRIGGER_REQUEST:02X}' THEN value END"
)
SIDES = {market_pb2.BUY: "BUY", market_pb2.SELL: "SELL"}
# A price is above zero (a non-zero digit before any exponent, no minus); a size is not below.
POSITIVE_TEXT = re.compile(r"\+?[^eE-]*[1-9].*")
JVM_DECODER = "io.candlewire.spark.DecodeTick"
# The ``ohlc`` table's schema as Arrow, with the plain strings Spark reads from Arrow.
OHLC_ROWS = pa.schema(
    f.with_type(pa.string()) if pa.types.is_large_string(f.type) else f
    for f in OHLC_SCHEMA.as_arrow()
)
DECIMAL = OHLC_ROWS.field("open").type  # the tables' DECIMAL(38,18)
MAX_TIME_MS = 253_402_300_799_999  # 9999-12-31T23:59:59.999Z: the last time Python holds
# The reasons this build names, which the book table stores as names: a newer ingestor's is not.
SNAPSHOT_REASONS = Names.of(book_pb2.SnapshotReason)
_SCALE = Decimal(1).scaleb(-DECIMAL.scale)
_DECIMAL_CONTEXT = Context(prec=DECIMAL.precision)


def parse_tick(value: bytes | None) -> market_pb2.Tick | market_pb2.FeedIdle | None:
    """A ticks-topic record as a valid tick or an idle mark, or None: undecodable, another
    message, no ticker, or a price or size that is not a finite decimal."""
    try:
        t = from_record(value or b"")
    except EnvelopeError:
        return None
    if isinstance(t, market_pb2.FeedIdle):
        return t if t.ticker else None
    return t if isinstance(t, market_pb2.Tick) and t.ticker and _decimals(t) else None


def decode_ticks(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """mapInArrow function: Kafka ``value`` column to TICK_ROWS, plus the input's other
    columns as they are (the record's Kafka ``partition`` and ``offset``: where the job has
    got to)."""
    for batch in batches:
        cols: dict[str, list] = {name: [] for name in TICK_ROWS.names}
        for value in batch.column("value").to_pylist():
            t = parse_tick(value)
            idle = isinstance(t, market_pb2.FeedIdle)
            cols["valid"].append(t is not None and not idle)
            cols["idle"].append(idle)
            if idle:
                for name in TICK_ROWS.names[2:]:
                    cols[name].append(None)
                cols["ticker"][-1] = t.ticker
                cols["exchange_time_ns"][-1] = t.event_time_ns
            elif t is not None:
                cols["ticker"].append(t.ticker)
                cols["trade_id"].append(t.trade_id)
                cols["price"].append(t.price)
                cols["size"].append(t.size)
                cols["side"].append(SIDES.get(t.side))
                cols["exchange_time_ns"].append(t.exchange_time_ns)
                cols["ingest_time_ns"].append(t.ingest_time_ns or None)
            else:
                for name in TICK_ROWS.names[2:]:
                    cols[name].append(None)
        out = pa.RecordBatch.from_pydict(cols, schema=TICK_ROWS)
        carried = [f for f in batch.schema if f.name != "value"]
        if carried:
            out = pa.RecordBatch.from_arrays(
                [*out.columns, *(batch.column(f.name) for f in carried)],
                schema=pa.schema([*TICK_ROWS, *carried]),
            )
        yield out


def _decimals(t: market_pb2.Tick) -> bool:
    """Price and size are decimal strings, the price above zero and the size not below:
    anything else is a malformed tick."""
    return bool(
        DECIMAL_TEXT.fullmatch(t.price)
        and POSITIVE_TEXT.fullmatch(t.price)
        and DECIMAL_TEXT.fullmatch(t.size)
        and not t.size.startswith("-")
    )


def decode_ticks_in_jvm(spark: SparkSession, records: DataFrame) -> DataFrame:
    """``records`` (Kafka ``value``, ``partition``, ``offset``...) as TICK_ROWS plus the other
    columns, decoded by the JVM UDF: rows equal to :func:`decode_ticks`' for every value."""
    if not getattr(spark, "_candlewire_decoder", False):  # once: each time logs a warning
        spark.udf.registerJavaFunction(
            "candlewire_decode_tick", JVM_DECODER, from_arrow_schema(TICK_ROWS)
        )
        spark._candlewire_decoder = True  # type: ignore[attr-defined]
    carried = [c for c in records.columns if c != "value"]
    return records.select(
        F.call_function("candlewire_decode_tick", "value").alias("t"), *carried
    ).select("t.*", *carried)


def decode_records(
    values: list[bytes], cls: type | UnionType, storable: Callable[[Any], bool] | None = None
) -> tuple[list, int]:
    """Driver-side decode of one message type (or a union of them); returns (messages,
    count of records undecodable or not ``storable``), in the records' order. Every topic is
    written by our ingestors, yet a record that passed the envelope and not the tables or
    the ledger stopped the job at every restart, on the same record: dropped and counted."""
    out, bad = [], 0
    for value in values:
        try:
            msg = from_record(value or b"")
        except EnvelopeError:
            bad += 1
            continue
        if isinstance(msg, cls) and (storable is None or storable(msg)):
            out.append(msg)
        else:
            bad += 1
    return out, bad


def _text(text: str) -> str:
    """A text PostgreSQL holds: a NUL, which it refuses, as U+FFFD."""
    return text.replace("\x00", "\ufffd") if "\x00" in text else text


def ledger_page(b: market_pb2.OHLCBatch) -> market_pb2.OHLCBatch:
    """A history page as the request ledger can record it, so its request is still answered:
    NULs in its texts replaced, and a page number or count past PostgreSQL's integer made
    the request's error (the page is nothing a reader could find)."""
    if b.page > INT32_MAX or b.metadata.expected_pages > INT32_MAX:
        failed = market_pb2.OHLCBatch(
            request_id=_text(b.request_id), error="a page number past 2**31 - 1"
        )
        if b.HasField("metadata"):  # where the answer goes: recorded with the error
            failed.metadata.CopyFrom(b.metadata)
            failed.metadata.request_id = _text(b.metadata.request_id)
            failed.metadata.expected_pages = min(b.metadata.expected_pages, INT32_MAX)
        return failed
    if "\x00" in b.request_id + b.error + b.metadata.request_id:
        b.request_id, b.error = _text(b.request_id), _text(b.error)
        b.metadata.request_id = _text(b.metadata.request_id)
    return b


def storable_book(m: book_pb2.BookDelta | book_pb2.BookSnapshot) -> bool:
    """A book record the tables and the publisher hold: a ticker's (the publisher keeps a
    sequence a topic), and a snapshot's reason one the table can name. Judged field by
    field: a walk of every field for enums tripled the books' decode."""
    return valid(m.ticker) and (
        not isinstance(m, book_pb2.BookSnapshot) or m.reason in SNAPSHOT_REASONS
    )


def staged_market(m: market_pb2.Market) -> market_pb2.Market:
    """A market as the staging table holds it: every market counts toward its snapshot's
    size, so none is dropped (one was, and the exchange's refresh never completed again).
    Its key's NULs replaced; the rest is made storable as it becomes a row
    (:func:`streaming.queries.metadata.market_row`)."""
    if "\x00" in m.request_id + m.ticker:
        m.request_id, m.ticker = _text(m.request_id), _text(m.ticker)
    return m


def ohlc_rows(columns: dict[str, list | pa.Array], source: str) -> pa.Table:
    """Rows for ``ohlc``, typed as the table is (its schema, as Arrow), so Spark casts nothing:
    Spark's per-row casts were seconds of a year of history's time. ``open_time_ms`` is epoch
    milliseconds; ``source`` and ``update_time`` (now) are filled in, absent columns null."""
    n = len(columns["ticker"])
    given = {
        **columns,
        "open_time": pa.array(columns["open_time_ms"], pa.int64()).cast(pa.timestamp("ms", "UTC")),
        "source": [source] * n,
        "update_time": [datetime.now(UTC)] * n,
    }
    return pa.Table.from_arrays(
        [_typed(given.get(f.name), f.type, n) for f in OHLC_ROWS], schema=OHLC_ROWS
    )


def _typed(values: list | pa.Array | None, type_: pa.DataType, n: int) -> pa.Array:
    if values is None:
        return pa.nulls(n, type_)
    if isinstance(values, pa.Array):
        return values.cast(type_)
    return pa.array(values, type_)


CandleKey = tuple[str, int, int]  # ticker, period_s, open_time_ms


def candle_key(c: market_pb2.OHLC) -> CandleKey:
    return c.ticker, c.period_s, c.open_time_ms


def candles_table(candles: list[market_pb2.OHLC], source: str) -> tuple[pa.Table, set[CandleKey]]:
    """OHLC messages as ``ohlc`` rows, decimals cast by Arrow (vectorised). Returns the table
    and the keys of the rows left out, for a malformed decimal or a key the table cannot
    hold (:func:`storable_keys`), so they are not counted as delivered."""
    keys = {f: [getattr(c, f) for c in candles] for f in ("ticker", "period_s", "open_time_ms")}
    unstorable: set[CandleKey] = set()
    storable = storable_keys(keys["ticker"], keys["period_s"], keys["open_time_ms"])
    if storable is not None:  # rare: judged again by the row, the others' keys noted
        unstorable = {candle_key(c) for c, ok in zip(candles, storable, strict=True) if not ok}
        candles = [c for c, ok in zip(candles, storable, strict=True) if ok]
        keys = {f: [v for v, ok in zip(vs, storable, strict=True) if ok] for f, vs in keys.items()}
    prices = {
        f: decimal_column([getattr(c, f) for c in candles])
        for f in ("open", "high", "low", "close", "volume")
    }
    table = ohlc_rows(
        {
            **keys,
            **prices,
            "trade_count": [c.trade_count for c in candles],
            "closed": [c.closed for c in candles],
        },
        source,
    )
    held = held_rows(prices.values())
    if held is None:
        return table, unstorable
    dropped = {candle_key(c) for c, ok in zip(candles, held.to_pylist(), strict=True) if not ok}
    return table.filter(held), dropped | unstorable


def storable_keys(tickers: list[str], periods: list[int], times_ms: list[int]) -> list[bool] | None:
    """Which candles' keys ``ohlc`` holds (a ticker, one of the periods, an open time up to
    year 9999: one past it failed the page's cast, and the job at every restart); None when
    all do. By column, each distinct ticker judged once."""
    names = pa.array(tickers, pa.string())
    times = pa.array(times_ms, pa.int64())
    ok = pc.and_(
        pc.is_in(pa.array(periods, pa.int64()), value_set=pa.array(PERIODS_S, pa.int64())),
        pc.and_(pc.greater_equal(times, 0), pc.less_equal(times, MAX_TIME_MS)),
    )
    known = [t for t in pc.unique(names).to_pylist() if valid(t)]
    ok = pc.and_(ok, pc.is_in(names, value_set=pa.array(known, pa.string())))
    return None if pc.all(ok).as_py() is not False else ok.to_pylist()


def kept_count(candles: Sequence[market_pb2.OHLC], dropped: set[CandleKey]) -> int:
    """A page's candles that reached Iceberg: HistoryReady counts what a reader will find."""
    if not dropped:
        return len(candles)
    return sum(candle_key(c) not in dropped for c in candles)


def decimal_column(values: list[str]) -> pa.Array:
    """Decimal strings as DECIMAL(38,18), vectorised; value by value only when the column
    holds a bad one, which becomes null. Arrow's own cast wraps some values past 20 digits
    silently ("1e30" came out as 18960114910927365649.47...): the client's checked cast
    refuses those, and they become null too."""
    try:
        return cast_decimals(pa.array(values, pa.string()))
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        return pa.array([_decimal(v) for v in values], DECIMAL)


def held_rows(decimals: Iterable[pa.Array]) -> pa.Array | None:
    """Where every one of ``decimals`` (:func:`decimal_column`'s) holds a value, or None
    when they all do everywhere: a row with a null would fail the write of a table whose
    columns are required, and every row of the batch with it."""
    held = functools.reduce(pc.and_, (pc.is_valid(a) for a in decimals))
    return held if pc.any(pc.invert(held)).as_py() else None


def _decimal(text: str) -> Decimal | None:
    try:
        value = Decimal(text).quantize(_SCALE, context=_DECIMAL_CONTEXT)
    except (InvalidOperation, ValueError):
        return None
    return value if value.is_finite() else None
