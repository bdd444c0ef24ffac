"""``Batches``: a socket read a loop turn at a time on asyncio, as the gateway's fast path and
critical ROUTER read theirs."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest
import zmq

from candlewire.zmqutil import NOBLOCK, Batches, recv_frames, send_frames


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
