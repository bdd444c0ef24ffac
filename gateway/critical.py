"""The critical path: deliver a UserEvent by its channel preferences, answer an EventAck.

- Preferences are tried in order. ``only_if_active`` skips a channel unless the user has a
  live session here. The first channel that delivers ends it: DELIVERED.
- A channel that says "later" (a Telegram 429 with ``retry_after``, an SMTP 4xx, an
  unreachable service) ends it with QUEUED. The retry is stored in PostgreSQL in the same
  transaction as the answer, and any gateway retries it when due, starting from that channel.
- When nothing delivers, the answer is ERROR, with each channel's reason.
- Every answer is kept for the dedup window, in memory and in PostgreSQL. An event seen
  again (a resend after a lost ack, to this gateway or another, before or after a restart)
  gets the same answer and is not delivered again.
- An event is claimed in PostgreSQL before it is delivered. A resend that reaches another
  gateway while this one still works on it gets no answer there (the container sends it
  again later) rather than a second delivery. A claim lapses after ``claim_lease_s``, so the
  events of a gateway that died mid-delivery are delivered by another: at least once.
- The ack goes out only once the answer is committed. Events in flight share their database
  round trips: one query looks up all their earlier answers, one their users' addresses, one
  statement (one commit) stores their answers (:class:`Batcher`).
"""

from __future__ import annotations

import asyncio
import enum
import logging
import time
import uuid
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Sequence
from typing import Generic, TypeVar

from gateway.channels import Channel, Outcome, Result
from gateway.directory import Answer, Directory, Retry, UserAddress
from gateway.metrics import GatewayMetrics
from gateway.sessions import Sessions
from gateway.symbols import SymbolCatalog
from proto import events_pb2 as ev

log = logging.getLogger("candlewire.gateway.critical")

RETRY_LEASE_S = 60.0
MAX_REMEMBERED = 100_000  # beyond this, the dedup window is served by PostgreSQL alone
MAX_BATCH = 512  # rows per database round trip
MAX_ID = 128  # characters in an event or user id: the width of the tables' key columns
DELIVER_SHARE = 0.8  # of the claim's lease a delivery may take; the rest is for the commit
# Channels that reach a user through this gateway's sessions, by user id: no address needed.
SESSION_CHANNELS = frozenset({ev.ACTIVE_SESSION, ev.WEB})

K = TypeVar("K")
V = TypeVar("V")


class Batcher(Generic[K, V]):
    """Group commit: the calls that arrive while one batch is in the database wait and go
    together in the next. So N events in flight cost one round trip (and one commit) per
    stage instead of N, and nothing waits on a timer: a lone call goes at once. One batch at
    a time, at most ``max_batch`` items each; ``run`` answers a batch in its order."""

    def __init__(
        self, run: Callable[[list[K]], Awaitable[Sequence[V]]], max_batch: int = MAX_BATCH
    ) -> None:
        self._run, self._max = run, max_batch
        self._queue: list[tuple[K, asyncio.Future[V]]] = []
        self._worker: asyncio.Task[None] | None = None

    async def __call__(self, item: K) -> V:
        loop = asyncio.get_running_loop()
        future: asyncio.Future[V] = loop.create_future()
        self._queue.append((item, future))
        if self._worker is None or self._worker.done():
            self._worker = loop.create_task(self._drain())
        return await future

    async def _drain(self) -> None:
        batch: list[tuple[K, asyncio.Future[V]]] = []
        try:
            while self._queue:
                batch, self._queue = self._queue[: self._max], self._queue[self._max :]
                try:
                    results = await self._run([item for item, _ in batch])
                except Exception as exc:  # each caller sees it: no answer, no ack
                    for _, future in batch:
                        if not future.done():
                            future.set_exception(exc)
                    continue
                for (_, future), result in zip(batch, results, strict=True):
                    if not future.done():
                        future.set_result(result)
        finally:  # cancelled (the gateway stops): nobody may wait forever
            for _, future in batch + self._queue:
                future.cancel()


class Claim(enum.Enum):
    """An event without an earlier answer: this gateway's to deliver, or another's."""

    OURS = "ours"
    ELSEWHERE = "elsewhere"


class CriticalDelivery:
    def __init__(
        self,
        directory: Directory,
        channels: dict[int, Channel],
        sessions: Sessions,
        symbols: SymbolCatalog,
        metrics: GatewayMetrics,
        *,
        dedup_window_s: float,
        max_retries: int,
        claim_lease_s: float,
    ) -> None:
        self.directory, self.channels, self.sessions = directory, channels, sessions
        self.symbols, self.metrics = symbols, metrics
        self.window_s, self.max_retries = dedup_window_s, max_retries
        self.lease_s = claim_lease_s
        self.owner = uuid.uuid4().hex  # this gateway's claims, for as long as it runs
        self._recent: OrderedDict[str, tuple[float, ev.EventAck]] = OrderedDict()
        self._busy: dict[str, asyncio.Future[ev.EventAck | None]] = {}
        self._claim: Batcher[str, ev.EventAck | Claim] = Batcher(self._claim_batch)
        self._user: Batcher[str, UserAddress] = Batcher(self._users_batch)
        self._record: Batcher[Answer, None] = Batcher(self._record_batch)

    async def handle(self, event: ev.UserEvent) -> ev.EventAck | None:
        """The answer for one event, delivering it only if no answer was given before; None
        while another gateway holds its claim (no ack: the sender resends it later).

        The answer is committed to PostgreSQL before this returns, and the caller acks only
        then: a crash before the commit leaves the event unacked, and the sender resends it.
        Concurrent calls share their database round trips (:class:`Batcher`)."""
        problem = _invalid(event)
        if problem:
            self.metrics.critical.labels("invalid").inc()
            return ev.EventAck(event_id=event.event_id, status=ev.ERROR, error_message=problem)
        known = self._remembered(event.event_id)
        if known is None and event.event_id in self._busy:  # a resend while we still work
            known = await asyncio.shield(self._busy[event.event_id])
            if known is None:
                self.metrics.critical.labels("elsewhere").inc()
                return None
        if known is not None:
            self.metrics.critical.labels("duplicate").inc()
            self._remember(known)
            return known
        # Claimed before the first await, so a copy in the same batch waits for this one.
        done: asyncio.Future[ev.EventAck | None] = asyncio.get_running_loop().create_future()
        self._busy[event.event_id] = done
        try:
            verdict = await self._claim(event.event_id)
            if verdict is Claim.ELSEWHERE:
                self.metrics.critical.labels("elsewhere").inc()
                done.set_result(None)
                return None
            if isinstance(verdict, ev.EventAck):
                self.metrics.critical.labels("duplicate").inc()
                ack = verdict
            else:
                # Within the claim's lease, so no other gateway delivers it meanwhile; past
                # it, no answer (the container resends, and the next claim decides).
                async with asyncio.timeout(self.lease_s * DELIVER_SHARE):
                    answer = await self._deliver(event, 0, 0)
                await self._record(answer)
                ack = answer.ack
                self.metrics.critical.labels(ev.AckStatus.Name(ack.status).lower()).inc()
            done.set_result(ack)
        except BaseException as exc:
            done.set_exception(exc)
            done.exception()  # retrieved: a waiting resend sees it, nobody else must
            raise
        finally:
            del self._busy[event.event_id]
        self._remember(ack)
        return ack

    async def _deliver(self, event: ev.UserEvent, start: int, attempts: int) -> Answer:
        user: UserAddress | None = None  # looked up once, and only for a channel that needs it
        rendered = self.symbols.render(event)
        reasons: list[str] = []
        prefs = list(event.delivery.channels) or [ev.ChannelPreference(channel=ev.ACTIVE_SESSION)]
        for index in range(start, len(prefs)):
            pref = prefs[index]
            name = ev.ChannelType.Name(pref.channel)
            if pref.only_if_active and not self.sessions.active(event.user_id):
                reasons.append(f"{name}: skipped, no active session")
                continue
            channel = self.channels.get(pref.channel)
            if channel is None:
                reasons.append(f"{name}: not available")
                continue
            if pref.channel in SESSION_CHANNELS:
                address = UserAddress(event.user_id)  # a session is found by its user id
            else:
                if user is None:
                    user = await self._user(event.user_id)
                address = user
            try:
                result = await channel.send(address, event, rendered)
            except Exception as exc:  # a channel bug must not lose the event
                log.exception("channel %s failed on %s", name, event.event_id)
                result = Result(Outcome.RETRY, f"{type(exc).__name__}", 30.0)
            self.metrics.channel.labels(name.lower(), result.outcome.value).inc()
            if result.outcome is Outcome.DELIVERED:
                return Answer(ev.EventAck(event_id=event.event_id, status=ev.DELIVERED))
            if result.outcome is Outcome.RETRY:
                ack = ev.EventAck(
                    event_id=event.event_id,
                    status=ev.QUEUED,
                    error_message=f"{name}: {result.detail}",
                )
                due = time.time() + max(result.retry_after_s, 0.05)
                return Answer(ack, Retry(event, index, attempts + 1), due)
            reasons.append(f"{name}: {result.detail}")
        message = "; ".join(reasons) or "no channel preference"
        return Answer(ev.EventAck(event_id=event.event_id, status=ev.ERROR, error_message=message))

    # -- one database round trip per batch --------------------------------------------------

    async def _claim_batch(self, event_ids: list[str]) -> list[ev.EventAck | Claim]:
        answers, ours = await self.directory.claim(
            event_ids, self.window_s, self.owner, self.lease_s
        )
        return [
            a if (a := answers.get(e)) is not None else Claim.OURS if e in ours else Claim.ELSEWHERE
            for e in event_ids
        ]

    def release(self) -> int:
        """Give up this gateway's claims on events it has not answered (it is stopping)."""
        return self.directory.release(self.owner)

    async def _users_batch(self, user_ids: list[str]) -> list[UserAddress]:
        found = await self.directory.users(user_ids)
        return [found[u] for u in user_ids]

    async def _record_batch(self, answers: list[Answer]) -> list[None]:
        await self.directory.record(answers)
        return [None] * len(answers)

    async def retry_due(self) -> int:
        """Deliver the queued events that are due; the number tried."""
        due = await asyncio.to_thread(self.directory.claim_due, RETRY_LEASE_S)
        for item in due:
            answer = await self._deliver(item.event, item.channel_index, item.attempts)
            ack, retry, event_id = answer.ack, answer.retry, item.event.event_id
            if retry is not None and retry.attempts <= self.max_retries:
                await asyncio.to_thread(self.directory.reschedule, retry, answer.due_at)
                continue
            await asyncio.to_thread(self.directory.finish, event_id)
            outcome = ev.AckStatus.Name(ack.status).lower() if retry is None else "gave_up"
            self.metrics.retries.labels(outcome).inc()
            if ack.status != ev.DELIVERED:
                log.warning("queued event %s not delivered: %s", event_id, ack.error_message)
        return len(due)

    def _remembered(self, event_id: str) -> ev.EventAck | None:
        hit = self._recent.get(event_id)
        if hit is None or hit[0] < time.monotonic() - self.window_s:
            return None
        return hit[1]

    def _remember(self, ack: ev.EventAck) -> None:
        now = time.monotonic()
        self._recent[ack.event_id] = (now, ack)
        self._recent.move_to_end(ack.event_id)
        while self._recent and (
            len(self._recent) > MAX_REMEMBERED
            or next(iter(self._recent.values()))[0] < now - self.window_s
        ):
            self._recent.popitem(last=False)


def _invalid(event: ev.UserEvent) -> str:
    """Why an event cannot be answered ("" if it can). Checked before it joins a batch: a
    value the database refuses would fail the statement, and so every event batched with
    it, at every resend."""
    if not event.event_id or not event.user_id:
        return "event_id and user_id are required"
    if any(len(x) > MAX_ID or "\x00" in x for x in (event.event_id, event.user_id)):
        return f"event_id and user_id must be at most {MAX_ID} characters, without NUL"
    return ""
