"""CEP firings, sent as they are made, each (trigger_id, firing) exactly once (#19).

The live path's evaluator, in the JVM whichever engine feeds it (``jvm/decoder``'s
``Triggers``, started by :mod:`streaming.queries.live`), reads the ticks topic's records in
Kafka order and hands its firings here at once (:meth:`emit_jvm`): onto the owner's
notification topic, and as the user's alert. Every ``stream_cep_record_s`` the triggers'
state is recorded with the Kafka offsets it stands at (:meth:`record_state`, one PostgreSQL
row per run), as ``CepState`` (``proto/cep.proto``), which a restart hands back to it.

Evaluation reads no wall clock, so a restart, which evaluates the records after the last
record again from the state recorded with it, makes the same firings with the same
numbers. A firing sent before a crash may so arrive twice, with the same
:func:`~candlewire.triggers.firing_key`: clients keep the first
(:class:`candlewire._protocol.NotificationInbox`), and the gateways deliver a critical
alert's event id once. A firing not sent before the crash is made after it: none is lost.
A start with no record begins a new line of states (:meth:`FiringDesk.restore`).

A one-shot trigger that fired is removed from the registry, by the trigger desk
(:meth:`streaming.desk.TriggerDesk.fired`), so the desk's list forgets it.
A firing of a trigger with a user is also that user's ``ALERT_TRIGGERED`` UserEvent (see
:func:`alert`): CRITICAL through the gateways' acked path when the trigger asks for it, so it
reaches Telegram or email when the user has no session; else informational, on the live
page of an open session.
"""

from __future__ import annotations

import json
import logging
import time

from google.protobuf.message import DecodeError

from candlewire.config import Settings
from candlewire.curve import PUBLISHER_KEY
from candlewire.events import EventPublisher
from candlewire.kafka import TICKS, TRIGGERS, end_offsets
from candlewire.triggers import Trigger, TriggerRejected, firing_key, parse_trigger
from proto import cep_pb2 as cep
from proto import events_pb2 as ev
from streaming.context import JobContext
from streaming.desk import TriggerDesk, apply_records, registry_records
from streaming.progress import CepCommit

log = logging.getLogger("candlewire.stream.firings")
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
        event_id=firing_event_id(event),
        timestamp=event.fired_time_ms,
        event_type=ev.ALERT_TRIGGERED,
        payload=json.dumps(payload).encode(),
        delivery=ev.DeliverySpec(
            priority=ev.CRITICAL if critical else ev.INFORMATIONAL, channels=ALERT_CHANNELS
        ),
    )


def firing_event_id(event: cep.CEPTriggerEvent) -> str:
    """One firing (:func:`candlewire.triggers.firing_key`). A state recorded before the
    evaluator's line was (0) keeps the ids it gave before."""
    trigger_id, registered_ms, started_ms, firing = firing_key(event)
    line = f":{started_ms}" if started_ms else ""
    return f"cep:{trigger_id}:{registered_ms}:{firing}{line}"


class FiringDesk:
    def __init__(self, ctx: JobContext, run_id: str, desk: TriggerDesk) -> None:
        self.ctx = ctx
        self.run_id = run_id
        self.desk = desk  # takes a one-shot registration that fired out of the registry
        # Alerts wait in this journal until a gateway acks them (critical ones), across
        # restarts of the job too.
        self.alerts = EventPublisher(
            ctx.settings,
            journal=ctx.settings.state_dir / "stream-events" / "pending.db",
            endpoint="stream_events",
            key=PUBLISHER_KEY,
        ).start()

    def restore(self) -> tuple[bytes, list[cep.CEPTriggerRequest], dict[int, int]]:
        """The triggers' state as last recorded (``CepState``) and the offsets to read on
        from.

        Without a readable record (a new checkpoint, or a record of another release) their
        state is lost: the registry's triggers, which the JVM's evaluator applies before the
        first record, start afresh at the ticks topic's end, as if registered now (their
        windows fill from then). Judging the topic's past again would send its old firings
        again, days of them after a new checkpoint. That state begins a line of its own
        (``started_ms``): its firings are numbered from 1 again, and must reach their users,
        not be dropped as repeats of the line before's. The live query records it at once,
        so a restart before its first periodic record goes on from it, not afresh."""
        record = self.ctx.progress.last_cep(self.run_id)
        if record is not None:
            try:
                state = cep.CepState.FromString(record.state)
                log.info("%d feeds with CEP triggers restored", len(state.feeds))
                return record.state, [], record.offsets
            except DecodeError as exc:
                log.warning("recorded trigger state not readable (%s): from the registry", exc)
        # The ends first: an ADD the desk writes meanwhile is then read in the topic.
        offsets = end_offsets(self.ctx.settings, TICKS)
        requests = list(registered(self.ctx.settings).values())
        started_ms = int(time.time() * 1000)
        log.info(
            "%d CEP triggers from the registry, a state begun at %d", len(requests), started_ms
        )
        state = cep.CepState(offsets=offsets, started_ms=started_ms)
        return state.SerializeToString(), requests, offsets

    def emit_jvm(self, data: bytes) -> None:
        """The JVM evaluator's firings (``CepFirings``), each with its trigger."""
        fired, refused = parse_firings(data)
        for trigger_id, why in refused:
            self.ctx.metrics.bad.labels(TRIGGERS.name).inc()
            log.warning("a firing of trigger %r dropped: %s", trigger_id, why)
        self.send(fired)

    def send(self, fired: list[tuple[Trigger, cep.CEPTriggerEvent]]) -> None:
        """On the owners' topics, and as alerts; a one-shot trigger leaves the registry,
        noted before its owner can hear of the firing and add it again."""
        for t, event in fired:
            if t.once:
                self.desk.fired(t.trigger_id, event.registered_ms)
            self.ctx.publisher.notify(t.notification_topic, event)
            if event.user_id:
                self.alerts.publish(alert(event, t.critical))
            log.debug("trigger %s fired (%d): %s", t.trigger_id, event.firing, event.value)
        self.ctx.metrics.notifications.labels("cep_trigger_event").inc(len(fired))
        self.ctx.metrics.trigger_firings.inc(len(fired))

    def record_state(self, commit: CepCommit) -> None:
        # A record past a one-shot's firing: its REMOVE written first, or no record (the
        # firing made again from the record before, after a crash, writes it then).
        if not self.desk.settle():
            raise RuntimeError("a fired one-shot's REMOVE is not in the registry yet")
        self.ctx.progress.record_cep(self.run_id, commit)

    def close(self) -> None:
        self.alerts.close()
        if not self.desk.settle():
            log.warning("a fired one-shot's removal not written: the next start fires it again")


def parse_firings(
    data: bytes,
) -> tuple[list[tuple[Trigger, cep.CEPTriggerEvent]], list[tuple[str, str]]]:
    """A batch of firings with their triggers, and the (trigger id, reason) of each whose
    trigger the desk's rules refuse: one written to Kafka by something other than the desk
    must not cost the batch's other firings, which are taken from the JVM once."""
    fired, refused = [], []
    for f in cep.CepFirings.FromString(data).firings:
        try:
            fired.append((parse_trigger(f.trigger), f.event))
        except TriggerRejected as exc:
            refused.append((f.trigger.trigger_id, str(exc)))
    return fired, refused


def registered(settings: Settings) -> dict[str, cep.CEPTriggerRequest]:
    """The registry's triggers now."""
    out: dict[str, cep.CEPTriggerRequest] = {}
    apply_records(out, registry_records(settings)[0])
    return out
