"""Several relays side by side: a client given all of them loses no history request and no
live message when one is killed (``kill -9``) under it.

Relay A runs as its own process on 127.0.0.1 and relay B in this one on 127.0.0.2, both on
the same ports, as on two hosts.
"""

from __future__ import annotations

import signal
import subprocess
import threading
import time
import zlib
from collections.abc import Iterator
from pathlib import Path

import pytest
import zmq

from candlewire.client import Client
from candlewire.config import Settings
from candlewire.testing import TickFeed, free_settings, spawn, wait_for
from proto import requests_pb2 as rq
from relay import Relay
from streaming.publisher import StreamPublisher
from tests.journal.test_journal import journal_settings, kafka_servers  # noqa: F401
from tests.support import FakeIngestor, FakePublisher, serve_pipeline

A, B = "127.0.0.1", "127.0.0.2"
START, DAY_MS = 1_700_000_000_000, 86_400_000


def two_relays(settings: Settings) -> tuple[Settings, Settings]:
    """Settings of everyone (relay A's host first) and of relay B on its own host."""
    every = settings.model_copy(update={"relay_hosts": [A, B]})
    return every, every.model_copy(update={"host": B, "bind_host": B})


def spawn_relay(settings: Settings) -> subprocess.Popen:
    return spawn(
        settings, ["relay"], healthy="candlewire_relay_up 1.0", metrics_endpoint="relay_metrics"
    )


def kill_9(proc: subprocess.Popen) -> None:
    proc.send_signal(signal.SIGKILL)
    proc.wait(10)


def starts_at_a(client_id: str) -> bool:
    """Whether a client's first request goes to relay A (clients spread by their id)."""
    return zlib.crc32(client_id.encode()) % 2 == 0


@pytest.fixture
def relays(tmp_path: Path) -> Iterator[tuple[Settings, subprocess.Popen, Relay]]:
    every, on_b = two_relays(free_settings(tmp_path))
    a = spawn_relay(every)
    b = Relay(on_b, metrics=False).start()
    yield every, a, b
    b.stop()
    a.kill()
    a.wait(10)


def test_history_requests_complete_through_the_relay_left(ctx, relays) -> None:
    every, a, b = relays
    publisher = FakePublisher(ctx, every.bind("stream_pub"))  # each relay dials its own host's
    publisher.sock.bind(f"tcp://{B}:{every.port('stream_pub')}")
    stop = threading.Event()
    pipeline = threading.Thread(target=serve_pipeline, args=(ctx, every, publisher, stop))
    pipeline.start()
    ids = [f"cl-{i}" for i in range(8)]
    assert any(map(starts_at_a, ids)) and not all(map(starts_at_a, ids))
    try:
        with Client(every, client_id="cl-before") as client:  # both up: requests are served
            note = client.request_history("BINANCE:BTC/USDT", 60, START, START + DAY_MS, timeout=20)
            assert note.status == rq.HISTORY_OK
        kill_9(a)
        for client_id in ids:
            with Client(every, client_id=client_id, attempt_timeout=0.5) as client:
                note = client.request_history(
                    "BINANCE:BTC/USDT", 60, START, START + DAY_MS, timeout=20
                )
                assert note.status == rq.HISTORY_OK, client_id
        assert b.metrics.requests.labels("ok")._value.get() >= len(ids)
    finally:
        stop.set()
        pipeline.join()
        publisher.close()


def test_a_live_subscription_loses_nothing_when_a_relay_is_killed(journal_settings) -> None:  # noqa: F811
    every, on_b = two_relays(journal_settings)
    ctx = zmq.Context()
    ingestor = FakeIngestor(ctx, every, ["SIM:"])
    a = spawn_relay(every)
    b = Relay(on_b, metrics=False).start()
    stream_pub = StreamPublisher(every)  # relay A dials it; it dials relay B's ingress
    feed = TickFeed(stream_pub)
    total = 12_000
    try:
        with Client(every) as client:
            sub = client.subscribe(feed.ticker, idle_timeout=30)
            got: list[int] = []
            arrived: list[float] = []

            def run() -> None:
                for tick in sub:
                    got.append(tick.stream.source_offset)
                    arrived.append(time.monotonic())
                    if tick.stream.source_offset == total - 1:
                        return

            reader = threading.Thread(target=run)
            reader.start()
            wait_for(lambda: got or feed.publish(1), timeout=10)  # until the path is up
            # ... and both paths: a tick through each relay, one of them a duplicate
            wait_for(lambda: sub.stats.duplicates > 0 or feed.publish(1), timeout=30)
            flowing = feed.flow(per_s=2000, seconds=(total - feed.next_offset) / 2000)
            wait_for(lambda: len(got) > 2000, timeout=20)
            killed = time.monotonic()
            kill_9(a)
            flowing.join()
            reader.join(30)
        assert got == list(range(got[0], total)), "every tick once, in order"
        assert sub.stats.gaps == 0, "relay B's copy carried on: nothing had to be fetched"
        assert sub.stats.duplicates > 0, "both relays delivered"
        after = [t for t in arrived if t > killed]
        print(f"longest pause after the kill: {max(map(float.__sub__, after[1:], after)):.3f}s")
    finally:
        stream_pub.close()
        b.stop()
        a.kill()
        ingestor.close()
        ctx.destroy(linger=0)
