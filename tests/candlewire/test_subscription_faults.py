"""A subscription against a relay and a journal that misbehave: a stand-in of each on
127.0.0.1, scripted, so that what a real one does only rarely happens every time."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator

import pytest
import zmq

from candlewire import Client
from candlewire import _core as core
from candlewire.config import Settings
from candlewire.errors import FellBehind
from candlewire.testing import free_settings
from candlewire.topics import market_data_topic
from proto import journal_pb2 as jr
from proto import market_pb2 as mk
from proto.envelope import decode_router, encode, encode_topic, expect

T = "SIM:BTC/USDT"
Answer = Callable[[jr.FetchRequest], jr.FetchReply | None]


def at(seq: int, offset: int = -1) -> mk.StreamPosition:
    return mk.StreamPosition(epoch=1, seq=seq, source_offset=offset, publish_time_ms=1000 + seq)


def candle(seq: int) -> mk.OHLC:
    return mk.OHLC(
        ticker=T, period_s=60, open_time_ms=60_000 * seq, open="1", high="1", low="1",
        close="1", volume="1", closed=True, stream=at(seq),
    )  # fmt: skip


class Relay:
    """Publishes ``script`` once a subscriber of a data topic is seen."""

    def __init__(self, stage: Stage, script: list[list[bytes]]) -> None:
        self.pub = stage.ctx.socket(zmq.XPUB)
        self.pub.bind(stage.settings.bind("market_data"))
        stage.run(self._run, self.pub, script)

    def _run(self, stop: threading.Event, script: list[list[bytes]]) -> None:
        while not stop.is_set():
            if self.pub.poll(50) and b"|" in (m := self.pub.recv()) and m[0] == 1:
                time.sleep(0.1)  # the subscription's other topics
                for frames in script:
                    self.pub.send_multipart(frames)
                return


class Journal:
    """Answers each FetchRequest with ``answer(request)`` (None: no answer)."""

    def __init__(self, stage: Stage, answer: Answer) -> None:
        self.router = stage.ctx.socket(zmq.ROUTER)
        self.router.bind(stage.settings.bind("journal"))
        self.answer, self.asked = answer, 0
        stage.run(self._run, self.router)

    def _run(self, stop: threading.Event) -> None:
        while not stop.is_set():
            if not self.router.poll(50):
                continue
            route, msg = decode_router(self.router.recv_multipart())
            self.asked += 1
            reply = self.answer(expect(msg, jr.FetchRequest))
            if reply is not None:
                self.router.send_multipart(route + encode(reply))


class Stage:
    """A context, free ports, and the stand-ins' threads, each closing its socket at the end."""

    def __init__(self, settings: Settings) -> None:
        self.ctx, self.settings = zmq.Context(), settings
        self.stop, self.threads = threading.Event(), list[threading.Thread]()

    def run(self, body: Callable[..., None], sock: zmq.Socket, *args: object) -> None:
        def owned() -> None:
            try:
                body(self.stop, *args)
            finally:
                sock.close(linger=0)

        self.threads.append(threading.Thread(target=owned, daemon=True))
        self.threads[-1].start()

    def close(self) -> None:
        self.stop.set()
        for t in self.threads:
            t.join(5)
        self.ctx.destroy(linger=0)  # and a failed test's client sockets with it


@pytest.fixture
def stage(tmp_path) -> Iterator[Stage]:
    stage = Stage(free_settings(tmp_path))
    yield stage
    stage.close()


def test_a_message_of_another_type_on_a_data_topic_is_dropped(stage) -> None:
    # A FeedIdle has no position: judging it raised ValueError and ended the subscription.
    # A candle has one: it went out to a tick subscriber as the position it holds.
    ctx, settings = stage.ctx, stage.settings
    topic = market_data_topic(T, "tick")
    Relay(stage, [
        encode_topic(topic, mk.Tick(ticker=T, price="1", size="1", stream=at(1, 1))),
        encode_topic(topic, mk.FeedIdle(ticker=T, event_time_ns=1)),
        encode_topic(topic, candle(2)),
        encode_topic(topic, mk.Tick(ticker=T, price="2", size="1", stream=at(2, 2))),
    ])  # fmt: skip
    with Client(settings, context=ctx) as client:
        sub = client.subscribe(T, "tick", idle_timeout=10)
        got = [next(sub), next(sub)]
        sub.close()
    assert [(type(m).__name__, m.stream.seq) for m in got] == [("Tick", 1), ("Tick", 2)]


def test_candles_held_back_go_out_before_the_replay_fails(stage) -> None:
    # A catch-up holds each chunk's candles until the next chunk is seen. When that next
    # one failed (the journal's retention moved on), the held ones were lost, and
    # ``resume_from`` named the last of them as delivered.
    ctx, settings = stage.ctx, stage.settings
    topic = market_data_topic(T, "ohlc:60")

    def answer(req: jr.FetchRequest) -> jr.FetchReply:
        if not req.HasField("after"):
            run = jr.JournalBatch(
                topic=topic, first=at(1), last=at(3), candles=map(candle, [1, 2, 3])
            )
            return jr.FetchReply(
                request_id=req.request_id, status=jr.FETCH_OK, runs=[run], cursor=1
            )
        return jr.FetchReply(request_id=req.request_id, status=jr.FETCH_OUT_OF_RANGE, error="gone")

    Journal(stage, answer)
    got: list[int] = []
    with Client(settings, context=ctx) as client, pytest.raises(FellBehind) as failed:
        for c in client.subscribe(T, "ohlc:60", since=1000, idle_timeout=10):
            got.append(c.stream.seq)  # type: ignore[union-attr]
    assert got == [1, 2, 3]
    assert failed.value.resume_from.seq == 3  # type: ignore[attr-defined]


def test_a_replay_that_scans_on_without_finding_its_topic_is_not_given_up(
    stage, monkeypatch
) -> None:
    # A sparse topic in a busy partition: the journal answers chunks that hold none of its
    # messages yet move on through the partition. Only chunks with messages counted as
    # progress, so such a replay was given up as "the journal service did not answer".
    ctx, settings = stage.ctx, stage.settings
    monkeypatch.setattr(core, "FILL_TIMEOUT_S", 0.5)
    topic = market_data_topic(T, "ohlc:60")

    def answer(req: jr.FetchRequest) -> jr.FetchReply:
        time.sleep(0.05)  # twenty chunks: twice the time without progress allowed
        if req.cursor < 20:
            return jr.FetchReply(
                request_id=req.request_id, status=jr.FETCH_OK, cursor=req.cursor + 1
            )
        run = jr.JournalBatch(topic=topic, first=at(1), last=at(1), candles=[candle(1)])
        return jr.FetchReply(
            request_id=req.request_id, status=jr.FETCH_OK, runs=[run], cursor=21, done=True
        )

    journal = Journal(stage, answer)
    with Client(settings, context=ctx) as client:
        sub = client.subscribe(T, "ohlc:60", since=1000, idle_timeout=10)
        first = next(sub)
        sub.close()
    assert first.stream.seq == 1 and journal.asked >= 21  # type: ignore[union-attr]


def test_a_client_sub_takes_no_frame_larger_than_the_relay_takes_in(stage) -> None:
    # It had no limit: a peer could make the client hold any frame it sent (the decoder's
    # field limits come after the whole frame is in memory).
    with Client(stage.settings, context=stage.ctx) as client:
        sub = client._core.open(zmq.SUB)
        assert sub.getsockopt(zmq.MAXMSGSIZE) == stage.settings.max_message_bytes
        sub.close(linger=0)


def tick(seq: int) -> mk.Tick:
    return mk.Tick(ticker=T, price="1", size="1", trade_id=str(seq), stream=at(seq, seq))


def test_a_live_message_published_before_since_is_skipped_not_fetched(stage, monkeypatch) -> None:
    # ``since=`` a moment ahead of the publisher's clock: the replay finds nothing, and the
    # first live message, published before ``since``, was judged a gap that no FETCH from
    # ``since`` can fill: the subscription ended with FellBehind.
    monkeypatch.setattr(core, "FILL_TIMEOUT_S", 1.0)
    topic = market_data_topic(T, "tick")

    def answer(req: jr.FetchRequest) -> jr.FetchReply:
        reply = jr.FetchReply(request_id=req.request_id, status=jr.FETCH_OK, cursor=1, done=True)
        if req.HasField("until") and req.until.publish_time_ms >= req.since_ms:  # journalled now
            reply.runs.append(jr.JournalBatch(topic=topic, first=at(4, 4), last=at(4, 4)))
            reply.runs[0].ticks.append(tick(4))
        return reply

    Journal(stage, answer)
    Relay(stage, [encode_topic(topic, tick(s)) for s in (3, 4, 5)])
    with Client(stage.settings, context=stage.ctx) as client:
        sub = client.subscribe(T, "tick", since=1004, idle_timeout=10, raw=True)
        got = [next(sub).stream.seq, next(sub).stream.seq]
        sub.close()
    assert got == [4, 5]


def test_a_replay_from_an_archive_with_nothing_journalled_after_it_goes_live(stage) -> None:
    # Retention had emptied the topic's journal partition: each FETCH was answered from the
    # archive up to "now", and the client asked again at once, thousands of times a second
    # (an Iceberg scan each), until a record landed there.
    topic = market_data_topic(T, "tick")

    def answer(req: jr.FetchRequest) -> jr.FetchReply:
        reply = jr.FetchReply(request_id=req.request_id, status=jr.FETCH_OK)
        if journal.asked > 50:  # asked on and on: the old client, stopped here
            reply.status, reply.error = jr.FETCH_OUT_OF_RANGE, "asked again at once"
        elif req.HasField("until"):  # journalled by now: the live message the client saw
            run = reply.runs.add(topic=topic, first=at(1, 1), last=at(1, 1))
            run.ticks.append(tick(1))
            reply.done, reply.cursor = True, 1
        else:  # the archive's rows (none here) up to where the journal would start
            reply.archive_until_ms, reply.done = 1001, True
        return reply

    journal = Journal(stage, answer)
    Relay(stage, [encode_topic(topic, tick(s)) for s in (1, 2)])
    with Client(stage.settings, context=stage.ctx) as client:
        sub = client.subscribe(T, "tick", since=1000, idle_timeout=10, raw=True)
        got = [next(sub).stream.seq, next(sub).stream.seq]
        sub.close()
    assert got == [1, 2]
    assert journal.asked <= 3


def test_a_run_of_another_topic_is_dropped_from_an_arrow_replay_too(stage) -> None:
    # The chunk's ticks read as columns took every run's, whatever its topic: another
    # ticker's trades came out in this one's batch (the messages' path drops such a run).
    topic = market_data_topic(T, "tick")

    def answer(req: jr.FetchRequest) -> jr.FetchReply:
        reply = jr.FetchReply(request_id=req.request_id, status=jr.FETCH_OK, done=True)
        ours = reply.runs.add(topic=topic, first=at(1, 1), last=at(2, 2))
        ours.ticks.extend([tick(1), tick(2)])
        other = reply.runs.add(topic=f"{T}x|tick", first=at(3, 3), last=at(3, 3))
        other.ticks.append(tick(3))
        reply.cursor = 1
        return reply

    Journal(stage, answer)
    Relay(stage, [])
    with Client(stage.settings, context=stage.ctx) as client:
        sub = client.subscribe(T, "tick", since=1000, idle_timeout=10, batches=True)
        batch = next(sub)
        sub.close()
    assert batch.column("trade_id").to_pylist() == ["1", "2"]
    assert sub.stats.malformed == 1


@pytest.mark.parametrize("beacon", [False, True], ids=["live gap", "head beacon"])
def test_a_gap_up_to_a_message_never_journalled_is_counted_lost_and_goes_on(
    stage, monkeypatch, beacon
) -> None:
    """Ticks 3 to 7 missed live; the journal holds 3 to 5, then (its write of 6 to 8 failed)
    only what came after. It says so (``passed``): 6 and 7 are counted lost and the
    subscription goes on with 8 in hand. It waited for 8 in the journal until FellBehind,
    and dropped 8. A head beacon naming 7 is the same, with nothing in hand."""
    ctx, settings = stage.ctx, stage.settings
    monkeypatch.setattr(core, "FILL_TIMEOUT_S", 1.0)
    topic = market_data_topic(T, "tick")

    def tick(seq: int) -> mk.Tick:
        return mk.Tick(ticker=T, price="1", size="1", stream=at(seq, seq))

    live = [tick(1), tick(2), *([mk.StreamHead(topic=topic, last=at(7, 7))] if beacon else [])]
    Relay(stage, [encode_topic(topic, m) for m in [*live, tick(8), tick(9)]])

    def answer(req: jr.FetchRequest) -> jr.FetchReply:
        run = jr.JournalBatch(
            topic=topic, first=at(3, 3), last=at(5, 5), ticks=map(tick, [3, 4, 5])
        )
        ok = {"request_id": req.request_id, "status": jr.FETCH_OK, "done": True, "passed": True}
        return jr.FetchReply(runs=[run] if req.after.seq < 5 else [], cursor=9, **ok)

    Journal(stage, answer)
    with Client(settings, context=ctx) as client:
        sub = client.subscribe(T, "tick", idle_timeout=10)
        got = [next(sub).stream.seq for _ in range(7)]  # type: ignore[union-attr]
        stats = sub.stats
        sub.close()
    assert got == [1, 2, 3, 4, 5, 8, 9]
    assert stats.lost == 2 and stats.gaps == 1
