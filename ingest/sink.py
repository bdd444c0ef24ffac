"""Kafka, the ingestor's only output: idempotent, acks=all, bounded, with back-pressure.

When librdkafka's bounded queue is full, ``produce`` raises BufferError; we then serve
delivery reports until there is room, which slows the fetching thread down instead of
growing memory. Delivery failures are counted and make :meth:`flush` report them.
"""

from __future__ import annotations

import threading

from confluent_kafka import KafkaError, KafkaException, Producer
from google.protobuf.message import Message

from candlewire.config import Settings
from candlewire.kafka import producer_config
from ingest.exchanges.base import TradeRun
from proto import market_pb2
from proto.envelope import record_head, to_record

KEYS_KEPT = 4096  # encoded keys remembered; a history request's id is a key too
POLL_EVERY = 1024  # records between two polls for error reports and events
TICK_HEAD = record_head(market_pb2.Tick)


class SinkError(RuntimeError):
    pass


class RecordTooLarge(SinkError):
    """A record over the producer's ``message.max.bytes``: no retry will take it."""


class _Failures:
    """Delivery failures, counted, not kept: after an outage of hours a list would grow by
    every record the outage refused. A callable object, not a bound method of the sink, so
    the producer does not keep the sink alive."""

    __slots__ = ("count", "last", "lock")

    def __init__(self) -> None:
        self.count = 0
        self.last = ""
        self.lock = threading.Lock()

    def __call__(self, err: KafkaError | None, _msg: object) -> None:
        if err is not None:
            with self.lock:
                self.count += 1
                self.last = str(err)


class KafkaSink:
    def __init__(self, settings: Settings, **overrides: object) -> None:
        # Delivery reports for failures only: a Python callback per record would cost more
        # than the produce call itself, and success needs no action from us. No record is
        # given up while Kafka is away (librdkafka's 5 minutes lost a longer outage's trades
        # with no gap to tell): the bounded queue fills, produce then waits, the venue's
        # stream backs up, and what it drops is a gap the ingestor finds and repairs.
        config = producer_config(settings, **{"message.timeout.ms": 0, **overrides})
        self._failures = _Failures()
        config.setdefault("delivery.report.only.error", True)
        config.setdefault("on_delivery", self._failures)
        self.message_timeout_ms = config["message.timeout.ms"]  # 0: never given up
        self._producer = Producer(config)
        self._produce = self._producer.produce
        self._sent = 0
        self._keys: dict[str, bytes] = {}  # a stream sends one key over and over

    def _key(self, key: str) -> bytes:
        key_bytes = self._keys.get(key)
        if key_bytes is None:
            if len(self._keys) >= KEYS_KEPT:
                self._keys.clear()
            key_bytes = self._keys[key] = key.encode()
        return key_bytes

    def send(self, topic: str, key: str, msg: Message) -> None:
        value, key_bytes = to_record(msg), self._keys.get(key)
        if key_bytes is None:
            key_bytes = self._key(key)
        try:
            self._produce(topic, value, key_bytes)
        except BufferError:
            self._produce_when_room(topic, value, key_bytes)
        except KafkaException as exc:
            if exc.args[0].code() != KafkaError.MSG_SIZE_TOO_LARGE:
                raise
            raise RecordTooLarge(
                f"a {type(msg).__name__} of {len(value):,} bytes is over the largest record "
                "Kafka takes"
            ) from None
        self._sent += 1
        if not self._sent % POLL_EVERY:  # serve error reports and events in bulk
            self._producer.poll(0)

    def send_trades(self, topic: str, key: str, run: TradeRun) -> None:
        """Each trade of ``run`` in order, as the record :meth:`send` writes for
        ``run.tick(i)``: one Tick changed and serialized again per trade, not one made."""
        tick = market_pb2.Tick(ticker=run.ticker, ingest_time_ns=run.ingest_time_ns)
        serialize, produce, key_bytes = tick.SerializeToString, self._produce, self._key(key)
        columns = zip(run.trade_ids, run.prices, run.sizes, run.sides, run.times_ns, strict=True)
        for trade_id, price, size, side, time_ns in columns:
            tick.trade_id, tick.price, tick.size = trade_id, price, size
            tick.side, tick.exchange_time_ns = side, time_ns  # type: ignore[assignment]
            value = TICK_HEAD + serialize()
            try:
                produce(topic, value, key_bytes)
            except BufferError:
                self._produce_when_room(topic, value, key_bytes)
        before, self._sent = self._sent, self._sent + len(run)
        if before // POLL_EVERY != self._sent // POLL_EVERY:
            self._producer.poll(0)

    def _produce_when_room(self, topic: str, value: bytes, key: bytes) -> None:
        """Back-pressure: serve the broker's replies until the queue takes the record."""
        while True:
            self._producer.poll(0.05)
            try:
                self._produce(topic, value, key)
                return
            except BufferError:
                continue

    @property
    def failures(self) -> int:
        """Records librdkafka gave up on since this sink was made."""
        return self._failures.count

    def flush(self, timeout: float = 60.0, *, since: int = 0) -> None:
        """Wait until every record is acknowledged; raise if any failed after ``since`` (a
        :attr:`failures` read before the caller sent its records). The sink is shared, so a
        job judges only its own window: an outage an hour ago must not fail it, and one
        that overlaps its records fails it even if another job's record was the one lost."""
        remaining = self._producer.flush(timeout)
        if remaining:
            raise SinkError(f"{remaining} records not acknowledged within {timeout:.0f}s")
        failed = self._failures.count - since
        if failed > 0:
            raise SinkError(f"{failed} records failed: {self._failures.last}")

    def poll(self) -> None:
        self._producer.poll(0)
