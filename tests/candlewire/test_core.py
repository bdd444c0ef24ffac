"""The client core's chunk handling, without sockets."""

from __future__ import annotations

import gc

from candlewire._core import chunk_messages
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
    msgs = chunk_messages(reply(3))
    assert [m.trade_id for m in msgs] == [str(i) for i in range(6)]
    assert gc.isenabled()
    gc.disable()
    try:
        chunk_messages(reply(2))
        assert not gc.isenabled()  # a caller's own pause is not undone
    finally:
        gc.enable()
