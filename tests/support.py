"""Helpers that play the other roles around the relay in tests: ingestors and publishers."""

from __future__ import annotations

import os
import random
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path

import zmq
from google.protobuf.message import Message
from prometheus_client import Counter

from candlewire.config import Settings
from candlewire.endpoints import ENDPOINTS
from candlewire.topics import NOTIFY_REPEAT_DELAYS_S
from proto import requests_pb2 as rq
from proto.envelope import decode_sub, encode_topic

_handed_out: set[int] = set()


def _ephemeral_low() -> int:
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def free_port() -> int:
    """A port that is free now and that the kernel will not hand out on its own.

    Port 0 picks from the ephemeral range, where every outgoing connection (Kafka
    clients, ZMQ connects) also takes its local port; between our pick and the
    service's bind one of those could take it. So pick below that range instead,
    never twice in one test run.
    """
    top = min(_ephemeral_low(), 32768) - 1
    rng = random.Random()
    for _ in range(1000):
        port = rng.randint(top - 12000, top)
        if port in _handed_out:
            continue
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
        _handed_out.add(port)
        return port
    raise RuntimeError("no free port below the ephemeral range")


def free_settings(tmp_path: object, **overrides: object) -> Settings:
    """Settings with every endpoint on its own free port, state under tmp_path."""
    return Settings(
        ports={name: free_port() for name in ENDPOINTS},
        state_dir=tmp_path,  # type: ignore[arg-type]
        **overrides,  # type: ignore[arg-type]
    )


def wait_for(
    predicate: Callable[[], object], timeout: float = 10.0, interval: float = 0.02
) -> object:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"condition not met within {timeout}s: {predicate}")


class FakeIngestor:
    """An ingestor's work-queue side: SUB with exchange prefixes."""

    def __init__(self, ctx: zmq.Context, settings: Settings, prefixes: list[str]) -> None:
        self.sock = ctx.socket(zmq.SUB)
        self.sock.setsockopt(zmq.LINGER, 0)
        for p in prefixes:
            self.sock.subscribe(p)
        self.sock.connect(settings.connect("work_queue"))

    def recv(self, timeout: float = 5.0) -> tuple[str, Message] | None:
        if not self.sock.poll(int(timeout * 1000)):
            return None
        return decode_sub(self.sock.recv_multipart())

    def close(self) -> None:
        self.sock.close()


class FakePublisher:
    """The stream processor's publishing side: PUB bound where the relay's XSUB connects."""

    def __init__(self, ctx: zmq.Context, endpoint: str, bind: bool = True) -> None:
        self.sock = ctx.socket(zmq.PUB)
        self.sock.setsockopt(zmq.LINGER, 0)
        if bind:
            self.sock.bind(endpoint)
        else:
            self.sock.connect(endpoint)

    def publish(self, topic: str, msg: Message) -> None:
        self.sock.send_multipart(encode_topic(topic, msg))

    def close(self) -> None:
        self.sock.close()


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
            note = rq.HistoryReadyNotification(
                request_id=work.request_id,
                status=status,
                row_count=(work.end_ms - work.start_ms) // (work.period_s * 1000),
                iceberg_table="candlewire.ohlc",
                ticker=work.ticker,
                period_s=work.period_s,
                start_ms=work.start_ms,
                end_ms=work.end_ms,
                error_message="" if status == rq.HISTORY_OK else "unknown symbol",
            )
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
    settings: Settings, frames: list[bytes], timeout: float = 5.0
) -> rq.SubmitResponse:
    """Send raw frames to the relay over REQ; a REQ peer must always get a SubmitResponse."""
    from proto.envelope import decode

    req = zmq.Context.instance().socket(zmq.REQ)
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


def relay_call(settings: Settings, msg: Message, timeout: float = 5.0) -> rq.SubmitResponse:
    """Send one envelope to the relay, as a trusted component would."""
    from proto.envelope import encode

    return relay_frames(settings, encode(msg), timeout)


def read_topic(
    settings: Settings, topic: str, done: Callable[[list], bool], timeout: float = 30.0
) -> list:
    """Decoded records of a Kafka topic from the beginning, until ``done(records)``."""
    from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

    from candlewire.kafka import consumer_config
    from proto.envelope import from_record

    consumer = Consumer(consumer_config(settings, f"reader-{time.monotonic_ns()}"))
    parts = consumer.list_topics(topic, timeout=10).topics[topic].partitions
    consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in parts])
    out: list = []
    deadline = time.monotonic() + timeout
    try:
        while not done(out) and time.monotonic() < deadline:
            msg = consumer.poll(0.2)
            if msg is not None and msg.error() is None:
                out.append(from_record(msg.value()))
    finally:
        consumer.close()
    return out


# -- the real streaming job ------------------------------------------------------------------

RUNNING: list[subprocess.Popen] = []  # streaming-job processes, stopped at session end


def start_job(settings: Settings) -> subprocess.Popen:
    """`candlewire stream` as a process, returned once its metrics say it is up.

    The watermark is two days so tests may produce ticks of the recent past; commits come
    every second so tests see rows soon.
    """
    env = {
        **os.environ,
        **settings.to_env(),
        "CANDLEWIRE_STREAM_WATERMARK_S": "172800",
        "CANDLEWIRE_STREAM_TICKS_TRIGGER_S": "1",
    }
    log = open(settings.state_dir / "stream.log", "ab")  # noqa: SIM115 - closed with the process
    proc = subprocess.Popen(
        [sys.executable, "-m", "candlewire.cli", "stream"],
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    url = f"http://127.0.0.1:{settings.port('stream_metrics')}/metrics"

    def up() -> bool:
        assert proc.poll() is None, (settings.state_dir / "stream.log").read_text()[-3000:]
        try:
            return (
                "candlewire_stream_up 1.0" in urllib.request.urlopen(url, timeout=1).read().decode()
            )
        except OSError:
            return False

    wait_for(up, timeout=180, interval=0.5)
    return proc


def stream_metric(settings: Settings, series: str) -> float:
    """Sum of the streaming job's Prometheus series whose line starts with ``series``."""
    url = f"http://{settings.host}:{settings.port('stream_metrics')}/metrics"
    body = urllib.request.urlopen(url, timeout=5).read().decode()
    return sum(float(x.split()[-1]) for x in body.splitlines() if x.startswith(series))
