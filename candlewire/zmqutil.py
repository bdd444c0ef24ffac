"""Socket options every candlewire service applies, in one place.

Bounded queues and message sizes are the safe defaults. How a connection's end finds its peer
gone (the host down, the network cut, no close) depends on which way the data flows:

- **A sending socket** (XPUB, PUB, DEALER) sends ZMTP heartbeats and drops a peer that has
  answered nothing for 15 s, whether it is gone or has stopped reading. Either way it would
  hold the sender's queue: an ``XPUB_NODROP`` publisher would refuse every message, for the
  live peers too. The dialling end connects again; what was in flight is repaired from the
  streams' sequence numbers, or resent by the critical path for want of an ack.
- **A receiving socket** (ROUTER, SUB, XSUB, PULL) sends none. libzmq stops reading a
  connection whose messages the socket's queue has no room for, and counts that as silence:
  with heartbeats, an owner that fell 15 s behind dropped its peer with what was in flight
  (``make fuzz`` lost 819 frames on the gateway's critical ROUTER), and a SUB aborted the
  process (libzmq 4.3.5, ``Assertion failed: _input_stopped``; libzmq #3937, #4767). It uses
  TCP keepalive instead, which the kernel answers however full the queue is: an idle
  connection to a vanished peer ends after about 15 s. With its own replies still in flight
  to the peer, only TCP's retransmission limit ends it (minutes); the queue bounds what that
  holds.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Iterator, Sequence

import zmq

HWM = 100_000
# The longest a dialling socket waits between attempts: how late a relay can find a
# publisher that came back.
RECONNECT_IVL_MAX_MS = 2_000
# Flags and options as plain ints: pyzmq turns an enum into an int per call, in Python,
# which costs more than the call itself on a fast path.
SNDMORE = int(zmq.SNDMORE)
NOBLOCK = int(zmq.NOBLOCK)
HEARTBEAT_IVL_MS = 5_000
HEARTBEAT_TIMEOUT_MS = 15_000
# Keepalive probes after 5 s idle, every 5 s, two unanswered: gone after 15 s, as above.
KEEPALIVE_IDLE_S, KEEPALIVE_INTVL_S, KEEPALIVE_CNT = 5, 5, 2
# The socket types whose owner reads what peers send at the peers' pace.
RECEIVERS: frozenset[int] = frozenset({zmq.ROUTER, zmq.SUB, zmq.XSUB, zmq.PULL})


def harden(
    sock: zmq.Socket, *, max_message_bytes: int, hwm: int = HWM, linger_ms: int = 500
) -> zmq.Socket:
    """``sock`` with the platform's bounds, reconnect pace and liveness check: keepalive for
    a receiving socket, heartbeats for a sending one (see the module's docstring)."""
    sock.setsockopt(zmq.MAXMSGSIZE, max_message_bytes)
    sock.setsockopt(zmq.SNDHWM, hwm)
    sock.setsockopt(zmq.RCVHWM, hwm)
    sock.setsockopt(zmq.LINGER, linger_ms)
    if sock.type in RECEIVERS:
        sock.setsockopt(zmq.TCP_KEEPALIVE, 1)
        sock.setsockopt(zmq.TCP_KEEPALIVE_IDLE, KEEPALIVE_IDLE_S)
        sock.setsockopt(zmq.TCP_KEEPALIVE_INTVL, KEEPALIVE_INTVL_S)
        sock.setsockopt(zmq.TCP_KEEPALIVE_CNT, KEEPALIVE_CNT)
    else:
        sock.setsockopt(zmq.HEARTBEAT_IVL, HEARTBEAT_IVL_MS)
        sock.setsockopt(zmq.HEARTBEAT_TIMEOUT, HEARTBEAT_TIMEOUT_MS)
    sock.setsockopt(zmq.RECONNECT_IVL, 100)
    sock.setsockopt(zmq.RECONNECT_IVL_MAX, RECONNECT_IVL_MAX_MS)
    return sock


def publish_to_relays(sock: zmq.Socket) -> zmq.Socket:
    """An XPUB that dials relays (an ingestor's, the stream job's to relays other than its
    own) keeps a relay's pipe while it redials it, and with it that relay's subscriptions:
    demand would outlive a relay that went down, and an ``XPUB_NODROP`` socket would refuse
    every message once the dead relay's queue filled, for the live relays too. Immediate
    pipes end with their connection, as if the relay had unsubscribed; it subscribes again
    when it is back."""
    sock.setsockopt(zmq.IMMEDIATE, 1)
    return sock


# pyzmq's Python-level send adds only RADIO and SERVER options to its compiled one, at about
# twice the compiled call's cost (1.2 µs of 2.1 a three-frame message here).
_PYTHON_SEND = zmq.Socket.send
_COMPILED_SEND = zmq.backend.Socket.send
# The shortcuts below lean on pyzmq's Cython backend, the one CPython's wheels carry: its
# send copies unless told otherwise, and a frame received with ``copy=False`` says whether
# more of its message follow. pyzmq's cffi backend (PyPy's) does neither, so with it pyzmq's
# own send and the ``RCVMORE`` option are used.
_CYTHON = zmq.backend.Socket.__module__.startswith("zmq.backend.cython")


def sender(sock: zmq.Socket) -> Callable[..., object]:
    """``sock.send``, or for a plain socket the compiled send beneath it (the same call and
    result). A socket whose class sends otherwise (an asyncio socket's send returns a
    future) keeps its own. By the socket's class: a ``send`` set on the object itself (a
    test's stand-in) is not seen."""
    if _CYTHON and type(sock).send is _PYTHON_SEND:
        return _COMPILED_SEND.__get__(sock)  # type: ignore[no-any-return]
    return sock.send


def send_frames(sock: zmq.Socket, frames: Sequence[bytes], flags: int = 0) -> None:
    """``sock.send_multipart(frames, flags)`` at a tenth of its cost (pyzmq's checks each
    frame and builds each flag in Python: 9.4 µs a three-frame message against 0.9 here,
    through :func:`sender`). ZMQ takes a message whole or not at all, so with ``NOBLOCK``
    only the first frame can raise ``zmq.Again``. ``flags``: a plain int (:data:`NOBLOCK`),
    not zmq's enum."""
    send, more = sender(sock), flags | SNDMORE
    for frame in frames[:-1]:
        send(frame, more)
    send(frames[-1], flags)


# pyzmq's plain socket receives through the compiled method itself; an asyncio socket's
# recv makes a future (and runs pyzmq's Python to settle it) for each message.
_COMPILED_RECV = zmq.backend.Socket.recv


def recv_frames(sock: zmq.Socket, flags: int = 0) -> list[bytes]:
    """``sock.recv_multipart(flags)``, its frames as bytes. Whether a frame has more behind
    it is read from the frame itself (``zmq.Frame.more``): pyzmq's ``RCVMORE`` option read
    makes a ``SocketOption`` enum each time, 4.6-4.9 µs a three-frame message against
    3.3-3.9 here. A message's parts arrive together, so only the first can raise
    ``zmq.Again``. Through the compiled receive, so an asyncio socket reads at once too:
    there, only with ``NOBLOCK`` or a message known to be queued (a poll said so). Its own
    loop rather than :func:`recv_message`'s frames: 0.23 µs a message less (2.20 against
    2.43), on the gateway's fast path."""
    if not _CYTHON:
        return [frame.bytes for frame in _recv_each(sock, flags)]
    recv = _COMPILED_RECV.__get__(sock)
    frame = recv(flags, copy=False)
    parts = [frame.bytes]
    while frame.more:
        frame = recv(flags, copy=False)
        parts.append(frame.bytes)
    return parts


def recv_message(sock: zmq.Socket, flags: int = 0) -> list[zmq.Frame]:
    """``sock.recv_multipart(flags, copy=False)``, read as :func:`recv_frames` reads, at a
    third of its cost (2.6-4.3 µs a three-frame message against 7.6-10.2): the frames
    themselves, whose properties name a CURVE sender."""
    if not _CYTHON:
        return _recv_each(sock, flags)
    recv = _COMPILED_RECV.__get__(sock)
    frame = recv(flags, copy=False)
    parts = [frame]
    while frame.more:
        frame = recv(flags, copy=False)
        parts.append(frame)
    return parts


def _recv_each(sock: zmq.Socket, flags: int) -> list[zmq.Frame]:
    """:func:`recv_message` without the Cython backend: ``RCVMORE`` asked after each frame."""
    recv, get = zmq.backend.Socket.recv, zmq.backend.Socket.get
    parts = [recv(sock, flags, copy=False)]
    while get(sock, zmq.RCVMORE):
        parts.append(recv(sock, flags, copy=False))
    return parts


def take_run(sock: zmq.Socket, limit: int) -> list[list[bytes]]:
    """The messages queued on a socket that a poll found readable, up to ``limit``, as
    :func:`recv_frames` reads each; none waits."""
    run: list[list[bytes]] = []
    with contextlib.suppress(zmq.Again):
        while len(run) < limit:
            run.append(recv_frames(sock, NOBLOCK))
    return run


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


# A message from :meth:`Batches.recv`: its frames, and its last frame as received (or None).
Received = tuple[list[bytes], zmq.Frame | None]


class Batches:
    """A socket on an asyncio loop, in batches: the loop waits only when nothing is queued,
    then takes every message queued (up to a limit) in one turn; the messages sent in one
    turn go out together at its end. pyzmq's asyncio socket makes a future for every send and
    receive (and a timer for every send while a receive waits), and a message sent alone
    wakes ZMQ's I/O thread alone: about four times the CPU of one in a burst.

    Sends never wait: on a socket that would block (not a ROUTER, which drops) the message
    is dropped. ZMQ's FD is edge-triggered and any call on the socket may take the edge of a
    message that arrived meanwhile, so ZMQ_EVENTS is checked when a wait starts, when the FD
    wakes and after the sends. Use it from one loop only, and not beside the same socket's
    asyncio methods (they would compete for the FD)."""

    def __init__(self, sock: zmq.Socket, peers: bool = False) -> None:
        """``peers``: keep each message's last frame as a :class:`zmq.Frame`, whose User-Id
        names its CURVE sender; without it every frame is received as bytes, which costs
        about half as much as a Frame (and pyzmq's ``recv_multipart``) on a fast path."""
        self.sock: zmq.Socket = zmq.Socket.shadow(sock.underlying)
        self._peers = peers
        self._ready: asyncio.Event | None = None  # while a receive waits
        self._outbox: list[list[bytes]] = []

    async def recv(self, limit: int) -> list[Received]:
        """The multipart messages queued, waiting for the first; at most ``limit``. Each is
        its frames and, with ``peers``, its last frame as received (else None). The loop
        gets a turn first, even when messages are queued: a flood on this socket must not
        starve the loop's other tasks (the sessions' writers, the critical path)."""
        await asyncio.sleep(0)
        while True:
            batch = self._take(limit)
            if batch:
                return batch
            await self._readable()

    def _take(self, limit: int) -> list[Received]:
        batch: list[Received] = []
        sock = self.sock
        with contextlib.suppress(zmq.Again):
            while len(batch) < limit:
                if self._peers:
                    frames = recv_message(sock, NOBLOCK)
                    batch.append(([f.bytes for f in frames], frames[-1]))
                else:
                    batch.append((recv_frames(sock, NOBLOCK), None))
        return batch

    def send(self, frames: list[bytes]) -> None:
        """Send at the end of this loop turn, with the other messages sent in it."""
        if not self._outbox:
            asyncio.get_running_loop().call_soon(self._flush)
        self._outbox.append(frames)

    def recheck(self) -> None:
        """After another call on the socket (a subscribe), which may have taken the FD's edge
        of a message that arrived meanwhile."""
        self._check()

    def _flush(self) -> None:
        outbox, self._outbox = self._outbox, []
        for frames in outbox:
            with contextlib.suppress(zmq.Again):
                send_frames(self.sock, frames, NOBLOCK)
        self._check()

    async def _readable(self) -> None:
        loop, fd = asyncio.get_running_loop(), self.sock.FD
        self._ready = asyncio.Event()
        loop.add_reader(fd, self._check)
        try:
            self._check()
            await self._ready.wait()
        finally:
            loop.remove_reader(fd)
            self._ready = None

    def _check(self) -> None:
        if self._ready is not None and self.sock.get(zmq.EVENTS) & zmq.POLLIN:
            self._ready.set()
