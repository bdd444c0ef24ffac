"""CEP firings, exactly once: evaluated by the committing query, recorded with its commit,
then sent (#19).

Each batch the committing query (:mod:`streaming.queries.ticks`) reads the registrations
that reached ``candlewire.triggers`` (:meth:`FiringDesk.sync`), judges the batch's timely,
distinct trades and idle marks of the feeds that have triggers, in Kafka order
(:meth:`FiringDesk.evaluate`, :class:`streaming.cep.Triggers`), and records the triggers'
state and the batch's firings in the same PostgreSQL row as the rest of the batch
(:class:`streaming.recovery.Ledger`). Only then are the firings sent, and marked sent.

- A crash before the record: the batch is replayed from the state before it, and makes
  the same firings, which nobody has seen yet.
- A crash after the record and before "sent": the restart sends the recorded firings. A
  client may then get a firing twice, with the same (trigger_id, firing): it keeps the first
  (:class:`candlewire._protocol.NotificationInbox`).

A one-shot trigger that fired is removed from the registry, so the desk's list forgets it.
"""

from __future__ import annotations

import logging
import pickle
import time
from decimal import Decimal

from confluent_kafka import Producer
from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from candlewire.kafka import TRIGGERS, producer_config
from proto import cep_pb2 as cep
from proto.envelope import to_record
from streaming.cep import Firing, Triggers
from streaming.context import JobContext
from streaming.desk import registry_records
from streaming.feeds import Judged
from streaming.recovery import Restored

log = logging.getLogger("candlewire.stream.firings")
# What one recorded firing needs to be sent: its topic, the event, and whether its trigger
# was one-shot (then its registration is removed).
Pending = list[tuple[str, bytes, bool]]


class FiringDesk:
    def __init__(self, ctx: JobContext, run_id: str) -> None:
        self.ctx = ctx
        self.run_id = run_id
        self._producer = Producer(producer_config(ctx.settings))

    def restore(self, restored: Restored) -> Triggers:
        """The triggers as of the last commit; its firings sent if they may not have been."""
        triggers: Triggers | None = None
        if restored.cep_state:
            try:
                triggers = Triggers.loads(restored.cep_state)
            except Exception as exc:  # a record of another release: start from the registry
                log.warning(
                    "recorded trigger state not readable (%s): re-reading the registry", exc
                )
        if triggers is None:
            triggers = Triggers(int(self.ctx.settings.stream_watermark_s * 1e9))
        if restored.cep_pending:
            self.send(restored.cep_pending, restored.candles_batch)
        log.info("%d feeds with CEP triggers restored", len(triggers.tickers()))
        return triggers

    def sync(self, triggers: Triggers) -> None:
        """Registrations since the last batch take effect before this batch's trades."""
        records, triggers.registry_offset = registry_records(
            self.ctx.settings, triggers.registry_offset
        )
        for req in records:
            triggers.apply(req)

    def evaluate(self, triggers: Triggers, df: DataFrame, verdicts: Judged) -> list[Firing]:
        tickers = triggers.tickers()
        if not tickers:
            return []
        rows = (
            df.where(F.col("ticker").isin(tickers) & (F.col("valid") | F.col("idle")))
            .select("ticker", "idle", "exchange_time_ns", "price", "size", "partition", "offset")
            .toArrow()
            .sort_by([("partition", "ascending"), ("offset", "ascending")])
        )
        skip = {*verdicts.duplicates, *verdicts.late}
        judged = [
            (r["ticker"], r["idle"], r["exchange_time_ns"], *_amounts(r))
            for r in rows.to_pylist()
            if (r["partition"], r["offset"]) not in skip
        ]
        fired = triggers.judge(judged)
        self.ctx.metrics.trigger_firings.inc(len(fired))
        return fired

    def pending(self, fired: list[Firing]) -> bytes | None:
        if not fired:
            return None
        now_ms = int(time.time() * 1000)
        items: Pending = [
            (f.trigger.notification_topic, f.event(now_ms).SerializeToString(), f.trigger.once)
            for f in fired
        ]
        return pickle.dumps(items)

    def send(self, pending: bytes, batch_id: int) -> None:
        items: Pending = pickle.loads(pending)
        for topic, data, once in items:
            event = cep.CEPTriggerEvent.FromString(data)
            self.ctx.publisher.notify(topic, event)
            self.ctx.metrics.notifications.labels("cep_trigger_event").inc()
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


def _amounts(row: dict) -> tuple[Decimal | None, Decimal | None]:
    if row["idle"]:
        return None, None
    return Decimal(row["price"]), Decimal(row["size"])
