"""candlewire: market data over ZeroMQ, Kafka, Spark and Iceberg.

The public API is small: :class:`Client`, :class:`AsyncClient`, :class:`Settings` and the
errors they raise.
"""

from candlewire.client import AsyncClient, Client
from candlewire.config import Settings
from candlewire.errors import (
    CandlewireError,
    FellBehind,
    HistoryFailed,
    ProtocolError,
    RequestRejected,
    RequestTimeout,
    SubscriptionFailed,
)

__all__ = [
    "AsyncClient",
    "CandlewireError",
    "Client",
    "FellBehind",
    "HistoryFailed",
    "ProtocolError",
    "RequestRejected",
    "RequestTimeout",
    "Settings",
    "SubscriptionFailed",
]
