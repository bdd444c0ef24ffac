"""Reading candles from Iceberg with pyiceberg, filters pushed down.

The ``ohlc`` table is partitioned by period and month and sorted by ticker, so these
equality and range predicates prune to the period's months, then to the files and row groups
whose statistics hold the ticker, before anything is read.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Literal

import pyarrow as pa
import pyarrow.compute as pc
import sqlalchemy.exc
from pyiceberg.exceptions import NoSuchTableError
from pyiceberg.expressions import (
    And,
    BooleanExpression,
    EqualTo,
    GreaterThan,
    GreaterThanOrEqual,
    LessThan,
    LessThanOrEqual,
)
from pyiceberg.table import Table

from candlewire.book import SNAPSHOT_EVERY_S, Book, replay
from candlewire.config import Settings, db_parts
from candlewire.errors import CatalogUnavailable
from candlewire.lake import driver_error, load_table
from candlewire.times import TimeLike, to_ms
from candlewire.topics import book_type, check_market_data, check_period, ohlc_type

COLUMNS = (
    "ticker",
    "period_s",
    "open_time",
    "open",
    "high",
    "low",
    "close",
    "volume",
    "trade_count",
    "source",
    # Final: the stream job's candle once its feed's watermark passed the window, an
    # exchange's kline once the exchange closed it. A forming one may still change.
    "closed",
)


def _iso(ms: int) -> str:
    from datetime import UTC, datetime

    return datetime.fromtimestamp(ms / 1000, UTC).isoformat()


def in_range(ticker: str, column: str, start_ms: int, end_ms: int) -> BooleanExpression:
    """``ticker``'s rows with ``column`` in [start, end), as a filter Iceberg prunes by."""
    return And(
        EqualTo("ticker", ticker),
        GreaterThanOrEqual(column, _iso(start_ms)),
        LessThan(column, _iso(end_ms)),
    )


Decimals = Literal["decimal", "float", "stored"]


def with_decimals(table: pa.Table, decimals: Decimals) -> pa.Table:
    """The tables' DECIMAL(38,18) columns as the reader asks: ``"decimal"`` keeps them exact
    at the smallest scale that holds every value (pandas then shows ``12972.75``, not 18
    digits), ``"float"`` as float64 (fast, rounded), ``"stored"`` as they are (for a reader
    that turns them into text itself)."""
    if decimals not in ("decimal", "float", "stored"):
        raise ValueError(f"decimals must be 'decimal', 'float' or 'stored', not {decimals!r}")
    if decimals == "stored":
        return table
    for i, field in enumerate(table.schema):
        if not pa.types.is_decimal(field.type):
            continue
        column = table.column(i)
        column = column.cast(pa.float64()) if decimals == "float" else _narrowest(column)
        table = table.set_column(i, field.with_type(column.type), column)
    return table


def _narrowest(column: pa.ChunkedArray) -> pa.ChunkedArray:
    """The same values at the smallest scale that loses none (Arrow refuses a lossy cast)."""
    t = column.type
    for scale in range(t.scale):
        try:
            return column.cast(pa.decimal128(t.precision - t.scale + scale, scale))
        except pa.ArrowInvalid:
            continue
    return column


def read_ticks(
    settings: Settings,
    ticker: str,
    start: TimeLike,
    end: TimeLike,
    decimals: Decimals = "decimal",
    *,
    table: Table | None = None,
) -> pa.Table:
    """Trades with exchange_time in [start, end), in time order (ties by trade id).
    ``table``: the ``ticks`` table when the caller has loaded it already."""
    table = table or load_table(settings, "ticks")
    row_filter = in_range(ticker, "exchange_time", to_ms(start, "start"), to_ms(end, "end"))
    rows = table.scan(row_filter=row_filter).to_arrow()
    rows = rows.sort_by([("exchange_time_ns", "ascending"), ("trade_id", "ascending")])
    return with_decimals(rows, decimals)


def read_stored(
    settings: Settings,
    ticker: str,
    period: int | str,
    start: TimeLike | None,
    end: TimeLike | None,
    at: TimeLike | None,
    decimals: Decimals,
) -> pa.Table | Book:
    """A client's ``history()``: candles of one period in [start, end), or with period
    ``"book"`` the L2 book as of ``at``. A ticker or period that names no data, and a catalog
    that cannot be read, are errors that say so, before or instead of a driver's traceback."""
    if period == book_type():
        check_market_data(ticker, book_type())
        with _catalog(settings, "book_snapshots"):
            return read_book(settings, ticker, _required(at, "at"))
    period_s = check_period(int(period))
    check_market_data(ticker, ohlc_type(period_s))
    start, end = _required(start, "start"), _required(end, "end")
    with _catalog(settings, "ohlc"):
        return read_history(settings, ticker, period_s, start, end, decimals)


def _required(value: TimeLike | None, name: str) -> TimeLike:
    if value is None:
        raise TypeError(f"history() needs {name}=")
    return value


@contextmanager
def _catalog(settings: Settings, table: str) -> Iterator[None]:
    """The catalog's failures as a user reads them: where it was looked for, and what to do."""
    where = db_parts(settings.catalog_db())[0]
    try:
        yield
    except sqlalchemy.exc.OperationalError as exc:
        raise CatalogUnavailable(
            f"the Iceberg catalog at {where} cannot be read ({driver_error(exc)}): is the "
            "stack up? "
            "(`candlewire status`)"
        ) from exc
    except NoSuchTableError as exc:
        raise CatalogUnavailable(
            f"the Iceberg catalog at {where} has no table {table} yet: the stream job creates "
            "its tables when it first starts (`make up`)"
        ) from exc


def read_history(
    settings: Settings,
    ticker: str,
    period: int,
    start: TimeLike,
    end: TimeLike,
    decimals: Decimals = "decimal",
    *,
    table: Table | None = None,
) -> pa.Table:
    """Candles with open_time in [start, end), sorted by open_time. ``table``: the ``ohlc``
    table when the caller has loaded it already."""
    table = table or load_table(settings, "ohlc")
    row_filter = And(
        EqualTo("period_s", int(period)),
        in_range(ticker, "open_time", to_ms(start, "start"), to_ms(end, "end")),
    )
    rows = _by_open_time(table.scan(row_filter=row_filter, selected_fields=COLUMNS).to_arrow())
    return with_decimals(rows, decimals)


def _by_open_time(table: pa.Table) -> pa.Table:
    """Sorted by open_time. Each file is written sorted and a month's rows are mostly one
    file, so ordering the files' batches is usually enough: no copy, where a full sort was
    a third of a year's read."""
    batches = sorted(
        (b for b in table.to_batches() if b.num_rows),
        key=lambda b: b.column("open_time")[0].value,
    )
    ordered = pa.Table.from_batches(batches, table.schema)
    times = ordered.column("open_time")
    if len(times) < 2 or pc.all(pc.less_equal(times[:-1], times[1:])).as_py():
        return ordered
    return ordered.sort_by("open_time")


def read_book(settings: Settings, ticker: str, at: TimeLike) -> Book:
    """The L2 book as of ``at``, rebuilt from Iceberg: the last snapshot at or before it,
    and the deltas after that snapshot up to ``at``. LookupError when no snapshot is held
    within a day before ``at``; BookError when the deltas held have a gap before ``at``
    (the ingestor lost one and its fresh snapshot came later)."""
    from proto import book_pb2

    at_ms = to_ms(at, "at")
    at_ns = (at_ms + 1) * 1_000_000 - 1  # every update within the millisecond
    snapshots = load_table(settings, "book_snapshots")
    snap = None
    for lookback_ms in (int(4 * SNAPSHOT_EVERY_S * 1000), 86_400_000):
        rows = snapshots.scan(
            row_filter=And(
                EqualTo("ticker", ticker),
                GreaterThanOrEqual("exchange_time", _iso(at_ms - lookback_ms)),
                LessThanOrEqual("exchange_time_ns", at_ns),
            )
        ).to_arrow()
        if rows.num_rows:
            last = rows.sort_by([("exchange_time_ns", "descending"), ("venue_seq", "descending")])
            snap = _book_message(book_pb2.BookSnapshot, last.slice(0, 1).to_pylist()[0])
            break
    if snap is None:
        raise LookupError(f"no {ticker} book snapshot within a day before {_iso(at_ms)}")
    deltas = (
        load_table(settings, "book_deltas")
        .scan(
            row_filter=And(
                EqualTo("ticker", ticker),
                GreaterThanOrEqual("exchange_time", _iso(snap.exchange_time_ns // 1_000_000)),
                GreaterThan("venue_seq", snap.venue_seq),
                LessThanOrEqual("exchange_time_ns", at_ns),
            )
        )
        .to_arrow()
        .sort_by("venue_seq")
    )
    book, _ = replay(snap, [_book_message(book_pb2.BookDelta, r) for r in deltas.to_pylist()])
    return book


def _book_message(cls: type, row: dict) -> object:
    """A book table's row as the message it was written from (sizes of removed levels 0)."""

    def levels(side: list[dict] | None) -> list[dict[str, str]]:
        return [{"price": str(lv["price"]), "size": str(lv["size"])} for lv in side or []]

    msg = cls(
        ticker=row["ticker"],
        venue_seq=row["venue_seq"],
        exchange_time_ns=row["exchange_time_ns"],
        bids=levels(row["bids"]),
        asks=levels(row["asks"]),
    )
    if row.get("prev_seq"):
        msg.prev_seq = row["prev_seq"]
    return msg
