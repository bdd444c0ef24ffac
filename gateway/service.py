"""The gateway process: user sessions in, user events out.

Read top to bottom:

1. :meth:`Gateway._main` opens everything: the user directory (PostgreSQL), the symbol
   catalog (Iceberg), the ROUTER for critical events, a SUB on every user container's XPUB,
   a SUB on the relay's market data, and the HTTP + WebSocket server.
2. :meth:`_session` is one browser: sign in with a token, then charts on request; events
   reach it through :class:`~gateway.sessions.Sessions`.
3. :meth:`_informational` is the fast path: a user's first session subscribes
   ``USER:{id}`` on every container, the last one unsubscribes, and each event fans out to
   that user's sessions, browsers and Telegram chats in session
   (:mod:`gateway.telegram_sessions`: ``/start`` and ``/stop`` through ``getUpdates``).
4. :meth:`_critical` is the at-least-once path (:mod:`gateway.critical`).
5. :meth:`_market` forwards candles to charts and reloads symbols on METADATA_UPDATE.

Everything runs on one asyncio loop in one thread; blocking database and Iceberg calls go
to worker threads. A malformed frame or WebSocket message is dropped and counted.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import json
import logging
import threading
import time
import weakref
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from http import HTTPStatus
from importlib import resources
from typing import Any

import zmq
import zmq.asyncio
from google.protobuf.message import DecodeError
from websockets.asyncio.server import Server, ServerConnection, serve
from websockets.datastructures import Headers
from websockets.exceptions import ConnectionClosed
from websockets.http11 import Request, Response

from candlewire import curve
from candlewire.config import PortTaken, Settings
from candlewire.curve import GATEWAY_KEY, Guard, Peer, dial, peer_of
from candlewire.runtime import MetricsServer, bind, binding, run_until_signal
from candlewire.topics import (
    market_data_topic,
    metadata_update_topic,
    ohlc_type,
    subscription_error_topic,
    user_topic,
)
from candlewire.zmqutil import Batches, harden
from gateway.auth import BadToken, check_secret, verify_token
from gateway.channels import Channel
from gateway.channels.email import EmailChannel
from gateway.channels.push import PushChannel
from gateway.channels.telegram import TelegramChannel
from gateway.config import GatewaySettings
from gateway.critical import MAX_ID, CriticalDelivery
from gateway.directory import Directory
from gateway.metrics import GatewayMetrics
from gateway.sessions import (
    SLOW_CLOSE_CODE,
    Session,
    SessionChannel,
    Sessions,
    event_message,
    to_json,
)
from gateway.symbols import SymbolCatalog
from gateway.telegram_sessions import TelegramSessions
from proto import events_pb2 as ev
from proto import market_pb2
from proto import requests_pb2 as rq
from proto.envelope import (
    EnvelopeError,
    OversizedField,
    decode,
    decode_sub,
    decode_subs,
    encode,
    expect,
    unchecked_payload,
)

log = logging.getLogger("candlewire.gateway")

PURGE_EVERY_S = 60.0
ANSWER_DRAIN_S = 5.0  # how long a stopping gateway lets critical events in flight finish
CRITICAL_BATCH = 256  # critical events taken from the ROUTER in one loop turn
INFORMATIONAL_BATCH = 256  # informational events taken from the SUB in one loop turn
MARKET_BATCH = 256  # candles and notices taken from the market-data SUB in one loop turn
SEED_CANDLES = 90  # what the page draws
SEED_READS = 2  # charts' seeds read from Iceberg at once, whatever the sessions
SEED_WAIT_S = 30.0  # a seed waits this long for a read's slot; live updates flow meanwhile
DEPTH_LEVELS = 10  # a side, in the page's depth panel
DEPTH_EVERY_S = 0.25  # the panel is redrawn at most this often


def build_channels(gw: GatewaySettings, sessions: Sessions) -> dict[int, Channel]:
    """Every channel; one without credentials answers SKIPPED, so preferences fall through."""
    timeout = gw.http_timeout_s
    return {
        ev.ACTIVE_SESSION: SessionChannel(ev.ACTIVE_SESSION, sessions),
        ev.WEB: SessionChannel(ev.WEB, sessions),
        ev.TELEGRAM: TelegramChannel(
            gw.telegram_token.get_secret_value(), gw.telegram_api, timeout
        ),
        ev.EMAIL: EmailChannel(
            gw.smtp_host,
            gw.smtp_port,
            gw.smtp_from,
            username=gw.smtp_user,
            password=gw.smtp_password.get_secret_value(),
            starttls=gw.smtp_starttls,
            ca_file=gw.smtp_ca_file,
            timeout_s=timeout,
        ),
        ev.PUSH: PushChannel(gw.vapid_private_key.get_secret_value(), gw.vapid_subject, timeout),
    }


class Gateway:
    def __init__(
        self,
        settings: Settings | None = None,
        gateway: GatewaySettings | None = None,
        *,
        metrics: bool = True,
    ) -> None:
        self.settings = settings or Settings()
        self.gw = gateway or GatewaySettings.load(self.settings)
        check_secret(self.gw.secret.get_secret_value())  # fail at start, not at first sign-in
        self.metrics = GatewayMetrics()
        self.symbols = SymbolCatalog(self.settings)
        self._serve_metrics = metrics
        port = self.settings.port("gateway_http")
        own = {f"http://{h}:{port}" for h in (self.settings.host, "127.0.0.1", "localhost")}
        self._last_seen: dict[str, tuple[int, int]] = {}  # chart topic -> (epoch, seq)
        # The sessions drawing each chart topic, until their cleanup releases it: a candle,
        # an error or a depth panel goes to its own, whatever the number of sessions (each
        # looked at every session before).
        self._charted: dict[str, set[Session]] = {}
        self._depth: dict[str, asyncio.Task] = {}  # charted ticker -> its book subscription
        # The panel message each followed ticker last sent, for a session that charts it
        # later (or again, for another period): a quiet book may not change for minutes.
        self._depth_shown: dict[str, dict[str, Any]] = {}
        # Charts' seeds: one a session (a newer chart cancels its last), SEED_READS read at
        # once; each read holds a worker thread, and a session may chart 20 times a second.
        self._seeding: weakref.WeakKeyDictionary[Session, asyncio.Task[None]] = (
            weakref.WeakKeyDictionary()
        )
        self._seed_slots = asyncio.Semaphore(SEED_READS)
        self._answering: set[asyncio.Task] = set()  # critical events in flight
        self._origins = frozenset(own | set(self.gw.allowed_origins))
        self._thread: threading.Thread | None = None
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self._task_failed: BaseException | None = None  # a main task that ended on an error
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stopping: asyncio.Event | None = None
        self._watching: Counter[str] = Counter()  # user -> browsers and chats (0, 1 or 2)
        self._event_batches: Batches | None = None  # the SUB, once the fast path runs
        self._market_batches: Batches | None = None  # the market-data SUB, once read
        self._reloading: asyncio.Task[None] | None = None  # the symbols' reload
        self._reload_again = False
        self.sessions = Sessions(
            self.gw.session_queue,
            self.gw.max_sessions_per_user,
            on_first=self._watch_user,
            on_last=self._unwatch_user,
            on_slow=self._slow,
        )

    # -- lifecycle -----------------------------------------------------------------------

    def start(self, timeout: float = 30.0) -> Gateway:
        self._thread = threading.Thread(target=self._run, name="gateway", daemon=True)
        self._thread.start()
        if not self._ready.wait(timeout):
            raise TimeoutError("gateway did not start in time")
        if self._error is not None:
            raise self._error
        return self

    def stop(self) -> None:
        if self._thread is None or not self._thread.is_alive():
            return
        if self._loop is not None and self._stopping is not None:
            self._loop.call_soon_threadsafe(self._stopping.set)
        self._thread.join(15)

    def run(self) -> None:
        run_until_signal(
            self._start_process,
            self.stop,
            lambda: self._thread is not None and self._thread.is_alive(),
        )
        if self._error is not None:  # a status a supervisor sees, and restarts on
            raise SystemExit(f"gateway stopped on an error: {self._error!r}")

    def _start_process(self) -> None:
        self.start()
        # What the process made to start lives as long as it does: a full collection need
        # not walk it again (one took 90 ms, a stall of every critical ack). Not in start():
        # a test process starts many gateways, and its garbage must stay collectable.
        gc.freeze()

    def _run(self) -> None:
        self._loop = asyncio.new_event_loop()
        try:
            self._loop.run_until_complete(self._main())
        except BaseException as exc:  # reported to start()
            self._error = exc
            if not isinstance(exc, PortTaken):  # that one is a line of its own, at start()
                log.exception("gateway stopped on an error")
        finally:
            self._ready.set()
            self._loop.close()

    async def _main(self) -> None:
        s, gw = self.settings, self.gw
        self._stopping = asyncio.Event()
        self._seed_slots = asyncio.Semaphore(SEED_READS)  # of this run's loop
        self.directory = Directory(gw.directory_url or s.sql_url())
        await asyncio.to_thread(self.directory.create)
        self.channels = build_channels(gw, self.sessions)
        telegram = self.channels[ev.TELEGRAM]
        assert isinstance(telegram, TelegramChannel)  # build_channels made it
        self.telegram = TelegramSessions(
            telegram,
            self.directory.engine,
            self.metrics,
            on_first=self._watch_user,
            on_last=self._unwatch_user,
            enabled=gw.telegram_sessions,
            poll_s=gw.telegram_poll_s,
            queue=gw.telegram_queue,
        )
        self.critical = CriticalDelivery(
            self.directory,
            self.channels,
            self.sessions,
            self.symbols,
            self.metrics,
            dedup_window_s=gw.dedup_window_s,
            max_retries=gw.max_retries,
            claim_lease_s=gw.claim_lease_s,
        )
        ctx = zmq.asyncio.Context()
        size = s.max_message_bytes
        guard = Guard.start(ctx, s, lambda c, r: self.metrics.refused.labels(c, r).inc())
        self._router = harden(ctx.socket(zmq.ROUTER), max_message_bytes=size)
        curve.serve(self._router, s, "gateway", "critical")
        # The SUB dials the containers, yet serves CURVE: they prove their keys to us.
        self._events = harden(ctx.socket(zmq.SUB), max_message_bytes=size)
        curve.serve(self._events, s, "gateway", "events")
        self._market = harden(ctx.socket(zmq.SUB), max_message_bytes=size)
        dial(self._market, s, "relay", GATEWAY_KEY)
        metrics_server: MetricsServer | None = None
        server: Server | None = None
        tasks: list[asyncio.Task[None]] = []
        try:
            bind(self._router, s, "critical_events")
            for endpoint in gw.container_endpoints(s):
                self._events.connect(endpoint)
            for endpoint in s.relays("market_data"):  # every relay: one may die
                self._market.connect(endpoint)
            self._market.subscribe(metadata_update_topic())
            with binding(s, "gateway_http"):
                server = await serve(
                    self._session,
                    s.bind_host,
                    s.port("gateway_http"),
                    process_request=self._http,
                    max_size=gw.max_ws_message_bytes,
                    max_queue=16,
                    close_timeout=2,
                    # Events are small and many: per-message deflate was a quarter of the
                    # gateway's CPU per informational event, for a few hundred bytes (#35).
                    compression=None,
                )
            if self._serve_metrics:
                metrics_server = MetricsServer(self.metrics.registry, s, "gateway_metrics")
            self._symbols_changed()  # read beside the start: until then no exchange is refused
            tasks = [
                asyncio.create_task(coro, name=coro.__qualname__)
                for coro in (
                    self._critical(),
                    self._informational(),
                    self._markets(),
                    self._retries(),
                    self._purge(),
                    self.telegram.run(),
                )
            ]
            for task in tasks:
                task.add_done_callback(self._task_ended)
            self.metrics.up.set(1)
            log.info(
                "gateway: http %s:%d, critical events on %s",
                s.bind_host,
                s.port("gateway_http"),
                s.bind("critical_events"),
            )
            self._ready.set()
            await self._stopping.wait()
            if self._task_failed is not None:
                raise RuntimeError("a gateway task ended on an error") from self._task_failed
        finally:
            self.metrics.up.set(0)
            tasks += self._depth.values()
            if self._reloading is not None:
                tasks.append(self._reloading)
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            await self._finish_answers()  # before the sessions close: some deliver to them
            if server is not None:
                server.close()
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(server.wait_closed(), 5)
            if metrics_server is not None:
                metrics_server.close()
            for channel in getattr(self, "channels", {}).values():
                with contextlib.suppress(Exception):
                    await channel.close()
            if guard is not None:
                guard.stop()
            ctx.destroy(linger=0)
            self.directory.close()

    def _task_ended(self, task: asyncio.Task[None]) -> None:
        """Each main task runs until the gateway stops; one ended by an error would leave the
        gateway half alive (serving sessions, delivering nothing), so the gateway stops on it
        and its process exits with an error, for its supervisor to restart."""
        if task.cancelled() or task.exception() is None:
            return  # stopping, or nothing to do (Telegram sessions off)
        exc = task.exception()
        log.critical("gateway task %s ended on %r: stopping the gateway", task.get_name(), exc)
        if self._task_failed is None:
            self._task_failed = exc
        if self._stopping is not None:
            self._stopping.set()

    # -- sessions -------------------------------------------------------------------------

    async def _session(self, ws: ServerConnection) -> None:
        signed_in = await self._sign_in(ws)
        if signed_in is None:
            return
        user, batched = signed_in
        session = self.sessions.open(user, ws, batched)
        if session is None:
            await ws.close(1008, "too many sessions for this user")
            return
        self._count_sessions()
        writer: asyncio.Task[None] | None = None
        bucket = TokenBucket(self.gw.ws_messages_per_s, 2 * self.gw.ws_messages_per_s)
        try:
            # The welcome in a frame of its own, ahead of whatever is queued meanwhile.
            await ws.send(to_json({"type": "welcome", "user": user}))
            writer = asyncio.create_task(session.write())
            async for raw in ws:
                if not bucket.take(time.monotonic()):
                    self.metrics.rate_limited.inc()
                    await ws.close(1008, "too many messages")
                    break
                reply = self._command(session, raw)
                if reply is not None:
                    session.offer(reply)
        except ConnectionClosed:
            pass
        finally:
            self.sessions.close(session)
            self._chart(session, None)
            if writer is not None:
                writer.cancel()
            self._count_sessions()

    async def _sign_in(self, ws: ServerConnection) -> tuple[str, bool] | None:
        """The first message must be ``{"op": "auth", "token": ...}``, within the timeout;
        ``"batch": true`` in it asks for queued messages together, a JSON array a frame.
        The user, and whether the session is batched."""
        try:
            raw = await asyncio.wait_for(ws.recv(), self.gw.auth_timeout_s)
            msg = json.loads(raw)
            if not isinstance(msg, dict) or msg.get("op") != "auth":
                raise BadToken('the first message must be {"op": "auth", "token": ...}')
            batch = msg.get("batch", False)
            if not isinstance(batch, bool):
                raise BadToken('"batch" must be true or false')
            user = verify_token(
                self.gw.secret.get_secret_value(),
                str(msg.get("token", "")),
                self.gw.token_max_age_s,
            )
            return user, batch
        # RecursionError: JSON nested past the parser's depth ("[[[[..." well within the
        # message size limit), as malformed as any other.
        except (BadToken, ValueError, RecursionError, TimeoutError) as exc:
            self.metrics.auth_failures.inc()
            reason = str(exc) if isinstance(exc, BadToken) else "sign-in failed"
            with contextlib.suppress(ConnectionClosed):
                await ws.send(json.dumps({"type": "error", "message": reason}))
                await ws.close(1008, reason[:100])
            return None
        except ConnectionClosed:
            return None

    def _command(self, session: Session, raw: str | bytes) -> dict[str, Any] | None:
        try:
            msg = json.loads(raw)
            op = msg.get("op") if isinstance(msg, dict) else None
        except (ValueError, RecursionError):  # not JSON, or nested past the parser's depth
            op = None
        if op == "chart":
            ticker, period = str(msg.get("ticker", "")), msg.get("period", 60)
            period = period if isinstance(period, int) else -1
            problem = self.symbols.check_chart(ticker, period)
            if problem is not None:
                return {"type": "error", "message": problem}
            self._chart(session, market_data_topic(ticker, ohlc_type(period)))
            if (seeding := self._seeding.get(session)) is not None:
                seeding.cancel()  # still waiting for a read, or its rows for a chart left
            self._seeding[session] = asyncio.get_running_loop().create_task(
                self._seed_chart(session, ticker, period)
            )
            # After this reply, which clears the page's panel: the ticker's last depth.
            asyncio.get_running_loop().call_soon(self._offer_depth, session, ticker)
            return {"type": "chart", "ticker": ticker, "period": period}
        if op == "unchart":
            self._chart(session, None)
            return {"type": "chart", "ticker": None}
        if op == "ping":
            return {"type": "pong"}
        self.metrics.dropped.labels("websocket", "bad_command").inc()
        return {"type": "error", "message": "unknown command; use chart, unchart or ping"}

    def _chart(self, session: Session, topic: str | None) -> None:
        """Point a session's chart at a topic. libzmq counts a SUB's duplicate subscriptions
        and tells the relay only of the first and the last, so each session simply
        subscribes and unsubscribes its own."""
        if session.chart == topic:
            return
        if session.chart is not None:
            drawing = self._charted.get(session.chart, set())
            drawing.discard(session)
            if not drawing:
                self._charted.pop(session.chart, None)
                self._last_seen.pop(session.chart, None)
            self._market.unsubscribe(session.chart)
            self._market.unsubscribe(_error_topic(session.chart))
        session.chart = topic
        if topic is not None:
            self._charted.setdefault(topic, set()).add(session)
            self._market.subscribe(_error_topic(topic))
            self._market.subscribe(topic)
        if self._market_batches is not None:
            self._market_batches.recheck()
        self._follow_depth()

    def _drawing(self, chart: Callable[[str], bool]) -> list[Session]:
        """The sessions drawing the charts (by topic) that ``chart`` accepts."""
        return [
            session
            for topic, drawing in self._charted.items()
            if chart(topic)
            for session in drawing
        ]

    def _follow_depth(self) -> None:
        """One book subscription per charted ticker, for the page's depth panel: started
        with the first chart of the ticker, cancelled with the last."""
        charted = {_chart_ticker(topic) for topic in self._charted}
        for ticker in charted - self._depth.keys():
            self._depth[ticker] = asyncio.get_running_loop().create_task(self._book(ticker))
        for ticker in self._depth.keys() - charted:
            self._depth.pop(ticker).cancel()
            self._depth_shown.pop(ticker, None)

    def _offer_depth(self, session: Session, ticker: str) -> None:
        """The last depth the ticker's panel showed, as it is when this runs (a newer book
        may have gone out since the chart command), if the session still charts it."""
        shown = self._depth_shown.get(ticker)
        if shown is not None and session.chart and _chart_ticker(session.chart) == ticker:
            session.offer(shown)

    async def _book(self, ticker: str) -> None:
        """A ticker's L2 book through the client's own subscription (a journal replay first,
        so it starts from a snapshot, and the same seam rules), to the sessions charting
        it, at most every DEPTH_EVERY_S: a book that comes sooner is shown when that time is
        up, as it is then, so the panel never keeps a book older than the last update. A
        venue without books, or none reachable: the panel says so once and the chart goes
        on."""
        from candlewire.client import AsyncClient  # the client: on a chart's first use

        def watchers() -> list[Session]:
            return self._drawing(lambda chart: _chart_ticker(chart) == ticker)

        loop = asyncio.get_running_loop()
        shown, due, latest = 0.0, None, None

        me = asyncio.current_task()

        def show() -> None:
            nonlocal shown, due
            if due is not None:
                due.cancel()
            shown, due = time.monotonic(), None
            if self._depth.get(ticker) is not me:
                return  # no longer followed: its cancellation is on its way
            self._depth_shown[ticker] = message = _depth_message(latest)
            self.sessions.offer_to(watchers(), message)

        try:
            async with AsyncClient(self.settings) as client:
                async for book in client.subscribe(ticker, "book", depth=DEPTH_LEVELS):
                    latest = book
                    wait = shown + DEPTH_EVERY_S - time.monotonic()
                    if wait <= 0:
                        show()
                    elif due is None:  # the book as it is then: the last of a burst shows
                        due = loop.call_later(wait, show)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            log.info("no depth for %s: %s", ticker, exc)
            self._depth_shown[ticker] = failed = {
                "type": "depth",
                "ticker": ticker,
                "error": str(exc),
            }
            self.sessions.offer_to(watchers(), failed)
        finally:
            if due is not None:  # the subscription is over: nothing more to show
                due.cancel()

    async def _seed_chart(self, session: Session, ticker: str, period: int) -> None:
        """The chart's recent past from the Iceberg ``ohlc`` table, so it does not start
        empty. Marked ``seed``: the page never lets one replace a live update."""
        from candlewire.history import read_history  # pyiceberg: on a chart's first use

        topic, now = session.chart, int(time.time() * 1000)
        start = now - period * 1000 * SEED_CANDLES
        try:  # cancelled here (a newer chart): nothing was read
            await asyncio.wait_for(self._seed_slots.acquire(), SEED_WAIT_S)
        except TimeoutError:  # reads that do not end (the catalog or storage away)
            log.warning(
                "no history to seed a chart of %s: no read free in %.0f s", ticker, SEED_WAIT_S
            )
            return
        # A thread's read runs to its end even once this task is cancelled: its slot is
        # given back when the read ends, so SEED_READS bounds the threads, not the tasks.
        reading = asyncio.ensure_future(
            asyncio.to_thread(
                read_history, self.settings, ticker, period, start, now + period * 1000
            )
        )
        reading.add_done_callback(self._seed_read)
        try:
            rows = await asyncio.shield(reading)
        except Exception as exc:  # no table yet, catalog away: live updates still flow
            log.warning("no history to seed a chart of %s: %s", ticker, exc)
            return
        if session.chart != topic or session.closed:
            return  # the session moved on meanwhile
        for row in rows.to_pylist():
            session.offer(_seed_candle(row))

    def _seed_read(self, reading: asyncio.Future[Any]) -> None:
        """A seed's read has ended: its slot goes back. The read's error is taken here too,
        for a chart left meanwhile, whose task no longer waits for it."""
        self._seed_slots.release()
        if not reading.cancelled():
            reading.exception()

    def _watch_user(self, user_id: str) -> None:
        """Called on a user's first browser session and on their first Telegram chat:
        ``USER:{id}`` is subscribed once for both, since containers count subscriptions as
        gateways watching (libzmq passes on every subscribe, but only the last unsubscribe)."""
        self._watching[user_id] += 1
        if self._watching[user_id] == 1:
            self._events.subscribe(user_topic(user_id))
            self._recheck_events()

    def _unwatch_user(self, user_id: str) -> None:
        self._watching[user_id] -= 1
        if self._watching[user_id] <= 0:
            del self._watching[user_id]
            self._events.unsubscribe(user_topic(user_id))
            self._recheck_events()

    def _recheck_events(self) -> None:
        if self._event_batches is not None:
            self._event_batches.recheck()

    def _slow(self, session: Session) -> None:
        self.metrics.slow_disconnects.inc()
        log.warning(
            "closing a session of %s: it fell %d messages behind",
            session.user_id,
            self.gw.session_queue,
        )
        # Closing ends the session's read loop, whose cleanup releases its chart and recounts.
        asyncio.get_running_loop().create_task(session.ws.close(SLOW_CLOSE_CODE, "too slow"))

    def _count_sessions(self) -> None:
        self.metrics.sessions.set(len(self.sessions.all()))
        self.metrics.users.set(self.sessions.users())

    # -- the fast path ----------------------------------------------------------------------

    async def _informational(self) -> None:
        """Every event queued on the SUB is taken in one loop turn (:class:`Batches`): a
        receive through pyzmq's asyncio socket made a future per event. After a short batch
        the loop waits ``events_coalesce_ms`` before the next, so that events coming one at
        a time share a turn: at 10,000 events a second, one a turn cost the gateway 72 µs of
        CPU an event, 42 with the default 1 ms (a flood's batches are full and never wait)."""
        self._event_batches = events = Batches(self._events, peers=self.settings.security.curve)
        counted = self.metrics.informational
        sent_to, no_session = counted.labels("sent"), counted.labels("no_session")
        taken, hold_s = self.metrics.informational_batch, self.gw.events_coalesce_ms / 1000
        # Bound once: an attribute lookup an event is a few percent of this loop's time.
        render, send, deliver = self.symbols.render, self.sessions.send, self.telegram.deliver
        while True:
            batch, delivered = await events.recv(INFORMATIONAL_BATCH), 0
            taken.observe(len(batch))
            decoded = decode_subs([frames for frames, _ in batch], ev.UserEvent)
            for (frames, last), event in zip(batch, decoded, strict=True):
                # One event that cannot be handled is dropped and counted: this task serves
                # every user, and it ending would stop the fast path for all of them. (A try
                # costs nothing until something raises.)
                try:
                    if event is None:  # not one the batch's parse took: alone, checked
                        event = expect(decode_sub(frames)[1], ev.UserEvent)
                    # ``last`` is None without CURVE: no sender to check
                    if last is not None and not self._may_send(peer_of(last), event, "events"):
                        continue
                    rendered, user = render(event), event.user_id
                    sent = send(user, event_message(event, rendered, "informational")) + deliver(
                        user, rendered
                    )  # neither waits: Telegram's HTTP is another task's
                except EnvelopeError as exc:
                    self.metrics.dropped.labels("user_events", exc.reason).inc()
                    continue
                except RecursionError:  # a payload the parser took, nested past the encoder
                    self.metrics.dropped.labels("user_events", "too_deep").inc()
                    continue
                except Exception:  # a bug: loud, yet only this event is lost
                    self.metrics.dropped.labels("user_events", "error").inc()
                    log.exception("dropped an informational event that could not be delivered")
                    continue
                if sent:
                    delivered += 1
                else:
                    no_session.inc()
            if delivered:  # once a batch: the counter takes a lock each time
                sent_to.inc(delivered)
            if hold_s and len(batch) < INFORMATIONAL_BATCH:
                await asyncio.sleep(hold_s)

    # -- the critical path ------------------------------------------------------------------

    async def _critical(self) -> None:
        """Every event queued on the ROUTER is taken in one loop turn and answered as one
        batch, so the events in flight share their database round trips
        (:class:`~gateway.critical.Batcher`). At most ``max_inflight`` are answered at once."""
        slots = asyncio.Semaphore(self.gw.max_inflight)
        self._acks = router = Batches(self._router, peers=self.settings.security.curve)
        while True:
            batch: list[tuple[bytes, ev.UserEvent]] = []
            for frames, last in await router.recv(CRITICAL_BATCH):
                peer = _peer(last)
                identity, body = frames[0], frames[1:]
                if body and not body[0]:
                    body = body[1:]  # DEALER's empty delimiter
                try:
                    event = expect(decode(body), ev.UserEvent)
                except EnvelopeError as exc:
                    self.metrics.dropped.labels("critical_events", exc.reason).inc()
                    refusal = _refusal(body, exc) if isinstance(exc, OversizedField) else None
                    if refusal is not None:  # final: its sender stops sending it again
                        router.send([identity, b"", *encode(refusal)])
                    continue
                if not self._may_send(peer, event, "critical"):
                    ack = ev.EventAck(
                        event_id=event.event_id,
                        status=ev.ERROR,
                        error_message=f"this key may send events of user {peer.user!r} only",
                    )
                    router.send([identity, b"", *encode(ack)])
                    continue
                if slots.locked() and batch:
                    self._start_answering(batch, slots)
                    batch = []
                await slots.acquire()
                batch.append((identity, event))
            if batch:
                self._start_answering(batch, slots)

    def _start_answering(
        self, batch: list[tuple[bytes, ev.UserEvent]], slots: asyncio.Semaphore
    ) -> None:
        """Answer a batch in a task; each event's slot is freed at its answer (a slow channel
        holds one slot, not the batch's), and what was never answered at the task's end."""
        held = [True] * len(batch)

        def reply(i: int, answer: ev.EventAck | BaseException | None) -> None:
            identity, event = batch[i]
            if held[i]:
                held[i] = False
                slots.release()
            if isinstance(answer, BaseException):  # no ack: the container resends
                log.error(
                    "event %s not handled; the container will resend",
                    event.event_id,
                    exc_info=answer,
                )
            elif answer is not None:  # None: another gateway delivers it; the container resends
                self._acks.send([identity, b"", *encode(answer)])  # with this turn's others

        def release(_task: asyncio.Task[None]) -> None:
            for i, still in enumerate(held):
                if still:
                    held[i] = False
                    slots.release()

        answering = self.critical.handle([event for _, event in batch], reply)
        task: asyncio.Task[None] = asyncio.create_task(answering)
        self._answering.add(task)
        task.add_done_callback(self._answering.discard)
        task.add_done_callback(release)

    async def _finish_answers(self) -> None:
        """At stop, once nothing more is read: the critical events in flight get
        ``ANSWER_DRAIN_S`` to be answered (a channel call cut short may have delivered, and
        another gateway would deliver it again); the rest are cancelled. Then this gateway's
        claims on events it has not answered are given up, so that their resends need not
        wait out the lease."""
        if self._answering:
            await asyncio.wait(set(self._answering), timeout=ANSWER_DRAIN_S)
        for task in self._answering:
            task.cancel()
        await asyncio.gather(*self._answering, return_exceptions=True)
        if hasattr(self, "critical"):
            with contextlib.suppress(Exception):  # else they lapse with their lease
                await asyncio.wait_for(asyncio.to_thread(self.critical.release), 5)

    def _may_send(self, peer: Peer | None, event: ev.UserEvent, channel: str) -> bool:
        """A container's key speaks for its own user only (None: CURVE is off)."""
        if peer is None or peer.role != "container" or peer.user == event.user_id:
            return True
        self.metrics.refused.labels(channel, "other_user").inc()
        log.warning("refused %s's event for user %s", peer.name, event.user_id)
        return False

    async def _retries(self) -> None:
        while True:
            try:
                while await self.critical.retry_due():
                    pass
            except Exception:  # the database may be away; try again later
                log.exception("retrying queued events failed")
            await asyncio.sleep(self.gw.retry_poll_s)

    async def _purge(self) -> None:
        while True:
            await asyncio.sleep(PURGE_EVERY_S)
            with contextlib.suppress(Exception):
                await asyncio.to_thread(self.directory.purge, self.gw.dedup_window_s)

    # -- market data and symbol metadata ----------------------------------------------------

    async def _markets(self) -> None:
        """What is queued on the market-data SUB is taken in one loop turn (:class:`Batches`),
        not a future a message; each candle goes to the sessions drawing its chart."""
        self._market_batches = market = Batches(self._market)
        while True:
            for frames, _ in await market.recv(MARKET_BATCH):
                try:
                    self._market_message(frames)
                except EnvelopeError as exc:
                    self.metrics.dropped.labels("market_data", exc.reason).inc()

    def _market_message(self, frames: list[bytes]) -> None:
        topic, msg = decode_sub(frames)
        if isinstance(msg, market_pb2.SymbolMetadataUpdated):
            self._symbols_changed()
        elif isinstance(msg, market_pb2.OHLC):
            if self._fresh(topic, msg):
                self.sessions.offer_to(list(self._charted.get(topic, ())), _candle(msg))
                self.metrics.candles.inc()
        elif isinstance(msg, rq.SubscriptionError):
            watchers = self._drawing(lambda chart: _error_topic(chart) == topic)
            self.sessions.offer_to(watchers, {"type": "error", "message": msg.error_message})

    def _fresh(self, topic: str, msg: market_pb2.OHLC) -> bool:
        """Through several relays each candle comes once per relay; its stream position
        drops the copies (an unsequenced one passes: a repeated candle only redraws)."""
        if not msg.HasField("stream"):
            return True
        pos, last = msg.stream, self._last_seen.get(topic)
        if last is not None and last[0] == pos.epoch and pos.seq <= last[1]:
            return False
        self._last_seen[topic] = (pos.epoch, pos.seq)
        return True

    def _symbols_changed(self) -> None:
        """Reload the symbols beside the market loop, whose candles must not wait a second
        for it; notes that come during a reload make one more, not one each."""
        if self._reloading is not None and not self._reloading.done():
            self._reload_again = True
            return
        self._reloading = asyncio.create_task(self._reload_symbols())

    async def _reload_symbols(self) -> None:
        while True:
            self._reload_again = False
            await asyncio.to_thread(self.symbols.reload)
            self.metrics.metadata_reloads.inc()
            self.metrics.symbols.set(len(self.symbols))
            if not self._reload_again:
                return

    # -- plain HTTP: the live page ----------------------------------------------------------

    def _http(self, connection: ServerConnection, request: Request) -> Response | None:
        path = request.path.split("?", 1)[0]
        if path == "/ws":
            origin = request.headers.get("Origin")
            if origin is not None and origin not in self._origins:
                # Another site's page, in a browser that carries the user's token.
                self.metrics.origin_refused.inc()
                log.warning("refused a session opened by a page from %s", origin)
                return connection.respond(HTTPStatus.FORBIDDEN, "origin not allowed\n")
            return None
        if path == "/healthz":
            return connection.respond(HTTPStatus.OK, "ok\n")
        if path in ("/", "/index.html"):
            page = resources.files("gateway").joinpath("static/index.html").read_text()
            return _typed(connection.respond(HTTPStatus.OK, page), "text/html; charset=utf-8")
        if path in SCRIPTS:
            script = resources.files("gateway").joinpath("static" + path)
            if not script.is_file():
                missing = f"{path} is built by `make install` (npm ci in gateway/web)\n"
                return connection.respond(HTTPStatus.NOT_FOUND, missing)
            response = connection.respond(HTTPStatus.OK, script.read_text())
            # The library changes only with its pinned version; our own script with a release.
            cache = "max-age=86400" if path.startswith("/vendor/") else "no-cache"
            return _typed(response, "text/javascript; charset=utf-8", cache)
        return connection.respond(HTTPStatus.NOT_FOUND, "not found\n")


def _refusal(body: list[bytes], exc: OversizedField) -> ev.EventAck | None:
    """An event too large to take, answered ERROR, so that a journalled sender does not send
    it again for ever; None when not even its id can be read."""
    try:
        event_id = ev.UserEvent.FromString(unchecked_payload(body, ev.UserEvent)).event_id
    except (EnvelopeError, DecodeError):
        return None
    if not event_id or len(event_id) > MAX_ID:
        return None
    return ev.EventAck(event_id=event_id, status=ev.ERROR, error_message=str(exc))


def _peer(last: zmq.Frame | None) -> Peer | None:
    """Who sent a message, from its last frame as received (kept only with CURVE on)."""
    return None if last is None else peer_of(last)


def _typed(response: Response, content_type: str, cache: str = "no-store") -> Response:
    headers = Headers(
        (k, v) for k, v in response.headers.raw_items() if k.lower() != "content-type"
    )
    headers["Content-Type"] = content_type
    headers["Cache-Control"] = cache
    headers["Content-Security-Policy"] = "default-src 'self' 'unsafe-inline'; connect-src 'self'"
    return Response(response.status_code, response.reason_phrase, headers, response.body)


@dataclass
class TokenBucket:
    """``rate`` a second on average, ``burst`` at once."""

    rate: float
    burst: float
    tokens: float = -1.0
    at: float = 0.0

    def take(self, now: float) -> bool:
        if self.tokens < 0:
            self.tokens, self.at = self.burst, now
        self.tokens = min(self.burst, self.tokens + (now - self.at) * self.rate)
        self.at = now
        if self.tokens < 1:
            return False
        self.tokens -= 1
        return True


# The page's scripts, as served from gateway/static: the library `make install` bundles
# (gateway/web's lockfile) and our chart (candles.js, which `candlewire chart` inlines too).
SCRIPTS = frozenset({"/vendor/lightweight-charts.js", "/candles.js"})


def _chart_ticker(chart_topic: str) -> str:
    return chart_topic.split("|", 1)[0]


def _error_topic(chart_topic: str) -> str:
    return subscription_error_topic(_chart_ticker(chart_topic))


def _depth_message(book: Any) -> dict[str, Any]:
    """A book for the page: its best levels a side as decimal text, the venue's number."""
    from candlewire.market import plain

    return {
        "type": "depth",
        "ticker": book.ticker,
        "seq": book.seq,
        "t": book.time_ns // 1_000_000,
        "bids": [[plain(p), plain(q)] for p, q in book.bids()],
        "asks": [[plain(p), plain(q)] for p, q in book.asks()],
    }


def _seed_candle(row: dict[str, Any]) -> dict[str, Any]:
    from candlewire.market import plain

    return {
        "type": "candle",
        "seed": True,
        "ticker": row["ticker"],
        "period": row["period_s"],
        "t": int(row["open_time"].timestamp() * 1000),
        "o": plain(row["open"]),
        "h": plain(row["high"]),
        "l": plain(row["low"]),
        "c": plain(row["close"]),
        "v": plain(row["volume"]),
        "closed": row["closed"],  # as the stream job stored it, past the feed's watermark
    }


def _candle(c: market_pb2.OHLC) -> dict[str, Any]:
    return {
        "type": "candle",
        "ticker": c.ticker,
        "period": c.period_s,
        "t": c.open_time_ms,
        "o": c.open,
        "h": c.high,
        "l": c.low,
        "c": c.close,
        "v": c.volume,
        "closed": c.closed,
    }
