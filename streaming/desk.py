"""The trigger desk: the stream processor's side of CEP trigger registration (#19).

The relay checks a request on its face and hands it over on the work queue
(:func:`~candlewire.topics.trigger_work_topic`); it keeps nothing. The desk decides what needs
state, and answers with ``CEPTriggerAck`` on the request's notification topic:

- ADD: the ticker must be listed in symbol metadata (and not delisted), the owner (the
  trigger's user, else with CURVE on the key its client id is under, else the client id)
  below ``cep_max_triggers_per_owner`` and the registry below ``cep_max_triggers``, and the id
  new, or the same trigger sent again (a client's retry is accepted twice, stored once).
- REMOVE: only the trigger's own client may remove it.
- LIST: the client's triggers.

A one-shot trigger that fired leaves the registry through the desk too (:meth:`TriggerDesk.fired`,
called by the firing path before the owner hears of the firing): the desk writes its REMOVE in
order with its own writes, before it handles another request. So the same trigger added again
after its firing is a new registration, not a retry of the one that fired, and a firing made
again after a restart takes out no registration added since.

The registry is the compacted Kafka topic ``candlewire.triggers``, keyed by trigger id: the
desk reads it whole at start and writes each change there, synchronously, before it
acknowledges, so an accepted trigger survives a restart of the job and of the relay. Each
change also goes into the ticks topic under its ticker: the live path's evaluator
(:mod:`streaming.queries.live`) meets it at the same place among the feed's trades, so a
restart from a recorded state agrees on what fires.
"""

from __future__ import annotations

import logging
import threading
import time

import zmq
from confluent_kafka import Consumer, Producer, TopicPartition

from candlewire.config import Settings
from candlewire.curve import DESK_KEY, dial, owner_of
from candlewire.kafka import TICKS, TRIGGERS, consumer_config, producer_config
from candlewire.symbols import SymbolCatalog
from candlewire.topics import trigger_work_topic
from candlewire.triggers import TriggerRejected, check_owner, parse_trigger
from candlewire.zmqutil import harden
from proto import cep_pb2 as cep
from proto.envelope import EnvelopeError, decode_sub, from_record, to_record
from streaming.context import JobContext

log = logging.getLogger("candlewire.stream.desk")

RELOAD_SYMBOLS_S = 5.0  # an unknown ticker reloads symbol metadata at most this often
CATCH_UP_S = 2.0  # how often the registry topic is read for changes others made


def registry_records(
    settings: Settings, start: int = 0, timeout: float = 30.0
) -> tuple[list[cep.CEPTriggerRequest], int]:
    """The triggers topic from ``start`` to its end as of now: its records in order, and the
    offset after them. An undecodable record is skipped (and logged)."""
    consumer = Consumer(consumer_config(settings, "candlewire-triggers"))
    records: list[cep.CEPTriggerRequest] = []
    try:
        low, high = consumer.get_watermark_offsets(TopicPartition(TRIGGERS.name, 0), timeout)
        start = max(start, low)
        if high <= start:
            return records, max(start, high)
        consumer.assign([TopicPartition(TRIGGERS.name, 0, start)])
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            msg = consumer.poll(0.5)
            if msg is None or msg.error():
                continue
            try:
                req = from_record(msg.value())
            except EnvelopeError:
                log.warning("triggers topic: undecodable record at offset %d", msg.offset())
                req = None
            if isinstance(req, cep.CEPTriggerRequest):
                records.append(req)
            if msg.offset() >= high - 1:
                return records, high
        raise TimeoutError(f"{TRIGGERS.name} not read to its end within {timeout:.0f}s")
    finally:
        consumer.close()


def apply_records(
    registry: dict[str, cep.CEPTriggerRequest], records: list[cep.CEPTriggerRequest]
) -> None:
    """The registry's records onto its triggers by id: an ADD holds, a REMOVE takes away."""
    for req in records:
        if req.action == cep.ADD:
            registry[req.trigger_id] = req
        else:
            registry.pop(req.trigger_id, None)


def same_trigger(a: cep.CEPTriggerRequest, b: cep.CEPTriggerRequest) -> bool:
    """The same registration sent again: everything but the fields the path fills in."""
    strip = ("request_id", "registered_ms", "notification_topic")
    x, y = cep.CEPTriggerRequest(), cep.CEPTriggerRequest()
    x.CopyFrom(a)
    y.CopyFrom(b)
    for m in (x, y):
        for f in strip:
            m.ClearField(f)  # type: ignore[arg-type]
    return x == y


def removal(held: cep.CEPTriggerRequest, registered_ms: int) -> cep.CEPTriggerRequest:
    """The REMOVE of a held registration, as the registry keeps it: its owner's, stamped
    ``registered_ms`` (the removal's time, or the fired registration's own)."""
    return cep.CEPTriggerRequest(
        trigger_id=held.trigger_id,
        client_id=held.client_id,
        user_id=held.user_id,
        ticker=held.ticker,
        action=cep.REMOVE,
        registered_ms=registered_ms,
    )


class TriggerDesk(threading.Thread):
    def __init__(self, ctx: JobContext) -> None:
        super().__init__(name="trigger-desk", daemon=True)
        self.ctx = ctx
        self.settings = ctx.settings
        self.symbols = SymbolCatalog(ctx.settings)
        records, self._offset = registry_records(ctx.settings)
        self.registry: dict[str, cep.CEPTriggerRequest] = {}
        apply_records(self.registry, records)
        self._caught_up = time.monotonic()
        # One-shot registrations that fired, (trigger id, registered_ms), noted by the live
        # path's thread and dropped once their REMOVE is written: at most one entry a
        # registration and firing, so bounded by the registry.
        self._fired: list[tuple[str, int]] = []
        self._fired_lock = threading.Lock()  # the list only: never held across Kafka's I/O
        self._lock = threading.Lock()  # the registry: the desk's thread, and settle()'s
        self._producer = Producer(producer_config(ctx.settings))
        self._stopping = threading.Event()
        self._reloaded = 0.0
        self._zmq = zmq.Context()
        self._sub = harden(
            self._zmq.socket(zmq.SUB), max_message_bytes=ctx.settings.max_message_bytes
        )
        dial(self._sub, ctx.settings, "relay", DESK_KEY)
        self._sub.subscribe(trigger_work_topic())
        self._sub.connect(ctx.settings.connect("work_queue"))
        log.info("trigger desk: %d triggers registered", len(self.registry))

    def run(self) -> None:
        self.symbols.reload()
        self._reloaded = time.monotonic()
        while not self._stopping.is_set():
            with self._lock:
                self._retire_fired()
                if time.monotonic() - self._caught_up >= CATCH_UP_S:
                    self._catch_up()
            if not self._sub.poll(200):
                continue
            frames = self._sub.recv_multipart()
            try:
                _topic, req = decode_sub(frames)
            except EnvelopeError as exc:
                self.ctx.metrics.trigger_requests.labels(f"dropped_{exc.reason}").inc()
                continue
            if not isinstance(req, cep.CEPTriggerRequest) or not req.notification_topic:
                self.ctx.metrics.trigger_requests.labels("dropped_unexpected").inc()
                continue
            with self._lock:
                ack = self.handle(req)
            self.ctx.metrics.trigger_requests.labels(
                "accepted" if ack.accepted else "refused"
            ).inc()
            self.ctx.publisher.notify(req.notification_topic, ack)

    def fired(self, trigger_id: str, registered_ms: int) -> None:
        """A one-shot registration fired: out of the registry before the next request is
        handled. Thread-safe; called before the firing is sent."""
        with self._fired_lock:
            self._fired.append((trigger_id, registered_ms))

    def settle(self) -> bool:
        """Every one-shot noted as fired out of the registry now, from any thread: before
        the triggers' state that passed its firing is recorded, and at the job's stop.
        False while a REMOVE could not be written (Kafka away): the desk tries again."""
        if not self._fired:
            return True  # the common case: nothing fired, and the desk's lock not waited for
        with self._lock:
            return self._retire_fired()

    def _retire_fired(self) -> bool:
        """The REMOVE of each one-shot registration that fired and is still held, in the
        order they fired; True when none is left to write. One added again since, or a
        firing made again after a restart, finds another registration (or none) under the
        id, and nothing is written."""
        while True:
            with self._fired_lock:
                if not self._fired:
                    return True
                trigger_id, registered_ms = self._fired[0]
            held = self.registry.get(trigger_id)
            # (A firing restored from an older release's record names no registration.)
            if held is not None and (not registered_ms or held.registered_ms == registered_ms):
                try:  # the evaluator removed it itself: the registry only
                    self._produce(
                        TRIGGERS.name, trigger_id, removal(held, registered_ms), "the registry"
                    )
                except TriggerRejected as exc:
                    log.warning("fired one-shot %s not yet removed: %s", trigger_id, exc)
                    return False
                del self.registry[trigger_id]
            with self._fired_lock:
                self._fired.pop(0)

    def _catch_up(self) -> None:
        """Our own changes and any others made (a registry written by an older release), in
        the topic's order."""
        self._caught_up = time.monotonic()
        try:
            records, self._offset = registry_records(self.settings, self._offset, timeout=5.0)
        except Exception as exc:  # Kafka away for a moment: try again later
            log.warning("trigger registry not read: %s", exc)
            return
        apply_records(self.registry, records)

    def handle(self, req: cep.CEPTriggerRequest) -> cep.CEPTriggerAck:
        self._retire_fired()  # a firing noted while this request was on its way comes first
        ack = cep.CEPTriggerAck(trigger_id=req.trigger_id, request_id=req.request_id)
        try:
            check_owner(req)
            with self._fired_lock:
                unretired = any(t == req.trigger_id for t, _ in self._fired)
            if req.action != cep.LIST and unretired:
                raise TriggerRejected(
                    cep.TRIGGER_REJECT_REASON_UNSPECIFIED,
                    f"trigger {req.trigger_id} fired and its removal is not recorded yet: "
                    "try again",
                )
            if req.action == cep.LIST:
                mine = sorted(
                    (t for t in self.registry.values() if t.client_id == req.client_id),
                    key=lambda t: t.registered_ms,
                )
                ack.triggers.extend(mine)
            elif req.action == cep.REMOVE:
                self._remove(req)
            else:
                self._add(req)
        except TriggerRejected as exc:
            ack.reason, ack.error_message = exc.reason, exc.message  # type: ignore[assignment]
            return ack
        ack.accepted = True
        return ack

    def _add(self, req: cep.CEPTriggerRequest) -> None:
        trigger = parse_trigger(req)
        held = self.registry.get(req.trigger_id)
        if held is not None:
            if same_trigger(held, req):
                return
            # Ids are one namespace: another client's is named as taken, nothing more.
            mine = held.client_id == req.client_id
            why = "exists with another condition" if mine else "is in use: choose another id"
            raise TriggerRejected(cep.DUPLICATE_TRIGGER, f"trigger {req.trigger_id} {why}")
        self._check_listed(trigger.ticker)
        if len(self.registry) >= self.settings.cep_max_triggers:
            raise TriggerRejected(
                cep.OVER_LIMIT,
                f"{len(self.registry)} triggers registered, at most "
                f"{self.settings.cep_max_triggers} (cep_max_triggers)",
            )
        owner = self._owner(req)
        count = sum(1 for t in self.registry.values() if self._owner(t) == owner)
        limit = self.settings.cep_max_triggers_per_owner
        if count >= limit:
            raise TriggerRejected(cep.OVER_LIMIT, f"{owner} has {count} triggers, at most {limit}")
        stored = cep.CEPTriggerRequest()
        stored.CopyFrom(req)
        stored.registered_ms = int(time.time() * 1000)
        self._write(stored)
        self.registry[req.trigger_id] = stored

    def _owner(self, req: cep.CEPTriggerRequest) -> str:
        """Whom a trigger counts against: its user, else the key (or client) behind it, so
        that a key does not pass the limit by naming more client ids."""
        return req.user_id or owner_of(self.settings, req.client_id)

    def _remove(self, req: cep.CEPTriggerRequest) -> None:
        held = self.registry.get(req.trigger_id)
        if held is None or held.client_id != req.client_id:
            raise TriggerRejected(
                cep.NO_SUCH_TRIGGER, f"{req.client_id} has no trigger {req.trigger_id}"
            )
        self._write(removal(held, int(time.time() * 1000)))
        del self.registry[req.trigger_id]

    def _check_listed(self, ticker: str) -> None:
        _, symbol = self.symbols.listed(ticker)
        stale = symbol is None and time.monotonic() - self._reloaded >= RELOAD_SYMBOLS_S
        if self.ctx.symbols_changed.is_set() or stale:
            self.ctx.symbols_changed.clear()
            self.symbols.reload()
            self._reloaded = time.monotonic()
            _, symbol = self.symbols.listed(ticker)
        if symbol is None or symbol.status == "DELISTED":
            why = "is delisted" if symbol is not None else "is not in symbol metadata"
            raise TriggerRejected(cep.UNKNOWN_TICKER, f"{ticker} {why}")

    def _write(self, req: cep.CEPTriggerRequest) -> None:
        """Into the registry, then into the ticks topic under the ticker, so the queries that
        evaluate meet it in order with the feed's trades; both acknowledged by Kafka before
        the client hears yes. If the second write fails, the first is undone."""
        self._produce(TRIGGERS.name, req.trigger_id, req, "the registry")
        try:
            self._produce(TICKS.name, req.ticker, req, "the ticks topic")
        except TriggerRejected:
            if req.action == cep.ADD:
                undo = cep.CEPTriggerRequest()
                undo.CopyFrom(req)
                undo.action = cep.REMOVE
                self._produce(TRIGGERS.name, req.trigger_id, undo, "the registry")
            raise

    def _produce(self, topic: str, key: str, req: cep.CEPTriggerRequest, what: str) -> None:
        failed: list[object] = []
        self._producer.produce(
            topic,
            key=key.encode(),
            value=to_record(req),
            on_delivery=lambda err, _msg: failed.append(err) if err is not None else None,
        )
        if self._producer.flush(10) or failed:
            raise TriggerRejected(
                cep.TRIGGER_REJECT_REASON_UNSPECIFIED, f"{what} could not be written: {failed}"
            )

    def close(self) -> None:
        self._stopping.set()
        if self.is_alive():
            self.join(2)
        self._sub.close(linger=0)
        self._zmq.term()
