"""The relay's sockets and its two loops.

- ``client_requests`` (ROUTER): a Python loop validates each request and answers at once;
  accepted work goes out on ``work_queue`` (PUB) under the ``{EXCHANGE}:`` topic. Trusted
  components may also send DataRequest (realtime, metadata) and IngestorControl here; the
  relay forwards them to ``work_queue`` or ``control`` unchanged.
- ``market_data`` (XPUB) ← ``stream_pub``, ``stream_live`` and ``publisher_ingress`` (XSUB): forwarded by
  libzmq's steerable proxy in its own thread, with no Python per message.
- With CURVE on (:mod:`candlewire.curve`), every socket is a CURVE server and each peer's
  role is checked per message (:mod:`relay.policy`). The market-data XPUB then runs in
  manual mode, in a Python loop instead of libzmq's proxy, so that each subscription is
  applied only if its sender may hear that topic.
- A watcher XPUB connected to that XSUB over inproc sees every topic's first subscription
  and last unsubscription (never data), so the relay can tell subscribers of a ticker whose
  exchange has no live ingestor, on the ticker's error topic.
- The same watcher tells when a request's notification topic is subscribed upstream. Work
  waits for that (at most ``NOTIFY_HOLD_S``): the client subscribes before it submits, but on
  another connection, and under load the request could overtake the subscription and its
  notification be published to nobody.
- Publishers are dialled from the static list and, with ``publisher_names``, found by DNS
  (:mod:`relay.discovery`): a lookup thread hands what changed to the proxy thread, which
  owns the XSUB, through the steering socket (libzmq's proxy returns on TERMINATE, takes the
  change and re-enters; messages wait in the sockets meanwhile).

Nothing is remembered between messages beyond that bounded wait, so a relay can be
restarted, or several run.
"""

from __future__ import annotations

import contextlib
import logging
import queue
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

import zmq
from google.protobuf.message import Message

from candlewire.config import PortTaken, Settings
from candlewire.curve import Guard, Peer, peer_of, peer_reader, serve, user_id_of
from candlewire.demand import ERROR_REPEAT_S, Demand, subscription_error
from candlewire.runtime import MetricsServer, bind, run_until_signal
from candlewire.topics import (
    TopicError,
    check_request_id,
    demanded_data,
    notification_prefixes,
    parse_ticker,
    response_topic,
    trigger_work_topic,
    work_prefix,
)
from candlewire.triggers import TriggerRejected, check_owner, parse_trigger
from candlewire.zmqutil import HWM, NOBLOCK, harden, recv_message, subscription, subscriptions
from proto import cep_pb2 as cep
from proto import requests_pb2 as rq
from proto.envelope import (
    EnvelopeError,
    UnexpectedMessage,
    UnknownMessageType,
    UnsupportedVersion,
    decode,
    encode,
    encode_topic,
    split_route,
)
from relay.discovery import Discovery, Resolver, parse_name, resolve
from relay.metrics import RelayMetrics
from relay.policy import Upstream, may_publish, may_request, may_subscribe
from relay.validation import Rejected, validate

log = logging.getLogger("candlewire.relay")

_REJECT_FOR_ENVELOPE: dict[type[EnvelopeError], int] = {
    UnsupportedVersion: rq.UNSUPPORTED_VERSION,
    UnknownMessageType: rq.UNEXPECTED_TYPE,
    UnexpectedMessage: rq.UNEXPECTED_TYPE,
}
# Ingestors reconnect to a restarted relay within about a second; only a ticker left
# unserved for longer is reported.
UNSERVED_AFTER_S = 2.0
UNSERVED_SCAN_S = 0.25  # how often the watched tickers are checked for a serving ingestor
STEER_TIMEOUT_MS = 2_000  # how long stop() waits for the proxy to take TERMINATE
FINISH_BEGUN_ROUNDS = 64  # forwards before new dials, at most: a stream may never pause
# How long accepted work waits for its notification topic's subscription. A client that
# subscribes through another relay, or not at all, is only delayed this much.
NOTIFY_HOLD_S = 1.0
MAX_HELD = 10_000  # beyond this, work goes out at once rather than queue without bound
MAX_LISTENED = 1_000_000  # notification topics remembered; beyond, requests just wait


@dataclass(frozen=True)
class _Held:
    due: float
    topic: str  # the notification topic it waits for
    work_topic: str
    work: Message


class Relay:
    """Bind everything in :meth:`start`; serve until :meth:`stop` or a signal."""

    def __init__(
        self,
        settings: Settings | None = None,
        *,
        metrics: bool = True,
        resolver: Resolver = resolve,
    ) -> None:
        self.settings = settings or Settings()
        s = self.settings
        publisher_ports = (s.port("stream_pub"), s.port("stream_live"))
        self._discovery = Discovery(
            [parse_name(n, publisher_ports) for n in s.publisher_names], resolver
        )
        # (connect, endpoint) pairs for the proxy thread, which alone touches the XSUB.
        self._dial: queue.SimpleQueue[tuple[bool, str]] = queue.SimpleQueue()
        self._steer_lock = threading.Lock()
        self.metrics = RelayMetrics()
        self._serve_metrics = metrics
        # Two I/O threads: with CURVE, each message is encrypted once per subscriber there,
        # and one thread was the fanout's limit (bench.relay --curve: 0.45-0.49 -> 0.51-0.53).
        self._ctx = zmq.Context(io_threads=2)
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._http: MetricsServer | None = None
        self._guard: Guard | None = None

    # -- lifecycle -------------------------------------------------------------------------

    def start(self) -> Relay:
        s = self.settings
        size = s.max_message_bytes
        # The ZAP handler first: a CURVE socket without one would admit any key.
        self._guard = Guard.start(self._ctx, s, self._count_refused)

        def bound(kind: int, channel: str, hwm: int = HWM) -> zmq.Socket:
            sock = harden(self._ctx.socket(kind), max_message_bytes=size, hwm=hwm)
            return serve(sock, s, "relay", channel)

        self._router = bound(zmq.ROUTER, "requests")
        # XPUB, not PUB: libzmq then tells us which exchange prefixes have a live ingestor
        # (first subscribe / last unsubscribe), state that rebuilds itself after a restart.
        self._work = bound(zmq.XPUB, "work")
        self._served: set[str] = set()
        # XPUB only so that what subscribers send up the wrong way is read and counted.
        self._control = bound(zmq.XPUB, "control")
        self._xpub = bound(zmq.XPUB, "market", self.settings.market_data_hwm)
        if s.security.curve:
            self._xpub.setsockopt(zmq.XPUB_MANUAL, 1)
        # Serves its dialled publishers too: they prove publisher keys to the relay.
        self._xsub = bound(zmq.XSUB, "ingress")
        self._watch = harden(self._ctx.socket(zmq.XPUB), max_message_bytes=size)
        self._watched = Demand(grace_s=None, accepts=demanded_data)
        self._unserved: dict[str, float] = {}  # ticker -> when next to report it
        self._next_unserved_scan = 0.0  # monotonic
        self._listened: set[str] = set()  # notification topics subscribed through this relay
        self._held: deque[_Held] = deque()
        self._steer = self._ctx.socket(zmq.PAIR)
        self._steer.setsockopt(zmq.SNDTIMEO, STEER_TIMEOUT_MS)
        steer_addr = f"inproc://relay-steer-{id(self)}"
        self._steer.bind(steer_addr)
        proxy_steer = self._ctx.socket(zmq.PAIR)
        proxy_steer.connect(steer_addr)
        try:
            bind(self._router, s, "client_requests")
            bind(self._work, s, "work_queue")
            bind(self._control, s, "control")
            bind(self._xpub, s, "market_data")
            bind(self._xsub, s, "publisher_ingress")
            self._xsub.bind(f"inproc://relay-watch-{id(self)}")
            self._watch.connect(f"inproc://relay-watch-{id(self)}")
            if self._serve_metrics:
                self._http = MetricsServer(self.metrics.registry, s, "relay_metrics")
        except PortTaken:  # names the port and its setting
            proxy_steer.close(linger=0)
            self._close_all()
            raise
        except zmq.ZMQError as exc:
            proxy_steer.close(linger=0)
            self._close_all()
            raise OSError(f"relay cannot bind its ports ({exc})") from exc
        for endpoint in [s.connect("stream_pub"), s.connect("stream_live"), *s.extra_publishers]:
            self._xsub.connect(endpoint)
        if s.publisher_names:
            self._xsub.setsockopt(zmq.IPV6, 1)  # a name may resolve to IPv6 addresses
            self._rediscover()  # the first lookup before serving, on this thread
            self._take_dials()
        proxy = threading.Thread(
            target=self._proxy, args=(proxy_steer,), name="relay-proxy", daemon=True
        )
        loop = threading.Thread(target=self._serve, name="relay-requests", daemon=True)
        self._threads = [proxy, loop]
        if s.publisher_names:
            self._threads.append(
                threading.Thread(target=self._discover, name="relay-discovery", daemon=True)
            )
        for t in self._threads:
            t.start()
        self.metrics.up.set(1)
        log.info(
            "relay serving: requests %s, market data %s",
            s.bind("client_requests"),
            s.bind("market_data"),
        )
        return self

    def stop(self, timeout: float = 5.0) -> None:
        if self._stop.is_set():
            return
        self._stop.set()
        try:
            with self._steer_lock:
                self._steer.send(b"TERMINATE")
        except zmq.Again:
            # The proxy is stuck inside libzmq: leave its sockets to the process exit rather
            # than hang here or close them under a running proxy.
            log.error("relay proxy did not take TERMINATE within %.1fs", STEER_TIMEOUT_MS / 1e3)
            for t in self._threads[1:]:
                t.join(timeout)
            self.metrics.up.set(0)
            return
        for t in self._threads:
            t.join(timeout)
        self._close_all()
        self.metrics.up.set(0)

    def run(self) -> None:
        """Serve in the foreground until SIGINT or SIGTERM."""
        run_until_signal(self.start, self.stop)

    def __enter__(self) -> Relay:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _close_all(self) -> None:
        if self._http is not None:
            self._http.close()
            self._http = None
        for name in ("_router", "_work", "_control", "_xpub", "_xsub", "_watch", "_steer"):
            sock = getattr(self, name, None)
            if sock is not None:
                sock.close(linger=200)
        if self._guard is not None:
            self._guard.stop()
            self._guard = None
        self._ctx.destroy(linger=200)

    def _not_subscription(self, endpoint: str) -> None:
        self.metrics.dropped.labels(endpoint, "not_subscription").inc()

    def _count_refused(self, channel: str, reason: str) -> None:
        self.metrics.refused.labels(channel, reason).inc()

    # -- market data: libzmq forwards, Python only steers --------------------------------

    def _proxy(self, steer: zmq.Socket) -> None:
        """Forward until stopped; a TERMINATE that is no stop means new publishers to dial."""
        try:
            while True:
                if self.settings.security.curve:
                    self._guarded_proxy(steer)
                else:
                    zmq.proxy_steerable(self._xsub, self._xpub, None, steer)
                    if not self._stop.is_set():
                        self._finish_begun(self._forward_one)
                if self._stop.is_set():
                    return
                self._take_dials()
        except zmq.ContextTerminated:
            pass
        finally:
            steer.close(linger=0)

    # -- publishers found by DNS ---------------------------------------------------------

    def _discover(self) -> None:
        """Re-resolve the publisher names; wake the proxy thread when something changed."""
        while not self._stop.wait(self.settings.discovery_interval_s):
            if self._rediscover():
                with self._steer_lock:
                    if self._stop.is_set():
                        return
                    self._steer.send(b"TERMINATE")

    def _rediscover(self) -> bool:
        failed = self._discovery.failures
        added, removed = self._discovery.refresh()
        self.metrics.discovery_failures.inc(self._discovery.failures - failed)
        for endpoint in sorted(added):
            self._dial.put((True, endpoint))
        for endpoint in sorted(removed):
            self._dial.put((False, endpoint))
        if added or removed:
            log.info("publishers found by DNS: +%s -%s", sorted(added), sorted(removed))
        return bool(added or removed)

    def _finish_begun(self, forward: Callable[[], None]) -> None:
        """Forward what XSUB has begun before a publisher is disconnected.

        The poll that last woke the proxy may have fetched the first frame of a message
        into XSUB. If that message's publisher is then disconnected, reading its next frame
        aborts the process inside libzmq (``fq.cpp``: ``!_more``; zeromq/libzmq#2163). A poll
        that finds nothing fetched nothing, and a whole message read leaves nothing begun,
        so a stream that never pauses ends this loop too.
        """
        for _ in range(FINISH_BEGUN_ROUNDS):
            if not self._xsub.poll(0):
                return
            forward()

    def _forward_one(self) -> None:
        """One whole waiting message from XSUB to XPUB, as the plain proxy forwards it."""
        try:
            frames = self._xsub.recv_multipart(zmq.NOBLOCK, copy=False)
        except zmq.Again:
            return
        self._xpub.send_multipart(frames)

    def _take_dials(self) -> None:
        while True:
            try:
                connect, endpoint = self._dial.get_nowait()
            except queue.Empty:
                break
            if connect:
                self._xsub.connect(endpoint)
            else:  # never connected (a failed connect) or already gone: nothing to undo
                with contextlib.suppress(zmq.ZMQError):
                    self._xsub.disconnect(endpoint)
        self.metrics.publishers.set(len(self._discovery.current))

    def _guarded_proxy(self, steer: zmq.Socket) -> None:
        """The proxy with CURVE on: data checked by sender, subscriptions by subscriber."""
        upstream = Upstream()
        publishers: dict[str, Peer | None] = {}  # User-Id -> peer, parsed once
        poller = zmq.Poller()
        for sock in (self._xsub, self._xpub, steer):
            poller.register(sock, zmq.POLLIN)
        while True:
            ready = dict(poller.poll())
            if steer in ready and steer.recv() == b"TERMINATE":
                if not self._stop.is_set():  # publishers to dial
                    self._finish_begun(lambda: self._forward_data(publishers))
                return
            if self._xsub in ready:
                self._forward_data(publishers)
            if self._xpub in ready:
                for _ in range(1024):
                    try:
                        frame = self._xpub.recv(zmq.NOBLOCK, copy=False)
                    except zmq.Again:
                        break
                    self._apply(upstream, peer_of(frame), frame.bytes)

    def _forward_data(self, peers: dict[str, Peer | None]) -> None:
        """Up to 1024 waiting messages to subscribers, each checked by its sender's key.

        Only the first frame is received as a libzmq message, for its ZAP User-Id; the rest
        are plain copies (market data is ~100 bytes), and nothing is looked up twice: this
        loop runs once per message and is what CURVE mode costs beyond the crypto.
        """
        recv, send, more = self._xsub.recv, self._xpub.send, self._xsub.get
        nonblock, sndmore, rcvmore = zmq.NOBLOCK, zmq.SNDMORE, zmq.RCVMORE
        for _ in range(1024):
            try:
                first = recv(nonblock, copy=False)
            except zmq.Again:
                return
            frames = [first.bytes]
            while more(rcvmore):
                frames.append(recv())
            user_id = user_id_of(first)  # "": the relay's own inproc watcher
            try:
                peer = peers[user_id]
            except KeyError:
                peer = peers[user_id] = Peer.parse(user_id) if user_id else None
            if peer is None or peer.role == "publisher" or may_publish(peer, frames[0]):
                last = frames.pop()
                for frame in frames:
                    send(frame, sndmore)
                send(last)
            else:
                self.metrics.refused.labels("ingress", "not_publisher").inc()

    def _apply(self, upstream: Upstream, peer: Peer | None, msg: bytes) -> None:
        """One (un)subscription from a client of the manual-mode XPUB."""
        sub = subscription(msg)
        if sub is None:
            self._not_subscription("market_data")
            return
        subscribed, topic = sub
        if subscribed:
            if not may_subscribe(peer, topic):
                upstream.refuse(topic)
                self.metrics.refused.labels("market", "foreign_topic").inc()
                return
            self._xpub.setsockopt(zmq.SUBSCRIBE, msg[1:])
            if upstream.subscribe(peer, topic):
                self._xsub.send(msg)
        else:
            self._xpub.setsockopt(zmq.UNSUBSCRIBE, msg[1:])
            if upstream.unsubscribe(peer, topic):
                self._xsub.send(msg)

    # -- client requests ---------------------------------------------------------------------

    def _serve(self) -> None:
        poller = zmq.Poller()
        poller.register(self._router, zmq.POLLIN)
        poller.register(self._work, zmq.POLLIN)
        poller.register(self._watch, zmq.POLLIN)
        poller.register(self._control, zmq.POLLIN)
        peer = peer_reader(self.settings)
        self._up_since = time.monotonic()
        while not self._stop.is_set():
            events = poller.poll(100)
            self._track_subscribers()
            self._release_held(time.monotonic())
            self._report_unserved(time.monotonic())
            if not events:
                continue
            self._track_ingestors()
            for _ in subscriptions(
                self._control, on_other=lambda: self._not_subscription("control")
            ):
                pass  # the control channel's subscriptions: the XPUB applies them
            for _ in range(1024):
                try:
                    frames = recv_message(self._router, NOBLOCK)
                except zmq.Again:
                    break
                self._handle([f.bytes for f in frames], peer(frames[-1]))
        self._release_held(float("inf"))  # accepted work is not lost to a clean stop

    def _track_ingestors(self) -> None:
        """Apply the work queue's subscription messages: ``\\x01`` + prefix, ``\\x00`` + prefix."""
        for subscribed, topic in subscriptions(
            self._work, on_other=lambda: self._not_subscription("work_queue")
        ):
            if subscribed:
                self._served.add(topic)
            else:
                self._served.discard(topic)
            self.metrics.served_exchanges.set(len(self._served))

    def _track_subscribers(self) -> None:
        # In plain mode the proxy passes on to the watcher too what market-data subscribers
        # send that is no subscription; with CURVE on, _apply sees it instead.
        for subscribed, topic in subscriptions(
            self._watch, on_other=lambda: self._not_subscription("market_data")
        ):
            self._track_listener(subscribed, topic)
            change = self._watched.apply(subscribed, topic, time.monotonic())
            if change is not None and not change[1]:
                self._unserved.pop(change[0], None)
        self.metrics.watched_tickers.set(len(self._watched.topics))

    def _track_listener(self, subscribed: bool, topic: str) -> None:
        if not topic.startswith(notification_prefixes()):
            return
        if not subscribed:
            self._listened.discard(topic)
        elif len(self._listened) < MAX_LISTENED:
            self._listened.add(topic)

    def _hold_until_heard(self, topic: str, work_topic: str, work: Message) -> None:
        if topic in self._listened:
            released = "not_held"
        elif len(self._held) >= MAX_HELD:
            released = "hold_full"
        else:
            self._held.append(_Held(time.monotonic() + NOTIFY_HOLD_S, topic, work_topic, work))
            return
        # Counted before it goes out: whoever sees the work sees the count.
        self.metrics.held.labels(released).inc()
        self._publish(self._work, work_topic, work)

    def _release_held(self, now: float) -> None:
        """Dispatch held work whose topic is now subscribed, or that waited long enough."""
        if not self._held:
            return
        waiting: deque[_Held] = deque()
        for held in self._held:
            heard = held.topic in self._listened
            if heard or now >= held.due:
                self.metrics.held.labels("heard" if heard else "timed_out").inc()
                self._publish(self._work, held.work_topic, held.work)
            else:
                waiting.append(held)
        self._held = waiting

    def _report_unserved(self, now: float) -> None:
        """Answer subscribers of tickers no live ingestor serves, after a short grace.

        A walk of every watched ticker, so at most every UNSERVED_SCAN_S, and by exchange:
        on every pass of the loop, 200,000 tickers subscribed by one peer made each client
        request wait seconds. A walk that takes long is made rarer still, so that walking
        holds the loop a fifth of its time at the most (200,000 tickers: 0.1 s a walk)."""
        if now < self._next_unserved_scan:
            return
        self._walk_unserved(now)
        took = time.monotonic() - now
        self._next_unserved_scan = now + max(UNSERVED_SCAN_S, 5 * took)

    def _walk_unserved(self, now: float) -> None:
        served: dict[str, bool] = {}
        for ticker in self._watched.tickers():
            exchange = ticker.partition(":")[0]  # a watched ticker is a valid one
            if exchange not in served:
                served[exchange] = self.has_ingestor(exchange)
            if served[exchange]:
                self._unserved.pop(ticker, None)
                continue
            due = self._unserved.setdefault(ticker, now + UNSERVED_AFTER_S)
            if now < due or now - self._up_since < UNSERVED_AFTER_S:
                continue
            self._unserved[ticker] = now + ERROR_REPEAT_S
            self._watch.send_multipart(
                subscription_error(
                    ticker, rq.NO_INGESTOR, f"no live ingestor serves {exchange}", "relay"
                )
            )
            self.metrics.unserved_reports.inc()

    def has_ingestor(self, exchange: str) -> bool:
        prefix = work_prefix(exchange)
        return any(prefix.startswith(sub) for sub in self._served)

    def _handle(self, frames: list[bytes], peer: Peer | None = None) -> None:
        route, body, is_req = split_route(frames)
        try:
            msg = decode(body)
        except EnvelopeError as exc:
            if not is_req:
                self.metrics.dropped.labels("client_requests", exc.reason).inc()
                return
            reason = _REJECT_FOR_ENVELOPE.get(type(exc), rq.MALFORMED)
            self._reply(route, self._reject("", reason, str(exc)))
            return
        refusal = may_request(peer, msg)
        if refusal is not None:
            self.metrics.refused.labels("requests", "forbidden").inc()
            self._reply(route, self._reject(getattr(msg, "request_id", ""), rq.FORBIDDEN, refusal))
            return
        self._reply(route, self._dispatch(msg))

    def _dispatch(self, msg: Message) -> rq.SubmitResponse:
        if isinstance(msg, rq.SubmitHistoricalRequest):
            try:
                accepted = validate(msg, max_rows=self.settings.max_history_rows)
            except Rejected as rej:
                return self._reject(msg.request_id, rej.reason, rej.message)
            if not self.has_ingestor(accepted.exchange):
                return self._reject(
                    msg.request_id,
                    rq.NO_INGESTOR,
                    f"no live ingestor serves {accepted.exchange}; retry shortly",
                )
            self._hold_until_heard(
                accepted.notification_topic, work_prefix(accepted.exchange), accepted.work
            )
            return self._accept(msg.request_id, accepted.notification_topic)
        if isinstance(msg, cep.CEPTriggerRequest):
            return self._trigger(msg)
        if isinstance(msg, rq.DataRequest) and msg.kind != rq.HISTORICAL:
            return self._work_request(msg)
        if isinstance(msg, rq.IngestorControl):
            return self._forward(self._control, msg.request_id, msg.exchange, msg.ticker, msg)
        return self._reject("", rq.UNEXPECTED_TYPE, f"{type(msg).__name__} is not accepted here")

    def _work_request(self, msg: rq.DataRequest) -> rq.SubmitResponse:
        """Trusted work (a stream's start or stop, a metadata refresh) for the ingestors;
        what every ingestor of the exchange would drop is refused here, once."""
        if msg.kind not in rq.DataRequestKind.values():  # a newer sender's kind
            return self._reject(msg.request_id, rq.UNEXPECTED_TYPE, f"unknown kind {msg.kind}")
        if msg.kind == rq.SYMBOL_METADATA:
            try:  # its id is its job's key among ingestors
                check_request_id(msg.request_id)
            except TopicError as exc:
                return self._reject(msg.request_id, rq.BAD_REQUEST_ID, str(exc))
        return self._forward(self._work, msg.request_id, msg.exchange, msg.ticker, msg)

    def _forward(
        self, sock: zmq.Socket, request_id: str, exchange: str, ticker: str, msg: Message
    ) -> rq.SubmitResponse:
        """Pass trusted work on after checking only what routing needs."""
        try:
            if ticker and parse_ticker(ticker).exchange != exchange:
                raise TopicError(f"ticker {ticker} does not belong to exchange {exchange!r}")
            if not exchange or not exchange.isupper():
                raise TopicError(f"exchange {exchange!r} must be set, upper case")
        except TopicError as exc:
            return self._reject(request_id, rq.BAD_TICKER, str(exc))
        if sock is self._work and not self.has_ingestor(exchange):
            return self._reject(request_id, rq.NO_INGESTOR, f"no live ingestor serves {exchange}")
        self._publish(sock, work_prefix(exchange), msg)
        return self._accept(request_id, "")

    def _trigger(self, msg: cep.CEPTriggerRequest) -> rq.SubmitResponse:
        """Refuse what is wrong on its face; the stream processor, which holds the registry,
        decides the rest and answers with CEPTriggerAck on the client's topic."""
        try:
            check_owner(msg)
            if msg.action == cep.ADD:
                parse_trigger(msg)
        except TriggerRejected as exc:
            return self._reject(msg.request_id, rq.BAD_TRIGGER_REQUEST, exc.message)
        if trigger_work_topic() not in self._served:
            return self._reject(
                msg.request_id, rq.NO_TRIGGER_DESK, "no stream processor takes triggers; retry"
            )
        topic = response_topic(msg.client_id)
        work = cep.CEPTriggerRequest()
        work.CopyFrom(msg)
        work.notification_topic = topic
        self._hold_until_heard(topic, trigger_work_topic(), work)
        return self._accept(msg.request_id, topic)

    def _publish(self, sock: zmq.Socket, topic: str, msg: Message) -> None:
        sock.send_multipart(encode_topic(topic, msg))
        if sock is self._work:
            self.metrics.work_published.inc()

    def _accept(self, request_id: str, topic: str) -> rq.SubmitResponse:
        self.metrics.requests.labels("ok").inc()
        return rq.SubmitResponse(
            request_id=request_id, status=rq.SUBMIT_OK, notification_topic=topic
        )

    def _reject(self, request_id: str, reason: int, message: str) -> rq.SubmitResponse:
        self.metrics.requests.labels("rejected").inc()
        self.metrics.rejections.labels(rq.RejectReason.Name(reason).lower()).inc()
        return rq.SubmitResponse(
            request_id=request_id, status=rq.SUBMIT_REJECTED, reason=reason, error_message=message
        )

    def _reply(self, route: list[bytes], resp: rq.SubmitResponse) -> None:
        self._router.send_multipart([*route, *encode(resp)])
