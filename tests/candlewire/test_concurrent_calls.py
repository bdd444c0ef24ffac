"""Calls in flight at once on one client (an AsyncClient's coroutines): each gets its own
answer, whichever call's wait took it off the shared notification SUB. Driven step by step,
the sans-I/O way: no relay."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
import zmq

from candlewire._core import ClientCore, Recv
from candlewire._protocol import MetadataCall
from candlewire.testing import free_settings
from candlewire.topics import metadata_update_topic
from proto import market_pb2
from proto import requests_pb2 as rq
from proto.envelope import encode_topic


@pytest.fixture
def core(tmp_path, monkeypatch) -> Iterator[ClientCore]:
    ctx = zmq.Context()
    made = ClientCore(free_settings(tmp_path), None, 5.0, 1.0, ctx.socket)

    def accepted(call: object) -> Iterator[object]:  # the relay's ack, at once
        return rq.SubmitResponse(status=rq.SUBMIT_OK)
        yield

    monkeypatch.setattr(made, "send", accepted)
    yield made
    made.close()
    ctx.destroy(linger=0)


def test_an_answer_another_call_read_reaches_its_own_call(core: ClientCore) -> None:
    # Each waiting call offered what was not its own to the inbox, which kept only history
    # notifications: the other call then waited for a repeat, or timed out.
    first, second = MetadataCall.build("SIM"), MetadataCall.build("BINANCE")
    deadline = time.monotonic() + 5
    waits = [core.submit_and_match(call, deadline) for call in (first, second)]
    assert all(isinstance(next(w), Recv) for w in waits)
    answer = market_pb2.SymbolMetadataUpdated(request_id=second.request.request_id)
    assert isinstance(waits[0].send(encode_topic(metadata_update_topic(), answer)), Recv)
    with pytest.raises(StopIteration) as done:
        waits[1].send(None)  # its own wait's slice passed with nothing on the socket
    assert done.value.value == answer
    waits[0].close()
    assert not core.inbox._answers and not core.inbox._calls  # nothing kept after the calls
