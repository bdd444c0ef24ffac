"""The public Python client: :class:`Client` (blocking) and :class:`AsyncClient` (asyncio).

A history request follows the spec's race-free order: subscribe to the notification topic,
wait until the SUB connection is up, submit over REQ with Lazy-Pirate retries (a fresh socket
and the same request_id, so a retry is idempotent), then wait for HistoryReadyNotification.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Iterator

import pyarrow as pa
import zmq
import zmq.asyncio
from google.protobuf.message import Message
from zmq.utils.monitor import parse_monitor_message

from candlewire._protocol import (
    MONITOR_EVENTS,
    ConnectionState,
    HistoryCall,
    MarketFilter,
    MetadataCall,
    NotificationInbox,
    Notify,
    TimeLike,
    ms,
    new_id,
    remaining,
)
from candlewire.config import Settings
from candlewire.errors import RequestRejected, RequestTimeout
from candlewire.history import read_history
from candlewire.topics import check_id, metadata_update_topic, response_topic
from proto import market_pb2
from proto import requests_pb2 as rq

SUBMIT_TIMEOUT_S = 30.0  # the spec's REQ/REP default
ATTEMPT_TIMEOUT_S = 2.5
HISTORY_TIMEOUT_S = 300.0
CONNECT_TIMEOUT_S = 5.0
RETRY_PAUSE_S = 0.2  # between retries of a NO_INGESTOR rejection


class _Base:
    def __init__(
        self,
        settings: Settings | None,
        client_id: str | None,
        submit_timeout: float,
        attempt_timeout: float,
    ) -> None:
        self.settings = settings or Settings()
        self.client_id = check_id(client_id or new_id("cl"), "client_id")
        self.submit_timeout = submit_timeout
        self.attempt_timeout = attempt_timeout
        self.inbox = NotificationInbox()
        self._state = ConnectionState()
        self._sub: zmq.Socket | None = None
        self._mon: zmq.Socket | None = None

    def _open_notifications(self, ctx: zmq.Context) -> None:
        """One SUB for all notifications, subscribed once to ``RESPONSE:{client_id}``."""
        sub = ctx.socket(zmq.SUB)
        sub.setsockopt(zmq.LINGER, 0)
        sub.setsockopt(zmq.RECONNECT_IVL, 100)
        sub.setsockopt(zmq.RECONNECT_IVL_MAX, 1000)
        self._mon = sub.get_monitor_socket(MONITOR_EVENTS)
        sub.subscribe(response_topic(self.client_id))
        sub.connect(self.settings.connect("market_data"))
        self._sub = sub

    def _new_req(self, ctx: zmq.Context) -> zmq.Socket:
        req = ctx.socket(zmq.REQ)
        req.setsockopt(zmq.LINGER, 0)
        req.connect(self.settings.connect("client_requests"))
        return req

    def _close_sockets(self) -> None:
        if self._sub is not None:
            self._sub.disable_monitor()
            self._sub.close(linger=0)
        if self._mon is not None:
            self._mon.close(linger=0)
        self._sub = self._mon = None


class Client(_Base):
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
        super().__init__(settings, client_id, submit_timeout, attempt_timeout)
        self._ctx = context or zmq.Context.instance()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._close_sockets()

    # -- history -----------------------------------------------------------------------------

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
        return self._submit(call)

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
    ) -> rq.HistoryReadyNotification | pa.Table:
        """Submit and wait until the rows are in Iceberg; raise HistoryFailed on ERROR.

        With ``read=True`` return the candles themselves (see :meth:`history`).
        """
        call = HistoryCall.build(self.client_id, ticker, period, start, end, notify, request_id)
        self._submit(call)
        try:
            note = self.wait_ready(call.request.request_id, timeout)
        finally:
            if notify == "request" and self._sub is not None:
                self._sub.unsubscribe(call.topic)
        return self.history(ticker, period, start, end) if read else note

    def history(self, ticker: str, period: int, start: TimeLike, end: TimeLike) -> pa.Table:
        """Candles already in Iceberg, read with pyiceberg (partition-pruned)."""
        return read_history(self.settings, ticker, period, start, end)

    def wait_ready(
        self, request_id: str, timeout: float = HISTORY_TIMEOUT_S
    ) -> rq.HistoryReadyNotification:
        deadline = time.monotonic() + timeout
        while (note := self.inbox.take(request_id)) is None:
            if not remaining(deadline):
                raise RequestTimeout(f"no HistoryReady for {request_id} within {timeout:.0f}s")
            assert self._sub is not None
            if self._sub.poll(ms(min(remaining(deadline), 0.5))):
                self.inbox.offer(self._sub.recv_multipart())
        return note

    def _submit(self, call: HistoryCall) -> rq.SubmitResponse:
        if self._sub is None:
            self._open_notifications(self._ctx)
        assert self._sub is not None
        if call.topic != response_topic(self.client_id):
            self._sub.subscribe(call.topic)
        self.inbox.expect(call.request.request_id)
        return self._send(call)

    def _send(self, call: HistoryCall | MetadataCall) -> rq.SubmitResponse:
        """REQ with Lazy-Pirate retries; a NO_INGESTOR rejection is retried until the deadline."""
        deadline = time.monotonic() + self.submit_timeout
        self._wait_connected(min(CONNECT_TIMEOUT_S, self.submit_timeout / 2))
        while True:
            try:
                return call.accept(self._lazy_pirate(call.frames(), deadline))
            except RequestRejected as exc:
                if not exc.retryable or remaining(deadline) < RETRY_PAUSE_S:
                    raise
            time.sleep(RETRY_PAUSE_S)

    def _wait_connected(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        assert self._mon is not None
        while True:
            wait = 0 if self._state.connected else remaining(deadline)
            if not self._mon.poll(ms(wait)):
                break
            self._state.update(parse_monitor_message(self._mon.recv_multipart()))
        # Not connected yet is not fatal: the relay may be restarting; the REQ retries cover it.

    def _lazy_pirate(self, frames: list[bytes], deadline: float) -> list[bytes]:
        while remaining(deadline):
            req = self._new_req(self._ctx)
            try:
                req.send_multipart(frames)
                if req.poll(ms(min(self.attempt_timeout, remaining(deadline)))):
                    return req.recv_multipart()
            finally:
                req.close(linger=0)
            self._wait_connected(0)
        raise RequestTimeout(f"relay did not answer within {self.submit_timeout:.0f}s")

    # -- symbol metadata -------------------------------------------------------------------

    def refresh_metadata(
        self, exchange: str, *, timeout: float = HISTORY_TIMEOUT_S
    ) -> market_pb2.SymbolMetadataUpdated:
        """Have an ingestor fetch the exchange's markets; return once they are in Iceberg.

        Like a history request: subscribe to METADATA_UPDATE first, submit, then wait for the
        SymbolMetadataUpdated that names our request_id (added, removed, changed counts).
        """
        if self._sub is None:
            self._open_notifications(self._ctx)
        assert self._sub is not None
        self._sub.subscribe(metadata_update_topic())
        call = MetadataCall.build(exchange)
        deadline = time.monotonic() + timeout
        self._send(call)
        try:
            while remaining(deadline):
                if self._sub.poll(ms(min(remaining(deadline), 0.5))):
                    frames = self._sub.recv_multipart()
                    done = call.match(frames)
                    if done is not None:
                        return done
                    self.inbox.offer(frames)
            raise RequestTimeout(f"no SymbolMetadataUpdated for {exchange} within {timeout:.0f}s")
        finally:
            self._sub.unsubscribe(metadata_update_topic())

    # -- market data ---------------------------------------------------------------------

    def subscribe(
        self, ticker: str, data_type: str = "tick", *, idle_timeout: float | None = None
    ) -> Iterator[Message]:
        """Yield decoded Tick/OHLC messages of one topic until closed.

        Subscribing is enough: an ingestor starts streaming the ticker for its first
        subscriber. SubscriptionFailed says why nothing will flow (no live ingestor for the
        exchange, a symbol the exchange does not list); ``idle_timeout`` raises
        RequestTimeout after that many seconds without a message.
        """
        sub = self._ctx.socket(zmq.SUB)
        sub.setsockopt(zmq.LINGER, 0)
        filt = MarketFilter.open(sub, ticker, data_type)
        sub.connect(self.settings.connect("market_data"))
        try:
            while True:
                if not sub.poll(ms(idle_timeout)):
                    raise RequestTimeout(f"no {filt.topic} message in {idle_timeout}s")
                msg = filt.accept(sub.recv_multipart())
                if msg is not None:
                    yield msg
        finally:
            sub.close(linger=0)


class AsyncClient(_Base):
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
        super().__init__(settings, client_id, submit_timeout, attempt_timeout)
        self._ctx = context or zmq.asyncio.Context.instance()

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._close_sockets()

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
        call = HistoryCall.build(self.client_id, ticker, period, start, end, notify, request_id)
        return await self._submit(call)

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
    ) -> rq.HistoryReadyNotification | pa.Table:
        call = HistoryCall.build(self.client_id, ticker, period, start, end, notify, request_id)
        await self._submit(call)
        try:
            note = await self.wait_ready(call.request.request_id, timeout)
        finally:
            if notify == "request" and self._sub is not None:
                self._sub.unsubscribe(call.topic)
        return await self.history(ticker, period, start, end) if read else note

    async def history(self, ticker: str, period: int, start: TimeLike, end: TimeLike) -> pa.Table:
        """Like :meth:`Client.history`, in a worker thread so the event loop stays free."""
        return await asyncio.to_thread(read_history, self.settings, ticker, period, start, end)

    async def wait_ready(
        self, request_id: str, timeout: float = HISTORY_TIMEOUT_S
    ) -> rq.HistoryReadyNotification:
        deadline = time.monotonic() + timeout
        while (note := self.inbox.take(request_id)) is None:
            if not remaining(deadline):
                raise RequestTimeout(f"no HistoryReady for {request_id} within {timeout:.0f}s")
            assert self._sub is not None
            if await self._sub.poll(ms(min(remaining(deadline), 0.5))):
                self.inbox.offer(await self._sub.recv_multipart())
        return note

    async def _submit(self, call: HistoryCall) -> rq.SubmitResponse:
        if self._sub is None:
            self._open_notifications(self._ctx)
        assert self._sub is not None
        if call.topic != response_topic(self.client_id):
            self._sub.subscribe(call.topic)
        self.inbox.expect(call.request.request_id)
        deadline = time.monotonic() + self.submit_timeout
        await self._wait_connected(min(CONNECT_TIMEOUT_S, self.submit_timeout / 2))
        while True:
            try:
                return call.accept(await self._lazy_pirate(call.frames(), deadline))
            except RequestRejected as exc:
                if not exc.retryable or remaining(deadline) < RETRY_PAUSE_S:
                    raise
            await asyncio.sleep(RETRY_PAUSE_S)

    async def _wait_connected(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        assert self._mon is not None
        while True:
            wait = 0 if self._state.connected else remaining(deadline)
            if not await self._mon.poll(ms(wait)):
                break
            self._state.update(parse_monitor_message(await self._mon.recv_multipart()))

    async def _lazy_pirate(self, frames: list[bytes], deadline: float) -> list[bytes]:
        while remaining(deadline):
            req = self._new_req(self._ctx)
            try:
                await req.send_multipart(frames)
                if await req.poll(ms(min(self.attempt_timeout, remaining(deadline)))):
                    return await req.recv_multipart()
            finally:
                req.close(linger=0)
            await self._wait_connected(0)
        raise RequestTimeout(f"relay did not answer within {self.submit_timeout:.0f}s")

    async def subscribe(
        self, ticker: str, data_type: str = "tick", *, idle_timeout: float | None = None
    ) -> AsyncIterator[Message]:
        sub = self._ctx.socket(zmq.SUB)
        sub.setsockopt(zmq.LINGER, 0)
        filt = MarketFilter.open(sub, ticker, data_type)
        sub.connect(self.settings.connect("market_data"))
        try:
            while True:
                if not await sub.poll(ms(idle_timeout)):
                    raise RequestTimeout(f"no {filt.topic} message in {idle_timeout}s")
                msg = filt.accept(await sub.recv_multipart())
                if msg is not None:
                    yield msg
        finally:
            sub.close(linger=0)
