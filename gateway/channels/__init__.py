"""Delivery channels, one file each behind :class:`Channel`.

A channel answers every send with a :class:`Result`: delivered, retry later (a rate limit or
a transient failure: the event is acked QUEUED and retried by the gateway), skipped (the
user has no address for it) or failed (permanent). Channels never raise for a delivery
problem, and never put a credential in a result or a log line.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import Protocol

from gateway.directory import UserAddress
from gateway.symbols import Rendered
from proto import events_pb2 as ev


class Outcome(Enum):
    DELIVERED = "delivered"
    RETRY = "retry"
    SKIPPED = "skipped"
    FAILED = "failed"


# The longest a service's "later" is waited out: a nonsense Retry-After (a year 9999 date,
# 1e300 seconds) must not park a queued event, or a poller, for ever.
MAX_RETRY_AFTER_S = 3600.0


@dataclass(frozen=True)
class Result:
    outcome: Outcome
    detail: str = ""
    retry_after_s: float = 0.0  # as the service asked; bounded where it is waited out


DELIVERED = Result(Outcome.DELIVERED)


def unreachable(service: str, exc: BaseException, retry_after_s: float) -> Result:
    """A transport failure, retried later. It names the exception's type only: messages of
    HTTP and SMTP errors may carry the URL or server reply, and a URL may hold a token."""
    return Result(Outcome.RETRY, f"{service} unreachable ({type(exc).__name__})", retry_after_s)


class Channel(Protocol):
    kind: ev.ChannelType.ValueType

    async def send(self, user: UserAddress, event: ev.UserEvent, message: Rendered) -> Result: ...

    async def close(self) -> None: ...
