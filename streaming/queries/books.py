"""The book queries (#38): ``candlewire.books`` published live on ``{ticker}|book``, and
committed to ``book_snapshots`` and ``book_deltas``.

The ingestor checked every record before Kafka (:mod:`ingest.books`), so these queries judge
nothing: the live one publishes each micro-batch sequenced and journalled, like candles, and
the committing one appends a batch at a time every ``stream_books_trigger_s``, stamped with
its batch id so a batch replayed after a crash is not appended twice. An undecodable record,
or a level that is no decimal, is dropped and counted.
"""

from __future__ import annotations

import logging

import pyarrow as pa
import pyarrow.compute as pc
from google.protobuf.message import Message
from pyiceberg.schema import Schema
from pyspark.sql import DataFrame

from candlewire.kafka import BOOKS
from candlewire.lake import BOOK_DELTAS_SCHEMA, BOOK_SNAPSHOTS_SCHEMA
from candlewire.topics import book_type, market_data_topic
from proto import book_pb2
from streaming.context import JobContext
from streaming.decode import decimal_column, decode_records, storable_book
from streaming.queries import TopicQuery
from streaming.recovery import run_id

log = logging.getLogger("candlewire.stream")
BookMessage = book_pb2.BookDelta | book_pb2.BookSnapshot
TABLE_OF: dict[type[Message], tuple[str, Schema]] = {
    book_pb2.BookSnapshot: ("book_snapshots", BOOK_SNAPSHOTS_SCHEMA),
    book_pb2.BookDelta: ("book_deltas", BOOK_DELTAS_SCHEMA),
}


def decode_books(values: list[bytes]) -> tuple[list[BookMessage], int]:
    """Snapshots and deltas in Kafka order; returns them and how many records were not."""
    return decode_records(values, book_pb2.BookDelta | book_pb2.BookSnapshot, storable_book)


def _side(msgs: list[BookMessage], side: str, typ: pa.ListType) -> tuple[pa.Array, list[bool]]:
    """One side's levels as a list column; also which rows hold a level that is no decimal."""
    offsets, prices, sizes = [0], [], []
    for m in msgs:
        for level in getattr(m, side):
            prices.append(level.price)
            sizes.append(level.size)
        offsets.append(len(prices))
    price, size = decimal_column(prices), decimal_column(sizes)
    struct = pa.StructArray.from_arrays([price, size], fields=list(typ.value_type))
    bad = [False] * len(msgs)
    if price.null_count or size.null_count:
        nulls = pc.or_(price.is_null(), size.is_null()).to_pylist()
        bad = [any(nulls[offsets[i] : offsets[i + 1]]) for i in range(len(msgs))]
    return pa.ListArray.from_arrays(pa.array(offsets, pa.int32()), struct).cast(typ), bad


def _plain(typ: pa.DataType) -> pa.DataType:
    """pyiceberg's Arrow types without the large variants, which Spark's conversion takes
    less readily."""
    if pa.types.is_large_string(typ):
        return pa.string()
    if pa.types.is_large_list(typ) or pa.types.is_list(typ):
        return pa.list_(_plain(typ.value_type))
    if pa.types.is_struct(typ):
        return pa.struct([pa.field(f.name, _plain(f.type)) for f in typ])
    return typ


def book_rows(msgs: list[BookMessage], schema: Schema) -> tuple[pa.Table, int]:
    """The rows of one book table, typed as the table is; drops (and counts) a message with
    a level that is no decimal."""
    arrow = pa.schema([pa.field(f.name, _plain(f.type)) for f in schema.as_arrow()])
    micros = pa.timestamp("us", "UTC")
    cols: dict[str, pa.Array] = {}
    bad = [False] * len(msgs)
    for side in ("bids", "asks"):
        cols[side], broken = _side(msgs, side, arrow.field(side).type)
        bad = [a or b for a, b in zip(bad, broken, strict=True)]
    cols["ticker"] = pa.array([m.ticker for m in msgs], pa.string())
    cols["venue_seq"] = pa.array([m.venue_seq for m in msgs], pa.int64())
    ns = [m.exchange_time_ns for m in msgs]
    cols["exchange_time_ns"] = pa.array(ns, pa.int64())
    cols["exchange_time"] = pa.array([t // 1000 for t in ns], micros)
    cols["ingest_time"] = pa.array([m.ingest_time_ns // 1000 or None for m in msgs], micros)
    if "reason" in arrow.names:
        name = book_pb2.SnapshotReason.Name
        cols["reason"] = pa.array([name(m.reason) for m in msgs], pa.string())  # type: ignore[union-attr]
    if "prev_seq" in arrow.names:
        cols["prev_seq"] = pa.array([m.prev_seq for m in msgs], pa.int64())  # type: ignore[union-attr]
        cols["checksum"] = pa.array(
            [m.checksum if m.HasField("checksum") else None for m in msgs],  # type: ignore[union-attr]
            pa.int64(),
        )
    table = pa.Table.from_arrays([cols[f.name].cast(f.type) for f in arrow], schema=arrow)
    if any(bad):
        table = table.filter(pa.array([not b for b in bad]))
    return table, sum(bad)


def topic_of(msg: BookMessage) -> bytes:
    return market_data_topic(msg.ticker, book_type()).encode()


class BooksLiveQuery(TopicQuery):
    """Each micro-batch's book records, published on ``{ticker}|book`` in Kafka order."""

    name = "books_live"
    topic = BOOKS.name
    max_per_trigger = 50_000

    def batch(self, df: DataFrame, batch_id: int) -> None:
        msgs, bad = decode_books([r.value for r in df.select("value").collect()])
        self.ctx.metrics.bad.labels(BOOKS.name).inc(bad)
        if msgs:
            self.ctx.publisher.publish_sequenced([(topic_of(m), m) for m in msgs])
        self.ctx.metrics.batches.labels(self.name).inc()


class BooksQuery(TopicQuery):
    """Book records into Iceberg, one append per table and batch, exactly once."""

    name = "books"
    topic = BOOKS.name
    max_per_trigger = 500_000

    def __init__(self, ctx: JobContext) -> None:
        super().__init__(ctx)
        self.trigger_s = ctx.settings.books_trigger_s()
        self.run = run_id(ctx.settings, self.name)  # this checkpoint's, whose batch ids count
        self.committed = {
            table: ctx.tables.last_stamped_batch(table, self.name, self.run)
            for table, _ in TABLE_OF.values()
        }

    def batch(self, df: DataFrame, batch_id: int) -> None:
        metrics = self.ctx.metrics
        msgs, bad = decode_books([r.value for r in df.select("value").collect()])
        for cls, (table, schema) in TABLE_OF.items():
            of_table = [m for m in msgs if isinstance(m, cls)]
            if not of_table or batch_id <= self.committed[table]:
                continue  # nothing, or appended before a crash
            rows, broken = book_rows(of_table, schema)
            bad += broken
            stamp = {"query": self.name, "run": self.run, "batch": batch_id}
            (
                self.ctx.spark.createDataFrame(rows)
                .writeTo(self.ctx.tables[table])
                .options(**{f"snapshot-property.candlewire.{k}": str(v) for k, v in stamp.items()})
                .append()
            )
            self.committed[table] = batch_id
            metrics.rows.labels(table).inc(rows.num_rows)
        metrics.bad.labels(BOOKS.name).inc(bad)
        metrics.batches.labels(self.name).inc()
