"""Symbol metadata as a service knows it: the Iceberg ``symbol_metadata`` table, read at start
and again on every METADATA_UPDATE (the spec's guard against a service that starts before the
metadata exists). The gateway checks chart subscriptions against it, the stream processor
trigger registrations.
"""

from __future__ import annotations

import logging
import multiprocessing
import threading
from dataclasses import dataclass
from decimal import Decimal
from multiprocessing.connection import Connection
from typing import ClassVar

from candlewire.config import Settings
from candlewire.topics import TopicError, parse_ticker

log = logging.getLogger("candlewire.symbols")

FIELDS = ("ticker", "exchange", "base", "quote", "tick_size", "status")
Row = tuple[str, str, str, str, Decimal | None, str]
READ_APART_TIMEOUT_S = 120.0


def read_rows(settings: Settings) -> list[Row]:
    """Every symbol of the ``symbol_metadata`` table, as tuples in :data:`FIELDS`' order."""
    from candlewire.lake import load_table

    table = load_table(settings, "symbol_metadata")
    rows = table.scan(selected_fields=FIELDS).to_arrow()
    return list(zip(*(rows.column(f).to_pylist() for f in FIELDS), strict=True))


def _read_into(settings: Settings, conn: Connection) -> None:
    try:
        conn.send(("rows", read_rows(settings)))
    except Exception as exc:
        conn.send(("error", f"{type(exc).__name__}: {exc}"))
    finally:
        conn.close()


def read_rows_apart(settings: Settings, timeout_s: float = READ_APART_TIMEOUT_S) -> list[Row]:
    """:func:`read_rows` in a child process, which exits with everything it imported."""
    ctx = multiprocessing.get_context("spawn")  # never fork a process with threads
    answers, sender = ctx.Pipe(duplex=False)
    child = ctx.Process(
        target=_read_into, args=(settings, sender), name="symbol-reader", daemon=True
    )
    child.start()
    sender.close()
    try:
        if not answers.poll(timeout_s):
            raise TimeoutError(f"the symbol reader gave no answer in {timeout_s:.0f} s")
        kind, value = answers.recv()
    except EOFError:
        child.join(1)
        raise RuntimeError(f"the symbol reader ended (exit code {child.exitcode})") from None
    finally:
        answers.close()
        if child.is_alive():
            child.join(5)
        if child.is_alive():
            child.kill()
            child.join()
    if kind == "error":
        raise RuntimeError(value)
    return value


@dataclass(frozen=True)
class Symbol:
    ticker: str
    base: str
    quote: str
    tick_size: Decimal | None
    status: str


class SymbolCatalog:
    """Thread-safe: reloads run in a worker thread while others read."""

    # Read the table in a child process (:func:`read_rows_apart`): Iceberg's reader stack
    # (pyiceberg, pyarrow, pandas, numpy) is about 130 MiB that a process keeps for good once
    # imported. Worth it in a service that reads the table only at start and on
    # METADATA_UPDATE, and imports nothing of that stack otherwise (#36).
    read_apart: ClassVar[bool] = False

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self._symbols: dict[str, Symbol] = {}
        self._exchanges: set[str] = set()
        self._lock = threading.Lock()
        self.loads = 0

    def reload(self) -> int:
        """Read the whole table again; on failure keep what we had."""
        try:
            rows = (read_rows_apart if self.read_apart else read_rows)(self.settings)
        except Exception as exc:  # no catalog yet must not stop the service
            log.warning("symbol metadata not loaded: %s", exc)
            return len(self._symbols)
        symbols = {
            ticker: Symbol(ticker, base, quote, tick, status)
            for ticker, _, base, quote, tick, status in rows
        }
        with self._lock:
            self._symbols = symbols
            self._exchanges = {row[1] for row in rows}
            self.loads += 1
        log.info("symbol metadata loaded: %d symbols", len(symbols))
        return len(symbols)

    def get(self, ticker: str) -> Symbol | None:
        with self._lock:
            return self._symbols.get(ticker)

    def __len__(self) -> int:
        with self._lock:
            return len(self._symbols)

    def listed(self, ticker: str) -> tuple[bool, Symbol | None]:
        """(whether the catalog lists the ticker's exchange at all, the symbol or None)."""
        try:
            exchange = parse_ticker(ticker).exchange
        except TopicError:
            return False, None
        with self._lock:
            return exchange in self._exchanges, self._symbols.get(ticker)
