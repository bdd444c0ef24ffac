"""The journal service's bounds, with its Kafka reader replaced by one that answers every
FETCH with a full chunk at once: no broker, so a client can ask faster than one is read."""

from __future__ import annotations

import time

import pytest
import zmq

import journal.service as service
from candlewire.testing import free_settings
from journal.reader import Fetched
from proto import journal_pb2 as jr
from proto.envelope import encode

TOPIC = "SIM:BTC/USDT|tick"


class FullChunks:
    """What JournalReader.fetch gives for a chunk of 5,000 ticks (about 300 KB)."""

    run = jr.JournalBatch(topic=TOPIC)
    for i in range(5_000):
        run.ticks.add(ticker="SIM:BTC/USDT", price="12345.67", size="0.001", trade_id=str(i))
    RUN = run.SerializeToString()

    def __init__(self, _settings: object) -> None:
        pass

    def fetch(self, req: jr.FetchRequest) -> Fetched:
        reply = jr.FetchReply(request_id=req.request_id, status=jr.FETCH_OK, cursor=1)
        return Fetched(reply, [self.RUN], 5_000)

    def close(self) -> None:
        pass


@pytest.fixture
def journal(tmp_path, monkeypatch):
    monkeypatch.setattr(service, "JournalReader", FullChunks)
    settings = free_settings(tmp_path)
    svc = service.JournalService(settings, metrics=False).start()
    yield settings
    svc.stop()


def test_a_client_that_asks_and_does_not_read_is_queued_a_few_replies_not_every_one(
    journal,
) -> None:
    # At ZeroMQ's default queue the service held every reply for such a peer (up to 7 MB
    # each, 100,000 of them); a client asks one chunk ahead, so a few are plenty.
    ctx = zmq.Context()
    greedy = ctx.socket(zmq.DEALER)
    greedy.setsockopt(zmq.RCVHWM, 1)
    greedy.setsockopt(zmq.RCVBUF, 4096)  # what it does not read backs up into the service
    greedy.connect(journal.connect("journal"))
    polite = ctx.socket(zmq.DEALER)
    polite.connect(journal.connect("journal"))
    try:
        asked = 300
        for i in range(asked):
            greedy.send_multipart(encode(jr.FetchRequest(request_id=f"g{i}", topic=TOPIC)))
        # Another client is served at once all the while.
        polite.send_multipart(encode(jr.FetchRequest(request_id="p", topic=TOPIC)))
        assert polite.poll(10_000)
        time.sleep(2)  # the service has answered all it will
        got = 0
        while greedy.poll(500):
            greedy.recv_multipart()
            got += 1
        assert 0 < got <= 2 * service.PEER_QUEUE + 4, got
    finally:
        ctx.destroy(linger=0)
