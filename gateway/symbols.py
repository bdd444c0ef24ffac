"""Symbol metadata in the gateway (:mod:`candlewire.symbols`), and how an event is put into
words with it: chart subscriptions are checked against it, and prices in events are shown
with the symbol's tick size.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from decimal import Decimal, InvalidOperation
from typing import Any

from candlewire.config import PERIODS_S
from candlewire.symbols import SymbolCatalog as BaseCatalog
from candlewire.topics import TopicError, parse_ticker
from proto import events_pb2 as ev

# Enum names by number, looked up per event (``EnumTypeWrapper.Name`` costs a microsecond).
EVENT_TYPES = {v.number: v.name for v in ev.EventType.DESCRIPTOR.values}
PRIORITIES = {v.number: v.name for v in ev.Priority.DESCRIPTOR.values}


def enum_name(names: dict[int, str], number: int) -> str:
    """A value's name; a number this build does not know (a newer sender) as the number."""
    return names.get(number) or str(number)


@dataclass(frozen=True)
class Rendered:
    event_id: str
    title: str
    text: str
    data: dict[str, Any] = field(default_factory=dict)


class SymbolCatalog(BaseCatalog):
    """The shared catalog, and what the gateway does with it."""

    read_apart = True  # its one use of Iceberg's reader, until a chart is first seeded

    def check_chart(self, ticker: str, period_s: int) -> str | None:
        """Why a chart subscription is refused, or None to accept it.

        A ticker of an exchange the catalog has never listed is let through: its ingestor
        answers UNKNOWN_SYMBOL itself if it has to.
        """
        try:
            t = parse_ticker(ticker)
        except TopicError as exc:
            return str(exc)
        if period_s not in PERIODS_S:
            return f"period {period_s} is not one of {', '.join(map(str, PERIODS_S))}"
        listed, known = self.listed(ticker)
        if listed and known is None:
            return f"{ticker} is not listed on {t.exchange}"
        if known is not None and known.status == "DELISTED":
            return f"{ticker} is delisted"
        return None

    def price(self, ticker: str, value: object) -> str:
        """A price rounded to the symbol's tick size, when we know it."""
        try:
            amount = Decimal(str(value))
        except InvalidOperation:
            return str(value)
        sym = self.get(ticker)
        if sym is None or not sym.tick_size:
            return str(amount)
        return str(amount.quantize(sym.tick_size.normalize()))

    def render(self, event: ev.UserEvent) -> Rendered:
        """Title and text for people; JSON payloads are shown field by field."""
        kind = enum_name(EVENT_TYPES, event.event_type).replace("_", " ").lower()
        try:
            data = json.loads(event.payload) if event.payload else {}
        except (ValueError, UnicodeDecodeError):
            data = None
        if not isinstance(data, dict):
            text = f"{len(event.payload)} bytes of payload"
            return Rendered(event.event_id, kind.capitalize(), text, {"event_id": event.event_id})
        ticker = str(data.get("ticker", ""))
        sym = self.get(ticker) if ticker else None
        title = kind.capitalize() + (f": {ticker}" if ticker else "")
        lines = []
        for key, value in data.items():
            if key in ("price", "stop", "limit", "fill_price") and ticker:
                value = self.price(ticker, value)
            lines.append(f"{key}: {value}")
        if sym is not None:
            lines.append(f"market: {sym.base}/{sym.quote}")
        lines.append(f"ref: {event.event_id}")
        out = {"event_id": event.event_id, **{k: v for k, v in data.items() if k != "event_id"}}
        return Rendered(event.event_id, title, "\n".join(lines), out)
