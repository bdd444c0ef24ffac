"""``harden``: a socket that receives keeps a peer that sends faster than its owner reads,
however long the owner falls behind; a sending socket still heartbeats its peers."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
import zmq

from candlewire import zmqutil
from candlewire.zmqutil import harden

SENT = 20_000


@pytest.fixture
def ctx() -> Iterator[zmq.Context]:
    ctx = zmq.Context()
    yield ctx
    ctx.destroy(linger=0)


@pytest.fixture(autouse=True)
def quick_heartbeats(monkeypatch: pytest.MonkeyPatch) -> None:
    """Heartbeats that would time a peer out within the owner's stall below."""
    monkeypatch.setattr(zmqutil, "HEARTBEAT_IVL_MS", 200)
    monkeypatch.setattr(zmqutil, "HEARTBEAT_TIMEOUT_MS", 600)


@pytest.mark.parametrize(
    "kinds", [(zmq.ROUTER, zmq.DEALER), (zmq.SUB, zmq.PUB)], ids=["router", "sub"]
)
def test_an_owner_that_falls_behind_loses_no_peer_and_no_message(ctx, kinds) -> None:
    """As the gateway's critical ROUTER under a flood of events, and its SUBs."""
    receiving, sending = kinds
    sock = harden(ctx.socket(receiving), max_message_bytes=1 << 10, hwm=1_000)
    peer = ctx.socket(sending)
    peer.setsockopt(zmq.SNDHWM, 0)  # the peer queues whatever the receiver's backlog holds back
    monitor = peer.get_monitor_socket(zmq.EVENT_DISCONNECTED)
    if receiving == zmq.SUB:  # a SUB dials its publisher
        sock.subscribe(b"")
        sock.connect(f"tcp://127.0.0.1:{peer.bind_to_random_port('tcp://127.0.0.1')}")
    else:
        peer.connect(f"tcp://127.0.0.1:{sock.bind_to_random_port('tcp://127.0.0.1')}")
    time.sleep(0.3)  # connected, subscribed
    for i in range(SENT):
        peer.send(i.to_bytes(4, "big"))
    time.sleep(2.0)  # the owner reads nothing: its queue is full and libzmq stops reading
    got = []
    while sock.poll(1_000):
        got.append(int.from_bytes(sock.recv_multipart()[-1], "big"))
    assert not monitor.poll(0), "the receiving socket dropped its peer"
    assert got == list(range(SENT))


def test_receivers_probe_by_keepalive_and_senders_by_heartbeat(ctx) -> None:
    for kind in (zmq.ROUTER, zmq.SUB, zmq.XSUB):
        sock = harden(ctx.socket(kind), max_message_bytes=1 << 10)
        assert sock.getsockopt(zmq.TCP_KEEPALIVE) == 1
        assert sock.getsockopt(zmq.HEARTBEAT_IVL) == 0
    for kind in (zmq.XPUB, zmq.DEALER, zmq.PUB):
        sock = harden(ctx.socket(kind), max_message_bytes=1 << 10)
        assert sock.getsockopt(zmq.HEARTBEAT_IVL) == 200
        assert sock.getsockopt(zmq.HEARTBEAT_TIMEOUT) == 600
