"""The container side of user events: :class:`EventPublisher`, embeddable in any process.

Two paths, as the spec routes them:

- **XPUB** (``user_events``), the informational fast path. It is bound with XPUB_VERBOSER,
  so every subscribe and unsubscribe reaches us, including the unsubscribes libzmq makes up
  for a gateway that disconnects without sending them. A gateway subscribes to
  ``USER:{user_id}`` once however many sessions it holds for that user, so the count per
  topic is the number of gateways watching it.
- **DEALER** to one or more gateways' ROUTERs (``critical_events``): at least once. Each
  event waits in a pending map until its EventAck; after ``ack_timeout`` it is sent again,
  and the DEALER's round robin hands it to the next gateway. Gateways deduplicate by
  event_id.

Pending events survive the process. A write-ahead log records each event with fsync
*before* :meth:`publish` returns, and each ack after it. On start the log is replayed, the
events still unacknowledged are sent again, and the log is compacted. ``kill -9`` at any
moment loses nothing that ``publish`` reported as sent.

Priorities: INFORMATIONAL goes to the XPUB when someone watches the user, else it is
dropped; NORMAL goes to the XPUB when watched, else to the DEALER; CRITICAL always goes to
the DEALER.
"""

from __future__ import annotations

import contextlib
import logging
import os
import struct
import threading
import time
from collections import Counter
from dataclasses import dataclass
from enum import Enum
from pathlib import Path

import zmq

from candlewire.config import Settings
from candlewire.topics import user_topic
from candlewire.zmqutil import harden, pending, subscription
from proto import events_pb2 as ev
from proto.envelope import EnvelopeError, decode, encode, encode_topic, expect

log = logging.getLogger("candlewire.events")

ACK_TIMEOUT_S = 30.0  # the spec's default
_PENDING, _ACKED = b"P", b"A"


class Route(Enum):
    XPUB = "xpub"
    DEALER = "dealer"
    DROPPED = "dropped"


@dataclass
class Pending:
    event: ev.UserEvent
    sent_at: float
    attempts: int = 1


class EventLog:
    """Append-only write-ahead log: ``P`` + UserEvent, ``A`` + event_id, length-prefixed."""

    def __init__(self, path: Path) -> None:
        self.path = path
        path.parent.mkdir(parents=True, exist_ok=True)
        self._file = path.open("ab")

    def replay(self) -> dict[str, ev.UserEvent]:
        """Events logged and not acknowledged; a torn last record (a crash mid-write) ends it."""
        pending: dict[str, ev.UserEvent] = {}
        data = self.path.read_bytes()
        pos = 0
        while pos + 5 <= len(data):
            kind, size = data[pos : pos + 1], struct.unpack(">I", data[pos + 1 : pos + 5])[0]
            body = data[pos + 5 : pos + 5 + size]
            if len(body) < size:
                break
            pos += 5 + size
            if kind == _PENDING:
                event = ev.UserEvent.FromString(body)
                pending[event.event_id] = event
            elif kind == _ACKED:
                pending.pop(body.decode(), None)
        return pending

    def _write(self, kind: bytes, body: bytes) -> None:
        self._file.write(kind + struct.pack(">I", len(body)) + body)
        self._file.flush()
        os.fsync(self._file.fileno())

    def pending(self, event: ev.UserEvent) -> None:
        self._write(_PENDING, event.SerializeToString())

    def acked(self, event_id: str) -> None:
        self._write(_ACKED, event_id.encode())

    def compact(self, pending: dict[str, ev.UserEvent]) -> None:
        """Rewrite the log with only what is pending, atomically."""
        tmp = self.path.with_suffix(".tmp")
        with tmp.open("wb") as f:
            for event in pending.values():
                body = event.SerializeToString()
                f.write(_PENDING + struct.pack(">I", len(body)) + body)
            f.flush()
            os.fsync(f.fileno())
        self._file.close()
        os.replace(tmp, self.path)
        self._file = self.path.open("ab")

    def close(self) -> None:
        self._file.close()


class EventPublisher:
    """Route UserEvents to gateways; thread-safe, one I/O thread owns the sockets."""

    def __init__(
        self,
        settings: Settings | None = None,
        *,
        gateways: list[str] | None = None,
        journal: Path | None = None,
        ack_timeout: float = ACK_TIMEOUT_S,
    ) -> None:
        self.settings = settings or Settings()
        self.gateways = gateways or [self.settings.connect("critical_events")]
        self.ack_timeout = ack_timeout
        self.journal = EventLog(journal or self.settings.state_dir / "events" / "pending.log")
        self.pending: dict[str, Pending] = {}
        self.acks: Counter[str] = Counter()
        self.dropped_frames = 0
        self._watchers: Counter[str] = Counter()
        self._lock = threading.Lock()
        self._outbox: list[tuple[Route, ev.UserEvent]] = []
        self._ctx = zmq.Context()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # -- lifecycle -----------------------------------------------------------------------

    def start(self) -> EventPublisher:
        if self._thread is not None:
            return self
        size = self.settings.max_message_bytes
        self._xpub = harden(self._ctx.socket(zmq.XPUB), max_message_bytes=size)
        self._xpub.setsockopt(zmq.XPUB_VERBOSER, 1)
        self._xpub.bind(self.settings.bind("user_events"))
        self._dealer = harden(self._ctx.socket(zmq.DEALER), max_message_bytes=size)
        for endpoint in self.gateways:
            self._dealer.connect(endpoint)
        self._wake_recv = self._ctx.socket(zmq.PAIR)
        self._wake_recv.bind(f"inproc://events-wake-{id(self)}")
        self._wake = self._ctx.socket(zmq.PAIR)
        self._wake.connect(f"inproc://events-wake-{id(self)}")
        recovered = self.journal.replay()
        self.journal.compact(recovered)
        now = time.monotonic()
        with self._lock:
            for event in recovered.values():
                # Sent again at once: the last send may never have left the dead process.
                self.pending[event.event_id] = Pending(event, now - self.ack_timeout, 0)
        if recovered:
            log.info("recovered %d pending events from %s", len(recovered), self.journal.path)
        self._thread = threading.Thread(target=self._loop, name="event-publisher", daemon=True)
        self._thread.start()
        return self

    def close(self) -> None:
        """Stop; pending events stay in the journal for the next start."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5)
        for sock in (self._xpub, self._dealer, self._wake, self._wake_recv):
            sock.close(linger=0)
        self._ctx.term()
        self.journal.close()

    def __enter__(self) -> EventPublisher:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- the API ---------------------------------------------------------------------------

    def watched(self, user_id: str) -> bool:
        with self._lock:
            return self._watchers[user_topic(user_id)] > 0

    def publish(self, event: ev.UserEvent) -> Route:
        """Route one event; a DEALER-bound event is journalled before this returns."""
        priority = event.delivery.priority
        if priority != ev.CRITICAL and self.watched(event.user_id):
            route = Route.XPUB
        elif priority == ev.INFORMATIONAL:
            return Route.DROPPED
        else:
            route = Route.DEALER
            with self._lock:
                self.journal.pending(event)
                self.pending[event.event_id] = Pending(event, time.monotonic(), 0)
        with self._lock:
            self._outbox.append((route, event))
        # A full wake pipe means a wake-up is already pending; the I/O thread takes the
        # whole outbox each time it wakes.
        with contextlib.suppress(zmq.Again):
            self._wake.send(b"", zmq.NOBLOCK)
        return route

    def unacked(self) -> int:
        with self._lock:
            return len(self.pending)

    # -- the I/O thread -------------------------------------------------------------------

    def _loop(self) -> None:
        poller = zmq.Poller()
        for sock in (self._xpub, self._dealer, self._wake_recv):
            poller.register(sock, zmq.POLLIN)
        while not self._stop.is_set():
            events = dict(poller.poll(100))
            if self._wake_recv in events:
                while self._wake_recv.poll(0):
                    self._wake_recv.recv()
            if self._xpub in events:
                self._track_watchers()
            if self._dealer in events:
                self._read_acks()
            self._send_outbox()
            self._resend_due(time.monotonic())

    def _track_watchers(self) -> None:
        for msg in pending(self._xpub):
            sub = subscription(msg)
            if sub is None:
                continue
            subscribed, topic = sub
            with self._lock:
                self._watchers[topic] += 1 if subscribed else -1
                if self._watchers[topic] <= 0:
                    del self._watchers[topic]

    def _send_outbox(self) -> None:
        with self._lock:
            out, self._outbox = self._outbox, []
        for route, event in out:
            if route is Route.XPUB:
                self._xpub.send_multipart(encode_topic(user_topic(event.user_id), event))
            else:
                self._send(event.event_id)

    def _send(self, event_id: str) -> None:
        with self._lock:
            p = self.pending.get(event_id)
            if p is None:
                return
            p.sent_at, p.attempts = time.monotonic(), p.attempts + 1
        # No gateway connected, or all full: the resend timer tries again.
        with contextlib.suppress(zmq.Again):
            self._dealer.send_multipart([b"", *encode(p.event)], zmq.NOBLOCK)

    def _resend_due(self, now: float) -> None:
        with self._lock:
            due = [eid for eid, p in self.pending.items() if now - p.sent_at >= self.ack_timeout]
        for event_id in due:
            log.info("no ack for %s; sending again", event_id)
            self._send(event_id)

    def _read_acks(self) -> None:
        while True:
            try:
                frames = self._dealer.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                return
            try:
                ack = expect(
                    decode(frames[1:] if frames and not frames[0] else frames), ev.EventAck
                )
            except EnvelopeError:
                self.dropped_frames += 1
                continue
            self.acks[ev.AckStatus.Name(ack.status)] += 1
            # DELIVERED and ERROR are final; QUEUED means the gateway owns the retry now.
            with self._lock:
                if self.pending.pop(ack.event_id, None) is not None:
                    self.journal.acked(ack.event_id)
                    if ack.status == ev.ERROR:
                        log.warning(
                            "event %s failed at the gateway: %s", ack.event_id, ack.error_message
                        )
