"""Telegram sessions: a chat that sent the bot ``/start`` is an active session, like a
browser, until it sends ``/stop``.

The spec's gateway subscribes ``USER:{id}`` "when the user's WebSocket/Telegram session
connects". Telegram has no connection, so the chat's own commands mark it: the gateway long
polls the Bot API's ``getUpdates`` (the one way to hear a bot's chats without a public
webhook URL), and informational events of the chat's users are sent to it with
``sendMessage``.

Which user a chat is. A chat id comes from Telegram itself, on our bot token, so it cannot be
forged, while a user id typed after ``/start`` can be. So ``/start`` opens the session for the
users whose ``telegram_chat_id`` in the user directory is this chat (set by onboarding:
``candlewire gateway user alice --telegram-chat 123``). ``/start alice`` (a deep link
``t.me/<bot>?start=alice``) narrows it to alice, when the chat is hers. A chat nobody linked
is told its id, to hand to whoever onboards users, and holds no session: strangers cannot
make the gateway keep state for them.

Restarts. Sessions are stored in PostgreSQL (``gateway_telegram_sessions``) and restored at
start: a user who said ``/start`` expects events until ``/stop``, not until the next deploy.
The offset is not stored: Telegram keeps every update until a ``getUpdates`` with a higher
offset confirms it, so after a restart only the batch in hand at the crash comes again, and
``/start`` and ``/stop`` are idempotent, so replaying it changes nothing (the chat may get its
confirmation twice). The Bot API serves one poller per bot (another gets 409 Conflict): in a
pool of gateways sharing a bot token, one polls (``telegram_sessions``) and holds them.

Delivery is best effort, as informational events are: the fast path only offers a message
to a bounded outbox and never waits on HTTP; one sender drains it, waits out a 429's
``retry_after``, and a full outbox drops and counts. A 403 (the user blocked the bot) ends the
session. :class:`UpdatesProtocol` and :class:`ChatSessions` are sans-I/O (h11-style): the
protocol and the bookkeeping, tested without a network; :class:`TelegramSessions` is the
thin shell that does the HTTP and database calls.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import httpx
import sqlalchemy as sa
from sqlalchemy.dialects.postgresql import insert

from candlewire.topics import TopicError, check_id
from gateway.channels import MAX_RETRY_AFTER_S, Outcome
from gateway.channels.telegram import TelegramChannel, json_object, message_text, retry_after
from gateway.directory import users as directory_users
from gateway.metrics import GatewayMetrics
from gateway.symbols import Rendered

log = logging.getLogger("candlewire.gateway.telegram")

ALLOWED_UPDATES = ["message"]
SEND_ATTEMPTS = 3
# Failures of a command that may pass on a later try (the database away, its pool full): the
# update is asked for again. Any other would fail the same way for ever, and an update left
# unconfirmed holds back every one after it, from every chat.
TRANSIENT = (sa.exc.OperationalError, sa.exc.DisconnectionError, sa.exc.TimeoutError)


# -- the getUpdates protocol, sans I/O ------------------------------------------------------


@dataclass(frozen=True)
class Command:
    """``/start`` or ``/stop`` from a chat; ``payload`` is what followed the command."""

    update_id: int
    kind: str
    chat_id: str
    payload: str = ""


@dataclass
class Poll:
    """What one ``getUpdates`` answer means: commands to apply, updates passed over, and how
    long to wait before the next poll (0: at once, the long poll itself waits)."""

    result: str
    delay_s: float = 0.0
    commands: list[Command] = field(default_factory=list)
    ignored: int = 0
    malformed: int = 0
    detail: str = ""


class Malformed(ValueError):
    pass


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def bot_command(text: str) -> tuple[str, str] | None:
    """``/start``, ``/stop`` (also ``/start@SomeBot``, as group chats send them) and the rest
    of the line; None for anything else."""
    head, _, rest = text.strip().partition(" ")
    name = head.split("@", 1)[0].lower()
    if name in ("/start", "/stop"):
        return name[1:], rest.strip()
    return None


def parse_update(update: dict[str, Any], update_id: int) -> Command | None:
    """A command, None for an update that is well formed but not for us (another update
    type, a photo, plain text); :class:`Malformed` for one the Bot API would never send."""
    if "message" not in update:
        return None
    msg = update["message"]
    if not isinstance(msg, dict):
        raise Malformed("message is not an object")
    chat = msg.get("chat")
    if not isinstance(chat, dict) or not _is_int(chat.get("id")):
        raise Malformed("message without a chat id")
    text = msg.get("text")
    if text is None:
        return None
    if not isinstance(text, str):
        raise Malformed("text is not a string")
    parsed = bot_command(text)
    if parsed is None:
        return None
    return Command(update_id, parsed[0], str(chat["id"]), parsed[1])


class Backoff:
    """Waits after failures in a row: ``min``, twice that, ... up to ``max``."""

    def __init__(self, min_s: float = 1.0, max_s: float = 60.0) -> None:
        self.min_s, self.max_s, self.failures = min_s, max_s, 0

    def next(self) -> float:
        self.failures += 1
        return min(self.max_s, self.min_s * 2 ** (self.failures - 1))

    def reset(self) -> None:
        self.failures = 0


class UpdatesProtocol:
    """The client side of ``getUpdates``: what to ask next, and what an answer means.

    ``offset`` is the last update_id seen plus one, which confirms every update before it;
    Telegram then never serves those again. Failures back off exponentially (``min`` to
    ``max``), a 429 waits its ``retry_after``, and a success resets the backoff.
    """

    def __init__(
        self,
        poll_s: int = 25,
        *,
        limit: int = 100,
        min_backoff_s: float = 1.0,
        max_backoff_s: float = 60.0,
    ) -> None:
        self.poll_s, self.limit = poll_s, limit
        self.backoff = Backoff(min_backoff_s, max_backoff_s)
        self.offset: int | None = None

    def request(self) -> dict[str, Any]:
        body: dict[str, Any] = {
            "timeout": self.poll_s,
            "limit": self.limit,
            "allowed_updates": ALLOWED_UPDATES,
        }
        if self.offset is not None:
            body["offset"] = self.offset
        return body

    def unreachable(self) -> Poll:
        return Poll("unreachable", self.backoff.next())

    def rewind(self, update_id: int) -> float:
        """Ask for an update again (applying it failed): it stays unconfirmed."""
        if self.offset is None or update_id < self.offset:
            self.offset = update_id
        return self.backoff.next()

    def receive(self, status: int, body: bytes) -> Poll:
        data = json_object(body)
        if status == 429:
            wait = min(retry_after(data, self.backoff.min_s), MAX_RETRY_AFTER_S)
            return Poll("rate_limited", wait, detail=str(data.get("description", ""))[:200])
        if status != 200 or data.get("ok") is not True:
            # 409: another poller of this bot, or a webhook set; 401/404: a wrong token.
            label = "conflict" if status == 409 else "error"
            detail = f"{status}: {str(data.get('description', ''))[:200]}"
            return Poll(label, self.backoff.next(), detail=detail)
        updates = data.get("result")
        if not isinstance(updates, list):
            return Poll(
                "malformed", self.backoff.next(), malformed=1, detail="result is not a list"
            )
        poll, start = Poll("ok"), self.offset
        for update in updates:
            if not isinstance(update, dict) or not _is_int(update.get("update_id")):
                poll.malformed += 1
                continue
            update_id: int = update["update_id"]
            if start is not None and update_id < start:
                poll.ignored += 1  # confirmed already: a server that repeats itself
                continue
            self.offset = max(self.offset or 0, update_id + 1)
            try:
                command = parse_update(update, update_id)
            except Malformed:
                poll.malformed += 1
                continue
            if command is None:
                poll.ignored += 1
            else:
                poll.commands.append(command)
        if updates and self.offset == start:
            # Nothing in the batch moved the offset, so the next poll returns it again at
            # once: wait, rather than spin on a server that sends only garbage.
            poll.delay_s = self.backoff.next()
        else:
            self.backoff.reset()
            if not updates and self.poll_s <= 0:
                poll.delay_s = self.backoff.min_s  # short polling: not in a tight loop
        return poll


# -- who is in session, sans I/O -------------------------------------------------------------


class ChatSessions:
    """Chats in session and the users each one is for, both ways. ``on_first(user)`` when a
    user's first chat starts and ``on_last(user)`` when the last one stops: the gateway
    subscribes and unsubscribes ``USER:{id}`` on them, as for browsers."""

    def __init__(self, on_first: Callable[[str], None], on_last: Callable[[str], None]) -> None:
        self._users: dict[str, set[str]] = {}  # chat -> users
        self._chats: dict[str, set[str]] = {}  # user -> chats
        self._on_first, self._on_last = on_first, on_last

    def start(self, chat_id: str, users: list[str]) -> None:
        mine = self._users.setdefault(chat_id, set())
        for user in users:
            if user in mine:
                continue
            mine.add(user)
            chats = self._chats.setdefault(user, set())
            chats.add(chat_id)
            if len(chats) == 1:
                self._on_first(user)

    def stop(self, chat_id: str) -> list[str]:
        """End a chat's session; the users it was for."""
        ended = sorted(self._users.pop(chat_id, ()))
        for user in ended:
            chats = self._chats[user]
            chats.discard(chat_id)
            if not chats:
                del self._chats[user]
                self._on_last(user)
        return ended

    def active(self, chat_id: str) -> bool:
        return chat_id in self._users

    def chats(self, user_id: str) -> list[str]:
        return sorted(self._chats.get(user_id, ()))

    def has(self, user_id: str) -> bool:
        return user_id in self._chats

    def __len__(self) -> int:
        return len(self._users)


# -- storage ---------------------------------------------------------------------------------

store_meta = sa.MetaData()
sessions_table = sa.Table(
    "gateway_telegram_sessions",
    store_meta,
    sa.Column("bot_id", sa.String(32), primary_key=True),
    sa.Column("chat_id", sa.String(64), primary_key=True),
    sa.Column("user_id", sa.String(128), primary_key=True),
    sa.Column("started_at", sa.Float, nullable=False),
)


class SessionStore:
    """Telegram sessions of one bot in PostgreSQL, and the directory's chat-to-user links.
    Blocking: called from worker threads."""

    def __init__(self, engine: sa.Engine, bot_id: str) -> None:
        self.engine, self.bot_id = engine, bot_id

    def create(self) -> None:
        store_meta.create_all(self.engine)

    def load(self) -> list[tuple[str, str]]:
        """Every (chat, user) in session."""
        t = sessions_table
        with self.engine.connect() as db:
            rows = db.execute(sa.select(t.c.chat_id, t.c.user_id).where(t.c.bot_id == self.bot_id))
            return [(r.chat_id, r.user_id) for r in rows]

    def linked(self, chat_id: str, only: str = "") -> list[str]:
        """The users whose directory entry names this chat (only ``only``, if given)."""
        u = directory_users
        query = sa.select(u.c.user_id).where(u.c.telegram_chat_id == chat_id)
        if only:
            query = query.where(u.c.user_id == only)
        with self.engine.connect() as db:
            return sorted(db.execute(query).scalars())

    def start(self, chat_id: str, users: list[str]) -> None:
        rows = [
            {"bot_id": self.bot_id, "chat_id": chat_id, "user_id": u, "started_at": time.time()}
            for u in users
        ]
        with self.engine.begin() as db:
            db.execute(insert(sessions_table).values(rows).on_conflict_do_nothing())

    def stop(self, chat_id: str) -> None:
        t = sessions_table
        with self.engine.begin() as db:
            db.execute(sa.delete(t).where(t.c.bot_id == self.bot_id, t.c.chat_id == chat_id))


# -- the shell -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Outgoing:
    chat_id: str
    text: str
    event: bool  # an event is not sent to a chat that stopped meanwhile; a reply is


class TelegramSessions:
    """Polls ``getUpdates``, applies ``/start`` and ``/stop``, and sends events to chats in
    session. :meth:`run` is the poller (a no-op when Telegram is off); :meth:`deliver` is
    for the fast path and never waits."""

    def __init__(
        self,
        channel: TelegramChannel,
        engine: sa.Engine,
        metrics: GatewayMetrics,
        *,
        on_first: Callable[[str], None],
        on_last: Callable[[str], None],
        enabled: bool = True,
        poll_s: int = 25,
        queue: int = 256,
    ) -> None:
        self.channel, self.metrics = channel, metrics
        self.enabled = enabled and channel.configured
        self.protocol = UpdatesProtocol(poll_s)
        self.chats = ChatSessions(on_first, on_last)
        self.store = SessionStore(engine, channel.bot_id)
        self.outbox: asyncio.Queue[Outgoing] = asyncio.Queue(queue)
        self._last_result = "ok"

    # the fast path

    def deliver(self, user_id: str, message: Rendered) -> int:
        """Offer an event to the user's chats in session; the number that took it."""
        if not self.chats.has(user_id):  # most users: no list to sort, no words to make
            return 0
        chats = self.chats.chats(user_id)
        text = message_text(message)
        return sum(self._offer(Outgoing(c, text, event=True)) for c in chats)

    def _offer(self, item: Outgoing) -> bool:
        try:
            self.outbox.put_nowait(item)
            return True
        except asyncio.QueueFull:
            self.metrics.telegram_messages.labels("queue_full").inc()
            return False

    # the poller

    async def run(self) -> None:
        if not self.enabled:
            return
        sender = asyncio.create_task(self._send_all())
        try:
            await self._restore()
            while True:
                try:
                    await self._poll()
                except Exception:  # a bug must not end Telegram sessions for good
                    log.exception("telegram poll failed")
                    await asyncio.sleep(self.protocol.backoff.next())
        finally:
            sender.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await sender

    async def _restore(self) -> None:
        """Sessions from before a restart; until the database answers, no polling (a
        ``/start`` could not be kept)."""
        backoff = Backoff(1.0, 30.0)
        while True:
            try:
                await asyncio.to_thread(self.store.create)
                rows = await asyncio.to_thread(self.store.load)
                break
            except Exception as exc:
                log.warning("telegram sessions not restored yet: %s", type(exc).__name__)
                await asyncio.sleep(backoff.next())
        for chat, user in rows:
            self.chats.start(chat, [user])
        self.metrics.telegram_sessions.set(len(self.chats))
        if rows:
            log.info("restored %d telegram sessions", len(self.chats))

    async def _poll(self) -> None:
        p = self.protocol
        try:
            status, body, _ = await self.channel.call(
                "getUpdates", p.request(), timeout_s=p.poll_s + self.channel.timeout_s
            )
        except httpx.HTTPError as exc:
            poll = p.unreachable()
            poll.detail = type(exc).__name__
        else:
            poll = p.receive(status, body)
        self.metrics.telegram_polls.labels(poll.result).inc()
        self.metrics.telegram_updates.labels("ignored").inc(poll.ignored)
        self.metrics.telegram_updates.labels("malformed").inc(poll.malformed)
        if poll.malformed:
            log.warning("telegram: %d malformed updates ignored", poll.malformed)
        if poll.result != self._last_result:  # log changes, not every retry
            log.warning("telegram getUpdates: %s %s", poll.result, poll.detail)
            self._last_result = poll.result
        delay = poll.delay_s
        for command in poll.commands:
            try:
                await self._apply(command)
            except TRANSIENT as exc:  # the update stays unconfirmed, and comes again
                log.warning("telegram /%s not applied yet: %s", command.kind, type(exc).__name__)
                delay = p.rewind(command.update_id)
                break
            except Exception:  # it would fail again: answered, and passed over
                log.exception("telegram /%s failed; passed over", command.kind)
                self.metrics.telegram_updates.labels("failed").inc()
                self._reply(
                    command.chat_id, f"candlewire: /{command.kind} failed. Try again later."
                )
        if delay:
            await asyncio.sleep(delay)

    async def _apply(self, command: Command) -> None:
        chat = command.chat_id
        if command.kind == "stop":
            await asyncio.to_thread(self.store.stop, chat)
            self.chats.stop(chat)
            self._reply(chat, "candlewire: stopped. Send /start to receive events here again.")
        else:
            if command.payload:  # typed by whoever writes to the bot
                try:
                    check_id(command.payload, "user id")
                except TopicError:
                    self.metrics.telegram_updates.labels("invalid").inc()
                    self._reply(
                        chat,
                        "candlewire: that is not a user id (1-128 of A-Z a-z 0-9 _ . : -). "
                        "Send /start, or /start followed by your user id.",
                    )
                    return
            users = await asyncio.to_thread(self.store.linked, chat, command.payload)
            if not users:
                self.metrics.telegram_updates.labels("unlinked").inc()
                self._reply(
                    chat,
                    f"candlewire: this chat (id {chat}) is not linked to a user. Give the id to "
                    "whoever set up your account: candlewire gateway user USER --telegram-chat "
                    f"{chat}",
                )
                return
            await asyncio.to_thread(self.store.start, chat, users)
            self.chats.start(chat, users)
            self._reply(
                chat,
                f"candlewire: events of {', '.join(users)} will arrive here. Send /stop to end.",
            )
        self.metrics.telegram_updates.labels(command.kind).inc()
        self.metrics.telegram_sessions.set(len(self.chats))

    def _reply(self, chat_id: str, text: str) -> None:
        self._offer(Outgoing(chat_id, text, event=False))

    async def _end(self, chat_id: str) -> None:
        """The user blocked the bot (403): the chat is out of session."""
        self.chats.stop(chat_id)
        self.metrics.telegram_sessions.set(len(self.chats))
        with contextlib.suppress(Exception):
            await asyncio.to_thread(self.store.stop, chat_id)

    # the sender

    async def _send_all(self) -> None:
        while True:
            item = await self.outbox.get()
            if item.event and not self.chats.active(item.chat_id):
                self.metrics.telegram_messages.labels("stopped").inc()
                continue
            try:
                await self._send(item)
            except Exception:
                log.exception("telegram send failed")

    async def _send(self, item: Outgoing) -> None:
        """One message, again after a 429's ``retry_after`` or a transient failure, a few
        times at most: informational events are not worth holding the whole queue for."""
        counted = self.metrics.telegram_messages
        for _ in range(SEND_ATTEMPTS):
            status, result = await self.channel.send_text(item.chat_id, item.text)
            if result.outcome is Outcome.DELIVERED:
                counted.labels("sent").inc()
                return
            if status == 403:
                counted.labels("blocked").inc()
                await self._end(item.chat_id)
                return
            if result.outcome is not Outcome.RETRY:
                counted.labels("failed").inc()
                log.warning("telegram message to a chat failed: %s", result.detail)
                return
            counted.labels("rate_limited" if status == 429 else "retried").inc()
            await asyncio.sleep(min(result.retry_after_s, MAX_RETRY_AFTER_S))
        counted.labels("given_up").inc()
