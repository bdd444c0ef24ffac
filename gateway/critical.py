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
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import OrderedDict

from gateway.channels import Channel, Outcome, Result
from gateway.directory import Directory, Retry
from gateway.metrics import GatewayMetrics
from gateway.sessions import Sessions
from gateway.symbols import SymbolCatalog
from proto import events_pb2 as ev

log = logging.getLogger("candlewire.gateway.critical")

RETRY_LEASE_S = 60.0
MAX_REMEMBERED = 100_000  # beyond this, the dedup window is served by PostgreSQL alone


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
    ) -> None:
        self.directory, self.channels, self.sessions = directory, channels, sessions
        self.symbols, self.metrics = symbols, metrics
        self.window_s, self.max_retries = dedup_window_s, max_retries
        self._recent: OrderedDict[str, tuple[float, ev.EventAck]] = OrderedDict()
        self._busy: dict[str, asyncio.Future[ev.EventAck]] = {}

    async def handle(self, event: ev.UserEvent) -> ev.EventAck:
        """The answer for one event, delivering it only if no answer was given before."""
        if not event.event_id or not event.user_id:
            self.metrics.critical.labels("invalid").inc()
            return ev.EventAck(
                event_id=event.event_id,
                status=ev.ERROR,
                error_message="event_id and user_id are required",
            )
        known = self._remembered(event.event_id)
        if known is None and event.event_id in self._busy:  # a resend while we still work
            known = await asyncio.shield(self._busy[event.event_id])
        if known is None:
            known = await asyncio.to_thread(self.directory.seen, event.event_id, self.window_s)
        if known is not None:
            self.metrics.critical.labels("duplicate").inc()
            self._remember(known)
            return known
        done: asyncio.Future[ev.EventAck] = asyncio.get_running_loop().create_future()
        self._busy[event.event_id] = done
        try:
            ack, retry, due = await self._deliver(event, 0, 0)
            await asyncio.to_thread(self.directory.record, ack, retry, due)
            done.set_result(ack)
        except BaseException as exc:
            done.set_exception(exc)
            done.exception()  # retrieved: a waiting resend sees it, nobody else must
            raise
        finally:
            del self._busy[event.event_id]
        self._remember(ack)
        self.metrics.critical.labels(ev.AckStatus.Name(ack.status).lower()).inc()
        return ack

    async def _deliver(
        self, event: ev.UserEvent, start: int, attempts: int
    ) -> tuple[ev.EventAck, Retry | None, float]:
        user = await asyncio.to_thread(self.directory.user, event.user_id)
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
            try:
                result = await channel.send(user, event, rendered)
            except Exception as exc:  # a channel bug must not lose the event
                log.exception("channel %s failed on %s", name, event.event_id)
                result = Result(Outcome.RETRY, f"{type(exc).__name__}", 30.0)
            self.metrics.channel.labels(name.lower(), result.outcome.value).inc()
            if result.outcome is Outcome.DELIVERED:
                return ev.EventAck(event_id=event.event_id, status=ev.DELIVERED), None, 0.0
            if result.outcome is Outcome.RETRY:
                retry = Retry(event, index, attempts + 1)
                ack = ev.EventAck(
                    event_id=event.event_id,
                    status=ev.QUEUED,
                    error_message=f"{name}: {result.detail}",
                )
                return ack, retry, time.time() + max(result.retry_after_s, 0.05)
            reasons.append(f"{name}: {result.detail}")
        message = "; ".join(reasons) or "no channel preference"
        return (
            ev.EventAck(event_id=event.event_id, status=ev.ERROR, error_message=message),
            None,
            0.0,
        )

    async def retry_due(self) -> int:
        """Deliver the queued events that are due; the number tried."""
        due = await asyncio.to_thread(self.directory.claim_due, RETRY_LEASE_S)
        for item in due:
            ack, retry, when = await self._deliver(item.event, item.channel_index, item.attempts)
            event_id = item.event.event_id
            if retry is not None and retry.attempts <= self.max_retries:
                await asyncio.to_thread(self.directory.reschedule, retry, when)
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
