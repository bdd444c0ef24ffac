"""Turn a SubmitHistoricalRequest into work, or into a reason to refuse it.

Pure functions: the relay holds no per-request state, so everything it decides is decided
here from the request alone.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from candlewire.config import PERIODS_S
from candlewire.topics import (
    TopicError,
    check_id,
    check_request_id,
    history_ready_topic,
    parse_ticker,
    response_topic,
)
from proto import requests_pb2 as rq
from proto.envelope import derive

# No exchange has trades before this (2009-01-03, the Bitcoin genesis block), so an earlier
# start is a unit mistake (seconds for milliseconds) rather than a real request.
EARLIEST_MS = 1_230_940_800_000


class Rejected(Exception):
    def __init__(self, reason: int, message: str) -> None:
        super().__init__(message)
        self.reason = reason
        self.message = message


@dataclass(frozen=True)
class Accepted:
    work: rq.DataRequest
    exchange: str
    notification_topic: str


def notification_topic_for(req: rq.SubmitHistoricalRequest) -> str:
    if req.notify == rq.NOTIFY_REQUEST:
        return history_ready_topic(req.request_id)
    return response_topic(req.client_id)


def validate(
    req: rq.SubmitHistoricalRequest, *, max_rows: int, now_ms: int | None = None
) -> Accepted:
    """Raise :class:`Rejected` with a specific reason, or return the work to publish."""
    try:
        check_request_id(req.request_id)
    except TopicError as exc:
        raise Rejected(rq.BAD_REQUEST_ID, str(exc)) from None
    if req.notify == rq.NOTIFY_CLIENT or req.client_id:
        try:
            check_id(req.client_id, "client_id")
        except TopicError as exc:
            raise Rejected(rq.BAD_REQUEST_ID, str(exc)) from None
    if req.notify not in (rq.NOTIFY_CLIENT, rq.NOTIFY_REQUEST):
        raise Rejected(rq.BAD_REQUEST_ID, f"unknown notify mode {req.notify}")
    try:
        ticker = parse_ticker(req.ticker)
    except TopicError as exc:
        raise Rejected(rq.BAD_TICKER, str(exc)) from None
    if req.period_s not in PERIODS_S:
        raise Rejected(rq.BAD_PERIOD, f"period_s {req.period_s} not in {list(PERIODS_S)}")
    now_ms = int(time.time() * 1000) if now_ms is None else now_ms
    if not req.start_ms < req.end_ms:
        raise Rejected(rq.BAD_RANGE, f"start_ms {req.start_ms} must be < end_ms {req.end_ms}")
    if req.start_ms < EARLIEST_MS:
        raise Rejected(rq.BAD_RANGE, f"start_ms {req.start_ms} is before 2009; are these ms?")
    if req.start_ms >= now_ms:  # the range is cut at now: it would hold nothing to answer
        raise Rejected(rq.BAD_RANGE, "start_ms is not in the past")
    rows = (req.end_ms - req.start_ms) // (req.period_s * 1000)
    if rows > max_rows:
        raise Rejected(rq.RANGE_TOO_LARGE, f"{rows} candles requested, at most {max_rows}")
    topic = notification_topic_for(req)
    work = derive(
        rq.DataRequest,
        req,
        kind=rq.HISTORICAL,
        exchange=ticker.exchange,
        end_ms=min(req.end_ms, now_ms),
        notification_topic=topic,
        submit_time_ms=now_ms,
    )
    return Accepted(work=work, exchange=ticker.exchange, notification_topic=topic)
