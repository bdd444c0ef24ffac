"""Several hosts on network namespaces (:mod:`launcher.netns`): three Kafka brokers, two
relays, two stream publishers the relays find by one DNS name, and a client given both
relays. ``kill -9`` of a relay and then of a broker under the client loses no tick and no
history request, the publishers' journal goes on being written with a broker gone, and
every connection stays on the hosts' own addresses. Root only. A scale-out run of its own
(``make scale``, with the Spark and whole-pipeline runs beside it), outside the test run's
25 minutes."""

from __future__ import annotations

import time
import urllib.request

import pytest
from confluent_kafka import Consumer, KafkaException, TopicPartition

from bench.scale import failover, kafka_bootstrap, start_hosts
from candlewire.config import Settings
from candlewire.kafka import JOURNAL
from launcher.netns import Lab

pytestmark = [
    pytest.mark.scale,
    pytest.mark.skipif(Lab.available() is not None, reason=str(Lab.available())),
]
SUBNET = "10.78.0"
HISTORY = 10


def discovered(address: str) -> float:
    url = Settings().metrics_url("relay_metrics", address)
    body = urllib.request.urlopen(url, timeout=5).read().decode()
    (line,) = [x for x in body.splitlines() if x.startswith("candlewire_relay_discovered_pub")]
    return float(line.split()[-1])


def journal_end(lab: Lab) -> int:
    """Records in the journal topic: what the publishers have had acknowledged (acks=all).
    Asked again, by a new client with fresh metadata, while a dead broker's partitions still
    wait for their new leader."""
    deadline = time.monotonic() + 60
    while True:
        consumer = Consumer({"bootstrap.servers": kafka_bootstrap(lab), "group.id": "netns"})
        try:
            return sum(
                consumer.get_watermark_offsets(TopicPartition(JOURNAL.name, p), timeout=5)[1]
                for p in range(JOURNAL.partitions)
            )
        except KafkaException:
            if time.monotonic() > deadline:
                raise
            time.sleep(1.0)
        finally:
            consumer.close()


def test_relays_publishers_and_brokers_on_hosts_of_their_own(tmp_path) -> None:
    with Lab(prefix="cwt", subnet=SUBNET) as lab:
        procs = start_hosts(lab, tmp_path, rate=2000, brokers=3)
        for relay in ("relay-a", "relay-b"):  # both publishers' two ports, by DNS
            assert discovered(lab.hosts[relay].address) == 4
        got = failover(lab, tmp_path, procs, HISTORY, kills=("relay-a", "kafka-2"))
        assert got["histories_done"] == HISTORY, got["histories"]
        assert got["ticks"] > 0 and got["missing"] == 0 and got["repeated"] == 0, got
        assert got["failover_s"] is not None and got["failover_s"] < 2.0, got
        written = journal_end(lab)
        time.sleep(2.0)
        assert journal_end(lab) > written, "the journal stopped with one broker of three gone"
        for host in ("relay-b", "pub-a", "client", "kafka-1"):
            assert lab.stray(host) == [], host
