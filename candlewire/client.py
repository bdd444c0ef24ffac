"""The public Python client: :class:`Client` (blocking) and :class:`AsyncClient` (asyncio).

A history request follows the spec's race-free order: subscribe to the notification topic,
wait until the SUB connection is up, submit over REQ with Lazy-Pirate retries (a fresh socket
and the same request_id, so a retry is idempotent), then wait for HistoryReadyNotification.

Both classes are thin shells over one protocol core (:mod:`candlewire._core`): each method
builds its call and runs the core's procedure, blocking or awaiting. A test keeps their
public APIs equal.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from typing import TYPE_CHECKING, Literal, overload

import pyarrow as pa
import zmq
import zmq.asyncio
from google.protobuf.message import Message

from candlewire._core import (
    ATTEMPT_TIMEOUT_S,
    HISTORY_TIMEOUT_S,
    SUBMIT_TIMEOUT_S,
    TRIGGER_TIMEOUT_S,
    ClientCore,
    Emitted,
    async_drive,
    async_drive_iter,
    drive,
    drive_iter,
)
from candlewire._protocol import (
    HistoryCall,
    NotificationInbox,
    Notify,
    Sequence,
    Since,
    SubscriptionStats,
    TimeLike,
    TriggerCall,
    book_start,
    new_id,
)
from candlewire.book import Book, BookFeed, DeltaRun, Verdict
from candlewire.config import Settings
from candlewire.market import MALFORMED, Candle, Tick, typed
from candlewire.topics import check_market_data
from candlewire.triggers import Condition, add_request
from proto import cep_pb2 as cep
from proto import market_pb2
from proto import requests_pb2 as rq

if TYPE_CHECKING:
    from candlewire.history import Decimals

# What a subscription yields (Message: with raw=True; RecordBatch: with batches=True; Book:
# a "book" subscription's maintained book).
Item = Tick | Candle | Book | Message | pa.RecordBatch


class Client:
    """Blocking client. Not thread-safe: use one per thread."""

    def __init__(
        self,
        settings: Settings | None = None,
        *,
        client_id: str | None = None,
        submit_timeout: float = SUBMIT_TIMEOUT_S,
        attempt_timeout: float = ATTEMPT_TIMEOUT_S,
        context: zmq.Context | None = None,
    ) -> None:
        ctx = context or zmq.Context.instance()
        self._core = ClientCore(settings, client_id, submit_timeout, attempt_timeout, ctx.socket)

    settings = property(lambda self: self._core.settings)
    client_id = property(lambda self: self._core.client_id)
    inbox: NotificationInbox = property(lambda self: self._core.inbox)  # type: ignore[assignment]

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Close the client's sockets, and its subscriptions' that are still open (iterating
        one then ends); a ``with`` block does it on leaving."""
        self._core.close()

    def submit(
        self,
        ticker: str,
        period: int,
        start: TimeLike,
        end: TimeLike,
        *,
        notify: Notify = "client",
        request_id: str | None = None,
    ) -> rq.SubmitResponse:
        """Submit without waiting for the data; subscribe first so nothing is missed."""
        call = HistoryCall.build(self.client_id, ticker, period, start, end, notify, request_id)
        return drive(self._core.submit(call))

    def request_history(
        self,
        ticker: str,
        period: int,
        start: TimeLike,
        end: TimeLike,
        *,
        notify: Notify = "client",
        timeout: float = HISTORY_TIMEOUT_S,
        request_id: str | None = None,
        read: bool = False,
        decimals: Decimals = "decimal",
    ) -> rq.HistoryReadyNotification | pa.Table:
        """Submit and wait until the rows are in Iceberg; raise HistoryFailed on ERROR.

        With ``read=True`` return the candles themselves (see :meth:`history`).
        """
        call = HistoryCall.build(self.client_id, ticker, period, start, end, notify, request_id)
        note = drive(self._core.request_history(call, timeout))
        return self.history(ticker, period, start, end, decimals=decimals) if read else note

    @overload
    def history(
        self,
        ticker: str,
        period: Literal["book"],
        start: None = None,
        end: None = None,
        *,
        at: TimeLike,
        decimals: Decimals = "decimal",
    ) -> Book: ...

    @overload
    def history(
        self,
        ticker: str,
        period: int | str,
        start: TimeLike | None = None,
        end: TimeLike | None = None,
        *,
        at: None = None,
        decimals: Decimals = "decimal",
    ) -> pa.Table: ...

    def history(
        self,
        ticker: str,
        period: int | str,
        start: TimeLike | None = None,
        end: TimeLike | None = None,
        *,
        at: TimeLike | None = None,
        decimals: Decimals = "decimal",
    ) -> pa.Table | Book:
        """Candles already in Iceberg, read with pyiceberg (partition-pruned). Times are
        ISO text, epoch ms, dates or datetimes (no zone: UTC). Prices are exact decimals at
        the smallest scale that holds them, or ``decimals="float"``.

        ``history(ticker, "book", at=T)`` is the L2 book as of T instead, rebuilt from the
        last snapshot before T and the deltas after it."""
        # Imported on the first read, not with the client: pyiceberg and SQLAlchemy are only
        # for reading Iceberg, which a process that only requests or subscribes never does.
        from candlewire.history import read_stored

        return read_stored(self.settings, ticker, period, start, end, at, decimals)

    def wait_ready(
        self, request_id: str, timeout: float = HISTORY_TIMEOUT_S
    ) -> rq.HistoryReadyNotification:
        """The HistoryReady of a submitted request; raise HistoryFailed on ERROR."""
        return drive(self._core.wait_ready(request_id, timeout))

    def refresh_metadata(
        self, exchange: str, *, timeout: float = HISTORY_TIMEOUT_S
    ) -> market_pb2.SymbolMetadataUpdated:
        """Have an ingestor fetch the exchange's markets; return once they are in Iceberg
        (added, removed and changed counts)."""
        return drive(self._core.refresh_metadata(exchange, timeout))

    def add_trigger(
        self,
        ticker: str,
        condition: Condition,
        *,
        trigger_id: str | None = None,
        user_id: str = "",
        once: bool = True,
        cooldown_s: int = 0,
        critical: bool = False,
        timeout: float = TRIGGER_TIMEOUT_S,
    ) -> cep.CEPTriggerAck:
        """Register a CEP trigger; its firings come on this client's topic as CEPTriggerEvent
        once the stream processor evaluates them. Raises TriggerRefused with the reason."""
        req = add_request(
            self.client_id,
            trigger_id or new_id("trg"),
            ticker,
            condition,
            user_id=user_id,
            once=once,
            cooldown_s=cooldown_s,
            critical=critical,
        )
        return drive(self._core.trigger(TriggerCall.build(req), timeout))

    def remove_trigger(self, trigger_id: str, *, timeout: float = TRIGGER_TIMEOUT_S) -> None:
        """Remove one of this client's triggers; TriggerRefused if it has none of that id."""
        req = cep.CEPTriggerRequest(
            trigger_id=trigger_id, client_id=self.client_id, action=cep.REMOVE
        )
        drive(self._core.trigger(TriggerCall.build(req), timeout))

    def list_triggers(self, *, timeout: float = TRIGGER_TIMEOUT_S) -> list[cep.CEPTriggerRequest]:
        """This client's registered triggers, oldest first."""
        req = cep.CEPTriggerRequest(client_id=self.client_id, action=cep.LIST)
        return list(drive(self._core.trigger(TriggerCall.build(req), timeout)).triggers)

    def next_firing(self, timeout: float = TRIGGER_TIMEOUT_S) -> cep.CEPTriggerEvent | None:
        """The next firing of this client's triggers (each firing once, with the values
        that made it fire), or None when none comes within ``timeout``."""
        return drive(self._core.next_firing(timeout))

    def subscribe(
        self,
        ticker: str,
        data_type: str = "tick",
        *,
        since: Since = None,
        idle_timeout: float | None = None,
        raw: bool = False,
        batches: bool = False,
        depth: int | None = None,
    ) -> Subscription:
        """Yield every tick or candle of one topic once, in order, until closed: as
        :class:`~candlewire.market.Tick` and :class:`~candlewire.market.Candle` (Decimal
        prices, UTC datetimes), or with ``raw=True`` as the protobuf messages.

        Subscribing is enough: the socket is subscribed when this returns, and an ingestor
        starts streaming the ticker for its first subscriber; ``close()`` (or dropping the
        subscription) unsubscribes. Waiting (``idle_timeout``, the journal) starts at the
        first ``next``. ``since`` (a time, or a message received before, or its ``stream``
        position) replays the journal from there and then goes on live with no gap and no
        repeat. Messages lost on the way (a full queue, a relay restart) are fetched from
        the journal before anything newer is yielded; ``.stats`` counts them.
        SubscriptionFailed says why nothing will flow (no live ingestor for the exchange, a
        symbol the exchange does not list), FellBehind that missing messages are held
        nowhere any more; ``idle_timeout`` raises RequestTimeout after that many seconds
        without a message.

        With ``batches=True``, what the journal replays (the ``since`` range, and any gap
        it fills later) comes as one ``pyarrow.RecordBatch`` per chunk, in the columns of
        :data:`~candlewire.market.TICK_SCHEMA` or :data:`~candlewire.market.CANDLE_SCHEMA`
        (prices DECIMAL(38,18) like the Iceberg tables); live messages still come one by
        one. The positions and the no-gap, no-repeat rules are the same at the seam.

        ``data_type="book"`` yields the ticker's L2 :class:`~candlewire.book.Book`, kept
        from a snapshot and the deltas after it, each time an update changed it (the same
        object, maintained; its ``bids()`` and ``asks()`` give ``depth`` levels). ``since``
        (a time) starts it from the last snapshot before then and hands it out from then on;
        a book unchanged since then is handed out as it stood, once the journal's replay is
        done. Deltas that arrive together
        (one of the stream job's micro-batches, or what queued while the caller was busy)
        are applied at once, and the book is handed out once, as of the last of them.
        """
        seq = Sequence(check_market_data(ticker, data_type))
        since, feed = book_start(ticker, data_type, since, depth)
        batches = batches and feed is None  # a book is kept message by message
        steps = self._core.subscribe(ticker, data_type, idle_timeout, since, seq, batches)
        return Subscription(self._core.track(drive_iter(steps)), seq.stats, raw, feed)


class Subscription:
    """The messages of one subscription, and what it had to repair (``stats``)."""

    def __init__(
        self,
        messages: Iterator[Emitted],
        stats: SubscriptionStats,
        raw: bool = False,
        books: BookFeed | None = None,
    ) -> None:
        self._source = messages
        self._messages: Iterator[Item] = (
            _booked(messages, books, stats)
            if books is not None
            else iter(messages)  # the emitting generator itself, not a wrapper around it
            if raw
            else _typed(messages, stats)
        )
        self.stats = stats

    def __iter__(self) -> Iterator[Item]:
        return self._messages  # a for loop runs the messages themselves, no wrapper call each

    def __next__(self) -> Item:
        return next(self._messages)

    def close(self) -> None:
        """Stop: unsubscribe and drop what is queued."""
        self._source.close()  # type: ignore[attr-defined]


class AsyncSubscription:
    """Like :class:`Subscription`, as an async iterator."""

    def __init__(
        self,
        messages: AsyncIterator[Emitted],
        stats: SubscriptionStats,
        raw: bool = False,
        books: BookFeed | None = None,
    ) -> None:
        self._source = messages
        self._messages: AsyncIterator[Item] = (
            _booked_async(messages, books, stats)
            if books is not None
            else aiter(messages)  # the emitting generator itself, not a wrapper around it
            if raw
            else _typed_async(messages, stats)
        )
        self.stats = stats

    def __aiter__(self) -> AsyncIterator[Item]:
        return self._messages

    async def __anext__(self) -> Item:
        return await anext(self._messages)

    async def aclose(self) -> None:
        """Stop: unsubscribe and drop what is queued."""
        await self._source.aclose()  # type: ignore[attr-defined]


def _typed(messages: Iterator[Emitted], stats: SubscriptionStats) -> Iterator[Item]:
    for msg in messages:
        try:
            yield typed(msg)
        except MALFORMED:  # dropped, counted; the subscription goes on
            stats.malformed += 1


def _booked(
    messages: Iterator[Emitted], feed: BookFeed, stats: SubscriptionStats
) -> Iterator[Book]:
    for msg in messages:
        book = feed.offer_run(msg) if isinstance(msg, DeltaRun) else feed.offer(msg)
        stats.malformed = feed.sync.counts[Verdict.MALFORMED]
        if book is not None:
            yield book


async def _booked_async(
    messages: AsyncIterator[Emitted], feed: BookFeed, stats: SubscriptionStats
) -> AsyncIterator[Book]:
    async for msg in messages:
        book = feed.offer_run(msg) if isinstance(msg, DeltaRun) else feed.offer(msg)
        stats.malformed = feed.sync.counts[Verdict.MALFORMED]
        if book is not None:
            yield book


async def _typed_async(
    messages: AsyncIterator[Emitted], stats: SubscriptionStats
) -> AsyncIterator[Item]:
    async for msg in messages:
        try:
            yield typed(msg)
        except MALFORMED:  # dropped, counted; the subscription goes on
            stats.malformed += 1


class AsyncClient:
    """asyncio client with the same API as :class:`Client`, awaitable."""

    def __init__(
        self,
        settings: Settings | None = None,
        *,
        client_id: str | None = None,
        submit_timeout: float = SUBMIT_TIMEOUT_S,
        attempt_timeout: float = ATTEMPT_TIMEOUT_S,
        context: zmq.asyncio.Context | None = None,
    ) -> None:
        ctx = context or zmq.asyncio.Context.instance()
        self._core = ClientCore(settings, client_id, submit_timeout, attempt_timeout, ctx.socket)

    settings = property(lambda self: self._core.settings)
    client_id = property(lambda self: self._core.client_id)
    inbox: NotificationInbox = property(lambda self: self._core.inbox)  # type: ignore[assignment]

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Like :meth:`Client.close`; an ``async with`` block does it on leaving."""
        self._core.close()

    async def submit(
        self,
        ticker: str,
        period: int,
        start: TimeLike,
        end: TimeLike,
        *,
        notify: Notify = "client",
        request_id: str | None = None,
    ) -> rq.SubmitResponse:
        """Like :meth:`Client.submit`."""
        call = HistoryCall.build(self.client_id, ticker, period, start, end, notify, request_id)
        return await async_drive(self._core.submit(call))

    async def request_history(
        self,
        ticker: str,
        period: int,
        start: TimeLike,
        end: TimeLike,
        *,
        notify: Notify = "client",
        timeout: float = HISTORY_TIMEOUT_S,
        request_id: str | None = None,
        read: bool = False,
        decimals: Decimals = "decimal",
    ) -> rq.HistoryReadyNotification | pa.Table:
        """Like :meth:`Client.request_history`."""
        call = HistoryCall.build(self.client_id, ticker, period, start, end, notify, request_id)
        note = await async_drive(self._core.request_history(call, timeout))
        if not read:
            return note
        return await self.history(ticker, period, start, end, decimals=decimals)

    @overload
    async def history(
        self,
        ticker: str,
        period: Literal["book"],
        start: None = None,
        end: None = None,
        *,
        at: TimeLike,
        decimals: Decimals = "decimal",
    ) -> Book: ...

    @overload
    async def history(
        self,
        ticker: str,
        period: int | str,
        start: TimeLike | None = None,
        end: TimeLike | None = None,
        *,
        at: None = None,
        decimals: Decimals = "decimal",
    ) -> pa.Table: ...

    async def history(
        self,
        ticker: str,
        period: int | str,
        start: TimeLike | None = None,
        end: TimeLike | None = None,
        *,
        at: TimeLike | None = None,
        decimals: Decimals = "decimal",
    ) -> pa.Table | Book:
        """Like :meth:`Client.history`, in a worker thread so the event loop stays free."""
        from candlewire.history import read_stored  # on the first read

        return await asyncio.to_thread(
            read_stored, self.settings, ticker, period, start, end, at, decimals
        )

    async def wait_ready(
        self, request_id: str, timeout: float = HISTORY_TIMEOUT_S
    ) -> rq.HistoryReadyNotification:
        """Like :meth:`Client.wait_ready`."""
        return await async_drive(self._core.wait_ready(request_id, timeout))

    async def refresh_metadata(
        self, exchange: str, *, timeout: float = HISTORY_TIMEOUT_S
    ) -> market_pb2.SymbolMetadataUpdated:
        """Like :meth:`Client.refresh_metadata`."""
        return await async_drive(self._core.refresh_metadata(exchange, timeout))

    async def add_trigger(
        self,
        ticker: str,
        condition: Condition,
        *,
        trigger_id: str | None = None,
        user_id: str = "",
        once: bool = True,
        cooldown_s: int = 0,
        critical: bool = False,
        timeout: float = TRIGGER_TIMEOUT_S,
    ) -> cep.CEPTriggerAck:
        """Like :meth:`Client.add_trigger`."""
        req = add_request(
            self.client_id,
            trigger_id or new_id("trg"),
            ticker,
            condition,
            user_id=user_id,
            once=once,
            cooldown_s=cooldown_s,
            critical=critical,
        )
        return await async_drive(self._core.trigger(TriggerCall.build(req), timeout))

    async def remove_trigger(self, trigger_id: str, *, timeout: float = TRIGGER_TIMEOUT_S) -> None:
        """Like :meth:`Client.remove_trigger`."""
        req = cep.CEPTriggerRequest(
            trigger_id=trigger_id, client_id=self.client_id, action=cep.REMOVE
        )
        await async_drive(self._core.trigger(TriggerCall.build(req), timeout))

    async def list_triggers(
        self, *, timeout: float = TRIGGER_TIMEOUT_S
    ) -> list[cep.CEPTriggerRequest]:
        """Like :meth:`Client.list_triggers`."""
        req = cep.CEPTriggerRequest(client_id=self.client_id, action=cep.LIST)
        return list(
            (await async_drive(self._core.trigger(TriggerCall.build(req), timeout))).triggers
        )

    async def next_firing(self, timeout: float = TRIGGER_TIMEOUT_S) -> cep.CEPTriggerEvent | None:
        """Like :meth:`Client.next_firing`."""
        return await async_drive(self._core.next_firing(timeout))

    def subscribe(
        self,
        ticker: str,
        data_type: str = "tick",
        *,
        since: Since = None,
        idle_timeout: float | None = None,
        raw: bool = False,
        batches: bool = False,
        depth: int | None = None,
    ) -> AsyncSubscription:
        """Like :meth:`Client.subscribe`, as an async iterator."""
        seq = Sequence(check_market_data(ticker, data_type))
        since, feed = book_start(ticker, data_type, since, depth)
        batches = batches and feed is None  # a book is kept message by message
        steps = self._core.subscribe(ticker, data_type, idle_timeout, since, seq, batches)
        return AsyncSubscription(self._core.track(async_drive_iter(steps)), seq.stats, raw, feed)
