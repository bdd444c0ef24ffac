"""Errors a client user can catch and act on."""

from __future__ import annotations

from proto import cep_pb2 as cep
from proto import requests_pb2 as rq
from proto.envelope import Names

# A newer relay's or stream job's reason is given by number, not lost to a ValueError.
REJECT_REASONS = Names.of(rq.RejectReason)
TRIGGER_REJECT_REASONS = Names.of(cep.TriggerRejectReason)


class CandlewireError(Exception):
    """Base of every candlewire client error."""


class RequestRejected(CandlewireError):
    """The relay refused the request; ``reason`` is a ``RejectReason`` name."""

    def __init__(self, response: rq.SubmitResponse) -> None:
        self.response = response
        self.reason = REJECT_REASONS[response.reason]
        self.retryable = response.reason in (rq.NO_INGESTOR, rq.NO_TRIGGER_DESK)
        super().__init__(f"request rejected ({self.reason}): {response.error_message}")


class BadTime(CandlewireError, ValueError):
    """An argument that should be a time is not one; ``argument`` names it."""

    def __init__(self, argument: str, value: object, why: str) -> None:
        self.argument, self.value = argument, value
        super().__init__(f"{argument}={value!r} is not a time: {why}")


class RequestTimeout(CandlewireError, TimeoutError):
    """No answer in time; the relay or the pipeline behind it may be down."""


class HistoryFailed(CandlewireError):
    """The pipeline answered with HistoryReadyNotification status ERROR."""

    def __init__(self, notification: rq.HistoryReadyNotification) -> None:
        self.notification = notification
        super().__init__(
            f"history request {notification.request_id} failed: {notification.error_message}"
        )


class SubscriptionFailed(CandlewireError):
    """Nothing will flow for a subscribed ticker: ``reason`` is NO_INGESTOR, UNKNOWN_SYMBOL or
    (a book subscription) NO_BOOK."""

    def __init__(self, error: rq.SubscriptionError) -> None:
        self.error = error
        self.reason = REJECT_REASONS[error.reason]
        super().__init__(
            f"subscription to {error.ticker} failed ({self.reason}): {error.error_message}"
        )


class CatalogUnavailable(CandlewireError):
    """The Iceberg catalog did not answer, or holds no such table yet: a read of history
    needs the stack's PostgreSQL (``candlewire status`` says whether it runs)."""


class ProtocolError(CandlewireError):
    """A peer answered with something that is not the expected envelope."""


class FellBehind(CandlewireError):
    """A subscription missed messages that no store can give back any more (or the journal
    could not be reached in time). ``resume_from`` is the last message delivered: subscribe
    again with ``since`` a time to read on from what is still held."""

    def __init__(self, message: str, resume_from: object = None) -> None:
        self.resume_from = resume_from
        super().__init__(message)


class TriggerRefused(CandlewireError):
    """The stream processor refused a trigger request; ``reason`` is a
    ``TriggerRejectReason`` name (UNKNOWN_TICKER, OVER_LIMIT, NO_SUCH_TRIGGER...)."""

    def __init__(self, ack: cep.CEPTriggerAck) -> None:
        self.ack = ack
        self.reason = TRIGGER_REJECT_REASONS[ack.reason]
        super().__init__(f"trigger {ack.trigger_id} refused ({self.reason}): {ack.error_message}")
