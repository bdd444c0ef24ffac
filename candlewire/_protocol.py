"""The client's sans-I/O half, shared by :class:`Client` and :class:`AsyncClient`.

Everything here is pure: building requests, reading replies, matching notifications. The two
clients only differ in how they wait on sockets.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections import OrderedDict, deque
from dataclasses import dataclass, field
from enum import Enum
from typing import Literal

import zmq
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.message import DecodeError, Message

from candlewire.book import JOIN_LOOKBACK_S, BookFeed
from candlewire.errors import HistoryFailed, ProtocolError, RequestRejected, SubscriptionFailed
from candlewire.positions import describe, is_after, is_next
from candlewire.times import TimeLike, to_ms
from candlewire.topics import (
    book_type,
    check_id,
    history_ready_topic,
    market_data_topic,
    response_topic,
    subscription_error_topic,
    tick_type,
)
from candlewire.triggers import FiringKey, check_owner, firing_key, parse_trigger
from proto import book_pb2, market_pb2
from proto import cep_pb2 as cep
from proto import journal_pb2 as jr
from proto import requests_pb2 as rq
from proto.envelope import (
    EnvelopeError,
    decode,
    decode_sub,
    encode,
    expect,
    unchecked_payload,
)
from proto.market_pb2 import StreamPosition

Notify = Literal["client", "request"]
Since = TimeLike | StreamPosition | None  # where a subscription starts: a time or a position

log = logging.getLogger("candlewire.client")
FETCH_MESSAGES = 0  # asked per journal chunk; 0: as many as the service gives (50k)
FIRINGS_REMEMBERED = 100_000  # (trigger_id, firing) pairs kept to drop repeats
MAX_QUEUED_FIRINGS = 100_000  # firings not yet taken; beyond, new ones are dropped
# Monitor events that change whether a SUB socket can receive.
MONITOR_EVENTS = zmq.EVENT_HANDSHAKE_SUCCEEDED | zmq.EVENT_DISCONNECTED


def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex}"


def owned_id(client_id: str, prefix: str) -> str:
    """A new id under the client's key name (``key.…``), which CURVE's relay requires of a
    ``HISTORY_READY:`` topic the client subscribes to."""
    owner, dot, _ = client_id.partition(".")
    return f"{owner}.{new_id(prefix)}" if dot else new_id(prefix)


def accept_ack(reply: list[bytes]) -> rq.SubmitResponse:
    """Check the relay's ack; raise :class:`RequestRejected` on refusal."""
    try:
        resp = expect(decode(reply), rq.SubmitResponse)
    except EnvelopeError as exc:
        raise ProtocolError(f"relay answered with a bad envelope: {exc}") from None
    if resp.status != rq.SUBMIT_OK:
        raise RequestRejected(resp)
    return resp


@dataclass
class HistoryCall:
    """One history request: what to send and which notification ends it."""

    request: rq.SubmitHistoricalRequest
    topic: str

    @classmethod
    def build(
        cls,
        client_id: str,
        ticker: str,
        period: int,
        start: TimeLike,
        end: TimeLike,
        notify: Notify,
        request_id: str | None = None,
    ) -> HistoryCall:
        if notify not in ("client", "request"):
            raise ValueError(f"notify must be 'client' or 'request', not {notify!r}")
        req = rq.SubmitHistoricalRequest(
            request_id=check_id(request_id or owned_id(client_id, "req"), "request_id"),
            client_id=client_id,
            ticker=ticker,
            period_s=int(period),
            start_ms=to_ms(start, "start"),
            end_ms=to_ms(end, "end"),
            notify=rq.NOTIFY_CLIENT if notify == "client" else rq.NOTIFY_REQUEST,
        )
        topic = (
            response_topic(client_id) if notify == "client" else history_ready_topic(req.request_id)
        )
        return cls(req, topic)

    def frames(self) -> list[bytes]:
        return encode(self.request)

    def accept(self, reply: list[bytes]) -> rq.SubmitResponse:
        resp = accept_ack(reply)
        if resp.notification_topic != self.topic:
            raise ProtocolError(
                f"relay names topic {resp.notification_topic!r}, client expected {self.topic!r}"
            )
        return resp


@dataclass
class MetadataCall:
    """One symbol-metadata refresh: a DataRequest, ended by its SymbolMetadataUpdated."""

    request: rq.DataRequest

    @classmethod
    def build(cls, exchange: str) -> MetadataCall:
        if not exchange or not exchange.isupper():
            raise ValueError(f"exchange {exchange!r} must be upper case, e.g. BINANCE")
        return cls(
            rq.DataRequest(request_id=new_id("md"), kind=rq.SYMBOL_METADATA, exchange=exchange)
        )

    def frames(self) -> list[bytes]:
        return encode(self.request)

    def accept(self, reply: list[bytes]) -> rq.SubmitResponse:
        return accept_ack(reply)

    def match(self, frames: list[bytes]) -> market_pb2.SymbolMetadataUpdated | None:
        try:
            _topic, msg = decode_sub(frames)
        except EnvelopeError:
            return None
        if (
            isinstance(msg, market_pb2.SymbolMetadataUpdated)
            and msg.request_id == self.request.request_id
        ):
            return msg
        return None


@dataclass
class TriggerCall:
    """One trigger request: the relay's ack names our topic, the CEPTriggerAck ends it."""

    request: cep.CEPTriggerRequest

    @classmethod
    def build(cls, request: cep.CEPTriggerRequest) -> TriggerCall:
        """Checked here as the relay and the stream processor will, so a mistake is told at
        once: raises :class:`~candlewire.triggers.TriggerRejected`."""
        request.request_id = request.request_id or new_id("tr")
        check_owner(request)
        if request.action == cep.ADD:
            parse_trigger(request)
        return cls(request)

    def frames(self) -> list[bytes]:
        return encode(self.request)

    def accept(self, reply: list[bytes]) -> rq.SubmitResponse:
        resp = accept_ack(reply)
        if resp.notification_topic != response_topic(self.request.client_id):
            raise ProtocolError(f"relay names topic {resp.notification_topic!r} for a trigger")
        return resp

    def match(self, frames: list[bytes]) -> cep.CEPTriggerAck | None:
        try:
            _topic, msg = decode_sub(frames)
        except EnvelopeError:
            return None
        if isinstance(msg, cep.CEPTriggerAck) and msg.request_id == self.request.request_id:
            return msg
        return None


@dataclass
class NotificationInbox:
    """Notifications seen on the client's SUB socket, kept until their caller asks."""

    dropped: int = 0
    _pending: set[str] = field(default_factory=set)
    _ready: dict[str, rq.HistoryReadyNotification] = field(default_factory=dict)
    # CEP firings in arrival order, each once (by its firing_key): the stream processor may
    # send one again after a restart, and every notification is repeated a few times.
    _firings: deque[cep.CEPTriggerEvent] = field(default_factory=deque)
    _seen: OrderedDict[FiringKey, None] = field(default_factory=OrderedDict)
    # Answers to calls in flight (a trigger's ack, a metadata refresh's update) that another
    # call's wait read off the shared SUB: an async client may wait on several at once.
    _calls: set[str] = field(default_factory=set)
    _answers: dict[str, list[bytes]] = field(default_factory=dict)

    def expect_answer(self, request_id: str) -> None:
        self._calls.add(request_id)

    def take_answer(self, request_id: str) -> list[bytes] | None:
        """The frames of ``request_id``'s answer if another wait read them, once."""
        return self._answers.pop(request_id, None)

    def forget_answer(self, request_id: str) -> None:
        self._calls.discard(request_id)
        self._answers.pop(request_id, None)

    def expect(self, request_id: str) -> None:
        """Only notifications of submitted requests are kept; repeats of done ones are not."""
        self._pending.add(request_id)

    def forget(self, request_id: str) -> None:
        """A request given up (refused, timed out): nothing of it is kept."""
        self._pending.discard(request_id)
        self._ready.pop(request_id, None)

    def offer(self, frames: list[bytes]) -> None:
        try:
            _topic, msg = decode_sub(frames)
        except EnvelopeError:
            self.dropped += 1
            return
        if isinstance(msg, rq.HistoryReadyNotification) and msg.request_id in self._pending:
            self._ready.setdefault(msg.request_id, msg)
        answer = isinstance(msg, cep.CEPTriggerAck | market_pb2.SymbolMetadataUpdated)
        if answer and msg.request_id in self._calls:  # type: ignore[union-attr]
            self._answers.setdefault(msg.request_id, frames)  # type: ignore[union-attr]
        if isinstance(msg, cep.CEPTriggerEvent):
            key = firing_key(msg)
            if key not in self._seen and len(self._firings) < MAX_QUEUED_FIRINGS:
                self._seen[key] = None
                self._firings.append(msg)
                while len(self._seen) > FIRINGS_REMEMBERED:
                    self._seen.popitem(last=False)

    def take_firing(self) -> cep.CEPTriggerEvent | None:
        return self._firings.popleft() if self._firings else None

    def take(self, request_id: str) -> rq.HistoryReadyNotification | None:
        note = self._ready.pop(request_id, None)
        if note is not None:
            self._pending.discard(request_id)
        if note is not None and note.status != rq.HISTORY_OK:
            raise HistoryFailed(note)
        return note


@dataclass
class MarketFilter:
    """Exact-topic filter for one market-data subscription (SUB filters by prefix).

    The ticker's error topic is subscribed first, so a SubscriptionError about it (no live
    ingestor, unknown symbol) cannot miss us and ends the subscription with an exception.
    """

    topic: str
    error_topic: str
    dropped: int = 0
    # What the topic carries (heads besides); another type on it is dropped and counted:
    # it had no position to judge (the subscription died) or went out as a position taken.
    kinds: tuple[type[Message], ...] = (Message,)

    @classmethod
    def open(cls, sub: zmq.Socket, ticker: str, data_type: str) -> MarketFilter:
        filt = cls(
            market_data_topic(ticker, data_type),
            subscription_error_topic(ticker),
            kinds=(market_pb2.StreamHead, *carried_by(data_type)),
        )
        sub.subscribe(filt.error_topic)
        sub.subscribe(filt.topic)
        return filt

    def accept(self, frames: list[bytes]) -> Message | None:
        try:
            topic, msg = decode_sub(frames)
        except EnvelopeError:
            self.dropped += 1
            return None
        if topic == self.error_topic and isinstance(msg, rq.SubscriptionError):
            # The error topic is the ticker's: a missing book fails only book subscribers.
            if msg.reason != rq.NO_BOOK or self.topic.endswith(f"|{book_type()}"):
                raise SubscriptionFailed(msg)
            return None
        if topic != self.topic:
            return None
        if isinstance(msg, self.kinds):
            return msg
        self.dropped += 1
        return None


def carried_by(data_type: str) -> tuple[type[Message], ...]:
    """The message types a market-data topic of ``data_type`` carries."""
    if data_type == book_type():
        return (book_pb2.BookDelta, book_pb2.BookSnapshot)
    if data_type == tick_type():
        return (market_pb2.Tick,)
    return (market_pb2.OHLC,)  # ohlc:{period}


class Verdict(Enum):
    NEXT = "next"  # deliver it
    DUPLICATE = "duplicate"  # delivered already (a replay, or a chunk brought it)
    EARLY = "early"  # published before the replay's ``since``: not asked for
    GAP = "gap"  # something is missing before it: fetch, then judge it again


@dataclass
class SubscriptionStats:
    """What one subscription saw; ``gaps`` were found from positions or heads, and
    ``filled`` messages were brought by FETCH."""

    delivered: int = 0
    gaps: int = 0
    filled: int = 0
    duplicates: int = 0
    heads: int = 0
    epochs: int = 0
    archived: int = 0  # older than the journal, read from Iceberg
    malformed: int = 0  # dropped: a price or size not a decimal(38,18), a time no datetime holds
    lost: int = 0  # positions a FETCH skipped: published live, never journalled (a write failed)


@dataclass
class Sequence:
    """The position of the last message a subscription delivered, and what to do next."""

    topic: str
    stats: SubscriptionStats = field(default_factory=SubscriptionStats)
    last: StreamPosition | None = None
    since_ms: int = 0  # replay from this publish time; 0: start with the first live message

    def judge(self, pos: StreamPosition) -> Verdict:
        if self.last is None:
            if not self.since_ms:
                return Verdict.NEXT
            # Published before ``since`` (a clock of the caller's ahead of the publisher's,
            # or ``since=now`` with a message on its way): no FETCH from ``since`` brings it,
            # and waiting for one ended the subscription (FellBehind).
            if pos.publish_time_ms < self.since_ms:
                return Verdict.EARLY
            # After a replay that found nothing (yet), the journal may still be behind.
            return Verdict.GAP
        if is_next(pos, self.last):
            return Verdict.NEXT
        if not is_after(pos, self.last):
            self.stats.duplicates += 1
            return Verdict.DUPLICATE
        return Verdict.GAP

    def behind(self, head: StreamPosition) -> bool:
        """A head beacon names a message after ours: the tail of a burst was lost."""
        self.stats.heads += 1
        return self.last is not None and is_after(head, self.last)

    def reached(self, pos: StreamPosition) -> bool:
        return self.last is not None and not is_after(pos, self.last)

    def take(self, pos: StreamPosition) -> None:
        """A live message, delivered."""
        self._delivered(pos, pos, 1, filled=False)

    def take_run(self, first: StreamPosition, last: StreamPosition, n: int) -> bool:
        """A run of ``n`` live messages whose positions follow one another (as
        :class:`~candlewire.book.DeltaRun` reads them): True, and all taken as delivered,
        when the first is the next; False leaves each to :meth:`judge`."""
        if not is_next(first, self.last):
            return False
        self._delivered(first, last, n, filled=False)
        return True

    def lost_before(self, pos: StreamPosition) -> None:
        """The journal went past ``pos``, a live message in hand, without those between the
        last delivered and it: counted lost, and ``pos`` is the next to take."""
        self._count_lost(pos, pos, 1)

    def lost_through(self, head: StreamPosition) -> None:
        """The journal went past a head beacon's position without the messages up to it:
        counted lost, that position taken as the last (nothing before it can come now)."""
        self._count_lost(head, head, 0)
        self.last = head

    def accept_chunk(self, msgs: list[Message], filled: bool) -> list[Message]:
        """A FETCH chunk's messages after the last delivered, taken as delivered. The service
        sends them in order after ``after``; only the chunk's edges are checked."""
        if msgs and not is_after(msgs[0].stream, self.last):  # type: ignore[attr-defined]
            msgs = [m for m in msgs if is_after(m.stream, self.last)]  # type: ignore[attr-defined]
        if not msgs:
            return msgs
        first, last = msgs[0].stream, msgs[-1].stream  # type: ignore[attr-defined]
        self._count_lost(first, last, len(msgs))
        self._delivered(first, last, len(msgs), filled)
        return msgs

    def accept_edges(
        self, first: StreamPosition, last: StreamPosition, n: int, filled: bool
    ) -> bool:
        """:meth:`accept_chunk` for a chunk held as columns, by its edges: True, and all of
        it taken as delivered, when its first message comes after the last delivered; False
        leaves it to :meth:`accept_chunk`, which drops the ones before."""
        if not is_after(first, self.last):
            return False
        self._count_lost(first, last, n)
        self._delivered(first, last, n, filled)
        return True

    def _count_lost(self, first: StreamPosition, last: StreamPosition, n: int) -> None:
        """Count the positions a chunk of ``n`` messages skips, before it and within it,
        where an epoch's seq says exactly which come next. The journal serves what it holds:
        a message published live whose journal write failed is in no chunk, and went by
        unseen (a chunk across epochs is not counted within)."""
        lost = 0
        if self.last is not None and first.epoch == self.last.epoch:
            lost += first.seq - self.last.seq - 1
        if first.epoch == last.epoch:
            lost += last.seq - first.seq + 1 - n
        if lost > 0:
            self.stats.lost += lost
            log.warning(
                "%s: %d messages the journal does not hold, before %s",
                self.topic,
                lost,
                describe(last),
            )

    def _delivered(self, first: StreamPosition, last: StreamPosition, n: int, filled: bool) -> None:
        if self.last is None or first.epoch != self.last.epoch:
            self.stats.epochs += 1
        if first.epoch != last.epoch:
            self.stats.epochs += 1
        self.last = last
        self.stats.delivered += n
        if filled:
            self.stats.filled += n

    def request(
        self,
        until: StreamPosition | None,
        cursor: int,
        request_id: str,
        after: StreamPosition | None = None,
    ) -> jr.FetchRequest:
        """The FETCH of what comes after the last delivered message, or after ``after`` (the
        end of a chunk not yet taken: :class:`FetchHead`)."""
        req = jr.FetchRequest(
            request_id=request_id, topic=self.topic, cursor=cursor, max_messages=FETCH_MESSAGES
        )
        last = after or self.last
        if last is not None:
            req.after.CopyFrom(last)
        else:
            req.since_ms = self.since_ms
        if until is not None:
            req.until.CopyFrom(until)
        return req


def _fetch_head_type() -> type[Message]:
    """A shadow of FetchReply with its own fields, and of each run only its last position
    (as its bytes): one parse of a 50k-tick chunk in under a millisecond, where the runs'
    messages take tens. Field numbers and types come from the contract's descriptors."""
    F = FieldDescriptor
    file = descriptor_pb2.FileDescriptorProto(name="fetch_head.proto", syntax="proto3")
    file.package = "candlewire_head"
    head = file.message_type.add(name="Head")
    for f in jr.FetchReply.DESCRIPTOR.fields:
        field = head.field.add(name=f.name, number=f.number, label=F.LABEL_OPTIONAL)
        if f.name == "runs":
            field.type, field.label = F.TYPE_MESSAGE, F.LABEL_REPEATED
            field.type_name = f".{file.package}.Run"
        else:
            field.type = F.TYPE_INT32 if f.type == F.TYPE_ENUM else f.type
    last = jr.JournalBatch.DESCRIPTOR.fields_by_name["last"]
    file.message_type.add(name="Run").field.add(
        name=last.name, number=last.number, type=F.TYPE_BYTES, label=F.LABEL_OPTIONAL
    )
    pool = descriptor_pool.DescriptorPool()
    pool.Add(file)
    return message_factory.GetMessageClass(pool.FindMessageTypeByName(f"{file.package}.Head"))


_FETCH_HEAD = _fetch_head_type()


@dataclass(frozen=True)
class FetchHead:
    """What a FETCH reply says of itself and where its last run ends: enough to ask for the
    next chunk before this one is read (#35: the service then reads while the client parses).
    Read without holding the runs to their limits; the reply is checked as it is read."""

    request_id: str
    status: int
    cursor: int
    done: bool
    archived: bool
    last: StreamPosition | None

    @classmethod
    def read(cls, frames: list[bytes]) -> FetchHead | None:
        """None when the frames hold no FetchReply, or one that does not parse."""
        try:
            head = _FETCH_HEAD.FromString(unchecked_payload(frames, jr.FetchReply))
            last = StreamPosition.FromString(head.runs[-1].last) if head.runs else None
        except (EnvelopeError, DecodeError, RuntimeWarning):
            return None
        return cls(
            head.request_id, head.status, head.cursor, head.done, bool(head.archive_until_ms), last
        )


def same_fetch(a: jr.FetchRequest, b: jr.FetchRequest) -> bool:
    """Whether two FETCHes ask for the same chunk (their ids aside)."""
    return (
        a.topic == b.topic
        and a.cursor == b.cursor
        and a.since_ms == b.since_ms
        and a.max_messages == b.max_messages
        and all(
            a.HasField(f) == b.HasField(f) and getattr(a, f) == getattr(b, f)
            for f in ("after", "until")
        )
    )


def book_start(
    ticker: str, data_type: str, since: Since, depth: int | None
) -> tuple[Since, BookFeed | None]:
    """For a book subscription, where it replays the journal from and the feed that keeps
    its book; any other subscription's ``since`` as it is, and no feed.

    A book starts from a snapshot: the replay begins a snapshot interval before ``since``
    (or before now), and the book is handed out from ``since`` on (live: at once)."""
    if data_type != book_type():
        return since, None
    if isinstance(since, StreamPosition) or hasattr(since, "stream"):
        raise TypeError("a book subscription starts from a time (since=), not a position")
    if depth is not None and depth < 1:
        raise ValueError(f"depth {depth} must be 1 or more")
    start_ms = int(time.time() * 1000) if since is None else to_ms(since, "since")
    feed = BookFeed(ticker, depth, from_ns=0 if since is None else start_ms * 1_000_000)
    return start_ms - int(JOIN_LOOKBACK_S * 1000), feed


class ConnectionState:
    """Tracks a SUB socket's connections (one per relay) from its monitor events."""

    def __init__(self) -> None:
        self._up: set[bytes] = set()

    @property
    def connected(self) -> bool:
        return bool(self._up)

    def update(self, event: dict) -> None:
        if event["event"] == zmq.EVENT_HANDSHAKE_SUCCEEDED:
            self._up.add(event["endpoint"])
        elif event["event"] == zmq.EVENT_DISCONNECTED:
            self._up.discard(event["endpoint"])


def remaining(deadline: float) -> float:
    return max(0.0, deadline - time.monotonic())


def ms(seconds: float | None) -> int | None:
    """Seconds to a zmq poll timeout; None waits forever."""
    return None if seconds is None else int(seconds * 1000)
