"""The real Kafka broker (KRaft) with the platform's producer and consumer settings."""

from __future__ import annotations

import uuid

from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient

from candlewire.kafka import TOPICS, consumer_config, producer_config
from tests.support import new_topic


def produce(settings, topic: str, values: list[bytes]) -> list[tuple[int, int]]:
    """Produce and return (partition, offset) of each acknowledged record."""
    acked: list[tuple[int, int]] = []
    errors: list[object] = []

    def on_delivery(err, msg) -> None:
        if err is not None:
            errors.append(err)
        else:
            acked.append((msg.partition(), msg.offset()))

    producer = Producer(producer_config(settings))
    for i, value in enumerate(values):
        producer.produce(topic, value=value, key=f"k{i % 7}".encode(), on_delivery=on_delivery)
        producer.poll(0)
    assert producer.flush(30) == 0
    assert not errors
    return acked


def consume(
    settings, topic: str, group: str, want: int, commit_after: int | None = None
) -> list[bytes]:
    consumer = Consumer(consumer_config(settings, group))
    consumer.subscribe([topic])
    got: list[bytes] = []
    try:
        while len(got) < want:
            msg = consumer.poll(10)
            assert msg is not None, f"only {len(got)} of {want} records arrived"
            assert msg.error() is None, msg.error()
            got.append(msg.value())
            if commit_after is not None and len(got) == commit_after:
                consumer.commit(asynchronous=False)
                break
    finally:
        consumer.close()
    return got


def test_platform_topics_exist(platform_settings, kafka) -> None:
    admin = AdminClient({"bootstrap.servers": platform_settings.kafka_servers()})
    topics = admin.list_topics(timeout=10).topics
    for spec in TOPICS:
        assert len(topics[spec.name].partitions) == spec.partitions


def test_idempotent_round_trip(platform_settings, kafka) -> None:
    topic = new_topic(platform_settings)
    values = [f"v{i}".encode() for i in range(2000)]
    acked = produce(platform_settings, topic, values)
    assert len(set(acked)) == 2000
    got = consume(platform_settings, topic, f"g-{uuid.uuid4().hex}", 2000)
    assert sorted(got) == sorted(values)
    # Per-key order survives (each key maps to one partition).
    for k in range(7):
        expected = [v for i, v in enumerate(values) if i % 7 == k]
        assert [v for v in got if v in set(expected)] == expected


def test_broker_restart_keeps_acked_records_and_committed_offsets(platform_settings, kafka) -> None:
    topic = new_topic(platform_settings, partitions=1)
    group = f"g-{uuid.uuid4().hex}"
    first = [f"a{i}".encode() for i in range(500)]
    produce(platform_settings, topic, first)
    assert consume(platform_settings, topic, group, 500, commit_after=200) == first[:200]

    kafka.stop()
    assert kafka.pid() is None
    kafka.start()

    second = [f"b{i}".encode() for i in range(100)]
    produce(platform_settings, topic, second)
    consumer = Consumer(consumer_config(platform_settings, group))
    committed = consumer.committed([TopicPartition(topic, 0)], timeout=10)
    consumer.close()
    assert committed[0].offset == 200
    # The group resumes exactly where it committed: nothing lost, nothing repeated.
    assert consume(platform_settings, topic, group, 400) == first[200:] + second
