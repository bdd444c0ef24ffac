"""The client core's chunk handling and its runs' close, without sockets."""

from __future__ import annotations

import gc
import threading
from collections.abc import Generator
from typing import Any

import pytest

from candlewire._core import Emit, Op, Ready, chunk_messages, drive_iter
from candlewire._protocol import Sequence
from proto import journal_pb2 as jr


def reply(n: int) -> jr.FetchReply:
    out = jr.FetchReply()
    for first in (0, n):
        run = out.runs.add(topic="X|tick")
        for i in range(first, first + n):
            run.ticks.add(trade_id=str(i))
    return out


def test_a_chunk_s_messages_come_in_order_and_the_collector_is_left_as_it_was() -> None:
    assert gc.isenabled()
    msgs = chunk_messages(reply(3), Sequence("X|tick"))
    assert [m.trade_id for m in msgs] == [str(i) for i in range(6)]
    assert gc.isenabled()
    gc.disable()
    try:
        chunk_messages(reply(2), Sequence("X|tick"))
        assert not gc.isenabled()  # a caller's own pause is not undone
    finally:
        gc.enable()


def test_a_run_that_is_not_the_topic_s_is_dropped_and_counted() -> None:
    # Read as they were, candles reached a tick subscriber, and a run of ticks and candles
    # ended a subscription in Arrow or in the candles' catch-up.
    out = reply(2)
    out.runs[0].candles.add(open_time_ms=60_000)  # ticks and a candle: no run of a topic
    out.runs.add(topic="Y|tick").ticks.add(trade_id="y")  # another topic's
    out.runs.add(topic="X|tick").candles.add(open_time_ms=0)  # a candle on the tick topic
    seq = Sequence("X|tick")
    assert [m.trade_id for m in chunk_messages(out, seq)] == ["2", "3"]
    assert seq.stats.malformed == 3 + 1 + 1


def test_a_reader_resuming_while_its_client_closes_the_run_elsewhere_just_ends() -> None:
    """A client closed on one thread while its subscription's reader, on another, asks for
    the next message: the reader's iterating ends, and nothing raises on either side (the
    reader got "generator already executing" while the close ran the procedure's cleanup)."""
    closing, release = threading.Event(), threading.Event()

    def procedure() -> Generator[Op, Any, None]:
        try:
            yield Ready()
            yield Emit("first")  # type: ignore[arg-type]
            yield Emit("never")  # type: ignore[arg-type]
        finally:  # where the sockets close; held open until the reader has asked
            closing.set()
            release.wait(5)

    started = drive_iter(procedure())
    messages = iter(started)
    assert next(messages) == "first"
    failed: list[BaseException] = []

    def close() -> None:
        try:
            started._run.cancel()
        except BaseException as e:  # reported below, on the test's thread
            failed.append(e)

    closer = threading.Thread(target=close)
    closer.start()
    try:
        assert closing.wait(5)
        with pytest.raises(StopIteration):
            next(messages)
    finally:
        release.set()
        closer.join(5)
    assert not closer.is_alive() and not failed
