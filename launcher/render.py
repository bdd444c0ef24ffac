"""Arrow tables as the CLI prints and writes them.

People read decimals without the 18 trailing zeros the tables store
(``12972.750000000000000000`` → ``12972.75``), aligned on the decimal point, and times in
UTC without the offset. A table wider than the terminal loses whole columns, in a stated
order (:data:`DROP_ORDER`, then right to left), never parts of cells, and says which; the
machine formats (``csv``, ``json``, ``parquet``) write every column.
"""

from __future__ import annotations

import io
import json
import sys
from collections.abc import Sequence
from datetime import datetime
from typing import IO

import pyarrow as pa

from candlewire.market import plain

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
FORMATS = ("table", "csv", "json", "parquet")


def aligned(texts: Sequence[str | None]) -> list[str]:
    """Decimal texts padded so their points line up (integers where the point would be)."""
    parts = [(t.partition(".")[0], t.partition(".")[2]) if t else ("", "") for t in texts]
    whole = max((len(w) for w, _ in parts), default=0)
    frac = max((len(f) for _, f in parts), default=0)
    out = []
    for t, (w, f) in zip(texts, parts, strict=True):
        if not t:
            out.append(" " * (whole + (frac + 1 if frac else 0)))
            continue
        tail = ("." + f.ljust(frac)) if f else " " * (frac + 1 if frac else 0)
        out.append(w.rjust(whole) + tail)
    return out


def cell_texts(column: pa.ChunkedArray | pa.Array) -> list[str]:
    """One column's cells as text: decimals aligned, times in UTC, nulls empty."""
    values = column.to_pylist()
    if pa.types.is_decimal(column.type):
        return aligned([None if v is None else plain(v) for v in values])
    if pa.types.is_timestamp(column.type):
        return ["" if v is None else _utc(v) for v in values]
    return ["" if v is None else str(v) for v in values]


def _utc(value: datetime) -> str:
    text = value.strftime("%Y-%m-%d %H:%M:%S")
    return text + (f".{value.microsecond // 1000:03d}" if value.microsecond else "")


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
            col = pa.array(
                [
                    None if v is None else v.isoformat().replace("+00:00", "Z")
                    for v in col.to_pylist()
                ],
                pa.string(),
            )
        columns.append(col)
    return pa.table(columns, names=table.column_names)


def to_file(table: pa.Table, path: str | None, fmt: str | None) -> str:
    """Write to ``path`` (``-`` or None: standard output); the format from ``fmt``, else the
    path's extension. Returns the format written."""
    if fmt is None or fmt == "table":
        fmt = (path or "").rsplit(".", 1)[-1].lower() if path and "." in path else "csv"
    if fmt not in FORMATS[1:]:
        raise ValueError(f"cannot tell the format of {path!r}: give --format csv|json|parquet")
    if path in (None, "-"):
        buf = io.BytesIO()
        write(table, fmt, buf)
        sys.stdout.buffer.write(buf.getvalue())
        sys.stdout.flush()
    else:
        with open(path, "wb") as f:
            write(table, fmt, f)
    return fmt
