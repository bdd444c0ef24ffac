"""Reading the journal (Kafka ``candlewire.live``) for one FETCH chunk.

A topic's messages sit in one partition (:func:`candlewire.kafka.journal_partition`), among
other topics'. A chunk starts at the request's cursor, or where Kafka's time index puts the
position's publish time (the record timestamp is the publish time), and reads forward until
it has ``max_messages`` of the topic, reaches ``until``, or reaches the end the partition had
when the chunk began. Replays after a restart are skipped by position
(:func:`candlewire.positions.is_after`), so each message is served once.
"""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass, field
from decimal import Decimal
from typing import NamedTuple

from confluent_kafka import OFFSET_END, Consumer, TopicPartition

from candlewire.config import Settings
from candlewire.kafka import JOURNAL, consumer_config, journal_partition
from candlewire.positions import add_items, describe, is_after, run_fits, run_items
from candlewire.topics import check_market_data, tick_type
from proto import journal_pb2 as jr
from proto.envelope import EnvelopeError, expect, from_record_and_payload
from proto.market_pb2 import StreamPosition, Tick

CHUNK_MAX = 50_000  # messages per reply (about 7 MB of ticks), whatever the client asks
SCAN_MAX = 200_000  # records read per chunk, the topic's or not: bounds one reply's time
READ_WAIT_S = 1.0
PARTITION_FETCH_BYTES = 1 << 20  # see JournalReader._new_consumer
# How far past the archive's boundary (the journal's oldest record) the journal is searched for
# trades published late with an event time before it: the live path's delay, with room.
SEAM_MS = 60_000
SEAMS_KEPT = 256


class BadRequest(ValueError):
    pass


def check_topic(topic: str) -> None:
    """A live topic the journal can hold; a TopicError (a ValueError) says why not."""
    ticker, sep, data_type = topic.partition("|")
    if not sep:
        raise BadRequest(f"topic {topic!r} is not TICKER|tick, TICKER|ohlc:PERIOD or TICKER|book")
    check_market_data(ticker, data_type)


class JournalUnavailable(RuntimeError):
    """Kafka did not answer in time: the FETCH is answered FETCH_UNAVAILABLE and asked again."""


@dataclass
class Chunk:
    cursor: int = 0
    done: bool = False
    passed: bool = False  # a message after ``until`` was seen
    scanned: int = 0
    taken: int = 0
    skipped: int = 0  # records of the topic that do not decode, or are no run of it
    runs: list[bytes] = field(default_factory=list)  # each run's bytes, for the reply


class Fetched(NamedTuple):
    """A FETCH's reply, and the runs that go in it as bytes after its own (read from the
    journal as they are: ``proto.envelope.encode_with``), and how many messages both hold."""

    reply: jr.FetchReply
    runs: list[bytes]
    count: int
    skipped: int = 0  # the topic's records read and not served: see :class:`Chunk`
    left_to_journal: int = 0  # archived trades of the seam, served by the journal instead


@dataclass
class Seam:
    """A tick topic's trades the journal holds with an event time before the archive's
    boundary: published after it, late. The archive serves event times before the boundary
    and the journal everything published from it, so these would come twice; the archive
    leaves them to the journal, which has their positions. Trades are told apart as the
    stream's judge tells them: by id and time, and an id-less one by all it has."""

    named: set[tuple[str, int]] = field(default_factory=set)  # (trade id, exchange ns)
    unnamed: Counter[tuple[int, Decimal, Decimal, int]] = field(default_factory=Counter)
    earliest_ns: int = 0  # no archived trade before it is one of these

    def add(self, tick: Tick) -> None:
        ns = tick.exchange_time_ns
        earliest = min(self.earliest_ns, ns) if self else ns
        if tick.trade_id:
            self.named.add((tick.trade_id, ns))
        else:
            try:
                self.unnamed[(ns, Decimal(tick.price), Decimal(tick.size), tick.side)] += 1
            except (ArithmeticError, ValueError, TypeError):  # no archived trade's: no match
                return
        self.earliest_ns = earliest

    def __bool__(self) -> bool:
        return bool(self.named or self.unnamed)


@dataclass
class Cursor:
    """One partition's consumer, where it stands, and records it read beyond the last chunk
    (a chunk that ends inside a consume() batch keeps the rest for the next one)."""

    consumer: Consumer
    next_offset: int
    pending: list = field(default_factory=list)

    def read(self, n: int, timeout: float = 0.2) -> list:
        """Up to ``n`` records: those kept from the last chunk, else what the consumer has
        fetched already, waiting up to ``timeout`` only while it has none. librdkafka's
        consume() waits until it has all ``n`` or the timeout passes, so a new reader's first
        read waited for the rest of the partition to arrive (80-90 ms of a replay's first
        chunk), not for the few records the chunk needs (#35)."""
        if self.pending:
            got, self.pending = self.pending, []
            return got
        got = self.consumer.consume(n, timeout=0)
        if not got:  # nothing fetched yet: wait for the first record only
            got = self.consumer.consume(1, timeout=timeout)
            if got and n > 1:
                got += self.consumer.consume(n - 1, timeout=0)
        return got


class JournalReader:
    """One consumer per journal partition, kept assigned: a chunk that goes on where the
    last one stopped reads on from what is already fetched, and any other start seeks."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.consumer = self._new_consumer()  # metadata: watermarks and time lookups
        self._readers: dict[int, Cursor] = {}
        self._oldest: dict[int, tuple[int, int]] = {}  # partition → (low offset, its time)
        # (topic, low offset) → its seam, the offset its scan reached, whether it is whole
        self._seams: dict[tuple[str, int], tuple[Seam, int, bool]] = {}

    def _new_consumer(self) -> Consumer:
        """A consumer that fetches a partition 1 MiB at a time (librdkafka's default, and
        at least one record batch however large): librdkafka decompresses a fetch whole
        before it hands out a record of it, so 16 MiB made a new reader's first records
        wait 50-150 ms for the rest of the partition; 1 MiB brings the first in 20-30 ms,
        and the next fetches follow while the chunk is read (#35)."""
        extra = {"fetch.max.bytes": 64 << 20, "max.partition.fetch.bytes": PARTITION_FETCH_BYTES}
        return Consumer(consumer_config(self.settings, "candlewire-journal", log_level=3, **extra))

    def close(self) -> None:
        self.consumer.close()
        for cursor in self._readers.values():
            cursor.consumer.close()

    def _at(self, partition: int, offset: int) -> Cursor:
        """The partition's reader, about to return ``offset`` next."""
        cursor = self._readers.get(partition)
        if cursor is None or cursor.next_offset != offset:
            if cursor is not None:
                cursor.consumer.close()
            c = self._new_consumer()
            c.assign([TopicPartition(JOURNAL.name, partition, offset)])
            cursor = self._readers[partition] = Cursor(c, offset)
        return cursor

    def available_from_ms(
        self, partition: int, continuing: bool = False
    ) -> tuple[int, int, int | None]:
        """(low, high, publish time of the oldest record held) of one partition. A chunk
        that goes on from the last one takes the marks its reader's fetches brought (no
        round trip to the broker)."""
        tp = TopicPartition(JOURNAL.name, partition)
        reader = self._readers.get(partition)
        low = high = -1
        if continuing and reader is not None:
            low, high = reader.consumer.get_watermark_offsets(tp, cached=True)
        if low < 0 or high < 0:
            low, high = self.consumer.get_watermark_offsets(tp, timeout=5)
        if low >= high:
            return low, high, None
        cached = self._oldest.get(partition)
        if cached is None or cached[0] != low:
            first = self._read_from(partition, low, 1)
            if not first:  # cached as 0, it turned every retention check off till low moved
                raise JournalUnavailable(f"the journal's oldest record ({low}) not read in time")
            cached = self._oldest[partition] = (low, first[0].timestamp()[1])
        return low, high, cached[1]

    def fetch(self, req: jr.FetchRequest) -> Fetched:
        check_topic(req.topic)
        after = req.after if req.HasField("after") else None
        until = req.until if req.HasField("until") else None
        if after is None and req.since_ms <= 0:
            raise BadRequest("a FETCH needs `after` (a position) or `since_ms`")
        partition = journal_partition(req.topic)
        low, high, oldest_ms = self.available_from_ms(partition, continuing=req.cursor > 0)
        reply = jr.FetchReply(request_id=req.request_id, status=jr.FETCH_OK)
        if oldest_ms is not None:
            reply.available_from_ms = oldest_ms
        start_ms = after.publish_time_ms if after is not None else req.since_ms
        if req.cursor > 0:
            start = req.cursor
            if start < low:
                return self._out_of_range(reply, req, oldest_ms, "the chunk's cursor")
        elif low > 0 and (oldest_ms is None or start_ms < oldest_ms):
            # Retention (or an operator) removed records from there on: a time is served
            # from Iceberg up to the journal's oldest record, a position cannot be.
            if after is None:
                boundary = oldest_ms if oldest_ms is not None else int(time.time() * 1000)
                from journal.archive import archive_chunk  # pyiceberg: on first use only

                seam = None
                if oldest_ms is not None and req.topic.endswith(f"|{tick_type()}"):
                    seam = self.seam(req.topic, partition, low, high, oldest_ms)
                left = archive_chunk(self.settings, req, boundary, reply, seam)
                # A journal that holds nothing has nothing after the archive: done, so the
                # client goes live (it asked again from now, at once, until a record came).
                reply.done = oldest_ms is None and reply.archive_until_ms >= boundary
                served = sum(len(run_items(run)) for run in reply.runs)
                return Fetched(reply, [], served, left_to_journal=left)
            return self._out_of_range(reply, req, oldest_ms, describe(after))
        elif oldest_ms is None:
            reply.done = True  # nothing journalled (yet): the caller may ask again
            return Fetched(reply, [], 0)
        else:
            start = self._offset_for(partition, max(start_ms, oldest_ms), high)
        chunk = self._scan(req, partition, start, high, after, until)
        reply.cursor = chunk.cursor
        reply.done, reply.passed = chunk.done, chunk.passed
        return Fetched(reply, chunk.runs, chunk.taken, chunk.skipped)

    def seam(self, topic: str, partition: int, low: int, high: int, boundary_ms: int) -> Seam:
        """The :class:`Seam` of a tick topic whose journal starts at ``low``, published at
        ``boundary_ms``: its runs published within :data:`SEAM_MS` of it. A call reads at
        most :data:`SCAN_MAX` records and the next goes on from there, so a replay's archive
        chunks read the stretch once, and the last chunks (the seam's event times) see it
        whole unless the journal has not yet reached its end."""
        key = (topic, low)
        seam, offset, whole = self._seams.pop(key, (Seam(), low, False))
        topic_key, boundary_ns, scanned = topic.encode(), boundary_ms * 1_000_000, 0
        reader = self._at(partition, offset) if not whole and offset < high else None
        deadline = time.monotonic() + READ_WAIT_S
        while reader is not None and not whole and reader.next_offset < high:
            if scanned >= SCAN_MAX:
                break
            batch = reader.read(min(1_000, high - reader.next_offset))
            if not batch and time.monotonic() > deadline:
                break
            for i, m in enumerate(batch):
                if m.error() is not None:
                    continue
                if m.timestamp()[1] >= boundary_ms + SEAM_MS:
                    reader.pending, whole = batch[i:], True
                    break
                scanned += 1
                reader.next_offset = m.offset() + 1
                if m.key() != topic_key:
                    continue
                got = _run_of(m.value(), topic)
                for tick in got[0].ticks if got is not None else ():
                    if tick.exchange_time_ns < boundary_ns:
                        seam.add(tick)
        if reader is not None:
            offset = reader.next_offset
        if len(self._seams) >= SEAMS_KEPT:
            self._seams.pop(next(iter(self._seams)))
        self._seams[key] = (seam, offset, whole)
        return seam

    def _out_of_range(
        self, reply: jr.FetchReply, req: jr.FetchRequest, oldest_ms: int | None, what: str
    ) -> Fetched:
        reply.status = jr.FETCH_OUT_OF_RANGE
        held = (
            "holds nothing"
            if oldest_ms is None
            else f"holds {req.topic} from publish time {oldest_ms} ms"
        )
        reply.error = (
            f"the journal no longer holds {req.topic} after {what}: it {held}; "
            "subscribe again with `since` at or after that"
        )
        return Fetched(reply, [], 0)

    def _offset_for(self, partition: int, at_ms: int, high: int) -> int:
        (tp,) = self.consumer.offsets_for_times(
            [TopicPartition(JOURNAL.name, partition, at_ms)], timeout=5
        )
        return high if tp.offset < 0 or tp.offset == OFFSET_END else tp.offset

    def _scan(
        self,
        req: jr.FetchRequest,
        partition: int,
        start: int,
        high: int,
        after: StreamPosition | None,
        until: StreamPosition | None,
    ) -> Chunk:
        want = min(req.max_messages or CHUNK_MAX, CHUNK_MAX)
        key = req.topic.encode()
        chunk = Chunk(cursor=start)
        last = after
        deadline = time.monotonic() + READ_WAIT_S
        reader = self._at(partition, start)
        while chunk.cursor < high and chunk.taken < want and chunk.scanned < SCAN_MAX:
            batch = reader.read(min(1_000, high - chunk.cursor))
            if not batch and time.monotonic() > deadline:
                return chunk  # Kafka is slow: hand back what there is, the cursor goes on
            for i, m in enumerate(batch):
                if m.error() is not None:
                    continue
                chunk.scanned += 1
                chunk.cursor = reader.next_offset = m.offset() + 1
                if m.key() != key:
                    continue
                got = _run_of(m.value(), req.topic)
                if got is None:
                    chunk.skipped += 1
                    continue
                run, raw = got
                since_ms = req.since_ms if after is None else 0
                last, done, taken = take(run, last, until, since_ms, chunk.runs, raw)
                chunk.taken += taken
                if done:
                    chunk.done = chunk.passed = True
                if done or chunk.taken >= want:
                    reader.pending = batch[i + 1 :]  # read ahead: the next chunk starts here
                    return chunk
        chunk.done = chunk.cursor >= high
        return chunk

    def _read_from(self, partition: int, offset: int, n: int) -> list:
        reader = self._at(partition, offset)
        got = [m for m in reader.read(n, timeout=5) if m.error() is None]
        reader.next_offset = got[-1].offset() + 1 if got else -1
        reader.pending = []
        return got


def _run_of(value: bytes, topic: str) -> tuple[jr.JournalBatch, bytes] | None:
    """A journal record's run of ``topic`` and its bytes as read; None for a record that
    does not decode or is no run of that topic (a broken writer's: no part of the stream)."""
    try:
        msg, raw = from_record_and_payload(value)
        run = expect(msg, jr.JournalBatch)
    except EnvelopeError:
        return None
    return (run, raw) if run_fits(run, topic) else None


def take(
    run: jr.JournalBatch,
    last: StreamPosition | None,
    until: StreamPosition | None,
    since_ms: int,
    out: list[bytes],
    raw: bytes | None = None,
) -> tuple[StreamPosition | None, bool, int]:
    """Add to ``out`` (serialized runs) what of ``run`` comes after ``last`` (and up to
    ``until``); return the new last position, whether ``until`` was passed, and how many
    messages were added. A run wholly inside the range is added whole, as ``raw`` (its
    bytes as read) when given and canonical; only a run at an edge is cut."""
    if last is not None and not is_after(run.last, last):
        return last, False, 0  # all delivered already (a replay after a restart)
    if run.last.publish_time_ms < since_ms:
        return last, False, 0
    items = run_items(run)
    inside = is_after(run.first, last) and (until is None or not is_after(run.last, until))
    if inside and run.first.publish_time_ms >= since_ms:
        # The bytes as read when they are the run's own encoding (each field once, minimal:
        # what every writer of the journal makes); anything longer is written anew, as the
        # decoder reads it, so a reader of the wire (the Arrow replay's columns) sees no
        # field twice.
        canonical = raw is not None and len(raw) == run.ByteSize()
        out.append(raw if canonical else run.SerializeToString())  # type: ignore[arg-type]
        return run.last, False, len(items)
    keep, done = [], False
    for item in items:
        pos = item.stream
        if until is not None and is_after(pos, until):
            done = True
            break
        if pos.publish_time_ms >= since_ms and is_after(pos, last):
            keep.append(item)
            last = pos
    if keep:
        cut = jr.JournalBatch(topic=run.topic)
        add_items(cut, keep)
        cut.first.CopyFrom(keep[0].stream)
        cut.last.CopyFrom(keep[-1].stream)
        out.append(cut.SerializeToString())
    return last, done, len(keep)
