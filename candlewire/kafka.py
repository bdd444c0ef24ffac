"""Kafka topic names and client settings, declared once.

Records are the wire envelope's bytes (version, type, protobuf), keyed by ticker (or by
request id for history pages) so each key's order holds within its partition.
"""

from __future__ import annotations

import time
import zlib
from dataclasses import dataclass
from typing import Any

from candlewire.config import KAFKA_PASSWORD, Settings


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
# Gaps in ingestors' trade streams (#37), keyed by gap_id: the latest record of a gap is
# its state (detected, repaired, unrepairable), so compaction keeps one record a gap.
GAPS = TopicSpec("candlewire.gaps", 1, {"cleanup.policy": "compact"})
# L2 books (#38): each ticker's snapshots and the deltas after them, in its one partition.
BOOKS = TopicSpec("candlewire.books", 3, {"retention.ms": str(7 * 86_400_000)})
TOPICS = (TICKS, OHLC_BATCHES, SYMBOL_METADATA, JOURNAL, TRIGGERS, GAPS, BOOKS)


def key_partition(spec: TopicSpec, key: bytes) -> int:
    """The partition of ``key`` in ``spec``'s topic: CRC-32 of the key, modulo the
    partitions, which is also where librdkafka's default partitioner (consistent_random)
    puts a keyed record."""
    return zlib.crc32(key) % spec.partitions


def journal_partition(topic: str) -> int:
    """The one journal partition a live topic's messages go to, so they keep their order
    and a FETCH reads one partition (chosen here, not by a client library's hash)."""
    return key_partition(JOURNAL, topic.encode())


class KafkaAuthError(RuntimeError):
    pass


def _password(settings: Settings) -> str:
    password = settings.secret(KAFKA_PASSWORD)
    if not password:
        raise KafkaAuthError(
            "[kafka] sasl is on but there is no password: set CANDLEWIRE_SECRET_KAFKA_PASSWORD "
            f"or run `candlewire up`, which makes {settings.state_dir}/secrets/{KAFKA_PASSWORD}"
        )
    return password


def client_auth(settings: Settings) -> dict[str, str]:
    """librdkafka's connection settings: the bootstrap servers and, with ``[kafka] sasl``,
    SASL/SCRAM. Every confluent-kafka client of the project starts from these."""
    conf = {"bootstrap.servers": settings.kafka_servers()}
    if settings.kafka.sasl:
        conf |= {
            "security.protocol": "SASL_PLAINTEXT",
            "sasl.mechanism": settings.kafka.mechanism,
            "sasl.username": settings.kafka.username,
            "sasl.password": _password(settings),
        }
    return conf


def java_auth(settings: Settings) -> dict[str, str]:
    """The same for Java's kafka-clients: Spark's source and sink take each with a ``kafka.``
    prefix (:func:`spark_options`), the JVM live path as they are. Kafka hides the JAAS
    line in its logs (a PASSWORD-type setting)."""
    conf = {"bootstrap.servers": settings.kafka_servers()}
    if settings.kafka.sasl:
        user, password = settings.kafka.username, _password(settings)
        conf |= {
            "security.protocol": "SASL_PLAINTEXT",
            "sasl.mechanism": settings.kafka.mechanism,
            "sasl.jaas.config": scram_jaas(user, password),
        }
    return conf


def scram_jaas(user: str, password: str) -> str:
    return (
        "org.apache.kafka.common.security.scram.ScramLoginModule required "
        f'username="{user}" password="{password}";'
    )


def spark_options(settings: Settings) -> dict[str, str]:
    """Spark's Kafka source and sink options for reaching the cluster."""
    return {f"kafka.{k}": v for k, v in java_auth(settings).items()}


def producer_config(settings: Settings, **overrides: object) -> dict[str, object]:
    """Idempotent, acks=all, bounded buffering: produce() blocks the caller via BufferError."""
    return {
        **client_auth(settings),
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
        **client_auth(settings),
        "group.id": group,
        "enable.auto.commit": False,
        "auto.offset.reset": "earliest",
        "isolation.level": "read_committed",
        **overrides,
    }


def end_offsets(settings: Settings, spec: TopicSpec, timeout: float = 10.0) -> dict[int, int]:
    """Each partition's end now (its high watermark): where a reader that starts now begins."""
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer(consumer_config(settings, "candlewire-ends", log_level=3))
    try:
        return {
            p: consumer.get_watermark_offsets(TopicPartition(spec.name, p), timeout=timeout)[1]
            for p in range(spec.partitions)
        }
    finally:
        consumer.close()


def ensure_topics(settings: Settings, timeout: float = 30.0) -> list[str]:
    """Create the topics that are missing; return the names created."""
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({**client_auth(settings), "log_level": 3})
    existing = set(admin.list_topics(timeout=timeout).topics)
    k = settings.kafka
    missing = [
        NewTopic(
            t.name,
            num_partitions=t.partitions,
            replication_factor=k.replicas(),
            config=k.durability() | t.config,
        )
        for t in TOPICS
        if t.name not in existing
    ]
    if missing:
        for fut in admin.create_topics(missing, request_timeout=timeout).values():
            fut.result()
        _await_leaders(admin, [t.topic for t in missing], timeout)
    return [t.topic for t in missing]


def _await_leaders(admin: Any, names: list[str], timeout: float) -> None:
    """Until the metadata any broker answers lists each topic with a leader for every
    partition: a cluster's controller acks a creation before its peers know the topic."""
    deadline = time.monotonic() + timeout
    while True:
        topics = admin.list_topics(timeout=timeout).topics
        if all(
            name in topics
            and topics[name].partitions
            and all(p.leader >= 0 for p in topics[name].partitions.values())
            for name in names
        ):
            return
        if time.monotonic() > deadline:
            raise TimeoutError(f"topics {names} have no leader after {timeout:.0f}s")
        time.sleep(0.1)


def kafka_health(settings: Settings, brokers: int = 1) -> str | None:
    """A real metadata request; None when it lists at least ``brokers`` brokers."""
    from confluent_kafka.admin import AdminClient

    admin = AdminClient({**client_auth(settings), "log_level": 0})
    try:
        md = admin.list_topics(timeout=2)
    except Exception as exc:
        return f"metadata request failed: {exc}"
    if len(md.brokers) < brokers:
        return f"{len(md.brokers)} of {brokers} brokers in metadata"
    return None
