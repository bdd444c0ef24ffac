"""Sequenced live streams end to end without Spark: the stream job's own publisher (so its
sequencing and journal writes), a real relay, Kafka, the journal service and the client.

Each test checks the subscriber's delivered sequence against what was published: every
tick once, in order (consecutive source offsets), whatever was lost on the way.
"""

from __future__ import annotations

import json
import os
import random
import signal
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path
from typing import TypeVar

import pytest
import zmq

from candlewire import _protocol
from candlewire.book import Book, BookSync, Verdict
from candlewire.client import Client
from candlewire.config import Settings
from candlewire.errors import FellBehind
from candlewire.testing import TickFeed, free_settings, metric, spawn, wait_for
from candlewire.topics import book_type, market_data_topic, work_prefix
from journal.service import JournalService
from proto import book_pb2, market_pb2
from proto import journal_pb2 as jr
from proto.envelope import decode, decode_sub, encode, to_record
from relay import Relay
from streaming.publisher import StreamPublisher, next_epoch
from tests.support import FakeIngestor

T = TypeVar("T")


@pytest.fixture
def journal_settings(tmp_path: Path, kafka, lakehouse: Settings) -> Settings:
    """Our own ports, the session's Kafka and Iceberg catalog (the journal's archive)."""
    from candlewire.kafka import ensure_topics

    s = free_settings(
        tmp_path,
        kafka_bootstrap=kafka_servers(kafka),
        catalog_url=lakehouse.catalog_db(),
        warehouse=lakehouse.warehouse_uri(),
        market_data_hwm=1000,
    )
    ensure_topics(s)
    return s


def kafka_servers(kafka) -> str:
    return f"127.0.0.1:{kafka.port}"


@pytest.fixture
def ingestor(journal_settings: Settings) -> Iterator[FakeIngestor]:
    """A SIM work-queue subscriber, so the relay does not answer NO_INGESTOR."""
    ctx = zmq.Context()
    ing = FakeIngestor(ctx, journal_settings, [work_prefix("SIM")])
    yield ing
    ing.close()
    ctx.destroy(linger=0)


@pytest.fixture
def relay(journal_settings: Settings, ingestor: FakeIngestor) -> Iterator[Relay]:
    r = Relay(journal_settings, metrics=False).start()
    wait_for(lambda: r.has_ingestor("SIM"))
    yield r
    r.stop()


@pytest.fixture
def journal(journal_settings: Settings) -> Iterator[JournalService]:
    svc = JournalService(journal_settings).start()
    yield svc
    svc.stop()


@pytest.fixture
def stream_pub(journal_settings: Settings) -> Iterator[StreamPublisher]:
    pub = StreamPublisher(journal_settings)
    yield pub
    pub.close()


def collect(sub, until_offset: int, timeout: float = 60.0) -> list[int]:
    """Source offsets delivered, until ``until_offset`` arrives."""
    got: list[int] = []
    deadline = time.monotonic() + timeout
    for msg in sub:
        got.append(msg.stream.source_offset)
        if msg.stream.source_offset >= until_offset or time.monotonic() > deadline:
            break
    return got


def test_late_joiner_replays_then_goes_live_without_gap_or_repeat(
    journal_settings, journal, stream_pub, relay
) -> None:
    if True:
        feed = TickFeed(stream_pub)
        feed.publish(500)
        since = int(time.time() * 1000) - 60_000
        time.sleep(0.5)
        flowing = feed.flow(per_s=2000, seconds=3)
        with Client(journal_settings) as client:
            sub = client.subscribe(feed.ticker, since=since, idle_timeout=30)
            got = collect(sub, until_offset=500 + 5999)
        flowing.join()
        assert got == list(range(len(got)))
        assert got[-1] == 500 + 5999
        assert sub.stats.delivered == len(got)


@pytest.mark.parametrize("failure", ["unavailable", "bug"])
def test_a_fetch_that_fails_in_the_service_is_asked_again_and_nothing_is_lost(
    journal_settings, journal, stream_pub, relay, monkeypatch, failure
) -> None:
    """The journal's Kafka read failing (FETCH_UNAVAILABLE: the client pauses and asks
    again) or a bug in the service (the request dropped and counted, the service going on;
    the client's attempt times out and it asks again): a late joiner still gets every tick
    once, in order."""
    fetch, failed = journal.reader.fetch, []

    def flaky(req: jr.FetchRequest):
        if len(failed) < 2:
            failed.append(req.request_id)
            raise RuntimeError("Kafka away")
        return fetch(req)

    if failure == "bug":  # the service's handling itself raises, not the read it reports
        handle = journal.handle

        def buggy(frames):
            if len(failed) < 2:
                failed.append("bug")
                raise AssertionError("a bug")
            return handle(frames)

        monkeypatch.setattr(journal, "handle", buggy)
    else:
        monkeypatch.setattr(journal.reader, "fetch", flaky)
    feed = TickFeed(stream_pub)
    feed.publish(2_000)
    stream_pub._journal.flush(30)
    since = int(time.time() * 1000) - 60_000
    with Client(journal_settings, attempt_timeout=1.0) as client:
        sub = client.subscribe(feed.ticker, since=since, idle_timeout=30)
        got = collect(sub, until_offset=1_999)
    assert got == list(range(2_000)) and sub.stats.delivered == 2_000
    assert len(failed) == 2
    registry = journal.metrics.registry
    if failure == "unavailable":
        status = {"status": "FETCH_UNAVAILABLE"}
        assert registry.get_sample_value("candlewire_journal_replies_total", status) == 2
    else:
        reason = {"reason": "internal_error"}
        assert registry.get_sample_value("candlewire_journal_dropped_frames_total", reason) == 2


@pytest.mark.parametrize("taken", [True, False], ids=["asked ahead", "asked again"])
def test_each_chunk_is_asked_for_ahead_and_one_asked_in_vain_is_dropped(
    journal_settings, journal, stream_pub, relay, monkeypatch, taken
) -> None:
    """The next chunk is asked for from a reply's head, before its runs are read, so the
    journal reads while the client parses: each message is served once. When that request
    is not the one the taken chunk calls for, the client asks again and drops the first
    one's reply by its id, unread: nothing is lost or repeated either way."""
    from candlewire import _core

    if not taken:
        monkeypatch.setattr(_core, "same_fetch", lambda _a, _b: False)
    fetches: list[jr.FetchRequest] = []  # as the journal received them
    fetch = journal.reader.fetch
    monkeypatch.setattr(journal.reader, "fetch", lambda req: fetches.append(req) or fetch(req))
    ahead: list[bool] = []  # each chunk but the last: its successor was asked before its read
    decode = _core.decode

    def reading(frames):
        msg = decode(frames)
        if isinstance(msg, jr.FetchReply) and msg.runs and not msg.done:
            wait_for(lambda: any(f.cursor == msg.cursor for f in fetches), 60)
            ahead.append(True)
        return msg

    monkeypatch.setattr(_core, "decode", reading)
    monkeypatch.setattr(_protocol, "FETCH_MESSAGES", 3_000)  # four chunks of three runs
    # With the client's attempt_timeout (below), far above what a loaded journal takes: a
    # FETCH not answered within it is sent again, and that chunk served twice; one not
    # answered within the fill's is FellBehind.
    monkeypatch.setattr(_core, "FILL_TIMEOUT_S", 120.0)
    feed = TickFeed(stream_pub)
    feed.next_offset = 1
    n = 12_000
    for _ in range(n // 1_000):
        feed.publish(1_000)  # a journal run each
    stream_pub._journal.flush(30)
    since = int(time.time() * 1000) - 60_000

    def served() -> float:
        return journal.metrics.registry.get_sample_value("candlewire_journal_records_served_total")

    before = served()
    with Client(journal_settings, attempt_timeout=120.0) as client:
        sub = client.subscribe(feed.ticker, since=since, raw=True, idle_timeout=30)
        got = [m.stream.source_offset for _, m in zip(range(n), sub, strict=False)]
        sub.close()
    assert got == list(range(1, n + 1))
    assert len(ahead) >= 2
    if taken:
        assert served() - before == n
    else:  # the chunks asked ahead were served too, and dropped
        assert served() - before > n


def publish_varied(feed: TickFeed, n: int, sides: tuple[int, ...] = (0, 1, 2)) -> None:
    """``n`` ticks of the feed with prices, sizes and sides that differ from tick to tick."""
    from candlewire.testing import to_record

    records, now = [], time.time_ns()
    for _ in range(n):
        off = feed.next_offset
        tick = market_pb2.Tick(
            ticker=feed.ticker,
            trade_id=str(off),
            price=f"{100 + off % 7}.{off % 100:02d}",
            size=f"0.{off % 1000:03d}1",
            side=sides[off % len(sides)],
            exchange_time_ns=now + off,
            ingest_time_ns=now,
        )
        records.append((feed.topic.encode(), to_record(tick), 0, off))
        feed.next_offset += 1
    feed.publisher.publish_ticks(records)


@pytest.mark.parametrize("columnar", [False, True], ids=["runs as messages", "as columns"])
def test_an_arrow_replay_equals_the_object_replay_and_goes_on_live(
    journal_settings, journal, stream_pub, relay, monkeypatch, columnar
) -> None:
    """Runs as messages: some ticks have no side and the first is at offset 0, so some
    fields are at their defaults (not on the wire) in some ticks only, and their runs are
    read message by message. As columns: every field is in every tick, and chunks are read
    as columns."""
    import pyarrow as pa

    from candlewire.market import _TickColumns

    batched = _TickColumns.batch
    # each chunk read off the wire: its first offset, length, and how many runs of it were
    # read as messages
    as_columns: list[tuple[int, int, int]] = []
    monkeypatch.setattr(
        _TickColumns,
        "batch",
        lambda c: (
            as_columns.append(
                (c.first.source_offset, len(c), sum(isinstance(p, list) for p in c._pieces))
            )
            or batched(c)
        ),
    )
    # As columns, the live ticks that follow carry every field too: a chunk that mixes them
    # with ticks lacking one is read row by row.
    feed = TickFeed(stream_pub, side=market_pb2.BUY if columnar else 0)
    start = feed.next_offset = 1 if columnar else 0
    publish_varied(feed, 3000, (1, 2) if columnar else (0, 1, 2))
    since = int(time.time() * 1000) - 60_000
    stream_pub._journal.flush(30)  # in the journal before the replay asks: no live tick follows
    time.sleep(0.5)
    with Client(journal_settings) as client:
        sub = client.subscribe(feed.ticker, since=since, idle_timeout=30)
        objects = [next(sub) for _ in range(3000)]
        sub.close()
    flowing = feed.flow(per_s=2000, seconds=2)
    rows: list[dict] = []
    live: list = []
    offsets: list[int] = []  # as they came: a gap filled later in the flow is a batch too
    with Client(journal_settings) as client:
        sub = client.subscribe(feed.ticker, since=since, idle_timeout=30, batches=True)
        for item in sub:
            if isinstance(item, pa.RecordBatch):
                times = item.column("time").cast(pa.int64())
                got = [
                    dict(r, time=t)
                    for r, t in zip(item.to_pylist(), times.to_pylist(), strict=True)
                ]
                rows.extend(got)
                offsets.extend(r["stream"]["source_offset"] for r in got)
            else:
                live.append(item)
                offsets.append(item.stream.source_offset)
            if offsets[-1] >= start + 6999:
                break
        sub.close()
    flowing.join()
    assert len(rows) >= 3000 and len(live) > 0  # the replay came in batches, then live ticks
    assert offsets == list(range(start, start + 7000))  # no gap, no repeat, at the seams too

    def fields(t) -> tuple:
        s = t.stream
        return (t.ticker, t.trade_id, t.price, t.size, t.side, t.time_ns, s.epoch, s.seq)

    def columns(r: dict) -> tuple:
        s = r["stream"]
        names = ("ticker", "trade_id", "price", "size", "side", "time")
        return (*(r[n] for n in names), s["epoch"], s["seq"])

    assert [columns(r) for r in rows[:3000]] == [fields(t) for t in objects]
    assert {t.side for t in objects} == ({"buy", "sell"} if columnar else {"", "buy", "sell"})
    assert sub.stats.malformed == 0
    replayed = [(n, messages) for first, n, messages in as_columns if first < start + 3000]
    assert sum(n for n, _ in replayed) >= 3000, as_columns
    # the varied ticks' runs went as messages; as columns, none did
    assert any(messages for _, messages in replayed) is not columnar, as_columns


BURST = 200_000


def test_slow_subscriber_with_a_tiny_queue_loses_nothing(
    journal_settings, journal, stream_pub, relay
) -> None:
    ctx = zmq.Context()
    ctx.setsockopt(zmq.RCVHWM, 50)
    ctx.setsockopt(zmq.RCVBUF, 8192)  # and a small kernel buffer, so the burst overflows
    try:
        feed = TickFeed(stream_pub)
        with Client(journal_settings, context=ctx) as client:
            sub = client.subscribe(feed.ticker, idle_timeout=30)
            started, heard = threading.Event(), threading.Event()

            def burst() -> None:
                started.wait()
                # The subscription reaches the feed in its own time: a tick at a time until
                # one is heard.
                while not heard.wait(0.2):
                    feed.publish(1)
                for _ in range(BURST // 1000):
                    feed.publish(1000)

            t = threading.Thread(target=burst)
            t.start()
            started.set()
            first = next(sub)
            heard.set()
            t.join()  # asleep while the whole burst goes by; then nothing more is published
            time.sleep(0.5)
            last = feed.next_offset - 1
            got = [first.stream.source_offset, *collect(sub, until_offset=last)]
            sub.close()
        assert got == list(range(got[0], last + 1)) and last - got[0] >= BURST
        # More than the relay's queue, the client's and the kernel's buffers hold: the
        # journal gave back most of it.
        assert sub.stats.gaps >= 1 and sub.stats.filled > BURST // 2
    finally:
        ctx.destroy(linger=0)


def test_kill_9_of_the_relay_while_ticks_flow_loses_and_repeats_nothing(
    journal_settings, journal, stream_pub, ingestor
) -> None:
    def start_relay():
        proc = spawn(
            journal_settings,
            ["relay"],
            healthy="candlewire_relay_up 1.0",
            metrics_endpoint="relay_metrics",
        )
        # the SIM ingestor has subscribed again: no NO_INGESTOR report for our ticker
        wait_for(
            lambda: (
                ingestor.keep_up()
                or metric(journal_settings, "relay_metrics", "candlewire_relay_work_topics")
            )
        )
        return proc

    relay = start_relay()
    try:
        feed = TickFeed(stream_pub)
        with Client(journal_settings) as client:
            sub = client.subscribe(feed.ticker, idle_timeout=30)
            flowing = feed.flow(per_s=5000, seconds=8)
            got: list[int] = []

            def kill_and_restart() -> None:
                nonlocal relay
                time.sleep(2)
                os.kill(relay.pid, signal.SIGKILL)
                relay.wait()
                time.sleep(1)
                relay = start_relay()

            killer = threading.Thread(target=kill_and_restart)
            killer.start()
            for msg in sub:
                got.append(msg.stream.source_offset)
                if got[-1] == 5000 * 8 - 1:
                    break
            killer.join()
        flowing.join()
        assert feed.next_offset == 40_000
        assert got == list(range(got[0], feed.next_offset))
        assert sub.stats.gaps >= 1
    finally:
        relay.kill()
        relay.wait()


def dealer(settings: Settings) -> zmq.Socket:
    s = zmq.Context.instance().socket(zmq.DEALER)
    s.setsockopt(zmq.LINGER, 0)
    s.connect(settings.connect("journal"))
    return s


def fetch(settings: Settings, frames: list[bytes], timeout: float = 30.0) -> jr.FetchReply | None:
    s = dealer(settings)
    try:
        s.send_multipart(frames)
        if not s.poll(int(timeout * 1000)):
            return None
        return decode(s.recv_multipart())  # type: ignore[return-value]
    finally:
        s.close()


def trim_journal(settings: Settings, journal: JournalService, topic: str) -> None:
    """Remove every journal record of the topic's partition so far, as retention would."""
    from confluent_kafka import TopicPartition
    from confluent_kafka.admin import AdminClient

    from candlewire.kafka import JOURNAL, journal_partition

    tp = TopicPartition(JOURNAL.name, journal_partition(topic))
    _low, high = journal.reader.consumer.get_watermark_offsets(tp)
    admin = AdminClient({"bootstrap.servers": settings.kafka_servers()})
    for f in admin.delete_records([TopicPartition(tp.topic, tp.partition, high)]).values():
        f.result(30)


def test_a_new_run_s_epoch_is_above_every_epoch_the_journal_holds(journal_settings) -> None:
    """A clock stepped back over a restart: the last run's epoch is an hour ahead of now.
    The next run's is above it, so a subscriber that followed the last run takes the new
    run's candles as new (positions order by epoch); by the clock it took each for one it
    had seen, until it subscribed again."""
    ahead = int(time.time() * 1000) + 3_600_000
    last = StreamPublisher(journal_settings, epoch=ahead)
    try:
        candle = market_pb2.OHLC(ticker="EPOCH:A/B", period_s=60, open_time_ms=60_000)
        last.publish_sequenced([(market_data_topic("EPOCH:A/B", "ohlc:60").encode(), candle)])
        last._journal.flush(10)
    finally:
        last.close()
    epoch = next_epoch(journal_settings)
    assert epoch > ahead
    assert next_epoch(journal_settings, after=epoch) > epoch  # a second start in one job


def test_a_range_no_store_holds_is_a_clear_error(journal_settings, journal, stream_pub) -> None:
    feed = TickFeed(stream_pub)
    feed.publish(10)
    stream_pub._journal.flush(10)
    kept_from = int(time.time() * 1000)
    time.sleep(0.05)
    seen = client_sees(journal_settings, feed.ticker, since=kept_from - 60_000, n=10)
    trim_journal(journal_settings, journal, feed.topic)
    feed.publish(5)  # these stay
    stream_pub._journal.flush(10)
    req = jr.FetchRequest(request_id="r1", topic=feed.topic, after=seen[4])
    reply = fetch(journal_settings, encode(req))
    assert reply is not None and reply.status == jr.FETCH_OUT_OF_RANGE, reply
    assert "no longer holds" in reply.error and "from publish time" in reply.error
    assert reply.available_from_ms > kept_from
    with Client(journal_settings) as client, pytest.raises(FellBehind, match="no longer holds"):
        next(client.subscribe(feed.ticker, since=seen[4]))
    # What is held is still served.
    later = client_sees(journal_settings, feed.ticker, since=reply.available_from_ms, n=5)
    assert [p.source_offset for p in later] == [10, 11, 12, 13, 14]


def test_an_oldest_record_not_read_in_time_is_asked_again_not_taken_for_none(
    journal_settings, journal, stream_pub, monkeypatch
) -> None:
    """The read of a partition's oldest record came back empty (Kafka slow): its time was
    kept as 0, and a FETCH after a position retention had removed was served from what was
    left, a hole, for as long as the journal's start stayed where it was."""
    feed = TickFeed(stream_pub)
    feed.publish(10)
    stream_pub._journal.flush(10)
    seen = client_sees(journal_settings, feed.ticker, since=int(time.time() * 1000) - 60_000, n=10)
    trim_journal(journal_settings, journal, feed.topic)
    feed.publish(5)
    stream_pub._journal.flush(10)
    read_from, slow = journal.reader._read_from, [True]

    def once_empty(partition: int, offset: int, n: int) -> list:
        return [] if slow and slow.pop() else read_from(partition, offset, n)

    journal.reader._oldest.clear()
    monkeypatch.setattr(journal.reader, "_read_from", once_empty)
    replies = []
    for i in range(2):
        req = jr.FetchRequest(request_id=f"r{i}", topic=feed.topic, after=seen[4])
        replies.append(fetch(journal_settings, encode(req)))
    assert [r.status for r in replies if r is not None] == [
        jr.FETCH_UNAVAILABLE,
        jr.FETCH_OUT_OF_RANGE,
    ]


def test_a_fetch_up_to_a_position_says_whether_the_journal_went_past_it(
    journal_settings, journal, stream_pub
) -> None:
    """``passed``: a message after ``until`` was read, so what the journal lacks up to it
    (a failed write) will never come; at the journal's end it may still (written a moment
    after the publish), and the client waits for it."""
    feed = TickFeed(stream_pub)
    feed.publish(10)
    stream_pub._journal.flush(10)
    seen = client_sees(journal_settings, feed.ticker, since=int(time.time() * 1000) - 60_000, n=10)
    inside = jr.FetchRequest(request_id="r1", topic=feed.topic, after=seen[1], until=seen[4])
    reply = fetch(journal_settings, encode(inside))
    assert reply is not None and (reply.status, reply.done, reply.passed) == (
        jr.FETCH_OK,
        True,
        True,
    )
    beyond = market_pb2.StreamPosition()
    beyond.CopyFrom(seen[9])
    beyond.seq, beyond.source_offset = beyond.seq + 5, beyond.source_offset + 5
    ahead = jr.FetchRequest(request_id="r2", topic=feed.topic, after=seen[1], until=beyond)
    reply = fetch(journal_settings, encode(ahead))
    assert reply is not None and (reply.status, reply.done, reply.passed) == (
        jr.FETCH_OK,
        True,
        False,
    )


def test_what_the_journal_no_longer_holds_comes_from_iceberg(
    journal_settings, journal, stream_pub
) -> None:
    """A `since` older than the journal's oldest record: the ``ticks`` table's trades from
    then (in time order), then the journal's."""
    import pyarrow as pa

    from candlewire.lake import NAMESPACE, catalog

    feed = TickFeed(stream_pub)
    three_days_ago = int(time.time() * 1000) - 3 * 86_400_000
    table = catalog(journal_settings).load_table(f"{NAMESPACE}.ticks")
    stored = [
        {
            "ticker": feed.ticker,
            "trade_id": f"old-{i}",
            "price": Decimal("100.5") + i,
            "size": Decimal("0.25"),
            "side": "SELL",
            "exchange_time": datetime.fromtimestamp((three_days_ago + 1000 * i) / 1000, UTC),
            "ingest_time": None,
            "exchange_time_ns": (three_days_ago + 1000 * i) * 1_000_000,
        }
        for i in (2, 0, 1)  # stored out of order: served in time order
    ]
    table.append(pa.Table.from_pylist(stored, schema=table.schema().as_arrow()))
    feed.publish(1)
    stream_pub._journal.flush(10)
    trim_journal(journal_settings, journal, feed.topic)
    feed.publish(4)
    stream_pub._journal.flush(10)
    with Client(journal_settings) as client:
        sub = client.subscribe(feed.ticker, since=three_days_ago - 86_400_000, raw=True)
        got = [next(sub) for _ in range(7)]
        sub.close()
    assert [t.trade_id for t in got] == ["old-0", "old-1", "old-2", "1", "2", "3", "4"]
    assert [t.price for t in got[:3]] == ["100.5", "101.5", "102.5"] and got[0].side == 2
    assert not got[0].HasField("stream") and got[3].stream.source_offset == 1
    assert sub.stats.archived == 3


def test_trades_published_after_the_archive_s_boundary_come_once(
    journal_settings, journal, stream_pub
) -> None:
    """The seam: the archive serves event times before the journal's oldest record, the
    journal everything published from it. Trades made before that record and published
    after it (the live path's delay) are in both; each comes once, from the journal, with
    its position: those with an id, and an id-less one told apart by its fields."""
    import pyarrow as pa

    from candlewire.lake import NAMESPACE, catalog

    feed = TickFeed(stream_pub)
    feed.publish(1)
    stream_pub._journal.flush(10)
    trim_journal(journal_settings, journal, feed.topic)
    made = time.time_ns() - 2_000_000_000  # two seconds before they are published
    old = made - 86_400_000_000_000
    late = [(f"late-{i}", made + i) for i in range(4)] + [("", made + 9)]
    table = catalog(journal_settings).load_table(f"{NAMESPACE}.ticks")
    stored = [
        {
            "ticker": feed.ticker,
            "trade_id": trade_id,
            "price": Decimal("100.25"),
            "size": Decimal("0.01"),
            "side": None,
            "exchange_time": datetime.fromtimestamp(ns / 1e9, UTC),
            "ingest_time": None,
            "exchange_time_ns": ns,
        }
        for trade_id, ns in [("old", old), *late]
    ]
    table.append(pa.Table.from_pylist(stored, schema=table.schema().as_arrow()))
    records = []
    for trade_id, ns in late:
        tick = market_pb2.Tick(
            ticker=feed.ticker, trade_id=trade_id, price="100.250", size="0.01",
            exchange_time_ns=ns,
        )  # fmt: skip
        records.append((feed.topic.encode(), to_record(tick), 0, feed.next_offset))
        feed.next_offset += 1
    stream_pub.publish_ticks(records)  # the journal's oldest record now
    feed.publish(2)
    stream_pub._journal.flush(10)
    with Client(journal_settings) as client:
        sub = client.subscribe(feed.ticker, since=old // 1_000_000 - 1000, raw=True)
        got = [next(sub) for _ in range(8)]
        sub.close()
    assert [t.trade_id for t in got] == ["old", *(i for i, _ in late), "6", "7"]
    assert [t.HasField("stream") for t in got] == [False] + [True] * 7
    assert sub.stats.archived == 1
    left = journal.metrics.registry.get_sample_value(
        "candlewire_journal_archive_left_to_journal_total"
    )
    assert left == len(late)
    # The journal holds less than a minute past its oldest record: the seam is kept as far
    # as it was read, and the next archive chunk goes on from there, not from the start.
    (key,) = [k for k in journal.reader._seams if k[0] == feed.topic]
    seam, offset, whole = journal.reader._seams[key]
    assert len(seam.named) == 4 and sum(seam.unnamed.values()) == 1 and not whole
    assert offset > key[1]


def test_an_archive_with_nothing_journalled_after_it_is_the_replay_s_end(
    journal_settings, journal, stream_pub
) -> None:
    """Retention emptied the topic's journal partition: the archive is served up to now, and
    said to be done, so the client goes live instead of asking again at once."""
    import pyarrow as pa

    from candlewire.lake import NAMESPACE, catalog

    feed = TickFeed(stream_pub)
    a_day_ago = int(time.time() * 1000) - 86_400_000
    table = catalog(journal_settings).load_table(f"{NAMESPACE}.ticks")
    row = {
        "ticker": feed.ticker,
        "trade_id": "old",
        "price": Decimal("1.5"),
        "size": Decimal("1"),
        "side": "BUY",
        "exchange_time": datetime.fromtimestamp(a_day_ago / 1000, UTC),
        "ingest_time": None,
        "exchange_time_ns": a_day_ago * 1_000_000,
    }
    table.append(pa.Table.from_pylist([row], schema=table.schema().as_arrow()))
    feed.publish(1)
    stream_pub._journal.flush(10)
    trim_journal(journal_settings, journal, feed.topic)
    req = jr.FetchRequest(request_id="a1", topic=feed.topic, since_ms=a_day_ago - 1000)
    reply = fetch(journal_settings, encode(req))
    assert reply is not None and reply.status == jr.FETCH_OK, reply
    assert [t.trade_id for r in reply.runs for t in r.ticks] == ["old"]
    assert reply.archive_until_ms > a_day_ago and reply.done


def client_sees(settings: Settings, ticker: str, since: object, n: int) -> list:
    with Client(settings) as client:
        sub = client.subscribe(ticker, since=since)
        got = [next(sub).stream for _ in range(n)]
        sub.close()
    return got


def test_malformed_fetches_are_dropped_and_counted_and_the_service_goes_on(
    journal_settings, journal, stream_pub
) -> None:
    bad = [
        [b"\x09", b"\x17junk"],  # unknown version
        [b"\x01", b"\x7f"],  # unknown type
        [b"\x01", b"\x17\xff\xff\xff"],  # unparsable FetchRequest
        [b"\x01"],  # missing frame
        [b"\x01", b"\x04"],  # a Tick is no request
    ]
    # Each on its own connection, open until the service has counted it: a LINGER 0 socket
    # closed before its connection is up would discard the frames unsent.
    senders = [dealer(journal_settings) for _ in bad]
    try:
        for s, frames in zip(senders, bad, strict=True):
            s.send_multipart(frames)
        topic_error = jr.FetchRequest(request_id="r2", topic="nonsense", since_ms=1)
        reply = fetch(journal_settings, encode(topic_error))
        assert reply is not None and reply.status == jr.FETCH_BAD_REQUEST
        assert "nonsense" in reply.error
        feed = TickFeed(stream_pub)
        feed.publish(3)
        stream_pub._journal.flush(10)
        good = jr.FetchRequest(request_id="r3", topic=feed.topic, since_ms=1)
        reply = fetch(journal_settings, encode(good))
        while reply is not None and reply.archive_until_ms:  # an earlier test trimmed the
            good.since_ms = reply.archive_until_ms  # partition: Iceberg first, as a client would
            reply = fetch(journal_settings, encode(good))
        assert reply is not None and reply.status == jr.FETCH_OK
        assert [t.trade_id for r in reply.runs for t in r.ticks] == ["0", "1", "2"]

        def dropped() -> float | None:
            """The frames dropped, once all the bad ones are (None before)."""
            n = sum(
                metric(
                    journal_settings,
                    "journal_metrics",
                    f'candlewire_journal_dropped_frames_total{{reason="{r}"}}',
                )
                for r in (
                    "unsupported_version",
                    "unknown_type",
                    "malformed_payload",
                    "missing_frame",
                    "unexpected_message",
                )
            )
            return n if n >= len(bad) else None

        assert wait_for(dropped, timeout=30) == len(bad)
        # Unanswered: the service sends a reply as soon as it has handled a request, and it
        # has handled (counted) each of these.
        assert not any(s.poll(100) for s in senders)
    finally:
        for s in senders:
            s.close()


def test_a_record_that_is_no_run_of_its_topic_is_skipped_and_counted(
    journal_settings, journal, stream_pub
) -> None:
    # A broken writer's records under the topic's key: candles in a tick run, and a run
    # naming another topic. Served, they reached a tick subscriber as candles or ended it.
    from confluent_kafka import Producer

    from candlewire.kafka import JOURNAL, journal_partition, producer_config
    from proto.envelope import to_record

    feed = TickFeed(stream_pub)
    position = market_pb2.StreamPosition(epoch=1, seq=1, publish_time_ms=int(time.time() * 1e3))
    unfit = [
        jr.JournalBatch(topic=feed.topic, first=position, last=position),
        jr.JournalBatch(topic=f"{feed.topic}x", first=position, last=position),
    ]
    unfit[0].candles.add(ticker=feed.ticker, period_s=60, stream=position)
    unfit[1].ticks.add(ticker=feed.ticker, price="1", size="1", stream=position)
    producer = Producer(producer_config(journal_settings))
    for run in unfit:
        producer.produce(
            JOURNAL.name, to_record(run), feed.topic.encode(), journal_partition(feed.topic)
        )
    producer.flush(10)
    feed.publish(3)
    stream_pub._journal.flush(10)
    req = jr.FetchRequest(request_id="u1", topic=feed.topic, since_ms=position.publish_time_ms)
    reply = fetch(journal_settings, encode(req))
    while reply is not None and reply.archive_until_ms:  # an earlier test trimmed the
        req.since_ms = reply.archive_until_ms  # partition: Iceberg first, as a client would
        reply = fetch(journal_settings, encode(req))
    assert reply is not None and reply.status == jr.FETCH_OK
    assert [(len(r.ticks), len(r.candles)) for r in reply.runs] == [(3, 0)]
    assert [t.trade_id for t in reply.runs[0].ticks] == ["0", "1", "2"]
    skipped = "candlewire_journal_skipped_records_total"
    assert metric(journal_settings, "journal_metrics", skipped) == 2


def test_async_late_joiner_and_the_watch_command(journal_settings, journal, stream_pub, relay):
    import asyncio
    import subprocess

    from candlewire.client import AsyncClient
    from candlewire.testing import candlewire_command

    feed = TickFeed(stream_pub)
    feed.publish(300)
    stream_pub._journal.flush(10)

    async def replay() -> list[int]:
        async with AsyncClient(journal_settings) as client:
            sub = client.subscribe(feed.ticker, since=int(time.time() * 1000) - 60_000)
            got = []
            async for msg in sub:
                got.append(msg.stream.source_offset)
                if len(got) == 300:
                    break
            await sub.aclose()
            return got

    assert asyncio.run(replay()) == list(range(300))
    out = subprocess.run(
        candlewire_command(
            "watch", feed.ticker, "--since", "5m", "--count", "300", "--format", "json"
        ),
        env=os.environ | journal_settings.to_env(),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    lines = [json.loads(line) for line in out.stdout.splitlines()]
    assert len(lines) == 300 and lines[0]["type"] == "tick" and lines[-1]["trade_id"] == "299"


@pytest.mark.parametrize("chunk", [0, 2], ids=["one-chunk", "cut-between"])
def test_a_late_joiner_gets_a_revised_candle_s_final_value_and_a_live_one_each_revision(
    journal_settings, journal, stream_pub, relay, monkeypatch, chunk
) -> None:
    """#37: a closed candle corrected after a gap is published again, revision one higher. A
    late joiner whose ``since`` is before the correction gets the window's final value only,
    also when the journal's chunks fall between the candle and its revision; a subscriber
    that is live gets each revision once."""
    monkeypatch.setattr(_protocol, "FETCH_MESSAGES", chunk)
    feed = TickFeed(stream_pub)
    topic = market_data_topic(feed.ticker, "ohlc:60").encode()
    minute = (int(time.time()) // 60 - 5) * 60_000

    def candle(i: int, close: str, closed: bool, revision: int = 0) -> market_pb2.OHLC:
        return market_pb2.OHLC(
            ticker=feed.ticker, period_s=60, open_time_ms=minute + 60_000 * i, open="1",
            high="2", low="1", close=close, volume="1", trade_count=1, closed=closed,
            revision=revision,
        )  # fmt: skip

    since = int(time.time() * 1000) - 1_000
    for c in (
        candle(0, "1.5", False),
        candle(0, "1.6", True),
        candle(1, "1.7", False),
        candle(0, "1.8", True, revision=1),  # trades fetched again after a gap
        candle(1, "1.9", True),
    ):
        stream_pub.publish_sequenced([(topic, c)])
    stream_pub._journal.flush(10)
    time.sleep(0.5)
    with Client(journal_settings) as client:
        sub = client.subscribe(feed.ticker, "ohlc:60", since=since, idle_timeout=30)
        got = [next(sub) for _ in range(4)]
        stream_pub.publish_sequenced([(topic, candle(1, "2.0", True, revision=1))])
        live = next(sub)
        sub.close()
    assert [(str(c.close), c.closed, c.revision) for c in got] == [
        ("1.5", False, 0),
        ("1.7", False, 0),
        ("1.8", True, 1),
        ("1.9", True, 0),
    ]
    assert (str(live.close), live.closed, live.revision) == ("2.0", True, 1)


def test_candles_older_than_the_journal_come_from_iceberg(
    journal_settings, journal, stream_pub
) -> None:
    import pyarrow as pa

    from candlewire.lake import NAMESPACE, catalog

    feed = TickFeed(stream_pub)
    topic = market_data_topic(feed.ticker, "ohlc:60")
    hour = (int(time.time()) // 3600 - 50) * 3_600_000
    table = catalog(journal_settings).load_table(f"{NAMESPACE}.ohlc")
    rows = [
        {
            "ticker": feed.ticker,
            "period_s": 60,
            "open_time": datetime.fromtimestamp((hour + 60_000 * i) / 1000, UTC),
            "open": Decimal(10 + i),
            "high": Decimal(12 + i),
            "low": Decimal(9 + i),
            "close": Decimal("11.5") + i,
            "volume": Decimal("3"),
            "trade_count": 7,
            "closed": True,
            "source": "live",
        }
        for i in range(3)
    ]
    table.append(pa.Table.from_pylist(rows, schema=table.schema().as_arrow()))
    live = market_pb2.OHLC(ticker=feed.ticker, period_s=60, open_time_ms=hour + 86_400_000)
    stream_pub.publish_sequenced([(topic.encode(), live)])
    stream_pub._journal.flush(10)
    trim_journal(journal_settings, journal, topic)
    with Client(journal_settings) as client:
        sub = client.subscribe(feed.ticker, "ohlc:60", since=hour, raw=True)
        got = [next(sub) for _ in range(3)]
        sub.close()
    assert [c.open_time_ms for c in got] == [hour, hour + 60_000, hour + 120_000]
    assert [(c.open, c.close, c.trade_count, c.closed) for c in got[:1]] == [
        ("10", "11.5", 7, True)
    ]


def book_updates(
    ticker: str, n: int, seed: int
) -> list[book_pb2.BookSnapshot | book_pb2.BookDelta]:
    """A snapshot, then ``n`` deltas that each set or remove a few levels of it."""
    rng = random.Random(seed)
    now = time.time_ns()
    snap = book_pb2.BookSnapshot(ticker=ticker, venue_seq=1, exchange_time_ns=now)
    snap.bids.extend(book_pb2.BookLevel(price=f"{p}.5", size="1") for p in range(90, 100))
    snap.asks.extend(book_pb2.BookLevel(price=f"{p}.5", size="1") for p in range(101, 111))
    out: list[book_pb2.BookSnapshot | book_pb2.BookDelta] = [snap]
    for seq in range(2, n + 2):
        d = book_pb2.BookDelta(ticker=ticker, venue_seq=seq, exchange_time_ns=now + seq)
        for side, prices in ((d.bids, range(85, 100)), (d.asks, range(101, 116))):
            for _ in range(rng.randint(0, 4)):
                size = "0" if rng.random() < 0.3 else f"{rng.random() * 5:.4f}"
                side.add(price=f"{rng.choice(prices)}.5", size=size)
        out.append(d)
    return out


def books_after_each(
    ticker: str,
    updates: list[book_pb2.BookSnapshot | book_pb2.BookDelta],
    view: Callable[[Book], T],
) -> dict[int, T]:
    """What ``view`` makes of the book after each update (by its ``venue_seq``), the updates
    applied one by one from the first, a snapshot: the reference a subscriber's books are
    held to. Every delta must apply."""
    truth, seen = BookSync(ticker), {}
    truth.on_snapshot(updates[0])
    for u in updates:
        assert isinstance(u, book_pb2.BookSnapshot) or truth.on_delta(u) is Verdict.APPLIED
        seen[u.venue_seq] = view(truth.book)
    return seen


def journalled_book(
    stream_pub, n: int, seed: int, published: int
) -> tuple[str, bytes, list[book_pb2.BookSnapshot | book_pb2.BookDelta], dict[int, tuple]]:
    """A new ticker's snapshot and ``n`` deltas (:func:`book_updates`), the first
    ``published`` of them published and in the journal; and each update's book as texts."""
    ticker = f"SIM:B{uuid.uuid4().hex[:6].upper()}/USDT"
    topic = market_data_topic(ticker, book_type()).encode()
    updates = book_updates(ticker, n, seed=seed)
    expected = books_after_each(ticker, updates, lambda b: (b.texts(True), b.texts(False)))
    stream_pub.publish_sequenced([(topic, m) for m in updates[:published]])
    stream_pub._journal.flush(10)
    return ticker, topic, updates, expected


@pytest.mark.parametrize("kind", ["sync", "async"])
def test_a_book_subscriber_behind_reads_its_queue_in_runs_and_its_books_stay_right(
    journal_settings, journal, stream_pub, relay, kind
) -> None:
    """#38: a subscriber that does not read while 599 deltas come takes them in runs, one
    book handed out per run (DeltaRun), and every book it is handed equals the book of the
    same updates applied one by one, down to the venue's texts; every message is counted
    delivered once."""
    import asyncio

    from candlewire.book import RUN_MIN
    from candlewire.client import AsyncClient

    ticker, topic, updates, expected = journalled_book(stream_pub, 610, 3, published=11)
    last = updates[-1].venue_seq
    seen: list[tuple[int, tuple]] = []
    # A second subscriber of the topic on the same relay, whose XPUB hands each message to
    # both at once: once the witness has a message, the client's copy is in its queue or
    # right behind on the wire (libzmq shows no socket's queue).
    witness = zmq.Context.instance().socket(zmq.SUB)
    witness.setsockopt(zmq.LINGER, 0)
    heard: list[int] = []  # the deltas' venue_seq, as the witness received them
    beacons: list[market_pb2.StreamHead] = []

    def hear() -> None:
        while witness.poll(0):
            _topic, msg = decode_sub(witness.recv_multipart())
            if isinstance(msg, book_pb2.BookDelta):
                heard.append(msg.venue_seq)
            elif isinstance(msg, market_pb2.StreamHead):
                beacons.append(msg)

    def watched() -> bool:
        return bool(relay.metrics.registry.get_sample_value("candlewire_relay_watched_tickers"))

    def take(book) -> bool:
        seen.append((book.seq, (book.texts(True), book.texts(False))))
        if book.seq == 11:  # replayed: one more, live
            # Not before the client's subscription is in the relay's XPUB (its watcher sees
            # a topic's first one after the XPUB took it in), and the publisher sends the
            # topic to the relay (a head beacon reached the witness subscribed after it):
            # else delta 12 would be a gap, filled from the journal.
            wait_for(watched, timeout=30)
            witness.subscribe(topic)
            witness.connect(journal_settings.connect("market_data"))
            wait_for(lambda: hear() or beacons, timeout=30)
            stream_pub.publish_sequenced([(topic, updates[11])])
        elif book.seq == 12:  # live: 599 deltas come while nobody reads
            stream_pub.publish_sequenced([(topic, m) for m in updates[12:]])
            # All of them queued for the client before it reads on: the witness has them.
            wait_for(lambda: hear() or heard[-1:] == [last], timeout=30)
        return book.seq < last

    try:
        if kind == "sync":
            with Client(journal_settings) as client:
                sub = client.subscribe(ticker, "book", idle_timeout=30)
                for book in sub:
                    if not take(book):
                        break
                sub.close()
        else:

            async def main():
                async with AsyncClient(journal_settings) as client:
                    sub = client.subscribe(ticker, "book", idle_timeout=30)
                    async for book in sub:
                        if not take(book):
                            break
                    await sub.aclose()
                    return sub

            sub = asyncio.run(main())
    finally:
        witness.close()
    assert heard == list(range(12, last + 1))  # nothing lost on the way to the witness
    assert seen[-1][0] == last
    assert all(texts == expected[seq] for seq, texts in seen), "a book differs from one by one"
    after = [seq for seq, _ in seen if seq > 12]
    assert len(after) <= 599 // RUN_MIN, f"{len(after)} books for 599 queued deltas: no runs"
    assert sub.stats.delivered == len(updates) and sub.stats.gaps == 0


def test_a_since_subscriber_of_a_quiet_book_gets_it_as_it_stood_then(
    journal_settings, journal, stream_pub, relay
) -> None:
    """The book last changed just before ``since``: the subscriber is handed it as it stood
    then once the replay ends, not only at its next change (it waited for the idle
    timeout), and after it each live change."""
    ticker, topic, updates, expected = journalled_book(stream_pub, 4, 5, published=4)
    since_ms = updates[3].exchange_time_ns // 1_000_000 + 1
    with Client(journal_settings) as client:
        sub = client.subscribe(ticker, "book", since=since_ms, idle_timeout=15)
        book = next(iter(sub))
        assert (book.seq, book.time_ns) == (4, updates[3].exchange_time_ns)
        assert (book.texts(True), book.texts(False)) == expected[4]
        update = updates[4]
        update.exchange_time_ns = (since_ms + 1000) * 1_000_000
        stream_pub.publish_sequenced([(topic, update)])
        book = next(iter(sub))
        sub.close()
    assert book.seq == 5 and (book.texts(True), book.texts(False)) == expected[5]
