"""Arrow tables and live messages as the CLI prints and writes them.

People read decimals without the 18 trailing zeros the tables store
(``12972.750000000000000000`` → ``12972.75``), aligned on the decimal point, and times in
UTC without the offset. A table wider than the terminal loses whole columns, in a stated
order (:data:`DROP_ORDER`, then right to left), never parts of cells, and says which; the
machine formats (``csv``, ``json``, ``parquet``) write every column. ``candlewire watch``
prints its messages the same way, one line each (:class:`LiveLines`), or as JSON lines
(:func:`live_record`).
"""

from __future__ import annotations

import io
import json
import sys
from collections.abc import Sequence
from datetime import UTC, datetime
from decimal import Decimal
from typing import IO, Any

import pyarrow as pa
from google.protobuf.message import Message
from rich.table import Table
from rich.text import Text

from candlewire.book import Book
from candlewire.errors import CandlewireError
from candlewire.gaps import GAP_CAUSES, GAP_STATUSES
from candlewire.market import Candle, Tick, plain
from candlewire.triggers import TriggerRejected, describe, parse_trigger
from launcher.formats import FORMATS
from proto import cep_pb2 as cep
from proto import market_pb2

# The columns a narrow terminal loses first, first to last: what repeats on every row or
# is bookkeeping before the prices. ``open_time`` and ``close`` go last of all.
DROP_ORDER = (
    "update_time",
    "first_trade_ns",
    "last_trade_ns",
    "source",
    "closed",
    "ticker",
    "period_s",
    "trade_count",
    "volume",
    "open",
    "high",
    "low",
)


def aligned(texts: Sequence[str | None]) -> list[str]:
    """Decimal texts padded so their points line up (integers where the point would be)."""
    parts = [_split(t) for t in texts]
    whole = max((len(w) for w, _ in parts), default=0)
    frac = max((len(f) for _, f in parts), default=0)
    return [_pad(t, whole, frac) for t in texts]


def _split(text: str | None) -> tuple[str, str]:
    whole, _, frac = (text or "").partition(".")
    return whole, frac


def _pad(text: str | None, whole: int, frac: int) -> str:
    """``text`` with its point at ``whole`` characters in and ``frac`` digits room after it."""
    w, f = _split(text)
    if not text:
        return " " * (whole + (frac + 1 if frac else 0))
    tail = ("." + f.ljust(frac)) if f else " " * (frac + 1 if frac else 0)
    return w.rjust(whole) + tail


def cell_texts(column: pa.ChunkedArray | pa.Array) -> list[str]:
    """One column's cells as text: decimals aligned, times in UTC, nulls empty."""
    values = column.to_pylist()
    if pa.types.is_decimal(column.type):
        return aligned([None if v is None else plain(v) for v in values])
    if pa.types.is_timestamp(column.type):
        return ["" if v is None else _utc(v) for v in values]
    return ["" if v is None else str(v) for v in values]


def _utc(value: datetime, millis: bool = False) -> str:
    """UTC without the offset; milliseconds when there are any (``millis``: always, so
    lines printed one by one keep one width)."""
    text = value.strftime("%Y-%m-%d %H:%M:%S")
    return text + (f".{value.microsecond // 1000:03d}" if millis or value.microsecond else "")


def iso(value: datetime) -> str:
    """ISO 8601 UTC with a ``Z``: how the machine formats write a time."""
    return value.isoformat().replace("+00:00", "Z")


def fit(widths: dict[str, int], width: int) -> list[str]:
    """The columns that fit ``width`` characters of a boxed table (a border and a space each
    side of every cell), dropping in :data:`DROP_ORDER`, then right to left."""
    kept = list(widths)
    order = [c for c in DROP_ORDER if c in widths]
    order += [c for c in reversed(kept) if c not in order]
    while len(kept) > 1 and sum(widths[c] + 3 for c in kept) + 1 > width:
        kept.remove(next(c for c in order if c in kept))
    return kept


def print_table(table: pa.Table, width: int | None = None, out: IO[str] | None = None) -> None:
    """As a boxed table that fits the terminal; the columns left out are named below it."""
    from rich.console import Console
    from rich.table import Table

    console = Console(file=out or sys.stdout, width=width)
    cells = {name: cell_texts(table[name]) for name in table.column_names}
    header = {name: f"{name} (UTC)" if _is_time(table, name) else name for name in cells}
    widths = {n: max([len(header[n]), *(len(t) for t in cells[n])]) for n in cells}
    kept = fit(widths, console.width)
    view = Table(*(header[n] for n in kept))
    for n, col in zip(kept, view.columns, strict=True):
        col.no_wrap, col.min_width = True, widths[n]
        # Decimal cells are already aligned and of one width (rich drops trailing spaces
        # of right-justified cells); other numbers go right.
        if _is_number(table, n) and not pa.types.is_decimal(table.schema.field(n).type):
            col.justify = "right"
    for i in range(table.num_rows):
        view.add_row(*(cells[n][i] for n in kept))
    console.print(view)
    dropped = [n for n in cells if n not in kept]
    if dropped:
        console.print(
            f"{len(dropped)} columns left out to fit {console.width} characters: "
            f"{', '.join(dropped)} (widen the terminal, or --format csv|json|parquet)"
        )
    console.print(f"{table.num_rows} rows")


def _is_time(table: pa.Table, name: str) -> bool:
    return pa.types.is_timestamp(table.schema.field(name).type)


def _is_number(table: pa.Table, name: str) -> bool:
    t = table.schema.field(name).type
    return pa.types.is_decimal(t) or pa.types.is_integer(t) or pa.types.is_floating(t)


def write(table: pa.Table, fmt: str, out: IO[bytes]) -> None:
    """Machine-readable, every column: csv and json with decimals as exact normalized text
    and times as ISO 8601 UTC; parquet with the table's own types."""
    if fmt == "parquet":
        import pyarrow.parquet as pq

        pq.write_table(table, out)
        return
    texts = _as_text(table)
    if fmt == "csv":
        import pyarrow.csv as pacsv

        pacsv.write_csv(texts, out)
        return
    if fmt == "json":
        rows = texts.to_pylist()
        out.write(json.dumps(rows, indent=1).encode() + b"\n")
        return
    raise ValueError(f"format {fmt!r}: one of {', '.join(FORMATS[1:])}")


def _as_text(table: pa.Table) -> pa.Table:
    """Decimals as normalized text (a float would round them); times as ISO 8601."""
    columns = []
    for name in table.column_names:
        col = table[name]
        if pa.types.is_decimal(col.type):
            col = pa.array([None if v is None else plain(v) for v in col.to_pylist()], pa.string())
        elif pa.types.is_timestamp(col.type):
            col = pa.array([None if v is None else iso(v) for v in col.to_pylist()], pa.string())
        columns.append(col)
    return pa.table(columns, names=table.column_names)


def to_file(table: pa.Table, path: str | None, fmt: str | None) -> str:
    """Write to ``path`` (``-`` or None: standard output); the format from ``fmt``, else the
    path's extension. Returns the format written."""
    if fmt is None or fmt == "table":
        fmt = (path or "").rsplit(".", 1)[-1].lower() if path and "." in path else "csv"
    if fmt not in FORMATS[1:]:
        raise CandlewireError(f"cannot tell the format of {path!r}: give --format csv|json|parquet")
    if path in (None, "-"):
        buf = io.BytesIO()
        write(table, fmt, buf)
        sys.stdout.buffer.write(buf.getvalue())
        sys.stdout.flush()
    else:
        with open(path, "wb") as f:
            write(table, fmt, f)
    return fmt


# -- live messages, one line each (``candlewire watch``) --------------------------------------

PRICES = ("open", "high", "low", "close", "volume")  # a candle's decimals, in print order
STYLES = {"buy": "green", "sell": "red", "closed": "bold", "forming": "dim", "repaired": "yellow"}


class LiveLines:
    """``candlewire watch``'s lines for people: one per message, printed as it comes.

    There is no table to measure first, so what has come so far sets each column's width:
    decimal points line up, and move only when a wider value arrives. ``repaired`` marks a
    message the subscription fetched from the journal after a sequence gap.
    """

    def __init__(self) -> None:
        self._points: dict[str, tuple[int, int]] = {}  # decimal column -> (whole, frac)
        self._widths: dict[str, int] = {"side": len("sell"), "state": len("forming")}

    def line(self, item: Tick | Candle | Message, repaired: bool = False) -> Text:
        if isinstance(item, Tick):
            parts = [
                (_utc(item.time, millis=True), "dim"),
                (self._left("ticker", item.ticker), "bold"),
                (self._left("side", item.side or "-"), STYLES.get(item.side, "")),
                (f"{self._decimal('size', item.size)} @ {self._decimal('price', item.price)}", ""),
            ]
        elif isinstance(item, Candle):
            state = "closed" if item.closed else "forming"
            parts = [
                (_utc(item.open_time), "dim"),
                (self._left("ticker", item.ticker), "bold"),
                (self._right("period", f"{item.period_s}s"), ""),
                *((f"{f[0].upper()} {self._decimal(f, getattr(item, f))}", "") for f in PRICES),
                (f"{self._right('trades', str(item.trade_count))} trades", ""),
                (self._left("state", state), STYLES[state]),
            ]
        else:  # neither a tick nor a candle: as protobuf says it
            from google.protobuf import json_format

            parts = [
                (type(item).__name__, "bold"),
                (json_format.MessageToJson(item, indent=None), ""),
            ]
        if repaired:
            parts.append(("repaired", STYLES["repaired"]))
        text = Text()
        for i, (part, style) in enumerate(parts):
            text.append("  " if i else "")
            text.append(part, style or None)
        text.rstrip()
        return text

    def _decimal(self, column: str, value: Decimal) -> str:
        text = plain(value)
        w, f = _split(text)
        whole, frac = self._points.get(column, (0, 0))
        self._points[column] = whole, frac = max(whole, len(w)), max(frac, len(f))
        return _pad(text, whole, frac)

    def _left(self, column: str, text: str) -> str:
        return text.ljust(self._grow(column, text))

    def _right(self, column: str, text: str) -> str:
        return text.rjust(self._grow(column, text))

    def _grow(self, column: str, text: str) -> int:
        self._widths[column] = width = max(self._widths.get(column, 0), len(text))
        return width


def live_record(item: Tick | Candle | Message, repaired: bool = False) -> dict[str, Any]:
    """One message for machines (``watch --format json``): snake_case keys, decimals as exact
    text, times as ISO 8601 UTC, and where it stands in its stream (absent for candles read
    from Iceberg, which have no place in one)."""
    if isinstance(item, Tick):
        record: dict[str, Any] = {
            "type": "tick",
            "ticker": item.ticker,
            "time": iso(item.time),
            "price": plain(item.price),
            "size": plain(item.size),
            "side": item.side,
            "trade_id": item.trade_id,
        }
    elif isinstance(item, Candle):
        record = {
            "type": "ohlc",
            "ticker": item.ticker,
            "period_s": item.period_s,
            "open_time": iso(item.open_time),
            **{f: plain(getattr(item, f)) for f in PRICES},
            "trade_count": item.trade_count,
            "closed": item.closed,
        }
    else:
        from google.protobuf import json_format

        return {
            "type": type(item).__name__,
            **json_format.MessageToDict(item, preserving_proto_field_name=True),
            "repaired": repaired,
        }
    if item.stream.epoch:
        record["stream"] = {"epoch": item.stream.epoch, "seq": item.stream.seq}
    record["repaired"] = repaired
    return record


def book_record(book: Book) -> dict[str, Any]:
    """A book for machines (``watch --type book --format json``): its levels as exact text,
    best first, the venue's sequence number and the exchange time."""
    record: dict[str, Any] = {
        "type": "book",
        "ticker": book.ticker,
        "time": iso(datetime.fromtimestamp(book.time_ns / 1e9, UTC)),
        "venue_seq": book.seq,
        "bids": [[plain(p), plain(q)] for p, q in book.bids()],
        "asks": [[plain(p), plain(q)] for p, q in book.asks()],
    }
    if book.position is not None and book.position.epoch:
        record["stream"] = {"epoch": book.position.epoch, "seq": book.position.seq}
    return record


def book_ladder(book: Book) -> Table:
    """A book as a price ladder: asks above (best at the bottom), bids below, sizes aligned
    on the point, the spread in the title."""
    bids, asks = book.bids(), book.asks()
    spread = f"spread {plain(asks[0][0] - bids[0][0])}" if bids and asks else "one-sided"
    title = f"{book.ticker}  seq {book.seq}  {iso(datetime.fromtimestamp(book.time_ns / 1e9, UTC))}"
    table = Table(title=f"{title}  {spread}", title_justify="left", min_width=64)
    # Left-justified: the texts are padded to one width with their points lined up, and
    # rich's right justification strips the padding after a point-less price like "101".
    table.add_column("bid size", justify="left", style="green")
    table.add_column("price", justify="left")
    table.add_column("ask size", justify="left", style="red")
    prices = aligned([plain(p) for p, _ in [*reversed(asks), *bids]])
    ask_sizes = aligned([plain(q) for _, q in reversed(asks)])
    bid_sizes = aligned([plain(q) for _, q in bids])
    for price, size in zip(prices[: len(asks)], ask_sizes, strict=True):
        table.add_row("", price, size)
    for price, size in zip(prices[len(asks) :], bid_sizes, strict=True):
        table.add_row(size, price, "")
    return table


def gap_table(gaps: Sequence[market_pb2.Gap], limit: int = 20) -> Table:
    """Gaps in ingestors' streams as ``candlewire status`` shows them: open ones first, then
    the most recently found; at most ``limit`` rows, and a caption saying how many more."""
    ranked = sorted(gaps, key=lambda g: (g.status != market_pb2.GAP_OPEN, -g.detected_ms))
    table = Table("ticker", "cause", "from → to (UTC)", "status", "refetched", "reason")
    table.title = "gaps in live streams (candlewire.gaps)"
    for g in ranked[:limit]:
        start = datetime.fromtimestamp(g.from_ns / 1e9, UTC)
        end = datetime.fromtimestamp(g.to_ns / 1e9, UTC)
        until = _utc(end, True)
        span = f"{_utc(start, True)} → {until[11:] if start.date() == end.date() else until}"
        table.add_row(
            g.ticker,
            GAP_CAUSES[g.cause],
            span,
            GAP_STATUSES[g.status].removeprefix("GAP_"),
            str(g.refetched),
            g.reason,
        )
    if len(ranked) > limit:
        table.caption = f"{len(ranked) - limit} more not shown"
    return table


def trigger_table(triggers: Sequence[cep.CEPTriggerRequest]) -> Table:
    """An owner's triggers as ``candlewire trigger ls`` shows them: each condition in words
    (:func:`~candlewire.triggers.describe`), whether it fires once or re-arms, whom it
    alerts, and when the stream job registered it."""
    table = Table("id", "ticker", "fires when", "fires", "alerts", "registered (UTC)")
    for req in triggers:
        try:
            when = describe(parse_trigger(req))
        except TriggerRejected:  # from a newer release: its condition as the wire has it
            when = req.WhichOneof("condition") or "no condition"
        fires = "once" if req.once else f"again after {req.cooldown_s} s"
        alerts = " ".join(filter(None, (req.user_id, "critical" if req.critical else "")))
        registered = datetime.fromtimestamp(req.registered_ms // 1000, UTC)
        table.add_row(req.trigger_id, req.ticker, when, fires, alerts or "-", _utc(registered))
    return table
