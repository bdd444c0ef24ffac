"""The stream processor's ZMQ PUB, which the relay's XSUB connects to, and its journal.

Market data is sequenced (:class:`Sequencer`): each message on a ``{ticker}|{type}`` topic
carries a :class:`StreamPosition`, written into the Kafka journal (``candlewire.live``) and
published, in that order, so whatever a subscriber received the journal service can also
serve. Every active topic gets a ``StreamHead`` beacon every ``HEAD_EVERY_S``: a subscriber
that lost the tail of a burst sees from it that there was more.

foreachBatch functions of different queries run on different threads; a lock serialises
their use of the one socket. Notifications are sent again after NOTIFY_REPEAT_DELAYS_S (a
subscription may still be travelling upstream the first time); market data is not.

The socket is an XPUB that never blocks and never drops silently (``XPUB_NODROP``): when a
relay's queue is full, the message is not sent and is counted in ``dropped``
(``candlewire_stream_publish_dropped``). Market data is in the journal already, so a
subscriber fills it from there. With several relays, one full queue holds the message back
from all of them.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import threading
import time

import zmq
from confluent_kafka import KafkaException, Producer
from google.protobuf.message import Message

from candlewire.config import Settings
from candlewire.curve import PUBLISHER_KEY, dial
from candlewire.kafka import JOURNAL, consumer_config, journal_partition, producer_config
from candlewire.positions import add_items
from candlewire.topics import NOTIFY_REPEAT_DELAYS_S
from candlewire.zmqutil import (
    HWM,
    NOBLOCK,
    SNDMORE,
    harden,
    publish_to_relays,
    send_frames,
    sender,
    subscriptions,
)
from proto import book_pb2, market_pb2
from proto import journal_pb2 as jr
from proto.envelope import MESSAGE_CLASSES, VERSION_FRAME, encode_topic, to_record, type_id

log = logging.getLogger("candlewire.stream")
TICK_TYPE = type_id(market_pb2.Tick())
BOOK_TYPES = frozenset({type_id(book_pb2.BookDelta()), type_id(book_pb2.BookSnapshot())})
HEAD_EVERY_S = 0.5  # the issue asks for at least one a second
HEAD_ACTIVE_S = 600.0  # a topic quiet for this long gets no more beacons
JOURNAL_BATCH_MAX = 5_000  # messages per journal record (a record stays well under 1 MiB)


EPOCH_READ_S = 10.0
EPOCH_TAIL = 8  # records read from each journal partition's end


def journal_epoch(settings: Settings) -> int:
    """The newest epoch the journal holds (0 when it holds none): its partitions' last
    records, which the newest run of each publisher writing there wrote."""
    from confluent_kafka import Consumer, KafkaError, TopicPartition

    from proto.envelope import EnvelopeError, expect, from_record_and_payload

    eof = {"enable.partition.eof": True}  # a partition's end said, even after no record
    consumer = Consumer(consumer_config(settings, "candlewire-epoch", log_level=3, **eof))
    try:
        ends: dict[int, int] = {}
        starts = []
        for p in range(JOURNAL.partitions):
            low, high = consumer.get_watermark_offsets(
                TopicPartition(JOURNAL.name, p), timeout=EPOCH_READ_S
            )
            if high > low:
                ends[p] = high
                starts.append(TopicPartition(JOURNAL.name, p, max(low, high - EPOCH_TAIL)))
        epoch, deadline = 0, time.monotonic() + EPOCH_READ_S
        consumer.assign(starts)
        while ends and time.monotonic() < deadline:
            for m in consumer.consume(100, timeout=0.2):
                if m.error() is not None:
                    if m.error().code() == KafkaError._PARTITION_EOF:
                        ends.pop(m.partition(), None)
                    continue
                try:
                    run = expect(from_record_and_payload(m.value())[0], jr.JournalBatch)
                except EnvelopeError:
                    continue
                epoch = max(epoch, run.last.epoch)
        if ends:
            raise RuntimeError(f"the journal's last records did not come within {EPOCH_READ_S}s")
        return epoch
    finally:
        consumer.close()


def next_epoch(settings: Settings, after: int = 0) -> int:
    """A new run's epoch: now in milliseconds, unless the journal (or ``after``) holds a
    later one. A clock stepped back over a restart would otherwise start an epoch below the
    last, and every subscriber that followed the last would take each new candle and book
    update for one it had already seen (positions order by epoch) until it subscribed again."""
    return max(int(time.time() * 1000), journal_epoch(settings) + 1, after + 1)


class Sequencer:
    """Positions per topic for one run (the epoch). Pure, so it is tested on its own."""

    def __init__(self, epoch: int) -> None:
        self.epoch = epoch
        self.last: dict[bytes, market_pb2.StreamPosition] = {}
        self._seen_at: dict[bytes, float] = {}

    def next(
        self, topic: bytes, now_ms: int, partition: int = 0, offset: int = -1
    ) -> market_pb2.StreamPosition:
        last = self.last.get(topic)
        pos = market_pb2.StreamPosition(
            epoch=self.epoch,
            seq=1 if last is None else last.seq + 1,
            publish_time_ms=now_ms,
            source_partition=partition,
            source_offset=offset,
        )
        self.last[topic] = pos
        self._seen_at[topic] = time.monotonic()
        return pos

    def heads(self, active_s: float = HEAD_ACTIVE_S) -> list[market_pb2.StreamHead]:
        """A beacon for each topic that published within ``active_s``. A quiet topic keeps
        its count: when it publishes again within this epoch, it goes on from there."""
        horizon = time.monotonic() - active_s
        return [
            market_pb2.StreamHead(topic=t.decode(), last=self.last[t])
            for t, at in self._seen_at.items()
            if at >= horizon
        ]


class StreamPublisher:
    """``epoch``: its positions' (the job's is :func:`next_epoch`); now in ms by default."""

    def __init__(self, settings: Settings, hwm: int = HWM, epoch: int | None = None) -> None:
        self._ctx = zmq.Context()
        self._sock = harden(
            self._ctx.socket(zmq.XPUB), max_message_bytes=settings.max_message_bytes, hwm=hwm
        )
        self._sock.setsockopt(zmq.XPUB_NODROP, 1)
        # Bound, yet a CURVE client: relays dial it and it proves a publisher's key to them.
        dial(self._sock, settings, "relay", PUBLISHER_KEY)
        self._sock.bind(settings.bind("stream_pub"))
        publish_to_relays(self._sock)
        for endpoint in settings.dialled_relays():
            self._sock.connect(endpoint)
        self._journal = Producer(producer_config(settings, **{"linger.ms": 2}))
        self.sequencer = Sequencer(epoch=epoch or int(time.time() * 1000))
        self._lock = threading.Lock()
        self._due: list[tuple[float, int, str, Message]] = []
        self._seq = itertools.count()
        self._stop = threading.Event()
        self._next_head = 0.0
        self._repeater = threading.Thread(target=self._repeat, name="notify-repeat", daemon=True)
        self._repeater.start()
        self.sent = 0
        self.dropped = 0
        self.journal_errors = 0
        self.refused_frames = 0  # what a relay sent up that is no subscription

    def _not_subscription(self) -> None:
        self.refused_frames += 1

    def publish(self, topic: str, msg: Message) -> None:
        frames = encode_topic(topic, msg)
        with self._lock:
            try:
                send_frames(self._sock, frames, NOBLOCK)
            except zmq.Again:
                self._take_commands()
                try:
                    send_frames(self._sock, frames, NOBLOCK)
                except zmq.Again:
                    self.dropped += 1
                    return
            self.sent += 1

    def _take_commands(self) -> None:
        """Before a refused message counts as dropped, and is sent once more: let the socket
        take the commands its I/O thread has queued for it. A send takes them at most once
        a millisecond, so a pipe's room as the socket sees it can be that far behind what
        its relay has read (ZMQ credits a pipe each half of its high-water mark read), and a
        pipe whose relay went down can outlive it as long: either refused a message that
        every relay had room for (XPUB_NODROP), on a loaded machine. Asking for ``EVENTS``
        takes them at once."""
        self._sock.getsockopt(zmq.EVENTS)

    def publish_ticks(self, items: list[tuple[bytes, bytes, int, int]]) -> None:
        """(topic, Kafka record, partition, offset): each record is already the envelope,
        so what is published is that value with its position appended as bytes (protobuf
        merges a repeated field number); only the journal record parses it."""
        now_ms = int(time.time() * 1000)
        with self._lock:
            stamped = []
            for topic, record, partition, offset in items:
                pos = self.sequencer.next(topic, now_ms, partition, offset)
                stamped.append((topic, record + market_pb2.Tick(stream=pos).SerializeToString()))
            self._send_market(stamped, now_ms)

    def publish_sequenced(self, items: list[tuple[bytes, Message]]) -> None:
        """(topic, message) pairs, each message stamped with its position: candles, and the
        books' snapshots and deltas."""
        now_ms = int(time.time() * 1000)
        with self._lock:
            stamped = []
            for topic, msg in items:
                msg.stream.CopyFrom(self.sequencer.next(topic, now_ms))  # type: ignore[attr-defined]
                kind = bytes([type_id(msg)])
                stamped.append((topic, VERSION_FRAME + kind + msg.SerializeToString()))
            self._send_market(stamped, now_ms)

    def _send_market(self, stamped: list[tuple[bytes, bytes]], now_ms: int) -> None:
        """Journal first, then publish (under the lock, so both see one order). The journal
        gets one record per topic and batch (:class:`JournalBatch`), not one per message."""
        runs: dict[bytes, list[bytes]] = {}
        for topic, record in stamped:
            runs.setdefault(topic, []).append(record)
        for topic, records in runs.items():
            for i in range(0, len(records), JOURNAL_BATCH_MAX):
                self._produce(topic, self._batch(topic, records[i : i + JOURNAL_BATCH_MAX]), now_ms)
        # send_frames' loop, inlined for a message a tick: its call and a tuple of frames
        # cost 0.4-0.6 µs more a tick than these three sends.
        send, more, first, dropped = sender(self._sock), SNDMORE, SNDMORE | NOBLOCK, 0
        refresh = True  # once a batch: a relay that is truly full refuses the rest at once
        for topic, record in stamped:
            try:
                send(topic, first)  # a message goes whole or not at all: its first frame decides
            except zmq.Again:
                if not refresh:
                    dropped += 1
                    continue
                refresh = False
                self._take_commands()
                try:
                    send(topic, first)
                except zmq.Again:
                    dropped += 1
                    continue
            send(record[:1], more)
            send(record[1:])
        self.sent += len(stamped) - dropped
        self.dropped += dropped
        self._journal.poll(0)

    @staticmethod
    def _batch(topic: bytes, records: list[bytes]) -> bytes:
        """One journal record: the run's messages as typed fields, so the journal service
        hands whole runs on and a client takes them without parsing each one."""
        run = jr.JournalBatch(topic=topic.decode())
        if records[0][1] in BOOK_TYPES:  # snapshots and deltas: two fields, merged by seq
            msgs = [MESSAGE_CLASSES[r[1]].FromString(r[2:]) for r in records]
            add_items(run, msgs)
            run.first.CopyFrom(msgs[0].stream)  # type: ignore[attr-defined]
            run.last.CopyFrom(msgs[-1].stream)  # type: ignore[attr-defined]
            return to_record(run)
        items = run.ticks if records[0][1] == TICK_TYPE else run.candles
        for record in records:
            items.add().MergeFromString(record[2:])
        run.first.CopyFrom(items[0].stream)
        run.last.CopyFrom(items[-1].stream)
        return to_record(run)

    def _produce(self, topic: bytes, record: bytes, now_ms: int) -> None:
        for _attempt in range(100):
            try:
                self._journal.produce(
                    JOURNAL.name,
                    value=record,
                    key=topic,
                    partition=journal_partition(topic.decode()),
                    timestamp=now_ms,
                    on_delivery=self._delivered,
                )
                return
            except BufferError:
                self._journal.poll(0.05)  # the journal's bounded queue is full: wait for it
            except KafkaException as exc:
                log.error("journal write failed: %s", exc)
                break
        self.journal_errors += 1

    def _delivered(self, err: object, _msg: object) -> None:
        if err is not None:
            self.journal_errors += 1
            log.error("journal write failed: %s", err)

    def notify(self, topic: str, msg: Message) -> None:
        self.publish(topic, msg)
        now = time.monotonic()
        with self._lock:
            for delay in NOTIFY_REPEAT_DELAYS_S[1:]:
                heapq.heappush(self._due, (now + delay, next(self._seq), topic, msg))

    def _repeat(self) -> None:
        while not self._stop.wait(0.1):
            now = time.monotonic()
            ready = []
            with self._lock:
                while self._due and self._due[0][0] <= now:
                    ready.append(heapq.heappop(self._due))
                if now >= self._next_head:
                    self._next_head = now + HEAD_EVERY_S
                    ready += [(0, 0, h.topic, h) for h in self.sequencer.heads()]
                self._journal.poll(0)
                for _ in subscriptions(self._sock, on_other=self._not_subscription):
                    pass  # the relays' subscriptions: the XPUB applies them
            for _, _, topic, msg in ready:
                self.publish(topic, msg)

    def close(self) -> None:
        self._stop.set()
        self._repeater.join(1)
        self._journal.flush(10)
        self._sock.close(linger=500)
        self._ctx.term()
