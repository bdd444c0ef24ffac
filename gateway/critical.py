"""The critical path: deliver a UserEvent by its channel preferences, answer an EventAck.

- Preferences are tried in order. ``only_if_active`` skips a channel unless the user has a
  live session here. The first channel that delivers ends it: DELIVERED.
- A channel that says "later" (a Telegram 429 with ``retry_after``, an SMTP 4xx, an
  unreachable service) ends it with QUEUED. The retry is stored in PostgreSQL in the same
  transaction as the answer, and any gateway retries it when due, starting from that channel;
  once that channel had ``max_retries`` retries, from the next preference. A gateway claims
  due retries for ``claim_lease_s`` and settles each only while its claim holds.
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
import sys
import time
import uuid
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Generic, TypeVar

from gateway.channels import MAX_RETRY_AFTER_S, Channel, Outcome, Result
from gateway.directory import Answer, Directory, Retry, UserAddress
from gateway.metrics import GatewayMetrics
from gateway.sessions import Sessions
from gateway.symbols import Rendered, SymbolCatalog
from proto import events_pb2 as ev
from proto.envelope import Names

log = logging.getLogger("candlewire.gateway.critical")
# A number this build does not name (a newer container's channel) is shown as the number.
ACK_STATUSES, CHANNEL_TYPES = Names.of(ev.AckStatus), Names.of(ev.ChannelType)

MAX_REMEMBERED = 100_000  # beyond this, the dedup window is served by PostgreSQL alone
MAX_BATCH = 512  # rows per database round trip
MAX_ID = 128  # characters in an event or user id: the width of the tables' key columns
DELIVER_SHARE = 0.8  # of the claim's lease a delivery may take; the rest is for the commit

# Called once for each event of a batch with its answer (see CriticalDelivery.handle).
Reply = Callable[[int, "ev.EventAck | BaseException | None"], None]
K = TypeVar("K")
V = TypeVar("V")


class Batcher(Generic[K, V]):
    """Group commit: the groups that arrive while one batch is in the database wait and go
    together in the next. So the events in flight cost one round trip (and one commit) per
    stage, and nothing waits on a timer: a lone group goes at once. One batch at a time, of
    whole groups up to ``max_batch`` items (a larger group goes alone); ``run`` answers a
    batch in its order, and each caller gets its group's answers."""

    def __init__(
        self, run: Callable[[list[K]], Awaitable[Sequence[V]]], max_batch: int = MAX_BATCH
    ) -> None:
        self._run, self._max = run, max_batch
        self._queue: list[tuple[list[K], asyncio.Future[list[V]]]] = []
        self._worker: asyncio.Task[None] | None = None

    async def __call__(self, items: list[K]) -> list[V]:
        loop = asyncio.get_running_loop()
        future: asyncio.Future[list[V]] = loop.create_future()
        self._queue.append((items, future))
        if self._worker is None or self._worker.done():
            self._worker = loop.create_task(self._drain())
        return await future

    async def _drain(self) -> None:
        batch: list[tuple[list[K], asyncio.Future[list[V]]]] = []
        try:
            while self._queue:
                taken = size = 0
                for items, _ in self._queue:
                    if taken and size + len(items) > self._max:
                        break
                    taken, size = taken + 1, size + len(items)
                batch, self._queue = self._queue[:taken], self._queue[taken:]
                try:
                    results = await self._run([item for items, _ in batch for item in items])
                    if len(results) != size:
                        raise RuntimeError(f"{len(results)} answers to a batch of {size}")
                except Exception as exc:  # each caller sees it: no answer, no ack
                    for _, future in batch:
                        if not future.done():
                            future.set_exception(exc)
                    continue
                start = 0
                for items, future in batch:
                    if not future.done():
                        future.set_result(list(results[start : start + len(items)]))
                    start += len(items)
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
        self._recent: Window[ev.EventAck] = Window(dedup_window_s)
        # Answers delivered whose commit failed (no ack went out): the resend is then
        # recorded with this answer, not delivered a second time (taken once, within the
        # window: a gateway that restarted meanwhile delivers it again, at least once).
        self._unrecorded: Window[Answer] = Window(dedup_window_s)
        self._busy: dict[str, asyncio.Future[ev.EventAck | None]] = {}
        self._claim: Batcher[str, ev.EventAck | Claim] = Batcher(self._claim_batch)
        self._user: Batcher[str, UserAddress] = Batcher(self._users_batch)
        self._record: Batcher[Answer, None] = Batcher(self._record_batch)
        self._counters = {
            name: metrics.critical.labels(name)
            for name in ("invalid", "duplicate", "elsewhere", "delivered", "queued", "error")
        }

    def _count(self, result: str) -> None:
        counter = self._counters.get(result)
        (counter if counter is not None else self.metrics.critical.labels(result)).inc()

    async def handle(self, events: Sequence[ev.UserEvent], reply: Reply) -> None:
        """Answer a batch of events (one turn of the ROUTER), delivering each only if no
        answer was given before. ``reply(i, answer)`` is called once for each event, as soon
        as its answer is known: an EventAck; None while another gateway holds its claim; an
        exception when it could not be answered. Only an EventAck is acked: otherwise the
        sender resends the event later. A slow channel delays only its own event.

        An answer is committed to PostgreSQL before it is replied: a crash before the commit
        leaves the event unacked, and the sender resends it. The batch shares its database
        round trips, with the other batches in flight too (:class:`Batcher`), and so do the
        deliveries that finish together. Only the deliveries run as a task an event (a
        channel may wait on a remote service), each with its deadline: against a task, three
        futures and two callbacks an event, that cut this path's Python by about a quarter."""
        loop = asyncio.get_running_loop()
        fresh: list[int] = []
        waits: list[tuple[int, asyncio.Future[ev.EventAck | None]]] = []
        mine: dict[str, asyncio.Future[ev.EventAck | None]] = {}
        try:
            for i, event in enumerate(events):
                problem = _invalid(event)
                event_id = event.event_id
                if problem:
                    self._count("invalid")
                    reply(i, ev.EventAck(event_id=event_id, status=ev.ERROR, error_message=problem))
                elif (known := self._recent.get(event_id)) is not None:
                    self._count("duplicate")
                    self._recent.put(known.event_id, known)
                    reply(i, known)
                elif (busy := self._busy.get(event_id)) is not None:  # a resend while we work
                    waits.append((i, busy))
                else:  # claimed before the first await: a copy in this batch or the next waits
                    self._busy[event_id] = mine[event_id] = loop.create_future()
                    fresh.append(i)
            work = [self._answer_copy(i, busy, reply) for i, busy in waits]
            if fresh:
                work.append(self._answer_fresh(events, fresh, mine, reply))
            if len(work) == 1:
                await work[0]
            elif work:  # each to its end, whatever another does: then nothing runs on
                for result in await asyncio.gather(*work, return_exceptions=True):
                    if isinstance(result, BaseException):
                        raise result
        finally:  # whatever went wrong, nobody waits forever on an event of this batch
            for event_id, busy in mine.items():
                if not busy.done():
                    busy.set_exception(RuntimeError("the gateway stopped answering it"))
                    busy.exception()  # retrieved: a waiting resend sees it, nobody else must
                if self._busy.get(event_id) is busy:
                    del self._busy[event_id]

    async def _answer_copy(
        self, i: int, busy: asyncio.Future[ev.EventAck | None], reply: Reply
    ) -> None:
        """A resend that arrived while its first copy is answered: the same answer."""
        try:
            known = await asyncio.shield(busy)
        except Exception as exc:  # the first copy was not answered: neither is this one
            reply(i, exc)
            return
        if known is None:
            self._count("elsewhere")
        else:
            self._count("duplicate")
            self._recent.put(known.event_id, known)
        reply(i, known)

    async def _answer_fresh(
        self,
        events: Sequence[ev.UserEvent],
        fresh: list[int],
        mine: dict[str, asyncio.Future[ev.EventAck | None]],
        reply: Reply,
    ) -> None:
        """Claim the events of a batch seen for the first time; deliver ours, and record and
        reply them as their deliveries finish."""
        loop = asyncio.get_running_loop()
        try:
            verdicts = await self._claim([events[i].event_id for i in fresh])
        except Exception as exc:  # nothing was claimed, nothing delivered
            self._settle(events, [(i, exc) for i in fresh], mine, reply)
            return
        # Within the claims' lease, so no other gateway delivers them meanwhile; past it, no
        # answer (the sender resends, and the next claim decides).
        deadline = loop.time() + self.lease_s * DELIVER_SHARE
        ours: dict[asyncio.Task[Answer], int] = {}
        pending: set[asyncio.Task[Answer]] = set()
        try:
            known: list[tuple[int, ev.EventAck | BaseException | None]] = []
            now: list[tuple[int, Answer | BaseException]] = []  # answered without a wait
            for i, verdict in zip(fresh, verdicts, strict=True):
                if verdict is Claim.ELSEWHERE:
                    self._count("elsewhere")
                    known.append((i, None))
                elif isinstance(verdict, ev.EventAck):
                    self._count("duplicate")
                    known.append((i, verdict))
                elif (done := self._unrecorded.get(events[i].event_id, take=True)) is not None:
                    now.append((i, done))  # delivered before: only its answer to record
                else:
                    try:  # a bug rendering one event (its payload) fails that event alone
                        way = self._way(events[i], 0, 0)
                        step = self._walk(way)
                    except Exception as exc:
                        now.append((i, exc))
                        continue
                    if isinstance(step, Answer):
                        now.append((i, step))
                    else:  # a channel that waits on a service: a task, with a deadline
                        task = loop.create_task(self._deliver_by(way, step, deadline))
                        ours[task] = i
                        pending.add(task)
            self._settle(events, known, mine, reply)
            if now:
                await self._record_done(now, events, mine, reply)
            while pending:
                done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
                finished = [(ours[t], _outcome(t)) for t in done]
                await self._record_done(finished, events, mine, reply)
        finally:  # cancelled (the gateway stops), or a bug: the rest get no answer
            for task in pending:
                task.cancel()
            if pending:
                await asyncio.gather(*pending, return_exceptions=True)

    async def _deliver_by(self, way: _Way, channel: Channel, deadline: float) -> Answer:
        """Deliver from ``channel`` on (where the walk stopped), cut off at the deadline
        (TimeoutError: no answer, no ack)."""
        async with asyncio.timeout_at(deadline):
            return await self._deliver(way, channel)

    async def _record_done(
        self,
        delivered: list[tuple[int, Answer | BaseException]],
        events: Sequence[ev.UserEvent],
        mine: dict[str, asyncio.Future[ev.EventAck | None]],
        reply: Reply,
    ) -> None:
        """Commit the answers of deliveries that finished together, then reply them."""
        done = [(i, a) for i, a in delivered if isinstance(a, Answer)]
        out: list[tuple[int, ev.EventAck | BaseException | None]] = [
            (i, a) for i, a in delivered if not isinstance(a, Answer)
        ]
        if done:
            try:
                await self._record([a for _, a in done])
            except Exception as exc:  # not committed: no ack, the sender resends
                out += [(i, exc) for i, _ in done]
                for _, a in done:
                    self._unrecorded.put(a.ack.event_id, a)
            else:
                for i, a in done:
                    self._count(ACK_STATUSES[a.ack.status].lower())
                    out.append((i, a.ack))
        self._settle(events, out, mine, reply)

    def _settle(
        self,
        events: Sequence[ev.UserEvent],
        answers: list[tuple[int, ev.EventAck | BaseException | None]],
        mine: dict[str, asyncio.Future[ev.EventAck | None]],
        reply: Reply,
    ) -> None:
        """Answers to events this batch claimed: the resends waiting on them are told, the
        acks remembered, then each is replied."""
        for i, answer in answers:
            event_id = events[i].event_id
            busy = mine[event_id]
            if self._busy.get(event_id) is busy:
                del self._busy[event_id]
            if isinstance(answer, BaseException):
                busy.set_exception(answer)
                busy.exception()  # retrieved: a waiting resend sees it, nobody else must
            else:
                busy.set_result(answer)
                if answer is not None:
                    self._recent.put(answer.event_id, answer)
        for i, answer in answers:
            reply(i, answer)

    def _way(self, event: ev.UserEvent, start: int, attempts: int) -> _Way:
        prefs = list(event.delivery.channels) or [ev.ChannelPreference(channel=ev.ACTIVE_SESSION)]
        return _Way(event, prefs, start, attempts, self.symbols.render(event))

    def _walk(self, way: _Way, awaited: Result | None = None) -> Answer | Channel:
        """Down the event's preferences, in order, while no channel needs to wait: the
        answer, or the channel at ``way.index`` that must be awaited (:meth:`_deliver`, which
        brings its result back as ``awaited``). A session channel answers at once
        (``send_now``): most critical events are answered without a task, a deadline or a
        wait of their own."""
        event, result = way.event, awaited
        while True:
            if result is not None:  # the channel at way.index answered
                answer = self._answer(way, result)
                if answer is not None:
                    return answer
                way.index, result = way.index + 1, None
            if way.index >= len(way.prefs):
                break
            pref = way.prefs[way.index]
            if pref.only_if_active and not self.sessions.active(event.user_id):
                reason = "skipped, no active session"
            elif (channel := self.channels.get(pref.channel)) is None:
                reason = "not available"
            elif (send_now := getattr(channel, "send_now", None)) is None:
                return channel
            else:  # a session is found by its user id: no address needed
                try:
                    result = send_now(UserAddress(event.user_id), event, way.rendered)
                except Exception:
                    result = self._failed(way)
                continue
            way.reasons.append(f"{way.name}: {reason}")
            way.index += 1
        message = "; ".join(way.reasons) or "no channel preference"
        return Answer(ev.EventAck(event_id=event.event_id, status=ev.ERROR, error_message=message))

    async def _deliver(self, way: _Way, step: Answer | Channel | None = None) -> Answer:
        """The first channel of the event's preferences that delivers, or says "later"
        (QUEUED, with its retry), from ``way.index`` on; ERROR with each one's reason when
        none does. ``step``: where a walk already stopped. The user's address is looked up
        once, and only for a channel that needs it."""
        if step is None:
            step = self._walk(way)
        while not isinstance(step, Answer):
            if way.user is None:
                way.user = (await self._user([way.event.user_id]))[0]
            try:
                result = await step.send(way.user, way.event, way.rendered)
            except Exception:
                result = self._failed(way)
            step = self._walk(way, result)
        return step

    def _failed(self, way: _Way) -> Result:
        """A channel that raised (a bug) must not lose the event: it is retried later. But
        a payload nested past what the encoder can write fails the same way at every retry:
        that channel fails at once, and the event goes on to its next preference (a text
        channel sends the rendered text, not the payload)."""
        if isinstance(sys.exception(), RecursionError):
            log.warning(
                "channel %s cannot send %s: its payload nests too deep",
                way.name,
                way.event.event_id,
            )
            return Result(Outcome.FAILED, "payload nested too deep to send")
        log.exception("channel %s failed on %s", way.name, way.event.event_id)
        return Result(Outcome.RETRY, f"{type(sys.exception()).__name__}", 30.0)

    def _answer(self, way: _Way, result: Result) -> Answer | None:
        """A channel's result as the event's answer, or None (and its reason kept) to try
        the next preference."""
        name, event = way.name, way.event
        self.metrics.channel.labels(name.lower(), result.outcome.value).inc()
        if result.outcome is Outcome.DELIVERED:
            return Answer(ev.EventAck(event_id=event.event_id, status=ev.DELIVERED))
        if result.outcome is Outcome.RETRY:
            ack = ev.EventAck(
                event_id=event.event_id, status=ev.QUEUED, error_message=f"{name}: {result.detail}"
            )
            # Bounded both ways, every channel alike (a NaN falls to the least: max keeps
            # its first argument unless the second compares greater).
            due = time.time() + min(MAX_RETRY_AFTER_S, max(0.05, result.retry_after_s))
            return Answer(ack, Retry(event, way.index, way.attempts + 1), due)
        way.reasons.append(f"{name}: {result.detail}")
        return None

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
        """Deliver the queued events that are due, together, each within the claims' lease
        (past it another gateway may retry them); the number tried."""
        due, until = await asyncio.to_thread(self.directory.claim_due, self.lease_s)
        deadline = asyncio.get_running_loop().time() + self.lease_s * DELIVER_SHARE
        tried = [self._retry(item, until, deadline) for item in due]
        for result in await asyncio.gather(*tried, return_exceptions=True):
            if isinstance(result, TimeoutError):
                self.metrics.retries.labels("lapsed").inc()  # its lease ends: due again then
            elif isinstance(result, BaseException):
                raise result
        return len(due)

    async def _retry(self, item: Retry, until: float, deadline: float) -> None:
        """One queued event, from the channel that asked to wait. A channel that had its
        ``max_retries`` gives the event to the next of its preferences, afresh."""
        gave_up: list[str] = []
        async with asyncio.timeout_at(deadline):
            answer = await self._deliver(self._way(item.event, item.channel_index, item.attempts))
            while (retry := answer.retry) is not None and retry.attempts > self.max_retries:
                way = self._way(item.event, retry.channel_index + 1, 0)
                gave_up.append(f"{answer.ack.error_message} (retried {self.max_retries} times)")
                way.reasons.extend(gave_up)
                answer = await self._deliver(way)
        ack, retry, event_id = answer.ack, answer.retry, item.event.event_id
        settled = await asyncio.to_thread(
            self.directory.settle_retry, event_id, until, retry, answer.due_at
        )
        if not settled:
            self.metrics.retries.labels("taken_over").inc()  # another's outcome stands
        elif retry is None:
            delivered = ack.status == ev.DELIVERED
            outcome = "gave_up" if gave_up and not delivered else ACK_STATUSES[ack.status].lower()
            self.metrics.retries.labels(outcome).inc()
            if not delivered:
                log.warning("queued event %s not delivered: %s", event_id, ack.error_message)


class Window(Generic[V]):
    """What was seen within the last ``window_s`` by event id, the oldest forgotten first
    and at most MAX_REMEMBERED of them (PostgreSQL serves the rest of the window)."""

    def __init__(self, window_s: float) -> None:
        self.window_s = window_s
        self._seen: OrderedDict[str, tuple[float, V]] = OrderedDict()

    def put(self, key: str, value: V) -> None:
        now, seen = time.monotonic(), self._seen
        seen[key] = (now, value)
        seen.move_to_end(key)
        while seen and (
            len(seen) > MAX_REMEMBERED or next(iter(seen.values()))[0] < now - self.window_s
        ):
            seen.popitem(last=False)

    def get(self, key: str, take: bool = False) -> V | None:
        hit = self._seen.pop(key, None) if take else self._seen.get(key)
        if hit is None or hit[0] < time.monotonic() - self.window_s:
            return None
        return hit[1]


@dataclass
class _Way:
    """An event on its way down its channel preferences: the one it is at, and why those
    before did not deliver."""

    event: ev.UserEvent
    prefs: list[ev.ChannelPreference]
    index: int
    attempts: int
    rendered: Rendered
    reasons: list[str] = field(default_factory=list)
    user: UserAddress | None = None

    @property
    def name(self) -> str:
        return CHANNEL_TYPES[self.prefs[self.index].channel]


def _outcome(task: asyncio.Task[Answer]) -> Answer | BaseException:
    """A finished delivery's answer, or what ended it; one cancelled from inside (a channel
    that let a cancellation out) fails alone, as any other error would."""
    if task.cancelled():
        return RuntimeError("the delivery was cancelled")
    return task.exception() or task.result()


def _invalid(event: ev.UserEvent) -> str:
    """Why an event cannot be answered ("" if it can). Checked before it joins a batch: a
    value the database refuses would fail the statement, and so every event batched with
    it, at every resend."""
    if not event.event_id or not event.user_id:
        return "event_id and user_id are required"
    event_id, user_id = event.event_id, event.user_id
    if len(event_id) > MAX_ID or len(user_id) > MAX_ID or "\x00" in event_id + user_id:
        return f"event_id and user_id must be at most {MAX_ID} characters, without NUL"
    return ""
