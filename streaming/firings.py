"""CEP firings, exactly once: recorded with the committing query's commit (#19).

Each batch the committing query (:mod:`streaming.queries.ticks`) takes the batch's trigger
registrations (carried beside the decoded trades, :data:`streaming.decode.CONTROL`) and the
trades and idle marks of the feeds with triggers, in Kafka order, into
:class:`streaming.cep.Triggers` (:meth:`FiringDesk.evaluate`), and records the triggers'
state and the batch's firings in the same PostgreSQL row as the rest of the batch
(:class:`streaming.recovery.Ledger`). Only then are the firings sent, and marked sent. The
fast path (:mod:`streaming.queries.cep`) has usually sent them already, within a second of
the trade, from the same state and the same records: the same (trigger_id, firing).

- A crash before the record: the batch is replayed from the state before it, and makes
  the same firings, which nobody has seen yet.
- A crash after the record and before "sent": the restart sends the recorded firings. A
  client may then get a firing twice, with the same (trigger_id, firing): it keeps the first
  (:class:`candlewire._protocol.NotificationInbox`).

A one-shot trigger that fired is removed from the registry, so the desk's list forgets it.
A firing of a trigger with a user is also that user's ``ALERT_TRIGGERED`` UserEvent (see
:func:`alert`): CRITICAL through the gateways' acked path when the trigger asks for it, so it
reaches Telegram or email when the user has no session; else informational, on the live
page of an open session.
"""

from __future__ import annotations

import json
import logging
import pickle
import time
from decimal import Decimal

import pyarrow as pa
import pyarrow.compute as pc
from confluent_kafka import Producer
from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from candlewire.events import EventPublisher
from candlewire.kafka import TRIGGERS, producer_config
from proto import cep_pb2 as cep
from proto import events_pb2 as ev
from proto.envelope import EnvelopeError, from_record, to_record
from streaming.cep import Event, Firing, Triggers
from streaming.context import JobContext
from streaming.recovery import Restored

log = logging.getLogger("candlewire.stream.firings")
# What one recorded firing needs to be sent: its topic, the event, whether its trigger was
# one-shot (then its registration is removed), and whether its alert is critical.
Pending = list[tuple[str, bytes, bool, bool]]
# An alert tries the user's open session first, then the channels that reach them offline.
ALERT_CHANNELS = [
    ev.ChannelPreference(channel=ev.ACTIVE_SESSION, only_if_active=True),
    *(ev.ChannelPreference(channel=c) for c in (ev.TELEGRAM, ev.EMAIL, ev.PUSH)),
]


def alert(event: cep.CEPTriggerEvent, critical: bool) -> ev.UserEvent:
    """The firing as the user's ALERT_TRIGGERED event. Its id is the firing's, so the
    gateway delivers a firing sent twice once."""
    payload = {
        "trigger_id": event.trigger_id,
        "ticker": event.ticker,
        "value": event.value,
        "reference": event.reference,
        "firing": event.firing,
        "event_time_ms": event.event_time_ms,
    }
    return ev.UserEvent(
        user_id=event.user_id,
        event_id=f"cep:{event.trigger_id}:{event.firing}",
        timestamp=event.fired_time_ms,
        event_type=ev.ALERT_TRIGGERED,
        payload=json.dumps(payload).encode(),
        delivery=ev.DeliverySpec(
            priority=ev.CRITICAL if critical else ev.INFORMATIONAL, channels=ALERT_CHANNELS
        ),
    )


class FiringDesk:
    def __init__(self, ctx: JobContext, run_id: str) -> None:
        self.ctx = ctx
        self.run_id = run_id
        self._producer = Producer(producer_config(ctx.settings))
        # Alerts wait in this journal until a gateway acks them (critical ones), across
        # restarts of the job too.
        self.alerts = EventPublisher(
            ctx.settings,
            journal=ctx.settings.state_dir / "stream-events" / "pending.db",
            endpoint="stream_events",
        ).start()

    def restored_state(self, restored: Restored) -> Triggers:
        """The triggers as of the last commit: each evaluating query starts from its own
        copy."""
        if restored.cep_state:
            try:
                return Triggers.loads(restored.cep_state)
            except Exception as exc:  # a record of another release: start from the registry
                log.warning("recorded trigger state not readable (%s): starting empty", exc)
        settings = self.ctx.settings
        return Triggers(settings.stream_watermark_s, settings.stream_dedup_horizon_s)

    def restore(self, restored: Restored) -> Triggers:
        """The committing query's state; the last commit's firings sent if they may not
        have been."""
        triggers = self.restored_state(restored)
        if restored.cep_pending:
            self.send(restored.cep_pending, restored.candles_batch)
        log.info("%d feeds with CEP triggers restored", len(triggers.tickers()))
        return triggers

    def emit(self, fired: list[Firing]) -> None:
        """The fast path's firings: on the owners' topics, and as alerts."""
        now_ms = int(time.time() * 1000)
        for f in fired:
            self._deliver(f.trigger.notification_topic, f.event(now_ms), f.trigger.critical)

    def evaluate(
        self,
        triggers: Triggers,
        df: DataFrame,
        registrations: list[tuple[int, int, cep.CEPTriggerRequest]],
    ) -> list[Firing]:
        """The batch's registrations and the trades and idle marks of the feeds with
        triggers, in Kafka order."""
        tickers = triggers.tickers() | {r.ticker for _, _, r in registrations}
        if not tickers:
            return []
        rows = (
            df.where(F.col("ticker").isin(sorted(tickers)) & (F.col("valid") | F.col("idle")))
            .select(*EVALUATED)
            .toArrow()
        )
        fired = triggers.judge(in_order(registrations, rows.to_pylist()))
        self.ctx.metrics.trigger_firings.inc(len(fired))
        return fired

    def pending(self, fired: list[Firing]) -> bytes | None:
        if not fired:
            return None
        now_ms = int(time.time() * 1000)
        items: Pending = [
            (
                f.trigger.notification_topic,
                f.event(now_ms).SerializeToString(),
                f.trigger.once,
                f.trigger.critical,
            )
            for f in fired
        ]
        return pickle.dumps(items)

    def send(self, pending: bytes, batch_id: int) -> None:
        items: Pending = pickle.loads(pending)
        for topic, data, once, critical in items:
            event = cep.CEPTriggerEvent.FromString(data)
            # Informational alerts went with the fast path: the gateways deduplicate only
            # the acked ones.
            self._deliver(topic, event, critical, informational=False)
            if once:
                done = cep.CEPTriggerRequest(
                    trigger_id=event.trigger_id,
                    client_id=event.client_id,
                    user_id=event.user_id,
                    ticker=event.ticker,
                    action=cep.REMOVE,
                )
                self._producer.produce(
                    TRIGGERS.name, key=event.trigger_id.encode(), value=to_record(done)
                )
            log.info("trigger %s fired (%d): %s", event.trigger_id, event.firing, event.value)
        self._producer.flush(10)
        self.ctx.progress.sent_pending(self.run_id, batch_id)

    def _deliver(
        self, topic: str, event: cep.CEPTriggerEvent, critical: bool, informational: bool = True
    ) -> None:
        """On the owner's topic, and as the user's alert."""
        self.ctx.publisher.notify(topic, event)
        self.ctx.metrics.notifications.labels("cep_trigger_event").inc()
        if event.user_id and (critical or informational):
            self.alerts.publish(alert(event, critical))

    def close(self) -> None:
        self.alerts.close()
        self._producer.flush(10)


EVALUATED = (
    "ticker",
    "idle",
    "exchange_time_ns",
    "price",
    "size",
    "trade_id",
    "partition",
    "offset",
)


def in_order(
    registrations: list[tuple[int, int, cep.CEPTriggerRequest]], rows: list[dict]
) -> list[Event]:
    """Registrations and decoded rows (:data:`EVALUATED`) as one sequence in Kafka order."""
    events: list[tuple[int, int, Event]] = list(registrations)
    for r in rows:
        t = r["exchange_time_ns"]
        item: Event = (
            (r["ticker"], t)
            if r["idle"]
            else (r["ticker"], t, Decimal(r["price"]), Decimal(r["size"]), r["trade_id"] or "")
        )
        events.append((r["partition"], r["offset"], item))
    events.sort(key=lambda e: (e[0], e[1]))
    return [e for _, _, e in events]


def registrations_in(rows: pa.Table) -> list[tuple[int, int, cep.CEPTriggerRequest]]:
    """(partition, offset, request) of the trigger registrations among decoded rows that
    carry the ``control`` column (:data:`streaming.decode.CONTROL`)."""
    out = []
    mask = pc.is_valid(rows["control"])
    if not pc.any(mask).as_py():
        return out
    hits = rows.filter(mask)
    for value, partition, offset in zip(
        *(hits[c].to_pylist() for c in ("control", "partition", "offset")), strict=True
    ):
        try:
            msg = from_record(value)
        except EnvelopeError:
            continue
        if isinstance(msg, cep.CEPTriggerRequest):
            out.append((partition, offset, msg))
    return out
