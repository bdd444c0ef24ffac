"""The publisher's positions, without sockets."""

from __future__ import annotations

import random
import time

import zmq

from candlewire.testing import free_settings, wait_for
from proto import market_pb2
from proto.envelope import from_record, to_record
from streaming.publisher import Sequencer, StreamPublisher
from tests.fuzz import FRAMES, SETTLE_S, Good, blast, not_subscription, peer


def test_each_topic_counts_from_one_without_holes() -> None:
    seq = Sequencer(epoch=7)
    a = [seq.next(b"A|tick", 1, 0, o).seq for o in range(3)]
    b = [seq.next(b"B|ohlc:60", 2).seq for _ in range(2)]
    assert a == [1, 2, 3] and b == [1, 2]
    assert seq.last[b"A|tick"].source_offset == 2 and seq.last[b"B|ohlc:60"].source_offset == -1
    heads = {h.topic: h.last.seq for h in seq.heads()}
    assert heads == {"A|tick": 3, "B|ohlc:60": 2}


def test_quiet_topics_get_no_more_heads_but_keep_counting() -> None:
    seq = Sequencer(epoch=7)
    seq.next(b"A|ohlc:60", 1)
    seq.next(b"A|ohlc:60", 1)
    seq._seen_at[b"A|ohlc:60"] = time.monotonic() - 700
    seq.next(b"B|tick", 1)
    assert [h.topic for h in seq.heads(active_s=600)] == ["B|tick"]
    # A candle topic is ordered by seq alone: starting again at 1 would look like a repeat.
    assert seq.next(b"A|ohlc:60", 1).seq == 3


def test_a_journal_record_holds_its_run_typed_with_first_and_last() -> None:
    seq = Sequencer(epoch=7)
    records = []
    for offset in (40, 41, 45):
        pos = seq.next(b"A|tick", 1, 0, offset)
        tick = market_pb2.Tick(ticker="A", trade_id=str(offset))
        records.append(to_record(tick) + market_pb2.Tick(stream=pos).SerializeToString())
    batch = from_record(StreamPublisher._batch(b"A|tick", records[1:]))
    assert (batch.first.seq, batch.last.seq) == (2, 3)
    assert (batch.first.source_offset, batch.last.source_offset) == (41, 45)
    assert [t.trade_id for t in batch.ticks] == ["41", "45"] and not batch.candles


def test_a_full_relay_queue_drops_are_counted_not_silent(tmp_path) -> None:
    """A relay that stops reading: the publisher never blocks, and every message it did not
    send is counted; the relay then receives exactly the others."""
    settings = free_settings(tmp_path)
    publisher = StreamPublisher(settings, hwm=500)
    ctx = zmq.Context()
    relay = ctx.socket(zmq.XSUB)
    relay.setsockopt(zmq.RCVHWM, 500)
    relay.connect(settings.connect("stream_pub"))
    relay.send(b"\x01")  # subscribe to everything, as the relay does for its clients
    try:

        def arrived() -> bool:  # the subscription has reached the publisher
            publisher.publish("T|x", HEAD)
            return bool(relay.poll(100))

        wait_for(arrived, timeout=10)
        while relay.poll(200):
            relay.recv_multipart()
        sent, dropped = publisher.sent, publisher.dropped
        # Until the queue is full: how many the kernel's socket buffers take first depends on
        # the machine (100,000 were all taken on a loaded one).
        published, t0 = 0, time.monotonic()
        while publisher.dropped == dropped and published < 2_000_000:
            for _ in range(10_000):
                publisher.publish("T|x", HEAD)
            published += 10_000
        assert time.monotonic() - t0 < 60  # never blocked on the full queue
        assert publisher.dropped - dropped > 0
        assert (publisher.sent - sent) + (publisher.dropped - dropped) == published
        received = 0
        while relay.poll(500):
            relay.recv_multipart()
            received += 1
        assert received == publisher.sent - sent
    finally:
        relay.close(linger=0)
        ctx.term()
        publisher.close()


HEAD = market_pb2.StreamHead(topic="T|x")


def test_a_relay_that_went_down_holds_back_nothing_the_others_get(tmp_path) -> None:
    """With several relays the publisher dials the others' ingress. One that goes down takes
    its subscriptions with it: its queue never fills, so the relay still up receives every
    message (a full queue of a subscriber makes ``XPUB_NODROP`` refuse the message to all)."""
    settings = free_settings(tmp_path).model_copy(
        update={"relay_hosts": ["127.0.0.1", "127.0.0.2"]}
    )
    (far_ingress,) = settings.dialled_relays()
    hwm = 200
    publisher = StreamPublisher(settings, hwm=hwm)
    with publisher._lock:  # the socket's other user, the repeater thread, holds it too
        events = publisher._sock.get_monitor_socket(zmq.EVENT_DISCONNECTED)
    ctx = zmq.Context()
    far = ctx.socket(zmq.XSUB)
    far.bind(far_ingress)
    near = ctx.socket(zmq.XSUB)
    near.connect(settings.connect("stream_pub"))
    for relay in (far, near):
        relay.send(b"\x01")  # subscribe to everything, as a relay does for its clients

    def both_hear() -> bool:
        publisher.publish("T|x", HEAD)
        return all(relay.poll(100) for relay in (far, near))

    try:
        wait_for(both_hear, timeout=30)
        far.close(linger=0)  # the far relay's host goes down
        assert events.poll(10_000), "the publisher saw the far relay's connection end"
        while near.poll(200):
            near.recv_multipart()
        dropped, received, run = publisher.dropped, 0, hwm // 4
        for _ in range(20):  # five queues' worth, a quarter at a time, each run taken first
            for _ in range(run):
                publisher.publish("T|x", HEAD)
            for _ in range(run):
                assert near.poll(5_000), f"the near relay got {received} of {20 * run}"
                near.recv_multipart()
                received += 1
        assert publisher.dropped == dropped
    finally:
        events.close(linger=0)
        near.close(linger=0)
        ctx.destroy(linger=0)
        publisher.close()


class _StaleCredit:
    """The publisher's socket, whose view of the relays' room is stale until it is asked
    for ``EVENTS``: it refuses the first frame of a ``topic`` message ``refusals`` times
    before that ask, and once more after it when ``stale_after`` (a relay truly full)."""

    def __init__(self, sock: zmq.Socket, topic: bytes, refusals: int, stale_after: bool) -> None:
        self.sock, self.topic, self.refusals, self.stale_after = sock, topic, refusals, stale_after
        self.asked = 0

    def send(self, data: bytes, flags: int = 0) -> None:
        stale = self.stale_after or not self.asked
        if data == self.topic and flags & zmq.NOBLOCK and stale and self.refusals:
            self.refusals -= 1
            raise zmq.Again
        self.sock.send(data, flags)

    def getsockopt(self, option: int) -> int:
        self.asked += option == zmq.EVENTS
        return self.sock.getsockopt(option)

    def __getattr__(self, name: str) -> object:
        return getattr(self.sock, name)


def test_a_message_refused_on_stale_room_is_sent_after_the_socket_takes_its_commands(
    tmp_path,
) -> None:
    """A ZMQ socket takes its I/O thread's commands (a relay's credit, a pipe's end) at most
    once a millisecond on sends, so it can refuse a message for a pipe that has room: the
    publisher asks for ``EVENTS``, which takes them, and sends it once more. Only a second
    refusal counts as dropped; in a batch, the rest are then refused without asking again."""
    settings = free_settings(tmp_path)
    publisher = StreamPublisher(settings)
    ctx = zmq.Context()
    relay = peer(ctx, zmq.XSUB, settings.connect("stream_pub"))
    relay.send(b"\x01")
    real = publisher._sock
    try:
        wait_for(lambda: relay.poll(100) or publisher.publish("T|y", HEAD) or False)
        publisher._stop.set()  # no heads repeated meanwhile: the counts are the test's alone
        publisher._repeater.join(5)
        while relay.poll(200):
            relay.recv_multipart()
        with publisher._lock:
            publisher._sock = stale = _StaleCredit(real, b"T|x", 1, stale_after=False)
        sent, dropped = publisher.sent, publisher.dropped
        publisher.publish("T|x", HEAD)
        assert (publisher.sent - sent, publisher.dropped - dropped, stale.asked) == (1, 0, 1)
        with publisher._lock:
            publisher._sock = stale = _StaleCredit(real, b"T|x", 2, stale_after=True)
        publisher.publish("T|x", HEAD)
        assert (publisher.sent - sent, publisher.dropped - dropped, stale.asked) == (1, 1, 1)
        with publisher._lock:  # a batch of three, each refused (the first twice): asked once
            publisher._sock = stale = _StaleCredit(real, b"T|x", 4, stale_after=True)
        publisher.publish_sequenced([(b"T|x", market_pb2.OHLC(ticker="X")) for _ in range(3)])
        assert (publisher.sent - sent, publisher.dropped - dropped, stale.asked) == (1, 4, 1)
        publisher._sock = real
        got = []
        while relay.poll(200):
            frames = relay.recv_multipart()
            got.append((frames[0], from_record(b"".join(frames[1:]))))
        assert got == [(b"T|x", HEAD)]  # the one sent, whole; nothing of the refused
    finally:
        with publisher._lock:
            publisher._sock = real
        publisher._journal.purge()  # its runs' journal records: no Kafka here to wait for
        relay.close(linger=0)
        ctx.destroy(linger=0)
        publisher.close()


def test_what_a_relay_sends_up_that_is_no_subscription_is_counted(tmp_path) -> None:
    """Hostile frames up the publisher's XPUB (tests/fuzz.py) while it publishes: each is
    counted, and the relay receives every message published."""
    settings = free_settings(tmp_path)
    publisher = StreamPublisher(settings)
    ctx = zmq.Context()
    relay = peer(ctx, zmq.XSUB, settings.connect("stream_pub"))
    relay.send(b"\x01")
    fuzzer = peer(ctx, zmq.XSUB, settings.connect("stream_pub"))
    rng = random.Random("publisher")
    n = iter(range(1 << 30))

    def published() -> bool:
        i = next(n)
        publisher.publish("T|x", market_pb2.StreamHead(topic=str(i)))
        return relay.poll(10_000) and from_record(
            b"".join(relay.recv_multipart()[1:])
        ).topic == str(i)

    try:
        wait_for(lambda: relay.poll(100) or publisher.publish("T|x", HEAD) or False)
        while relay.poll(200):
            relay.recv_multipart()
        with Good(published, pause_s=0.005) as good:
            blast(fuzzer, lambda: [not_subscription(rng)])
            wait_for(lambda: publisher.refused_frames >= FRAMES, timeout=SETTLE_S)
        good.check()
        assert publisher.refused_frames == FRAMES
    finally:
        publisher.close()
        ctx.destroy(linger=0)
