"""100k random frames on each relay socket; the relay must keep serving.

Each socket is hit by the peer type that may legally connect to it (so frames reach the
relay's code), plus a raw TCP STREAM peer that sends random bytes below the ZMTP layer.
"""

from __future__ import annotations

import contextlib
import random
import time

import pytest
import zmq

from candlewire import Client
from proto import requests_pb2 as rq
from proto.envelope import encode
from tests.support import FakeIngestor, counted, wait_for

FRAMES = 100_000
START = 1_700_000_000_000


def random_multipart(rng: random.Random) -> list[bytes]:
    kind = rng.random()
    if kind < 0.25:  # REQ-shaped: delimiter, then noise
        return [b"", *(rng.randbytes(rng.randint(0, 40)) for _ in range(rng.randint(0, 3)))]
    if kind < 0.5:  # a plausible envelope with a random payload
        return [b"\x01", bytes([rng.choice([0x01, 0x03, 0x10, 0x11, 0x7F])]) + rng.randbytes(20)]
    return [rng.randbytes(rng.randint(0, 64)) for _ in range(rng.randint(1, 4))]


def still_serves(settings) -> None:
    with Client(settings, submit_timeout=10) as client:
        resp = client.submit("BINANCE:BTC/USDT", 60, START, START + 86_400_000)
    assert resp.status == rq.SUBMIT_OK


def drain(sock: zmq.Socket) -> None:
    """Read whatever the relay sent back, as a real peer would, without blocking.

    Done on the sending thread: a ZeroMQ socket is not thread-safe, and a second thread
    reading the socket the test sends on once hung this test in ``send``.
    """
    if sock.type == zmq.PUB:
        return
    while True:
        try:
            sock.recv_multipart(zmq.NOBLOCK)
        except zmq.Again:
            return


@pytest.fixture
def ingestor(ctx, settings, relay):
    ing = FakeIngestor(ctx, settings, ["BINANCE:"])
    time.sleep(0.2)
    yield ing
    ing.close()


def handled(relay) -> float:
    """Messages the relay answered or dropped: every inbound ROUTER message is one of them."""
    m = relay.metrics
    return sum(sum(counted(c).values()) for c in (m.requests, m.dropped))


@pytest.mark.parametrize(
    ("endpoint", "peer_type"),
    [
        ("client_requests", zmq.DEALER),
        ("market_data", zmq.XSUB),  # a subscriber may send arbitrary (un)subscribe frames
        ("publisher_ingress", zmq.PUB),  # a publisher may send arbitrary data frames
        ("work_queue", zmq.XSUB),
        ("control", zmq.XSUB),
    ],
)
def test_random_frames_on_each_socket(ctx, settings, relay, ingestor, endpoint, peer_type) -> None:
    rng = random.Random(f"{endpoint}-{peer_type}")
    peer = ctx.socket(peer_type)
    peer.setsockopt(zmq.LINGER, 0)
    peer.setsockopt(zmq.SNDHWM, 0)
    peer.connect(settings.connect(endpoint))
    before = handled(relay)
    for i in range(FRAMES):
        peer.send_multipart(random_multipart(rng))
        if i % 256 == 0:
            drain(peer)
    if endpoint == "client_requests":
        wait_for(lambda: drain(peer) or handled(relay) - before >= FRAMES, timeout=60)
        assert handled(relay) - before == FRAMES
    still_serves(settings)
    peer.close()


def test_raw_tcp_garbage_on_each_port(settings, relay, ingestor) -> None:
    """Bytes that are not even ZMTP: the handshake fails, the peer is dropped."""
    import socket

    rng = random.Random(7)
    for name in ("client_requests", "market_data", "publisher_ingress", "work_queue", "control"):
        for _ in range(20):
            addr = ("127.0.0.1", settings.port(name))
            with socket.create_connection(addr, timeout=2) as s, contextlib.suppress(OSError):
                s.sendall(rng.randbytes(rng.randint(1, 5000)))
    still_serves(settings)


def test_oversized_message_disconnects_peer_not_relay(ctx, settings, relay, ingestor) -> None:
    dealer = ctx.socket(zmq.DEALER)
    dealer.setsockopt(zmq.LINGER, 0)
    dealer.connect(settings.connect("client_requests"))
    dealer.send_multipart([b"", b"\x01", b"\x10" + b"x" * (settings.max_message_bytes + 1)])
    assert not dealer.poll(500)
    dealer.close()
    still_serves(settings)
    # A well-formed envelope still gets its reply after all that.
    req = ctx.socket(zmq.REQ)
    req.connect(settings.connect("client_requests"))
    req.send_multipart(encode(rq.SubmitResponse()))
    assert req.poll(5000)
    req.close(linger=0)
