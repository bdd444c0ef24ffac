"""What the journal no longer holds, from Iceberg: ticks from ``ticks``, candles from
``ohlc``.

A late joiner whose ``since`` is older than the journal's oldest record (the boundary) gets
the archive's rows with event times in [since, boundary) first, then the journal from the
boundary on. Archived rows carry no position (they were never published with one): the
seam is by time, the archive's event time against the journal's publish time. A trade made
before the boundary and published after it is in both, and left to the journal
(:class:`journal.reader.Seam`, within ``SEAM_MS`` of the boundary); one stamped after the
boundary by a venue whose clock runs ahead of ours, yet published before it, is in neither.
A candle whose window ended before the boundary is closed; a later one is served as it
stood, open, and the journal's revisions go on from there.

Each chunk reads a window of time chosen from the files' statistics (:func:`window`), not
everything from ``since`` to the boundary: with ``since`` far back, a replay of a long
history read the whole of it again for every 20,000 rows it served.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.compute as pc
from pyiceberg.catalog.sql import SqlCatalog
from pyiceberg.conversions import from_bytes
from pyiceberg.expressions import And, EqualTo
from pyiceberg.table import Table
from pyiceberg.types import TimestamptzType

from candlewire.config import Settings
from candlewire.history import in_range, read_history, read_ticks
from candlewire.lake import NAMESPACE, catalog
from candlewire.market import plain_texts
from candlewire.topics import book_type
from journal.reader import Seam
from proto import journal_pb2 as jr
from proto import market_pb2

ARCHIVE_CHUNK = 20_000


@dataclass(frozen=True)
class Span:
    """One data file's bounds on its event-time column, in ms, and its row count."""

    first_ms: int
    last_ms: int
    rows: int


def window(
    spans: Sequence[Span], since_ms: int, boundary_ms: int, chunk: int, each_ms: int = 0
) -> tuple[int, int]:
    """The [start, end) a chunk reads: from the first row any file may hold at or after
    ``since_ms``, so an empty stretch of time is skipped in one step, to where the files,
    taken in order of their first rows, hold about ``chunk`` rows after the start. A ticks
    file holds one ticker's day, so its count is that ticker's; within the file that reaches
    the chunk, its rows are taken as spread evenly over its time (a busy day's file holds many
    chunks, and each chunk read all of the file that was left). ``each_ms`` > 0 says the
    table holds at most one of the ticker's rows per ``each_ms`` (a period's candles, whose
    files hold every ticker's): the end is then ``chunk`` of those after the start, and the
    files' counts are not used. The end is always after the start, so a replay moves on."""
    if not spans:
        return since_ms, boundary_ms
    ordered = sorted(spans, key=lambda s: s.first_ms)
    start = min(max(since_ms, ordered[0].first_ms), boundary_ms)
    end = boundary_ms
    if each_ms > 0:
        end = start + each_ms * chunk
    else:
        held = 0.0
        for span in ordered:
            if span.last_ms < start:
                continue
            begin, length = max(span.first_ms, start), span.last_ms + 1 - span.first_ms
            after = span.rows * (span.last_ms + 1 - begin) / length  # its rows from the start
            if held + after >= chunk:
                end = max(
                    begin + int((span.last_ms + 1 - begin) * (chunk - held) / after), start + 1
                )
                break
            held += after
    if all(s.last_ms < end for s in ordered):  # no file holds more after it
        end = boundary_ms
    return start, min(boundary_ms, end)


# A replay asks chunk after chunk: the journal service keeps its catalog (a connection's
# setup was a seventh of a chunk's time) and loads the table anew for each, so a chunk sees
# every commit before it.
_catalogs: dict[str, SqlCatalog] = {}


def _table(settings: Settings, name: str) -> Table:
    url = settings.sql_url()
    held = _catalogs.get(url)
    if held is None:
        held = _catalogs[url] = catalog(settings)
    return held.load_table(f"{NAMESPACE}.{name}")


def spans(
    table: Table, ticker: str, column: str, since_ms: int, boundary_ms: int, period_s: int = 0
) -> list[Span]:
    """The statistics of the files that may hold ``ticker``'s rows with ``column`` in
    [since, boundary) (of ``period_s``, for candles), from the manifests alone (no data
    file is read). A file without bounds on the column counts as spanning the whole range."""
    field_id = table.schema().find_field(column).field_id
    row_filter = in_range(ticker, column, since_ms, boundary_ms)
    if period_s:
        row_filter = And(EqualTo("period_s", period_s), row_filter)
    out = []
    for task in table.scan(row_filter=row_filter).plan_files():
        lower = (task.file.lower_bounds or {}).get(field_id)
        upper = (task.file.upper_bounds or {}).get(field_id)
        first = from_bytes(TimestamptzType(), lower) // 1000 if lower else since_ms
        last = from_bytes(TimestamptzType(), upper) // 1000 if upper else boundary_ms
        out.append(Span(first, last, task.file.record_count))
    return out


def archive_chunk(
    settings: Settings,
    req: jr.FetchRequest,
    boundary_ms: int,
    reply: jr.FetchReply,
    seam: Seam | None = None,
) -> int:
    """Fill ``reply`` with the archive's next chunk from ``req.since_ms``; its
    ``archive_until_ms`` says where the next request starts (at the boundary: the journal).
    A chunk holds rows unless it reaches the boundary, so a client never waits on an empty
    window. Trades of the ``seam`` are left to the journal: how many, returned."""
    ticker, _, data_type = req.topic.partition("|")
    if data_type == book_type():
        # A book before the journal is rebuilt from its own tables (Client.book_at), not
        # replayed: the caller goes on from the journal's first snapshot.
        reply.archive_until_ms = boundary_ms
        return 0
    ticks = data_type == "tick"
    table = _table(settings, "ticks" if ticks else "ohlc")
    column = "exchange_time" if ticks else "open_time"
    each_ms = 0 if ticks else int(data_type.removeprefix("ohlc:")) * 1000
    files = spans(table, ticker, column, req.since_ms, boundary_ms, each_ms // 1000)
    start, until, rows, rows_wanted, left = req.since_ms, boundary_ms, None, ARCHIVE_CHUNK, 0
    while files:  # none: nothing to read up to the boundary
        start, end = window(files, start, boundary_ms, rows_wanted, each_ms)
        if ticks:
            rows = read_ticks(settings, ticker, start, end, "stored", table=table)
            rows, until = _cut(rows, "exchange_time_ns", 1_000_000, end)
            if seam:
                cut = rows.num_rows
                rows = _without(rows, seam)
                left += cut - rows.num_rows
        else:
            rows = read_history(
                settings, ticker, each_ms // 1000, start, end, "stored", table=table
            )
            ms = pc.divide(rows.column("open_time").cast(pa.int64()), 1000)
            rows, until = _cut(rows.append_column("open_ms", ms), "open_ms", 1, end)
        if rows.num_rows or until >= boundary_ms:
            break
        # Nothing of this ticker's there (a candle file holds every ticker's, so its bounds
        # promise more than a new ticker has): on from there, over twice the time.
        start, until, rows_wanted = until, boundary_ms, rows_wanted * 2
        files = [s for s in files if s.last_ms >= start]
    run = reply.runs.add(topic=req.topic)
    if rows is not None:
        if ticks:
            _add_ticks(run, rows)
        else:
            _add_candles(run, rows, each_ms, boundary_ms)
    reply.archive_until_ms = until
    return left


def _texts(rows: pa.Table, name: str) -> list[str]:
    """A decimal column as the wire's text (empty for null)."""
    return plain_texts(rows.column(name)).fill_null("").to_pylist()


def _ints(column: pa.ChunkedArray) -> list[int]:
    return column.cast(pa.int64()).fill_null(0).to_pylist()


_SIDES = dict(market_pb2.Side.items())


def _add_ticks(run: jr.JournalBatch, rows: pa.Table) -> None:
    ingest_ns = pc.multiply(rows.column("ingest_time").cast(pa.int64()), 1000)
    for ticker, trade_id, price, size, side, exchange_ns, ingest in zip(
        rows.column("ticker").to_pylist(),
        rows.column("trade_id").to_pylist(),
        _texts(rows, "price"),
        _texts(rows, "size"),
        rows.column("side").to_pylist(),
        _ints(rows.column("exchange_time_ns")),
        _ints(ingest_ns),
        strict=True,
    ):
        run.ticks.add(
            ticker=ticker,
            trade_id=trade_id,
            price=price,
            size=size,
            side=_SIDES[side] if side else 0,
            exchange_time_ns=exchange_ns,
            ingest_time_ns=ingest,
        )


def _add_candles(run: jr.JournalBatch, rows: pa.Table, period_ms: int, boundary_ms: int) -> None:
    """Closed when the window ended before the boundary; one still open then goes on in the
    journal, whose revisions close it (a 4-hour or a day's candle when the journal holds
    less than its period)."""
    for ticker, period, open_ms, o, h, low, c, v, count in zip(
        rows.column("ticker").to_pylist(),
        rows.column("period_s").to_pylist(),
        rows.column("open_ms").to_pylist(),
        *(_texts(rows, name) for name in ("open", "high", "low", "close", "volume")),
        _ints(rows.column("trade_count")),
        strict=True,
    ):
        run.candles.add(
            ticker=ticker,
            period_s=period,
            open_time_ms=open_ms,
            open=o,
            high=h,
            low=low,
            close=c,
            volume=v,
            trade_count=count,
            closed=open_ms + period_ms <= boundary_ms,
        )


def _without(rows: pa.Table, seam: Seam) -> pa.Table:
    """``rows`` less the trades of ``seam`` (few, and only at the archive's end)."""
    times = rows.column("exchange_time_ns")
    if not rows.num_rows or pc.max(times).as_py() < seam.earliest_ns:
        return rows
    unnamed = Counter(seam.unnamed)
    keep = []
    for r in rows.to_pylist():
        ns, trade_id = r["exchange_time_ns"], r["trade_id"]
        if ns < seam.earliest_ns:
            keep.append(True)
        elif trade_id:
            keep.append((trade_id, ns) not in seam.named)
        else:
            key = (ns, r["price"], r["size"], _SIDES[r["side"]] if r["side"] else 0)
            keep.append(unnamed[key] <= 0)
            unnamed[key] -= 1
    return rows.filter(pa.array(keep))


def _cut(rows: pa.Table, column: str, per_ms: int, end_ms: int) -> tuple[pa.Table, int]:
    """At most about ARCHIVE_CHUNK rows, ending at a whole millisecond (rows of the same
    millisecond stay together), and the millisecond the next chunk starts at: ``end_ms``,
    the window's end, when every row of it fits."""
    if rows.num_rows <= ARCHIVE_CHUNK:
        return rows, end_ms
    times = rows.column(column).to_pylist()
    last_ms = times[ARCHIVE_CHUNK - 1] // per_ms
    end = ARCHIVE_CHUNK
    while end < len(times) and times[end] // per_ms == last_ms:
        end += 1
    return rows.slice(0, end), last_ms + 1
