"""Kafka, the ingestor's only output: idempotent, acks=all, bounded, with back-pressure.

When librdkafka's bounded queue is full, ``produce`` raises BufferError; we then serve
delivery reports until there is room, which slows the fetching thread down instead of
growing memory. Delivery failures are counted and make :meth:`flush` report them.
"""

from __future__ import annotations

import threading

from confluent_kafka import KafkaError, Producer
from google.protobuf.message import Message

from candlewire.config import Settings
from candlewire.kafka import producer_config
from proto.envelope import to_record


class SinkError(RuntimeError):
    pass


class KafkaSink:
    def __init__(self, settings: Settings, **overrides: object) -> None:
        self._producer = Producer(producer_config(settings, **overrides))
        self._lock = threading.Lock()
        self.delivered = 0
        self.failed: list[str] = []
        self._sent = 0

    def _on_delivery(self, err: KafkaError | None, _msg: object) -> None:
        with self._lock:
            if err is None:
                self.delivered += 1
            else:
                self.failed.append(str(err))

    def send(self, topic: str, key: str, msg: Message) -> None:
        value = to_record(msg)
        while True:
            try:
                self._producer.produce(
                    topic, value=value, key=key.encode(), on_delivery=self._on_delivery
                )
                break
            except BufferError:
                self._producer.poll(0.05)  # back-pressure: wait for the broker to drain us
        self._sent += 1
        if self._sent % 256 == 0:  # delivery reports in bulk: a poll per record costs ~1 µs
            self._producer.poll(0)

    def flush(self, timeout: float = 60.0) -> None:
        """Wait until every record is acknowledged; raise if any was not."""
        remaining = self._producer.flush(timeout)
        if remaining:
            raise SinkError(f"{remaining} records not acknowledged within {timeout:.0f}s")
        if self.failed:
            raise SinkError(f"{len(self.failed)} records failed: {self.failed[0]}")

    def poll(self) -> None:
        self._producer.poll(0)
