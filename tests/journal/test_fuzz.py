"""Hostile frames on the journal's ROUTER while a client FETCHes (tests/fuzz.py)."""

from __future__ import annotations

import random

import zmq

from candlewire.testing import TickFeed
from proto import journal_pb2 as jr
from proto.envelope import encode
from tests.fuzz import FRAMES, SETTLE_S, Good, blast, malformed, peer
from tests.journal.test_journal import fetch, journal, journal_settings, stream_pub  # noqa: F401
from tests.support import counted, wait_for


def test_the_fetch_socket(journal_settings, journal, stream_pub, ctx) -> None:  # noqa: F811
    """Every malformed request is dropped and counted; every good FETCH is answered in full."""
    feed = TickFeed(stream_pub)
    feed.publish(20)
    stream_pub._journal.flush(10)
    rng = random.Random("journal")
    good = jr.FetchRequest(request_id="g", topic=feed.topic, since_ms=1)
    samples = [good, jr.FetchRequest(request_id="s", topic=feed.topic, cursor=5, max_messages=9)]

    def fetched() -> bool:
        reply = fetch(journal_settings, encode(good), timeout=30)
        return (
            reply is not None
            and reply.status == jr.FETCH_OK
            and sum(len(run.ticks) for run in reply.runs) == 20
        )

    def make() -> list[bytes]:
        frames = malformed(rng, samples)
        return [b"", *frames] if rng.random() < 0.5 or not frames else frames

    def dropped() -> float:
        return sum(counted(journal.metrics.dropped).values())

    wait_for(fetched, timeout=30)
    fuzzer = peer(ctx, zmq.DEALER, journal_settings.connect("journal"))
    with Good(fetched, pause_s=0.05) as traffic:
        blast(fuzzer, make)
        wait_for(lambda: dropped() >= FRAMES, timeout=SETTLE_S)
    traffic.check()
    assert dropped() == FRAMES
