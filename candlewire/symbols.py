"""Symbol metadata as a service knows it: the Iceberg ``symbol_metadata`` table, read at start
and again on every METADATA_UPDATE (the spec's guard against a service that starts before the
metadata exists). The gateway checks chart subscriptions against it, the stream processor
trigger registrations.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass
from decimal import Decimal

from candlewire.config import Settings
from candlewire.topics import TopicError, parse_ticker

log = logging.getLogger("candlewire.symbols")


@dataclass(frozen=True)
class Symbol:
    ticker: str
    base: str
    quote: str
    tick_size: Decimal | None
    status: str


class SymbolCatalog:
    """Thread-safe: reloads run in a worker thread while others read."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self._symbols: dict[str, Symbol] = {}
        self._exchanges: set[str] = set()
        self._lock = threading.Lock()
        self.loads = 0

    def reload(self) -> int:
        """Read the whole table again; on failure keep what we had."""
        from candlewire.lake import load_table

        try:
            table = load_table(self.settings, "symbol_metadata")
            rows = table.scan(
                selected_fields=("ticker", "exchange", "base", "quote", "tick_size", "status")
            ).to_arrow()
        except Exception as exc:  # no catalog yet must not stop the service
            log.warning("symbol metadata not loaded: %s", exc)
            return len(self._symbols)
        symbols = {
            r["ticker"]: Symbol(r["ticker"], r["base"], r["quote"], r["tick_size"], r["status"])
            for r in rows.to_pylist()
        }
        with self._lock:
            self._symbols = symbols
            self._exchanges = {r for r in rows.column("exchange").to_pylist()}
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
