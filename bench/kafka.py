"""Kafka's own kafka-producer-perf-test against a local broker: the ingest baseline.

Starts a private broker on free ports (so it never disturbs `make up`), runs
org.apache.kafka.tools.ProducerPerformance from the fetched jars with 100-byte records and
acks=all, idempotence on, as our ingestors produce, and prints its records/s. The last line
is JSON. ``bench/ingest.py`` compares against :func:`perf_test_records_per_s`.

    python -m bench.kafka [--records N]
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
from collections.abc import Iterable

from confluent_kafka import Producer

from bench.stack import private_broker, sigterm_unwinds
from candlewire.config import Settings

TOPIC = "bench.perf"


def produce_all(
    producer: Producer, topic: str, records: Iterable[tuple[bytes, bytes]], flush_s: float = 120.0
) -> None:
    """Each (key, value) into ``topic`` in order, as fast as the producer takes them: when its
    queue is full (``BufferError``) it is served until there is room. Then until all are sent."""
    for key, value in records:
        while True:
            try:
                producer.produce(topic, key=key, value=value)
                break
            except BufferError:
                producer.poll(0.05)
    producer.flush(flush_s)


def perf_test_records_per_s(settings: Settings, records: int, size: int = 100) -> float:
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": settings.kafka_servers()})
    if TOPIC not in admin.list_topics(timeout=10).topics:
        admin.create_topics([NewTopic(TOPIC, num_partitions=6, replication_factor=1)])[
            TOPIC
        ].result()
    jars = settings.jvm_dir / "kafka"
    out = subprocess.run(
        [
            "java",
            "-Xmx512m",
            "-cp",
            f"{jars}/*",
            "org.apache.kafka.tools.ProducerPerformance",
            "--topic",
            TOPIC,
            "--num-records",
            str(records),
            "--record-size",
            str(size),
            "--throughput",
            "-1",
            "--producer-props",
            f"bootstrap.servers={settings.kafka_servers()}",
            "acks=all",
            "enable.idempotence=true",
            "linger.ms=5",
            "compression.type=lz4",
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    # "N records sent, X records/sec (Y MB/sec), ..." is the summary line.
    summary = [line for line in out.stdout.splitlines() if " records sent, " in line][-1]
    print(summary)
    return float(re.search(r"([\d.]+) records/sec", summary).group(1))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--records", type=int, default=2_000_000)
    args = parser.parse_args()
    with private_broker() as settings:
        rate = perf_test_records_per_s(settings, args.records)
    print(
        json.dumps(
            {"kafka_perf_records_per_s": round(rate), "record_bytes": 100, "records": args.records}
        )
    )


if __name__ == "__main__":
    with sigterm_unwinds():  # its brokers and services stop on a kill too
        main()
