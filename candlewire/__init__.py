"""candlewire: market data over ZeroMQ, Kafka, Spark and Iceberg.

The public API is small: :class:`Client`, :class:`AsyncClient`, :class:`Settings`, the
errors they raise, and :func:`condition` for CEP triggers.

They are imported when first used (PEP 562): every service imports some ``candlewire``
module, and the client's stack (pyiceberg, SQLAlchemy, pandas) would otherwise cost each of
them about a second and 140 MiB that a relay or a journal never uses.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from candlewire.client import AsyncClient, Client
    from candlewire.config import Settings
    from candlewire.errors import (
        BadTime,
        CandlewireError,
        FellBehind,
        HistoryFailed,
        ProtocolError,
        RequestRejected,
        RequestTimeout,
        SubscriptionFailed,
        TriggerRefused,
    )
    from candlewire.triggers import TriggerRejected, condition

# Each public name and the module that defines it.
_HOME = {
    "AsyncClient": "candlewire.client",
    "Client": "candlewire.client",
    "Settings": "candlewire.config",
    "BadTime": "candlewire.errors",
    "CandlewireError": "candlewire.errors",
    "CatalogUnavailable": "candlewire.errors",
    "FellBehind": "candlewire.errors",
    "HistoryFailed": "candlewire.errors",
    "ProtocolError": "candlewire.errors",
    "RequestRejected": "candlewire.errors",
    "RequestTimeout": "candlewire.errors",
    "SubscriptionFailed": "candlewire.errors",
    "TopicError": "candlewire.topics",
    "TriggerRefused": "candlewire.errors",
    "TriggerRejected": "candlewire.triggers",
    "condition": "candlewire.triggers",
}

__all__ = [
    "AsyncClient",
    "BadTime",
    "CandlewireError",
    "CatalogUnavailable",
    "Client",
    "FellBehind",
    "HistoryFailed",
    "ProtocolError",
    "RequestRejected",
    "RequestTimeout",
    "Settings",
    "SubscriptionFailed",
    "TopicError",
    "TriggerRefused",
    "TriggerRejected",
    "condition",
]


def __getattr__(name: str) -> Any:
    home = _HOME.get(name)
    if home is None:
        raise AttributeError(f"module 'candlewire' has no attribute {name!r}")
    value = getattr(importlib.import_module(home), name)
    globals()[name] = value  # once: later lookups are plain attribute reads
    return value


def __dir__() -> list[str]:
    return sorted(__all__)
