"""Hostile traffic for a bound socket while good traffic flows (#21).

Each socket's test sends ``FRAMES`` messages that its service must refuse, from a peer of the
type that may legally connect (so they reach the service's code, not just libzmq's), and
checks three things: the service still runs, every good message sent meanwhile arrived, and
the service's drop counters grew by exactly the number sent.

CI sends ``CANDLEWIRE_FUZZ_FRAMES`` (20,000) to each socket; ``make fuzz`` sends 1,000,000.
Messages past the socket's size limit never reach a decoder (libzmq drops the peer), so
they are tested on their own, not counted here.
"""

from __future__ import annotations

import os
import random
import threading
import time
from collections.abc import Callable, Sequence

import zmq
from google.protobuf.message import Message

from proto.envelope import (
    MAX_BYTES_FIELD,
    MAX_STRING_BYTES,
    MESSAGE_CLASSES,
    VERSION_FRAME,
    EnvelopeError,
    decode,
    encode,
)

FRAMES = int(os.environ.get("CANDLEWIRE_FUZZ_FRAMES", "20000"))
SETTLE_S = max(60.0, FRAMES / 5_000)  # how long a service may take to work off its backlog
UNKNOWN_TYPES = bytes(t for t in range(256) if t not in MESSAGE_CLASSES)
# Declared lengths no frame can hold: past a field, past the message size, past 32 and 63 bits.
HUGE_LENGTHS = (1 << 20, (1 << 31) - 1, 1 << 32, 1 << 62)


def varint(n: int) -> bytes:
    out = bytearray()
    while True:
        byte, n = n & 0x7F, n >> 7
        out.append(byte | (0x80 if n else 0))
        if not n:
            return bytes(out)


def oversized(msg: Message, rng: random.Random) -> Message:
    """``msg`` with one string or bytes field just past its limit (up to four times it)."""
    fields = [f for f in msg.DESCRIPTOR.fields if f.type in (f.TYPE_STRING, f.TYPE_BYTES)]
    fields = [f for f in fields if not f.is_repeated]
    field = rng.choice(fields)
    out = type(msg)()
    out.CopyFrom(msg)
    if field.type == field.TYPE_BYTES:
        setattr(
            out, field.name, rng.randbytes(rng.randint(MAX_BYTES_FIELD + 1, 4 * MAX_BYTES_FIELD))
        )
    else:
        setattr(out, field.name, "x" * rng.randint(MAX_STRING_BYTES + 1, 4 * MAX_STRING_BYTES))
    return out


def _candidate(rng: random.Random, samples: Sequence[Message]) -> list[bytes]:
    body = encode(rng.choice(samples))[1]
    pick = rng.random()
    if pick < 0.2:  # truncated: cut inside the payload
        return [VERSION_FRAME, body[: rng.randrange(1, max(2, len(body)))]]
    if pick < 0.3:  # another protocol version
        return [bytes([rng.choice((0, 2, 3, 0x7F, 0xFF))]), body]
    if pick < 0.4:  # a type byte nobody knows
        return [VERSION_FRAME, bytes([rng.choice(UNKNOWN_TYPES)]) + body[1:]]
    if pick < 0.55:  # a length-delimited field declaring more bytes than any frame holds
        field = bytes([(rng.randint(1, 9) << 3) | 2])
        return [VERSION_FRAME, body[:1] + field + varint(rng.choice(HUGE_LENGTHS)) + b"\0" * 8]
    if pick < 0.65:  # too few or too many envelope frames
        return rng.choice(([], [VERSION_FRAME], [VERSION_FRAME, body, body], [body]))
    if pick < 0.85:  # random bytes
        return [rng.randbytes(rng.randint(0, 64)) for _ in range(rng.randint(1, 3))]
    return encode(oversized(rng.choice(samples), rng))  # valid envelope, hostile field


def malformed(rng: random.Random, samples: Sequence[Message]) -> list[bytes]:
    """Envelope frames that :func:`proto.envelope.decode` refuses, shaped after ``samples``
    (the messages the socket takes): what a decoder must drop and count."""
    while True:
        frames = _candidate(rng, samples)
        try:
            decode(frames)
        except EnvelopeError:
            return frames


def not_subscription(rng: random.Random) -> bytes:
    """One frame from a subscriber that is no (un)subscription: an XPUB's owner reads it."""
    pick = rng.random()
    if pick < 0.1:
        return b""
    first = bytes([rng.randrange(2, 256)])
    if pick < 0.5:  # a publisher's envelope sent up the wrong way
        return first + VERSION_FRAME + rng.randbytes(rng.randint(0, 40))
    return first + rng.randbytes(rng.randint(0, 200))


def drain(sock: zmq.Socket) -> int:
    """Read what the service sent back, as a real peer would, without blocking; the count."""
    got = 0
    if sock.type in (zmq.PUB, zmq.XPUB):
        return got
    while True:
        try:
            sock.recv_multipart(zmq.NOBLOCK)
        except zmq.Again:
            return got
        got += 1


def blast(sock: zmq.Socket, make: Callable[[], list[bytes]], n: int = FRAMES) -> int:
    """Send ``n`` messages, reading replies as they come (on this thread: sockets are not
    thread-safe); the replies read."""
    replies = 0
    for i in range(n):
        sock.send_multipart(make())
        if i % 256 == 0:
            replies += drain(sock)
    return replies


def peer(ctx: zmq.Context, kind: int, endpoint: str) -> zmq.Socket:
    sock = ctx.socket(kind)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.SNDHWM, 0)  # every frame is sent; none is lost on the test's side
    sock.setsockopt(zmq.RCVHWM, 0)
    sock.connect(endpoint)
    return sock


class Good:
    """Good traffic on a thread while the fuzz runs: ``step`` is called until stopped and
    returns whether its message arrived as it should."""

    def __init__(self, step: Callable[[], bool], pause_s: float = 0.01) -> None:
        self.sent = self.arrived = 0
        self.error: BaseException | None = None
        self._step, self._pause = step, pause_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="good-traffic", daemon=True)

    def __enter__(self) -> Good:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(60)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.sent += 1
            try:
                self.arrived += bool(self._step())
            except BaseException as exc:  # reported by check()
                self.error = exc
                return
            time.sleep(self._pause)

    def check(self) -> None:
        assert self.error is None, f"good traffic failed: {self.error!r}"
        assert self.sent > 0 and self.arrived == self.sent, (self.arrived, self.sent)
