"""WebSocket sessions: who is connected, what each is owed, and who is too slow.

Several sessions per user, each with a bounded outbox that one writer task drains. A
session that lets its outbox fill is closed (code 1013, "try again later"): the gateway
never buffers without bound for a client that does not read. ``on_first`` and ``on_last``
fire when a user's first session opens and last one closes; the gateway subscribes and
unsubscribes ``USER:{id}`` on them.

A session that signed in with ``"batch": true`` gets what is queued together as one frame, a
JSON array of messages (:func:`batch_frames`); any other gets a frame a message. For the
client, a frame a message cost more than the message: a browser's ``onmessage`` each, a
Python client's reader thread handing over each (#35).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import math
from collections import deque
from collections.abc import Callable
from typing import Any

import orjson
from websockets.asyncio.server import ServerConnection
from websockets.exceptions import ConnectionClosed

from gateway.channels import DELIVERED, Outcome, Result
from gateway.directory import UserAddress
from gateway.symbols import EVENT_TYPES, PRIORITIES, Rendered
from proto import events_pb2 as ev

log = logging.getLogger("candlewire.gateway.sessions")

SLOW_CLOSE_CODE = 1013
WRITE_BATCH = 256  # queued messages written to a session's socket at once, at most
# A batched session's frame holds queued messages together up to this many bytes; a larger
# message goes in a frame of its own.
BATCH_FRAME_BYTES = 64 * 1024
_dumps = orjson.dumps
# What orjson refuses, as compact JSON with no cycle check (our messages hold none), in ASCII
# as json.dumps makes it. No NaN or Infinity, which are not JSON: see :func:`to_json`.
_ENCODER = json.JSONEncoder(check_circular=False, allow_nan=False, separators=(",", ":"))


def to_json(message: dict[str, Any]) -> str:
    """A message (a dict) as its session's text: always valid JSON.

    orjson writes it at a tenth of json's cost (0.4 µs against 3.2 for an event, #35), as
    UTF-8, and writes NaN and a number past a double (``1e400``, which ``json.loads`` reads
    from a payload as a float) as null, as JavaScript's own ``JSON.stringify`` does: bare,
    a browser's ``JSON.parse`` would refuse the whole frame (a batched session's every
    message in it), while the event still arrives and its text shows the value. What orjson
    refuses (an integer past 64 bits, a lone surrogate such as a string cut inside an emoji,
    nesting past 255) goes through json's encoder, which writes the integer exact and the
    surrogate as its ASCII escape, the only form UTF-8 can carry."""
    try:
        return _dumps(message).decode()
    except TypeError:  # orjson.JSONEncodeError
        pass
    try:
        return _ENCODER.encode(message)
    except ValueError:  # "Out of range float values are not JSON compliant"
        return _ENCODER.encode(_finite(message))


def _finite(value: Any) -> Any:
    """``value`` with every NaN and infinite float in it made None."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_finite(v) for v in value]
    return value


def batch_frames(texts: list[str], limit: int = BATCH_FRAME_BYTES) -> list[str]:
    """Messages (each :func:`to_json`'s text) as the frames of a batched session, in order:
    consecutive ones joined into a JSON array up to ``limit`` bytes of UTF-8, one alone as
    itself. (``isascii`` reads a flag the string keeps: only a text that is not ASCII is
    encoded to be measured.)"""
    runs: list[list[str]] = []
    size = limit + 1  # no run yet: the first text starts one
    for text in texts:
        n = len(text) if text.isascii() else len(text.encode("utf-8", "surrogatepass"))
        if size + n + 1 > limit:
            runs.append([])
            size = 0
        runs[-1].append(text)
        size += n + 1
    return [run[0] if len(run) == 1 else f"[{','.join(run)}]" for run in runs]


class Session:
    def __init__(
        self,
        user_id: str,
        ws: ServerConnection,
        max_queue: int,
        batched: bool = False,
        on_full: Callable[[Session], None] | None = None,
    ) -> None:
        """``on_full``: called once, when an offer finds the outbox full (the session is
        then closed); :class:`Sessions` passes its slow-consumer rule."""
        self.user_id, self.ws, self.batched = user_id, ws, batched
        self._on_full = on_full
        # What the writer has yet to send, at most ``max_queue``. A deque and an event rather
        # than an ``asyncio.Queue``, whose put and get run in Python: 1.8 µs an event against
        # 0.3 (#35). The event is set when the outbox stops being empty.
        self.outbox: deque[str] = deque()
        self.max_queue = max_queue
        self._ready = asyncio.Event()
        self.chart: str | None = None  # the market-data topic this session draws
        self.closed = False

    def offer(self, message: dict[str, Any]) -> bool:
        """Queue a message; False (and the session is closing) when the client is too slow."""
        return self.offer_text(to_json(message))

    def offer_text(self, text: str) -> bool:
        """:meth:`offer` of a message already made text (:func:`to_json`)."""
        if self.closed:
            return False
        outbox = self.outbox
        if len(outbox) >= self.max_queue:
            # Whoever offered (an event, a candle, a command's reply, a seed candle), the
            # same rule: the session is closed and its socket with it, not left open unfed.
            self.closed = True
            if self._on_full is not None:
                self._on_full(self)
            return False
        outbox.append(text)
        if len(outbox) == 1:
            self._ready.set()
        return True

    def keeps_up(self) -> bool:
        """Whether the writer keeps the outbox at most half full."""
        return not self.closed and len(self.outbox) * 2 < self.max_queue

    async def write(self) -> None:
        """Drain the outbox to the socket until the session ends: what is queued goes out
        together (:meth:`_send_all`). A message the socket refuses closes the session (the
        browser reconnects), rather than ending this task while the session looks open and
        its messages pile up unsent."""
        outbox, ready, take = self.outbox, self._ready, self.outbox.popleft
        try:
            while not self.closed:
                if not outbox:
                    ready.clear()
                    await ready.wait()
                    continue
                texts = [take() for _ in range(min(len(outbox), WRITE_BATCH))]
                if self.batched and len(texts) > 1:
                    texts = batch_frames(texts)
                if len(texts) == 1:
                    await self.ws.send(texts[0])
                else:
                    await self._send_all(texts)
        except ConnectionClosed:
            pass
        except Exception:
            log.exception("closing a session of %s: a message could not be sent", self.user_id)
            self.closed = True
            with contextlib.suppress(ConnectionClosed):
                await self.ws.close(1011, "internal error")

    async def _send_all(self, texts: list[str]) -> None:
        """Several messages, each its own frame, in one write to the socket: websockets
        writes each frame on its own, a system call each: nearly all a session's
        writer cost per event under load. Its send context still checks the connection's state
        and waits while the socket's buffer is full, once a batch: the buffer can pass its
        high-water mark by one batch (WRITE_BATCH messages, each bounded by the outbox's)."""
        ws = self.ws
        async with ws.send_context():
            for text in texts:
                ws.protocol.send_text(text.encode())
            data = ws.protocol.data_to_send()
            frames = [d for d in data if d]
            ws.transport.write(b"".join(frames))
            if len(frames) < len(data):  # the protocol asks for a half-close, as websockets
                if ws.transport.can_write_eof():  # does on its own send
                    ws.transport.write_eof()
                else:
                    ws.transport.close()


class Sessions:
    def __init__(
        self,
        max_queue: int,
        max_per_user: int,
        on_first: Callable[[str], None],
        on_last: Callable[[str], None],
        on_slow: Callable[[Session], None],
    ) -> None:
        self.max_queue, self.max_per_user = max_queue, max_per_user
        self._by_user: dict[str, set[Session]] = {}
        self._on_first, self._on_last, self._on_slow = on_first, on_last, on_slow

    def open(self, user_id: str, ws: ServerConnection, batched: bool = False) -> Session | None:
        """A new session, or None when the user already has the most allowed."""
        mine = self._by_user.setdefault(user_id, set())
        if len(mine) >= self.max_per_user:
            return None
        session = Session(user_id, ws, self.max_queue, batched, on_full=self._too_slow)
        mine.add(session)
        if len(mine) == 1:
            self._on_first(user_id)
        return session

    def close(self, session: Session) -> None:
        session.closed = True
        mine = self._by_user.get(session.user_id)
        if mine is None or session not in mine:
            return
        mine.discard(session)
        if not mine:
            del self._by_user[session.user_id]
            self._on_last(session.user_id)

    def active(self, user_id: str) -> bool:
        return bool(self._by_user.get(user_id))

    def all(self) -> list[Session]:
        return [s for mine in self._by_user.values() for s in mine]

    def users(self) -> int:
        return len(self._by_user)

    def send(self, user_id: str, message: dict[str, Any]) -> int:
        """Offer a message to every session of a user; the number that took it."""
        return self.offer_to(list(self._by_user.get(user_id, ())), message)

    def send_critical(self, user_id: str, message: dict[str, Any]) -> int:
        """:meth:`send` of a critical event, to the user's sessions that keep up: one whose
        outbox is half full may well fill and be closed, its outbox and the event with it,
        after the event was answered DELIVERED. None that keeps up: the event goes on to its
        next channel."""
        keeping_up = [s for s in self._by_user.get(user_id, ()) if s.keeps_up()]
        return self.offer_to(keeping_up, message)

    def offer_to(self, sessions: list[Session], message: dict[str, Any]) -> int:
        """Offer a message to each of ``sessions``, made text once for all of them (a candle
        goes to every session drawing its chart); the number that took it."""
        if not sessions:
            return 0
        text, taken = to_json(message), 0
        for session in sessions:
            if session.offer_text(text):
                taken += 1
        return taken

    def _too_slow(self, session: Session) -> None:
        """A session's outbox filled: it leaves, and ``on_slow`` closes its socket (1013)."""
        if session in self._by_user.get(session.user_id, ()):
            self.close(session)
            self._on_slow(session)


def event_message(event: ev.UserEvent, rendered: Rendered, path: str) -> dict[str, Any]:
    """What a browser receives for one event."""
    number, priority = event.event_type, event.delivery.priority
    return {
        "type": "event",
        "path": path,
        "event_id": rendered.event_id,
        "event_type": EVENT_TYPES[number],
        "priority": PRIORITIES[priority],
        "timestamp": event.timestamp,
        "title": rendered.title,
        "text": rendered.text,
        "data": rendered.data,
    }


class SessionChannel:
    """ACTIVE_SESSION and WEB on the critical path: this gateway's open sessions."""

    def __init__(self, kind: ev.ChannelType.ValueType, sessions: Sessions) -> None:
        self.kind, self._sessions = kind, sessions

    def send_now(self, user: UserAddress, event: ev.UserEvent, message: Rendered) -> Result:
        """The answer at once: a session's outbox takes the message or it does not."""
        if self._sessions.send_critical(event.user_id, event_message(event, message, "critical")):
            return DELIVERED
        if self._sessions.active(event.user_id):
            return Result(Outcome.SKIPPED, "no session on this gateway keeps up")
        return Result(Outcome.SKIPPED, "no active session on this gateway")

    async def send(self, user: UserAddress, event: ev.UserEvent, message: Rendered) -> Result:
        return self.send_now(user, event, message)

    async def close(self) -> None:
        return None
