"""Helpers that play the other roles around the relay in tests: ingestors and publishers."""

from __future__ import annotations

import subprocess
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import zmq
from google.protobuf.message import Message
from prometheus_client import Counter

from candlewire.config import Settings
from candlewire.curve import Keyring, dial
from candlewire.kafka import client_auth
from candlewire.testing import free_port as free_port
from candlewire.testing import free_settings as free_settings
from candlewire.testing import history_ready, spawn
from candlewire.testing import stream_metric as stream_metric
from candlewire.testing import wait_for as wait_for
from candlewire.topics import NOTIFY_REPEAT_DELAYS_S, parse_ticker
from ingest.exchanges.base import TradeRun
from ingest.sink import SinkError
from proto import requests_pb2 as rq
from proto.envelope import decode_sub, encode_topic


def history_work(
    ticker: str, period_s: int, start_ms: int, end_ms: int, request_id: str = "h"
) -> rq.DataRequest:
    """A history request as the relay hands it to ingestors: what ``run_history`` takes."""
    return rq.DataRequest(
        request_id=request_id,
        kind=rq.HISTORICAL,
        ticker=ticker,
        exchange=parse_ticker(ticker).exchange,
        period_s=period_s,
        start_ms=start_ms,
        end_ms=end_ms,
    )


def new_topic(settings: Settings, partitions: int = 3) -> str:
    """A topic of the test's own on the session's broker: what the platform's jobs read
    must not see a test's records."""
    from confluent_kafka.admin import AdminClient, NewTopic

    name = f"test-{uuid.uuid4().hex[:10]}"
    admin = AdminClient(client_auth(settings))
    topic = NewTopic(name, num_partitions=partitions, replication_factor=1)
    admin.create_topics([topic])[name].result()
    return name


class RecordingSink:
    """Stands in for ingest's KafkaSink: records what would go to Kafka, in order."""

    def __init__(self, failed_before: int = 0) -> None:
        self.records: list[tuple[str, str, Message]] = []
        self.failures = failed_before  # records "Kafka refused" before; none after

    def send(self, topic: str, key: str, msg: Message) -> None:
        self.records.append((topic, key, msg))

    def send_trades(self, topic: str, key: str, run: TradeRun) -> None:
        self.records.extend((topic, key, tick) for tick in run.ticks())

    def flush(self, timeout: float = 60.0, *, since: int = 0) -> None:
        """KafkaSink's rule: failures after ``since`` fail the flush."""
        if self.failures > since:
            raise SinkError(f"{self.failures - since} records failed")

    def sent(self, topic: str) -> list:
        """The messages sent to one topic."""
        return [m for t, _, m in self.records if t == topic]


class FakeIngestor:
    """An ingestor's work-queue side: SUB with exchange prefixes."""

    def __init__(
        self, ctx: zmq.Context, settings: Settings, prefixes: list[str], key: str = "ingest"
    ) -> None:
        self.sock = dial(ctx.socket(zmq.SUB), settings, "relay", key)
        self.sock.setsockopt(zmq.LINGER, 0)
        for p in prefixes:
            self.sock.subscribe(p)
        for endpoint in settings.relays("work_queue"):  # as the ingestor: from every relay
            self.sock.connect(endpoint)

    def keep_up(self) -> None:
        """Let libzmq run the socket's pending commands, as a receive loop does: after a
        relay restart, the reconnected SUB sends its subscriptions again only then."""
        self.sock.poll(0)

    def recv(self, timeout: float = 5.0) -> tuple[str, Message] | None:
        if not self.sock.poll(int(timeout * 1000)):
            return None
        return decode_sub(self.sock.recv_multipart())

    def close(self) -> None:
        self.sock.close()


class FakePublisher:
    """The stream processor's publishing side: PUB bound where the relay's XSUB connects."""

    def __init__(
        self,
        ctx: zmq.Context,
        endpoint: str,
        bind: bool = True,
        settings: Settings | None = None,
        key: str = "stream",
    ) -> None:
        """With ``settings`` and CURVE on, it proves ``key`` to the relay as a publisher."""
        self.sock = ctx.socket(zmq.PUB)
        self._lock = threading.Lock()
        if settings is not None:
            dial(self.sock, settings, "relay", key)
        self.sock.setsockopt(zmq.LINGER, 0)
        if bind:
            self.sock.bind(endpoint)
        else:
            self.sock.connect(endpoint)

    def publish(self, topic: str, msg: Message) -> None:
        self.send(encode_topic(topic, msg))

    def send(self, frames: list[bytes]) -> None:
        """Frames as they are, malformed or not. Feeds on several threads share one PUB: a
        ZeroMQ socket used by two threads at once can abort the process in libzmq."""
        with self._lock:
            self.sock.send_multipart(frames)

    def close(self) -> None:
        self.sock.close()


def secured_settings(state_dir: object, **overrides: object) -> Settings:
    """Free ports with CURVE on, and the keys ``candlewire keys init`` makes."""
    settings = free_settings(state_dir, security={"curve": True}, **overrides)
    Keyring(settings).init()
    return settings


def serve_pipeline(ctx, settings, publisher, stop: threading.Event, status=rq.HISTORY_OK) -> None:
    """Play ingestor + stream processor: answer every DataRequest at once.

    Like the real stream processor it repeats each notification on NOTIFY_REPEAT_DELAYS_S.
    """
    ing = FakeIngestor(ctx, settings, ["BINANCE:"])
    due: list[tuple[float, str, rq.HistoryReadyNotification]] = []
    try:
        while not stop.is_set():
            now = time.monotonic()
            for item in [d for d in due if d[0] <= now]:
                due.remove(item)
                publisher.publish(item[1], item[2])
            got = ing.recv(0.05)
            if got is None:
                continue
            _, work = got
            note = history_ready(work, status)
            publisher.publish(work.notification_topic, note)
            due += [(now + d, work.notification_topic, note) for d in NOTIFY_REPEAT_DELAYS_S[1:]]
    finally:
        ing.close()


def counted(counter: Counter) -> dict[tuple[str, ...], float]:
    """A Prometheus counter's totals by label values (``()`` when it has no labels)."""
    return {
        tuple(s.labels.values()): s.value
        for m in counter.collect()
        for s in m.samples
        if s.name.endswith("_total")
    }


def relay_frames(
    settings: Settings, frames: list[bytes], timeout: float = 5.0, key: str = "ingest"
) -> rq.SubmitResponse:
    """Send raw frames to the relay over REQ; a REQ peer must always get a SubmitResponse."""
    from proto.envelope import decode

    req = dial(zmq.Context.instance().socket(zmq.REQ), settings, "relay", key)
    req.setsockopt(zmq.LINGER, 0)
    req.connect(settings.connect("client_requests"))
    try:
        req.send_multipart(frames)
        assert req.poll(int(timeout * 1000)), "relay left a REQ peer without a reply"
        resp = decode(req.recv_multipart())
    finally:
        req.close()
    assert isinstance(resp, rq.SubmitResponse)
    return resp


def relay_call(
    settings: Settings, msg: Message, timeout: float = 5.0, key: str = "ingest"
) -> rq.SubmitResponse:
    """Send one envelope to the relay, as a trusted component (an ingestor's key) would."""
    from proto.envelope import encode

    return relay_frames(settings, encode(msg), timeout, key)


@contextmanager
def _from_the_beginning(settings: Settings, topic: str) -> Iterator[tuple[Any, list[int]]]:
    """A consumer of its own group, assigned every partition of ``topic`` from offset 0, and
    those partitions; closed on the way out."""
    from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

    from candlewire.kafka import consumer_config

    consumer = Consumer(consumer_config(settings, f"reader-{time.monotonic_ns()}"))
    try:
        parts = list(consumer.list_topics(topic, timeout=10).topics[topic].partitions)
        consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in parts])
        yield consumer, parts
    finally:
        consumer.close()


def read_topic(
    settings: Settings, topic: str, done: Callable[[list], bool], timeout: float = 30.0
) -> list:
    """Decoded records of a Kafka topic from the beginning, until ``done(records)``."""
    from proto.envelope import from_record

    out: list = []
    deadline = time.monotonic() + timeout
    with _from_the_beginning(settings, topic) as (consumer, _):
        while not done(out) and time.monotonic() < deadline:
            msg = consumer.poll(0.2)
            if msg is not None and msg.error() is None:
                out.append(from_record(msg.value()))
    return out


def read_topic_to_end(settings: Settings, topic: str, timeout: float = 60.0) -> list:
    """Every decoded record the topic holds as of the call: each partition read up to its end
    offset then. For "nothing more came" checks, where a read bounded by time alone may stop
    short on a loaded machine."""
    from confluent_kafka import TopicPartition

    from proto.envelope import from_record

    out: list = []
    deadline = time.monotonic() + timeout
    with _from_the_beginning(settings, topic) as (consumer, parts):
        ends = {
            p: consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1]
            for p in parts
        }
        while True:
            behind = [TopicPartition(topic, p) for p, end in ends.items() if end > 0]
            if not behind:
                return out
            assert time.monotonic() < deadline, f"{topic}: not read to its end in {timeout} s"
            msg = consumer.poll(0.2)
            if msg is not None and msg.error() is None:
                out.append(from_record(msg.value()))
            for tp in consumer.position(behind):  # past control records too
                if tp.offset >= ends[tp.partition]:
                    ends[tp.partition] = 0


# -- the real streaming job ------------------------------------------------------------------

IDLE_TIMEOUT_S = 30.0
RUNNING: list[subprocess.Popen] = []  # streaming-job processes, stopped at session end
RELAYS: list = []  # the live pipeline's relay; a test may replace it (the last one is stopped)


def fast_books() -> Any:
    """The live pipeline's second SIM exchange, ``BOOKS``: 50 book updates a second, so a
    test compares a thousand books in under a minute (SIM's own makes one a second). Each
    call makes the same exchange (its seed and rate), a test's oracle for the ingestor's."""
    from ingest.exchanges.sim import SimExchange

    return SimExchange(name="BOOKS", rate=50.0)


def faulty_books() -> Any:
    """The live pipeline's third SIM exchange, ``FAULTY``: ten book updates a second, and
    once its book streams, an update that loses a level change under its true checksum (at
    2 s), a skipped one (at 6 s) and one with a price that is no number (at 10 s). Each call
    makes the same exchange, a test's oracle."""
    from ingest.exchanges.sim import SimExchange

    faults = "book:checksum@2s,book:skip@6s,book:malformed@10s"
    return SimExchange(name="FAULTY", rate=10.0, faults=faults)


def start_job(settings: Settings) -> subprocess.Popen:
    """`candlewire stream` as a process, returned once its metrics say it is up.

    Commits come every second so tests see rows soon; book appends every 3 s, since a book
    streams through whole modules and each append costs the job Spark's fixed work (at 1 s,
    one SIM book kept 0.68 of a core busy, at 3 s 0.50). The lateness allowance is the default
    (each test's ticker is a feed with its own clock, so ticks of the recent past are fine);
    a feed quiet for IDLE_TIMEOUT_S gets its idle mark, longer than any pause a test makes
    inside one feed's trades.
    """
    env = {
        "CANDLEWIRE_STREAM_TICKS_TRIGGER_S": "1",
        "CANDLEWIRE_STREAM_BOOKS_TRIGGER_S": "3",
        "CANDLEWIRE_STREAM_IDLE_TIMEOUT_S": str(IDLE_TIMEOUT_S),
    }
    return spawn(
        settings,
        ["stream"],
        healthy="candlewire_stream_up 1.0",
        metrics_endpoint="stream_metrics",
        env=env,
        log=settings.state_dir / "stream.log",
        timeout=180,
    )
