"""The gaps ingestors found in their live trade streams (#37), as ``candlewire.gaps`` holds
them: read by ``candlewire status``, Dagster's ``gaps`` asset, the tests and ``bench.gaps``.

The topic is compacted and keyed by gap id, so a gap's latest record is its state (open,
repaired, unrepairable) and an empty value deletes it. ``docs/explanation/gaps.md`` tells
the whole story.
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass, field

from candlewire.config import Settings
from candlewire.kafka import GAPS, consumer_config
from proto import market_pb2
from proto.envelope import EnvelopeError, Names, expect, from_record

# As read from the topic: a newer ingestor's cause or status is shown as its number.
GAP_CAUSES, GAP_STATUSES = Names.of(market_pb2.GapCause), Names.of(market_pb2.GapStatus)


@dataclass
class GapLog:
    """Every gap's latest record, by gap id."""

    gaps: dict[str, market_pb2.Gap] = field(default_factory=dict)
    undecodable: int = 0  # records skipped: one bad record must not hide every other gap
    complete: bool = True  # every partition read to its end within the timeout

    def listed(self) -> list[market_pb2.Gap]:
        return list(self.gaps.values())


def read_gaps(settings: Settings, timeout_s: float = 3.0, limit: int | None = None) -> GapLog:
    """The topic's latest record of each gap, read up to its end as of the call (the last
    ``limit`` records of each partition, when given); empty at once when the topic is
    missing or empty. ``complete`` says whether the end was reached within ``timeout_s``."""
    from confluent_kafka import Consumer, TopicPartition

    out = GapLog()
    consumer = Consumer(consumer_config(settings, f"candlewire-gaps-{uuid.uuid4().hex[:12]}"))
    try:
        topic = consumer.list_topics(GAPS.name, timeout=timeout_s).topics.get(GAPS.name)
        if topic is None or topic.error is not None:
            return out  # no ingestor has found a gap yet
        ends: dict[int, int] = {}
        starts = []
        for p in topic.partitions:
            low, high = consumer.get_watermark_offsets(
                TopicPartition(GAPS.name, p), timeout=timeout_s
            )
            if high > low:
                ends[p] = high
                first = low if limit is None else max(low, high - limit)
                starts.append(TopicPartition(GAPS.name, p, first))
        if not ends:
            return out
        consumer.assign(starts)
        deadline = time.monotonic() + timeout_s
        while ends and time.monotonic() < deadline:
            for msg in consumer.consume(num_messages=500, timeout=0.2):
                if msg.error() is not None:
                    continue
                if msg.offset() >= ends.get(msg.partition(), 0) - 1:
                    ends.pop(msg.partition(), None)
                key = (msg.key() or b"").decode(errors="replace")
                if not msg.value():
                    out.gaps.pop(key, None)
                    continue
                try:
                    gap = expect(from_record(msg.value()), market_pb2.Gap)
                except EnvelopeError:
                    out.undecodable += 1
                    continue
                out.gaps[key or gap.gap_id] = gap
        out.complete = not ends
        return out
    finally:
        consumer.close()
