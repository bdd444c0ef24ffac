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
from dataclasses import dataclass, field

from confluent_kafka import OFFSET_END, Consumer, TopicPartition

from candlewire.config import PERIODS_S, Settings
from candlewire.kafka import JOURNAL, consumer_config, journal_partition
from candlewire.positions import describe, is_after
from candlewire.topics import ohlc_type, parse_ticker, tick_type
from proto import journal_pb2 as jr
from proto.envelope import EnvelopeError, expect, from_record
from proto.market_pb2 import StreamPosition

CHUNK_MAX = 20_000  # messages per reply, whatever the client asks
SCAN_MAX = 200_000  # records read per chunk, the topic's or not: bounds one reply's time
READ_WAIT_S = 1.0


class BadRequest(ValueError):
    pass


DATA_TYPES = frozenset({tick_type(), *(ohlc_type(p) for p in PERIODS_S)})


def check_topic(topic: str) -> None:
    """A live topic the journal can hold; a TopicError (a ValueError) says why not."""
    ticker, sep, data_type = topic.partition("|")
    if not sep or data_type not in DATA_TYPES:
        raise BadRequest(f"topic {topic!r} is not TICKER|tick or TICKER|ohlc:PERIOD")
    parse_ticker(ticker)


@dataclass
class Chunk:
    records: list[bytes] = field(default_factory=list)
    cursor: int = 0
    done: bool = False
    scanned: int = 0


class JournalReader:
    """One consumer per journal partition, kept assigned: a chunk that goes on where the
    last one stopped reads on from what is already fetched, and any other start seeks."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.consumer = self._new_consumer()  # metadata: watermarks and time lookups
        self._readers: dict[int, tuple[Consumer, list[int]]] = {}  # partition → (c, [next])
        self._oldest: dict[int, tuple[int, int]] = {}  # partition → (low offset, its time)

    def _new_consumer(self) -> Consumer:
        extra = {"fetch.max.bytes": 64 << 20, "max.partition.fetch.bytes": 16 << 20}
        return Consumer(consumer_config(self.settings, "candlewire-journal", log_level=3, **extra))

    def close(self) -> None:
        self.consumer.close()
        for c, _ in self._readers.values():
            c.close()

    def _at(self, partition: int, offset: int) -> Consumer:
        """The partition's consumer, about to return ``offset`` next."""
        entry = self._readers.get(partition)
        if entry is None or entry[1][0] != offset:
            if entry is not None:
                entry[0].close()
            c = self._new_consumer()
            c.assign([TopicPartition(JOURNAL.name, partition, offset)])
            entry = self._readers[partition] = (c, [offset])
        return entry[0]

    def available_from_ms(self, partition: int) -> tuple[int, int, int | None]:
        """(low, high, publish time of the oldest record held) of one partition."""
        low, high = self.consumer.get_watermark_offsets(
            TopicPartition(JOURNAL.name, partition), timeout=5
        )
        if low >= high:
            return low, high, None
        cached = self._oldest.get(partition)
        if cached is None or cached[0] != low:
            first = self._read_from(partition, low, 1)
            cached = (low, first[0].timestamp()[1] if first else 0)
            self._oldest[partition] = cached
        return low, high, cached[1]

    def fetch(self, req: jr.FetchRequest) -> jr.FetchReply:
        check_topic(req.topic)
        after = req.after if req.HasField("after") else None
        until = req.until if req.HasField("until") else None
        if after is None and req.since_ms <= 0:
            raise BadRequest("a FETCH needs `after` (a position) or `since_ms`")
        partition = journal_partition(req.topic)
        low, high, oldest_ms = self.available_from_ms(partition)
        reply = jr.FetchReply(request_id=req.request_id, status=jr.FETCH_OK)
        if oldest_ms is not None:
            reply.available_from_ms = oldest_ms
        start_ms = after.publish_time_ms if after is not None else req.since_ms
        if req.cursor > 0:
            start = req.cursor
            if start < low:
                return self._out_of_range(reply, req, oldest_ms, "the chunk's cursor")
        elif oldest_ms is None or low >= high:
            reply.done = True  # nothing journalled (yet): the caller may ask again
            return reply
        elif after is not None and start_ms < oldest_ms:
            return self._out_of_range(reply, req, oldest_ms, describe(after))
        else:
            start = self._offset_for(partition, max(start_ms, oldest_ms), high)
        chunk = self._scan(req, partition, start, high, after, until)
        reply.records.extend(chunk.records)
        reply.cursor = chunk.cursor
        reply.done = chunk.done
        return reply

    def _out_of_range(
        self, reply: jr.FetchReply, req: jr.FetchRequest, oldest_ms: int | None, what: str
    ) -> jr.FetchReply:
        reply.status = jr.FETCH_OUT_OF_RANGE
        held = (
            "holds nothing"
            if oldest_ms is None
            else f"holds {req.topic} from publish time {oldest_ms} ms"
        )
        reply.error = (
            f"the journal no longer holds {req.topic} after {what}: it {held}; "
            "subscribe again with `since` a time to read older data"
        )
        return reply

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
        consumer = self._at(partition, start)
        next_offset = self._readers[partition][1]
        while chunk.cursor < high and len(chunk.records) < want and chunk.scanned < SCAN_MAX:
            batch = consumer.consume(min(1_000, high - chunk.cursor), timeout=0.2)
            if not batch and time.monotonic() > deadline:
                return chunk  # Kafka is slow: hand back what there is, the cursor goes on
            for i, m in enumerate(batch):
                if m.error() is not None:
                    continue
                chunk.scanned += 1
                chunk.cursor = next_offset[0] = m.offset() + 1
                if m.key() != key:
                    continue
                try:
                    run = expect(from_record(m.value()), jr.JournalBatch)
                except EnvelopeError:
                    continue
                since_ms = req.since_ms if after is None else 0
                last, done = take(run, last, until, since_ms, chunk.records)
                if done:
                    chunk.done = True
                if done or len(chunk.records) >= want:
                    if i + 1 < len(batch):  # consumed ahead: the next chunk seeks back
                        next_offset[0] = -1
                    return chunk
            if len(batch) and batch[-1].offset() + 1 != next_offset[0]:
                next_offset[0] = -1
        chunk.done = chunk.cursor >= high
        return chunk

    def _read_from(self, partition: int, offset: int, n: int) -> list:
        consumer = self._at(partition, offset)
        got = [m for m in consumer.consume(n, timeout=5) if m.error() is None]
        self._readers[partition][1][0] = got[-1].offset() + 1 if got else -1
        return got


def take(
    run: jr.JournalBatch,
    last: StreamPosition | None,
    until: StreamPosition | None,
    since_ms: int,
    out: list[bytes],
) -> tuple[StreamPosition | None, bool]:
    """Append what of ``run`` comes after ``last`` (and up to ``until``); return the new
    last position and whether ``until`` was passed. A run wholly inside the range is taken
    without decoding a record; only a run at an edge is read message by message."""
    if last is not None and not is_after(run.last, last):
        return last, False  # all delivered already (a replay after a restart)
    if run.last.publish_time_ms < since_ms:
        return last, False
    inside = is_after(run.first, last) and (until is None or not is_after(run.last, until))
    if inside and run.first.publish_time_ms >= since_ms:
        out.extend(run.records)
        return run.last, False
    for record in run.records:
        try:
            pos = from_record(record).stream  # type: ignore[attr-defined]
        except EnvelopeError:
            continue
        if until is not None and is_after(pos, until):
            return last, True
        if pos.publish_time_ms >= since_ms and is_after(pos, last):
            out.append(record)
            last = pos
    return last, False
