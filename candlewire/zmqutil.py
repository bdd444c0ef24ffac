"""Socket options every candlewire service applies, in one place.

Bounded queues and message sizes are the safe defaults; ZMTP heartbeats let a bound socket
notice a peer that vanished without closing its connection.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import zmq

HWM = 100_000
HEARTBEAT_IVL_MS = 5_000
HEARTBEAT_TIMEOUT_MS = 15_000


def harden(
    sock: zmq.Socket, *, max_message_bytes: int, hwm: int = HWM, linger_ms: int = 500
) -> zmq.Socket:
    sock.setsockopt(zmq.MAXMSGSIZE, max_message_bytes)
    sock.setsockopt(zmq.SNDHWM, hwm)
    sock.setsockopt(zmq.RCVHWM, hwm)
    sock.setsockopt(zmq.LINGER, linger_ms)
    sock.setsockopt(zmq.HEARTBEAT_IVL, HEARTBEAT_IVL_MS)
    sock.setsockopt(zmq.HEARTBEAT_TIMEOUT, HEARTBEAT_TIMEOUT_MS)
    sock.setsockopt(zmq.RECONNECT_IVL, 100)
    sock.setsockopt(zmq.RECONNECT_IVL_MAX, 2_000)
    return sock


def pending(sock: zmq.Socket, limit: int = 10_000) -> Iterator[bytes]:
    """The single-frame messages waiting on a socket, without blocking (at most ``limit``)."""
    for _ in range(limit):
        try:
            yield sock.recv(zmq.NOBLOCK)
        except zmq.Again:
            return


def subscription(msg: bytes) -> tuple[bool, str] | None:
    """An XPUB's subscription message as (subscribed, topic); None for anything else."""
    if not msg or msg[0] not in (0, 1):
        return None
    return bool(msg[0]), msg[1:].decode(errors="replace")


def subscriptions(
    sock: zmq.Socket, limit: int = 10_000, on_other: Callable[[], None] | None = None
) -> Iterator[tuple[bool, str]]:
    """The (subscribed, topic) changes waiting on an XPUB, without blocking. Anything else a
    subscriber sent is skipped, and told to ``on_other`` (a drop counter)."""
    for msg in pending(sock, limit):
        sub = subscription(msg)
        if sub is not None:
            yield sub
        elif on_other is not None:
            on_other()
