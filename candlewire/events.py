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

Pending events survive the process. A journal (SQLite in WAL mode, :class:`EventLog`)
commits each event to disk *before* :meth:`publish` returns and forgets it at its ack. On
start the events still unacknowledged are sent again. ``kill -9`` at any moment loses
nothing that ``publish`` reported as sent.

Priorities: INFORMATIONAL goes to the XPUB when someone watches the user, else it is
dropped; NORMAL goes to the XPUB when watched, else to the DEALER; CRITICAL always goes to
the DEALER.
"""

from __future__ import annotations

import contextlib
import logging
import sqlite3
import threading
import time
from collections import Counter
from dataclasses import dataclass
from enum import Enum
from pathlib import Path

import zmq

from candlewire.config import Settings
from candlewire.curve import dial
from candlewire.topics import user_topic
from candlewire.zmqutil import (
    NOBLOCK,
    SNDMORE,
    harden,
    recv_frames,
    send_frames,
    sender,
    subscriptions,
)
from proto import events_pb2 as ev
from proto.envelope import (
    EnvelopeError,
    Names,
    check_sizes,
    decode,
    encode,
    encode_topic,
    expect,
)

log = logging.getLogger("candlewire.events")
ACK_STATUSES = Names.of(ev.AckStatus)  # a newer gateway's status is counted by number

ACK_TIMEOUT_S = 30.0  # the spec's default
# Once woken, the I/O thread waits this long for more events before it sends: one at a time,
# an event cost it 35 µs of CPU at 10,000 a second, 14 with this wait, 3 in a flood.
COALESCE_S = 0.001


class Route(Enum):
    """Where :meth:`EventPublisher.publish` sent an event: the fast path (a watching
    gateway's SUB), the acked DEALER path, or nowhere (informational, nobody watching)."""

    XPUB = "xpub"
    DEALER = "dealer"
    DROPPED = "dropped"


@dataclass
class Pending:
    """An event sent on the DEALER path and not yet acked: when, and how often."""

    event: ev.UserEvent
    sent_at: float
    attempts: int = 1


class EventLog:
    """Pending events in SQLite, in WAL mode with full sync: an event is committed (and on
    disk) before :meth:`EventPublisher.publish` returns, and deleted when its ack arrives.
    SQLite's own journal makes a crash mid-write harmless, so there is nothing to compact.

    The caller serialises use (the publisher's lock), so one connection serves all threads.
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        path.parent.mkdir(parents=True, exist_ok=True)
        self._db = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=FULL")
        self._db.execute(
            "CREATE TABLE IF NOT EXISTS pending (event_id TEXT PRIMARY KEY, event BLOB NOT NULL)"
        )

    def replay(self) -> dict[str, ev.UserEvent]:
        """Events logged and not acknowledged, in the order they were published."""
        rows = self._db.execute("SELECT event_id, event FROM pending ORDER BY rowid")
        return {event_id: ev.UserEvent.FromString(body) for event_id, body in rows}

    def pending(self, event: ev.UserEvent) -> None:
        """Record ``event`` (committed, on disk) until its ack."""
        self._db.execute(
            "INSERT OR REPLACE INTO pending VALUES (?, ?)",
            (event.event_id, event.SerializeToString()),
        )

    def acked(self, event_id: str) -> None:
        """Forget an acked event."""
        self._db.execute("DELETE FROM pending WHERE event_id = ?", (event_id,))

    def close(self) -> None:
        """Close the database."""
        self._db.close()


class EventPublisher:
    """Route UserEvents to gateways; thread-safe, one I/O thread owns the sockets."""

    def __init__(
        self,
        settings: Settings | None = None,
        *,
        gateways: list[str] | None = None,
        journal: Path | None = None,
        ack_timeout: float = ACK_TIMEOUT_S,
        endpoint: str = "user_events",
        key: str | None = None,
        coalesce_s: float = COALESCE_S,
    ) -> None:
        """``key``: the CURVE key proved to gateways (default the configured one): a
        container's, bound to its user, or the stream job's publisher key. ``coalesce_s``:
        how long the I/O thread lets events gather once woken, so that events published one
        at a time leave together (0: each as it comes)."""
        if not 0 <= coalesce_s <= 0.1:
            raise ValueError(f"coalesce_s must be 0 to 0.1 seconds, not {coalesce_s}")
        self.coalesce_s = coalesce_s
        self.settings = settings or Settings()
        self.endpoint = endpoint  # the XPUB's, by name: a user container's, or the job's
        self.key = key
        self.gateways = gateways or [self.settings.connect("critical_events")]
        self.ack_timeout = ack_timeout
        self.journal = EventLog(journal or self.settings.state_dir / "events" / "pending.db")
        self.pending: dict[str, Pending] = {}
        self.acks: Counter[str] = Counter()
        self.dropped_frames = 0
        self.outboxes_sent = 0  # the times the I/O thread took a non-empty outbox
        self._watchers: Counter[str] = Counter()
        self._lock = threading.Lock()
        self._outbox: list[tuple[Route, ev.UserEvent]] = []
        self._ctx = zmq.Context()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # -- lifecycle -----------------------------------------------------------------------

    def start(self) -> EventPublisher:
        """Bind the XPUB, dial the gateways, send again what the journal holds, and start
        the I/O thread; a ``with`` block calls it."""
        if self._thread is not None:
            return self
        size = self.settings.max_message_bytes
        self._xpub = harden(self._ctx.socket(zmq.XPUB), max_message_bytes=size)
        self._xpub.setsockopt(zmq.XPUB_VERBOSER, 1)
        # Bound, yet a CURVE client: gateways dial it and authenticate this key.
        dial(self._xpub, self.settings, "gateway", self.key)
        self._xpub.bind(self.settings.bind(self.endpoint))
        self._dealer = harden(self._ctx.socket(zmq.DEALER), max_message_bytes=size)
        dial(self._dealer, self.settings, "gateway", self.key)
        for endpoint in self.gateways:
            self._dealer.connect(endpoint)
        self._wake_recv = self._ctx.socket(zmq.PAIR)
        self._wake_recv.bind(f"inproc://events-wake-{id(self)}")
        self._wake = self._ctx.socket(zmq.PAIR)
        self._wake.connect(f"inproc://events-wake-{id(self)}")
        recovered = self.journal.replay()
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
        """Whether a gateway subscribes to ``user_id``'s events (a session is open)."""
        with self._lock:
            return self._watched(user_id)

    def _watched(self, user_id: str) -> bool:
        """:meth:`watched`, for a caller that holds the lock."""
        return self._watchers[user_topic(user_id)] > 0

    def publish(self, event: ev.UserEvent) -> Route:
        """Route one event; a DEALER-bound event is journalled before this returns. One
        that no gateway would accept (a field past its limit, or larger than a message may
        be) raises OversizedField: journalled, it would be sent again for ever."""
        priority = event.delivery.priority
        with self._lock:
            if priority != ev.CRITICAL and self._watched(event.user_id):
                route = Route.XPUB
            elif priority == ev.INFORMATIONAL:
                return Route.DROPPED
            else:
                route = Route.DEALER
                check_sizes(event, self.settings.max_message_bytes)
                self.journal.pending(event)
                self.pending[event.event_id] = Pending(event, time.monotonic(), 0)
            # The I/O thread takes the whole outbox each time it wakes, so only the event
            # that finds it empty wakes it: a wake-up refused by a full pipe raises, and
            # raising cost more than the rest of a publish. Under the lock: publishing
            # threads share the wake socket, and a ZMQ socket is not thread-safe.
            if not self._outbox:
                with contextlib.suppress(zmq.Again):
                    self._wake.send(b"", NOBLOCK)
            self._outbox.append((route, event))
        return route

    def unacked(self) -> int:
        """Events sent on the DEALER path and not yet acked."""
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
                if self.coalesce_s:  # the events published meanwhile go out with this one
                    self._stop.wait(self.coalesce_s)
                while self._wake_recv.poll(0):
                    self._wake_recv.recv()
            if self._xpub in events:
                self._track_watchers()
            if self._dealer in events:
                self._read_acks()
            self._send_outbox()
            self._resend_due(time.monotonic())

    def _track_watchers(self) -> None:
        for subscribed, topic in subscriptions(self._xpub, on_other=self._not_subscription):
            with self._lock:
                self._watchers[topic] += 1 if subscribed else -1
                if self._watchers[topic] <= 0:
                    del self._watchers[topic]

    def _not_subscription(self) -> None:
        self.dropped_frames += 1

    def _send_outbox(self) -> None:
        with self._lock:
            out, self._outbox = self._outbox, []
        if not out:
            return
        self.outboxes_sent += 1
        send = sender(self._xpub)  # once an outbox: a flood's holds thousands of events
        for route, event in out:
            if route is Route.XPUB:  # send_frames' loop, unrolled for three frames
                topic, version, body = encode_topic(user_topic(event.user_id), event)
                send(topic, SNDMORE)
                send(version, SNDMORE)
                send(body, 0)
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
            send_frames(self._dealer, [b"", *encode(p.event)], NOBLOCK)

    def _resend_due(self, now: float) -> None:
        with self._lock:
            due = [eid for eid, p in self.pending.items() if now - p.sent_at >= self.ack_timeout]
        for event_id in due:
            log.info("no ack for %s; sending again", event_id)
            self._send(event_id)

    def _read_acks(self) -> None:
        while True:
            try:
                frames = recv_frames(self._dealer, NOBLOCK)
            except zmq.Again:
                return
            try:
                ack = expect(
                    decode(frames[1:] if frames and not frames[0] else frames), ev.EventAck
                )
            except EnvelopeError:
                self.dropped_frames += 1
                continue
            self.acks[ACK_STATUSES[ack.status]] += 1
            # DELIVERED and ERROR are final; QUEUED means the gateway owns the retry now.
            with self._lock:
                if self.pending.pop(ack.event_id, None) is not None:
                    self.journal.acked(ack.event_id)
                    if ack.status == ev.ERROR:
                        log.warning(
                            "event %s failed at the gateway: %s", ack.event_id, ack.error_message
                        )
