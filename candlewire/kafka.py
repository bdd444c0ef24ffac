"""Kafka topic names and client settings, declared once.

Records are the wire envelope's bytes (version, type, protobuf), keyed by ticker (or by
request id for history pages) so each key's order holds within its partition.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass

from candlewire.config import Settings


@dataclass(frozen=True)
class TopicSpec:
    name: str
    partitions: int
    config: dict[str, str]


TICKS = TopicSpec("candlewire.ticks", 6, {"retention.ms": str(7 * 86_400_000)})
OHLC_BATCHES = TopicSpec("candlewire.ohlc-batches", 3, {"retention.ms": str(7 * 86_400_000)})
SYMBOL_METADATA = TopicSpec("candlewire.symbol-metadata", 1, {"cleanup.policy": "compact"})
# What the stream processor published on {ticker}|{type}, positions included: the journal
# that FETCH reads (journal/). A day, and at most 1 GiB per partition.
JOURNAL = TopicSpec(
    "candlewire.live",
    6,
    {"retention.ms": str(86_400_000), "retention.bytes": str(1 << 30), "compression.type": "lz4"},
)
# Registered CEP triggers, keyed by trigger_id: the latest record of each id is its state
# (an ADD, or the REMOVE that ended it), so compaction keeps exactly the registry.
TRIGGERS = TopicSpec("candlewire.triggers", 1, {"cleanup.policy": "compact"})
TOPICS = (TICKS, OHLC_BATCHES, SYMBOL_METADATA, JOURNAL, TRIGGERS)


def journal_partition(topic: str) -> int:
    """The one journal partition a live topic's messages go to, so they keep their order
    and a FETCH reads one partition (chosen here, not by a client library's hash)."""
    return zlib.crc32(topic.encode()) % JOURNAL.partitions


def producer_config(settings: Settings, **overrides: object) -> dict[str, object]:
    """Idempotent, acks=all, bounded buffering: produce() blocks the caller via BufferError."""
    return {
        "bootstrap.servers": settings.kafka_servers(),
        "enable.idempotence": True,
        "acks": "all",
        "linger.ms": 5,
        "compression.type": "lz4",
        "queue.buffering.max.messages": 200_000,
        "queue.buffering.max.kbytes": 65_536,
        "message.timeout.ms": 300_000,
        **overrides,
    }


def consumer_config(settings: Settings, group: str, **overrides: object) -> dict[str, object]:
    return {
        "bootstrap.servers": settings.kafka_servers(),
        "group.id": group,
        "enable.auto.commit": False,
        "auto.offset.reset": "earliest",
        "isolation.level": "read_committed",
        **overrides,
    }


def ensure_topics(settings: Settings, timeout: float = 30.0) -> list[str]:
    """Create the topics that are missing; return the names created."""
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": settings.kafka_servers(), "log_level": 3})
    existing = set(admin.list_topics(timeout=timeout).topics)
    missing = [
        NewTopic(t.name, num_partitions=t.partitions, replication_factor=-1, config=t.config)
        for t in TOPICS
        if t.name not in existing
    ]
    if missing:
        for fut in admin.create_topics(missing, request_timeout=timeout).values():
            fut.result()
    return [t.topic for t in missing]


def kafka_health(settings: Settings) -> str | None:
    """A real metadata request; None when the broker answers."""
    from confluent_kafka.admin import AdminClient

    admin = AdminClient({"bootstrap.servers": settings.kafka_servers(), "log_level": 0})
    try:
        md = admin.list_topics(timeout=2)
    except Exception as exc:
        return f"metadata request failed: {exc}"
    return None if md.brokers else "no brokers in metadata"
