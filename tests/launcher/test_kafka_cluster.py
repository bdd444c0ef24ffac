"""``[kafka] brokers = 3``: the local stack's Kafka as a three-node KRaft quorum, each broker
on its own loopback address. Topics are replicated three times with min.insync.replicas 2,
and acks=all writes go on, losing nothing, after ``kill -9`` of a broker."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator

import pytest
from confluent_kafka.admin import AdminClient, ConfigResource

from candlewire.config import Settings
from candlewire.kafka import TICKS, TOPICS, client_auth
from candlewire.testing import free_settings, wait_for
from launcher.stack import ProcessService, Stack, kafka_services
from tests.candlewire.test_kafka import consume, produce


@pytest.fixture(scope="module")
def cluster(tmp_path_factory) -> Iterator[tuple[Settings, list[ProcessService]]]:
    settings = free_settings(tmp_path_factory.mktemp("cluster"), kafka={"brokers": 3})
    stack = Stack(settings, kafka_services(settings))
    for svc in stack.services:
        svc.stop_timeout = 5  # a broker whose peer is gone waits long to hand over
    try:
        stack.up(echo=lambda _: None)
        yield settings, stack.services
    finally:
        stack.down(echo=lambda _: None)


def test_three_brokers_on_their_own_addresses(cluster) -> None:
    settings, services = cluster
    assert [s.name for s in services] == ["kafka-1", "kafka-2", "kafka-3"]
    md = AdminClient(client_auth(settings)).list_topics(timeout=10)
    assert sorted(b.host for b in md.brokers.values()) == ["127.0.0.1", "127.0.0.2", "127.0.0.3"]
    assert settings.kafka_servers().count(",") == 2


def test_topics_are_replicated_three_times_with_two_in_sync(cluster) -> None:
    settings, _ = cluster
    admin = AdminClient(client_auth(settings))
    # Each broker learns a topic from the controller's log; the one asked may be behind.
    wanted = {spec.name for spec in TOPICS}

    def listed() -> object:
        md = admin.list_topics(timeout=10)
        return md if wanted <= set(md.topics) else None

    md = wait_for(listed, timeout=30)
    for spec in TOPICS:
        parts = md.topics[spec.name].partitions.values()
        assert {len(p.replicas) for p in parts} == {3}, spec.name
    resource = ConfigResource(ConfigResource.Type.TOPIC, TICKS.name)
    config = admin.describe_configs([resource])[resource].result()
    assert config["min.insync.replicas"].value == "2"


def test_replication_is_configured_once_for_every_client() -> None:
    three = Settings(kafka={"brokers": 3})
    assert (three.kafka.replicas(), three.kafka.durability()) == (3, {"min.insync.replicas": "2"})
    two = Settings(kafka={"brokers": 3, "replication": 2})
    assert (two.kafka.replicas(), two.kafka.durability()) == (2, {"min.insync.replicas": "1"})
    one = Settings()  # one broker, or a cluster of someone else's: the broker decides
    assert (one.kafka.replicas(), one.kafka.durability()) == (-1, {})
    assert three.kafka_servers() == "127.0.0.1:9092,127.0.0.2:9092,127.0.0.3:9092"


def test_acked_writes_survive_kill_9_of_a_broker(cluster) -> None:
    settings, services = cluster
    before = [f"before-{i}".encode() for i in range(500)]
    produce(settings, TICKS.name, before)
    victim = services[1]
    pid = victim.pid()
    assert pid is not None
    os.kill(pid, signal.SIGKILL)
    admin = AdminClient(client_auth(settings))
    wait_for(lambda: len(admin.list_topics(timeout=5).brokers) == 2, timeout=60)
    after = [f"after-{i}".encode() for i in range(500)]
    produce(settings, TICKS.name, after)  # acks=all: two in sync are enough
    got = consume(settings, TICKS.name, "cluster-test", want=1000)
    assert sorted(got) == sorted(before + after)
