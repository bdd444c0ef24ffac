"""candlewire: market data over ZeroMQ, Kafka, Spark and Iceberg.

The public API is small: :class:`Client`, :class:`AsyncClient`, :class:`Settings`, the
errors they raise, and :func:`condition` for CEP triggers.
"""

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

__all__ = [
    "AsyncClient",
    "BadTime",
    "CandlewireError",
    "Client",
    "FellBehind",
    "HistoryFailed",
    "ProtocolError",
    "RequestRejected",
    "RequestTimeout",
    "Settings",
    "SubscriptionFailed",
    "TriggerRefused",
    "TriggerRejected",
    "condition",
]
