"""``Batches``: a socket read a loop turn at a time on asyncio, as the gateway's fast path and
critical ROUTER read theirs; and the frame helpers under it and under the client core."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest
import zmq
import zmq.asyncio

from candlewire._core import Recv, RecvRun, async_perform
from candlewire.zmqutil import NOBLOCK, Batches, recv_frames, recv_message, send_frames, sender


@pytest.fixture
def pair() -> Iterator[tuple[zmq.Socket, zmq.Socket]]:
    ctx = zmq.Context()
    pull, push = ctx.socket(zmq.PULL), ctx.socket(zmq.PUSH)
    pull.bind("inproc://batches")
    push.connect("inproc://batches")
    yield push, pull
    ctx.destroy(linger=0)


@pytest.mark.parametrize("peers", [False, True], ids=["bytes", "with the last frame"])
def test_each_message_comes_whole_and_a_batch_keeps_to_its_limit(pair, peers: bool) -> None:
    push, pull = pair
    sent = [[b"topic", b"\x01", bytes([i]) * i] for i in range(1, 8)]
    for frames in sent:
        push.send_multipart(frames)

    async def read() -> list[list]:
        batches = Batches(pull, peers=peers)
        return [await batches.recv(3) for _ in range(3)]

    first, second, third = asyncio.run(read())
    assert [len(b) for b in (first, second, third)] == [3, 3, 1]
    got = [message for batch in (first, second, third) for message in batch]
    assert [frames for frames, _ in got] == sent
    for frames, last in got:
        if peers:
            assert isinstance(last, zmq.Frame) and last.bytes == frames[-1]
        else:
            assert last is None


def test_a_flood_does_not_starve_the_loop_s_other_tasks(pair) -> None:
    """With messages always queued, each receive still gives the loop a turn: the gateway's
    session writers and critical path run between batches of an informational flood."""
    push, pull = pair
    for i in range(100):
        push.send_multipart([b"topic", str(i).encode()])

    async def read() -> list[int]:
        batches, turns, seen = Batches(pull), [0], []

        async def other() -> None:
            while True:
                turns[0] += 1
                await asyncio.sleep(0)

        task = asyncio.get_running_loop().create_task(other())
        for _ in range(5):
            await batches.recv(10)
            seen.append(turns[0])
        task.cancel()
        return seen

    seen = asyncio.run(read())
    assert seen == sorted(seen) and len(set(seen)) == len(seen), seen


def test_send_frames_sends_a_message_whole_or_not_at_all(pair) -> None:
    push, pull = pair
    send_frames(push, [b"topic", b"\x01", b"body"])
    send_frames(push, [b"alone"])
    assert pull.recv_multipart() == [b"topic", b"\x01", b"body"]
    assert pull.recv_multipart() == [b"alone"]
    lonely = zmq.Context.instance().socket(zmq.PUSH)  # no peer: nothing can be queued
    try:
        with pytest.raises(zmq.Again):
            send_frames(lonely, [b"a", b"b"], NOBLOCK)
    finally:
        lonely.close(linger=0)


def test_a_plain_socket_sends_through_the_compiled_send_an_asyncio_one_through_its_own(
    pair,
) -> None:
    """The fast paths skip pyzmq's Python-level send on a plain socket (the same call, and a
    message arrives as sent, frames and flags), but never on an asyncio socket, whose send
    returns a future and must not block its loop."""
    push, pull = pair
    send = sender(push)
    assert send.__func__ is zmq.backend.Socket.send  # type: ignore[attr-defined]
    assert send(b"topic", zmq.SNDMORE) is None and send(b"body") is None
    assert pull.recv_multipart() == [b"topic", b"body"]
    shadow = zmq.Socket.shadow(push.underlying)  # as Batches holds a socket
    assert sender(shadow).__func__ is zmq.backend.Socket.send  # type: ignore[attr-defined]

    async def on_asyncio() -> None:
        ctx = zmq.asyncio.Context()
        sock = ctx.socket(zmq.PUSH)
        try:
            send = sender(sock)
            assert send == sock.send and send.__func__ is type(sock).send  # type: ignore[attr-defined]
        finally:
            sock.close(linger=0)
            ctx.term()

    asyncio.run(on_asyncio())


def test_recv_frames_takes_each_message_whole_whatever_its_frames(pair) -> None:
    """One frame, several, empty ones and a large one: each message as it was sent, none
    running into the next; nothing queued is ``zmq.Again`` without blocking."""
    push, pull = pair
    sent = [[b"one"], [b"t", b"", b"x" * 100_000], [b"", b""], [b"a", b"b", b"c", b"d", b"e"]]
    for frames in sent:
        send_frames(push, frames)
    assert [recv_frames(pull) for _ in sent] == sent
    with pytest.raises(zmq.Again):
        recv_frames(pull, NOBLOCK)


def test_recv_message_takes_each_message_whole_as_its_frames(pair) -> None:
    """As :func:`recv_frames`, but the frames themselves (a CURVE sender's name is on them)."""
    push, pull = pair
    sent = [[b"one"], [b"t", b"", b"x" * 100_000], [b"a", b"b", b"c"]]
    for frames in sent:
        send_frames(push, frames)
    got = [recv_message(pull) for _ in sent]
    assert all(isinstance(f, zmq.Frame) for message in got for f in message)
    assert [[f.bytes for f in message] for message in got] == sent
    with pytest.raises(zmq.Again):
        recv_message(pull, NOBLOCK)


def test_an_asyncio_socket_reads_what_a_poll_found_and_still_wakes_for_what_comes_later() -> None:
    """``async_perform`` takes what a poll found queued straight from the socket, without
    pyzmq's future a message: a run up to its limit, each message whole, then the rest; and
    a message sent after those reads still wakes the next poll (the reads may have taken the
    socket's edge; pyzmq checks the events as a poll starts). Over inproc in one ZMQ
    context, so all five are queued before the first poll."""

    async def run() -> tuple[list, list, list | None, list | None]:
        plain = zmq.Context()
        ctx = zmq.asyncio.Context.shadow(plain.underlying)
        pull, push = ctx.socket(zmq.PULL), plain.socket(zmq.PUSH)
        try:
            pull.bind("inproc://async-runs")
            push.connect("inproc://async-runs")
            for i in range(5):
                push.send_multipart([b"t", str(i).encode()])
            first = await async_perform(RecvRun(pull, 5.0, 3))
            rest = await async_perform(RecvRun(pull, 5.0, 10))
            nothing = await async_perform(Recv(pull, 0.05))
            late = [b"late", b"", b"x" * 1000]
            later = asyncio.get_running_loop().call_later(0.1, push.send_multipart, late)
            woke = await async_perform(Recv(pull, 5.0))
            later.cancel()
            return first, rest, nothing, woke
        finally:
            push.close(linger=0)
            pull.close(linger=0)
            plain.term()

    first, rest, nothing, woke = asyncio.run(run())
    sent = [[b"t", str(i).encode()] for i in range(5)]
    assert first == sent[:3] and rest == sent[3:]
    assert nothing is None
    assert woke == [b"late", b"", b"x" * 1000]


def test_without_the_cython_backend_a_message_is_read_whole_by_its_rcvmore(pair) -> None:
    """The fallback for pyzmq's cffi backend (whose frames do not say whether more follow)
    reads each message as the fast path does."""
    from candlewire.zmqutil import _recv_each

    push, pull = pair
    sent = [[b"one"], [b"t", b"", b"x" * 100_000], [b"a", b"b", b"c"]]
    for frames in sent:
        send_frames(push, frames)
    assert [[f.bytes for f in _recv_each(pull, 0)] for _ in sent] == sent
    with pytest.raises(zmq.Again):
        _recv_each(pull, NOBLOCK)
