"""``harden``: a receiving socket keeps a peer that sends faster than its owner reads, however
long the owner falls behind, and a stalled SUB behind a heartbeating publisher recovers
(libzmq aborted the process when the SUB heartbeated too)."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
import zmq

from candlewire import zmqutil
from candlewire.zmqutil import harden

SENT = 20_000
STALL_S = 2.0  # the owner reads nothing for this long: past the heartbeats' timeout below


@pytest.fixture
def ctx() -> Iterator[zmq.Context]:
    ctx = zmq.Context()
    yield ctx
    ctx.destroy(linger=0)


@pytest.fixture(autouse=True)
def quick_heartbeats(monkeypatch: pytest.MonkeyPatch) -> None:
    """Heartbeats that time a silent peer out well within ``STALL_S``."""
    monkeypatch.setattr(zmqutil, "HEARTBEAT_IVL_MS", 200)
    monkeypatch.setattr(zmqutil, "HEARTBEAT_TIMEOUT_MS", 600)


def subscribed(xpub: zmq.Socket) -> None:
    """Wait for a SUB's subscription to reach ``xpub``: a publisher drops what it sends
    before that."""
    assert xpub.poll(10_000) and xpub.recv()[:1] == b"\x01"


def drain(sock: zmq.Socket) -> list[int]:
    got: list[int] = []
    while len(got) < SENT and sock.poll(5_000):
        got.append(int.from_bytes(sock.recv_multipart()[-1], "big"))
    return got


@pytest.mark.parametrize("receiving", [zmq.ROUTER, zmq.SUB], ids=["router", "sub"])
def test_an_owner_that_falls_behind_loses_no_peer_and_no_message(ctx, receiving: int) -> None:
    """As the gateway's critical ROUTER under a flood of events from one container, and its
    SUBs; the peer is a plain socket, as a fuzzer or another vendor's client is."""
    sock = harden(ctx.socket(receiving), max_message_bytes=1 << 10, hwm=1_000)
    peer = ctx.socket(zmq.DEALER if receiving == zmq.ROUTER else zmq.XPUB)
    peer.setsockopt(zmq.SNDHWM, 0)  # the peer queues whatever the receiver's backlog holds back
    monitor = peer.get_monitor_socket(zmq.EVENT_DISCONNECTED)
    if receiving == zmq.SUB:  # a SUB dials its publisher
        sock.subscribe(b"")
        sock.connect(f"tcp://127.0.0.1:{peer.bind_to_random_port('tcp://127.0.0.1')}")
        subscribed(peer)
    else:
        peer.connect(f"tcp://127.0.0.1:{sock.bind_to_random_port('tcp://127.0.0.1')}")
    for i in range(SENT):
        peer.send(i.to_bytes(4, "big"))
    time.sleep(STALL_S)  # the owner's queue is full, and libzmq stops reading the connection
    assert drain(sock) == list(range(SENT))
    assert not monitor.poll(0), "the receiving socket dropped its peer"


def test_a_sub_that_fell_behind_a_heartbeating_publisher_carries_on(ctx) -> None:
    """Both ends hardened, as the gateway's SUB on a relay's XPUB: the publisher may drop the
    stalled SUB (it answered no heartbeat), which then dials again and gets what is sent
    after; the process does not abort."""
    xpub = harden(ctx.socket(zmq.XPUB), max_message_bytes=1 << 10, hwm=0)
    sub = harden(ctx.socket(zmq.SUB), max_message_bytes=1 << 10, hwm=1_000)
    sub.subscribe(b"")
    sub.connect(f"tcp://127.0.0.1:{xpub.bind_to_random_port('tcp://127.0.0.1')}")
    subscribed(xpub)
    for i in range(SENT):
        xpub.send(i.to_bytes(4, "big"))
    time.sleep(STALL_S)
    got = drain(sock=sub)
    assert got[:1] == [0] and got == sorted(set(got)), "what arrives comes once, in order"
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:  # sent until the SUB, subscribed again, has one
        xpub.send(SENT.to_bytes(4, "big"))
        if sub.poll(100):
            assert int.from_bytes(sub.recv(), "big") == SENT
            return
    pytest.fail("the SUB got nothing sent after its stall")
