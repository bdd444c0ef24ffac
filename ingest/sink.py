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
        # Delivery reports for failures only: a Python callback per record would cost more
        # than the produce call itself, and success needs no action from us.
        config = producer_config(settings, **overrides)
        failed: list[str] = []
        lock = threading.Lock()

        def on_delivery(err: KafkaError | None, _msg: object) -> None:
            # A closure, not a bound method: the producer must not keep this sink alive.
            if err is not None:
                with lock:
                    failed.append(str(err))

        config.setdefault("delivery.report.only.error", True)
        config.setdefault("on_delivery", on_delivery)
        self._producer = Producer(config)
        self.failed = failed
        self._sent = 0

    def send(self, topic: str, key: str, msg: Message) -> None:
        value, key_bytes = to_record(msg), key.encode()
        while True:
            try:
                self._producer.produce(topic, value, key_bytes)
                break
            except BufferError:
                self._producer.poll(0.05)  # back-pressure: wait for the broker to drain us
        self._sent += 1
        if self._sent % 1024 == 0:  # serve error reports and events in bulk
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
