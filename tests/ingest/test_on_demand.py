"""Realtime on demand: subscriptions through the relay start and stop ingestor streams."""

from __future__ import annotations

import signal
import time
from collections.abc import Iterator

import pytest
import zmq

from candlewire import Client, SubscriptionFailed
from candlewire.config import Settings
from candlewire.topics import ingestor_topic, market_data_topic, work_prefix
from ingest.exchanges.sim import SimExchange
from ingest.service import Ingestor, stream_key
from proto import requests_pb2 as rq
from proto.envelope import decode_sub, encode
from relay import Relay
from tests.ingest.test_service import (
    STEADY_BEAT_S,
    all_ticks_of,
    sees_taking,
    start_ingestor,
    subprocess_ingestor,
    ticks_of,
)
from tests.support import wait_for

GRACE_S = 1.5


@pytest.fixture
def relay(broker_settings) -> Iterator[Relay]:
    r = Relay(broker_settings, metrics=False).start()
    yield r
    r.stop()


class Watcher:
    """A market-data subscriber as libzmq sees it: a SUB socket and its topics."""

    def __init__(self, ctx: zmq.Context, settings: Settings, ticker: str, kind: str) -> None:
        self.sock = ctx.socket(zmq.SUB)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.setsockopt(zmq.RECONNECT_IVL, 100)
        self.sock.subscribe(market_data_topic(ticker, kind))
        self.sock.connect(settings.connect("market_data"))

    def read(self) -> None:
        """Take what arrived, as a subscriber does; libzmq acts on a reconnection (resends
        the subscriptions) only when the application next uses the socket."""
        while self.sock.poll(0):
            self.sock.recv_multipart()

    def close(self) -> None:
        self.sock.close()


def streaming(ingestors: list[Ingestor], ticker: str) -> list[Ingestor]:
    return [i for i in ingestors if stream_key(ticker) in i.jobs]


def demand_topics(ingestor: Ingestor, ticker: str) -> set[str]:
    """The topics of ``ticker`` the ingestor has heard someone subscribe to."""
    return set(ingestor.demand.topics.get(ticker, ()))


def settled_owner(ingestors: list[Ingestor], ticker: str, exchange: str) -> list[Ingestor]:
    """The one ingestor streaming ``ticker``, once every other one has heard it does (its
    heartbeat lists the stream, so they leave it to it); else nothing."""
    found = streaming(ingestors, ticker)
    if len(found) != 1:
        return []
    now = time.monotonic()
    key, owner = stream_key(ticker), found[0]
    agreed = all(
        i.views[exchange].owner(key, now, i.taking_work(now)) == owner.id
        for i in ingestors
        if i is not owner
    )
    return found if agreed else []


def sim(name: str) -> SimExchange:
    return SimExchange(name=name, symbols={"A/USDT": 10.0, "B/USDT": 20.0}, rate=20.0)


def test_first_subscriber_starts_second_adds_nothing_last_leaving_stops(relay, ctx) -> None:
    s = relay.settings
    ticker = "SIMD:A/USDT"
    tick, candles = market_data_topic(ticker, "tick"), market_data_topic(ticker, "ohlc:60")
    # Beats of 2 s: a stalled test process must not make either peer think the other dead
    # and take the stream over (that would be a new job).
    ings = [
        start_ingestor(
            s, sim("SIMD"), grace_s=GRACE_S, ingestor_id=f"d{i}", heartbeat_s=STEADY_BEAT_S
        )
        for i in (1, 2)
    ]
    control = ctx.socket(zmq.SUB)
    control.subscribe(work_prefix("SIMD"))
    control.connect(s.connect("control"))
    try:
        # Both past warm-up and each taking work in the other's view: they agree who ranks
        # first for the ticker.
        a, b = ings
        wait_for(lambda: sees_taking(a, b, "SIMD") and sees_taking(b, a, "SIMD"), timeout=30)
        first = Watcher(ctx, s, ticker, "tick")
        # One ingestor streams each ticker (a brief duplicate while heartbeat views disagree
        # resolves itself: the lower-ranked peer yields). The owner, once the other has
        # heard it stream:
        owners = wait_for(lambda: settled_owner(ings, ticker, "SIMD"), timeout=30)
        time.sleep(1.0)
        assert streaming(ings, ticker) == owners
        job = owners[0].jobs[stream_key(ticker)]
        assert len(ticks_of(s, ticker, 20)) >= 20

        second = Watcher(ctx, s, ticker, "ohlc:60")
        wait_for(lambda: all(demand_topics(i, ticker) == {tick, candles} for i in ings), 30)
        first.close()
        wait_for(lambda: all(demand_topics(i, ticker) == {candles} for i in ings), 30)
        time.sleep(2 * GRACE_S)  # the first subscriber left more than a grace ago
        assert streaming(ings, ticker) == owners and owners[0].jobs[stream_key(ticker)] is job
        assert not job.stop.is_set()
        assert not control.poll(0), "no cancel while someone still watches"

        left = time.monotonic()
        second.close()
        wait_for(lambda: not streaming(ings, ticker), timeout=GRACE_S + 30)
        # The ingestor heard the last subscriber leave after ``left`` and stops the stream a
        # grace after that: however late this thread sees it, never sooner.
        assert time.monotonic() - left >= GRACE_S, "the stream outlives its subscriber for a grace"
        assert control.poll(30_000), "the cancel goes out on the control channel"
        _, msg = decode_sub(control.recv_multipart())
        assert (msg.action, msg.ticker) == (rq.CANCEL_REALTIME, ticker)
        # Each peer drops its own request, at its own grace's end or on the cancel.
        wait_for(lambda: all(stream_key(ticker) not in i.pending for i in ings), 30)
        wait_for(job.future.done, timeout=30)  # its thread has sent its last tick
        for i in ings:
            i._sink.flush(30)
        settled = len(all_ticks_of(s, ticker))
        time.sleep(1.5)
        assert len(all_ticks_of(s, ticker)) == settled, "ticks kept flowing"
    finally:
        control.close()
        for i in ings:
            i.stop()


def test_relay_restart_keeps_active_subscriptions_streaming(broker_settings, ctx):
    s = broker_settings
    ticker = "SIMD:B/USDT"
    relays = [Relay(s, metrics=False).start()]
    # A grace far longer than the restart can take: the ingestor's publisher dials the new
    # relay again only after a backoff of up to RECONNECT_IVL_MAX_MS, and a loaded machine
    # adds its own delays.
    ing = start_ingestor(s, sim("SIMD"), grace_s=30.0)
    watcher = Watcher(ctx, s, ticker, "tick")
    try:
        wait_for(lambda: streaming([ing], ticker), timeout=10)
        job = ing.jobs[stream_key(ticker)]
        relays.pop().stop()
        # Its subscriptions went with its connection; the grace keeps the stream meanwhile.
        wait_for(lambda: not ing.demand.watched(ticker), timeout=30)
        relays.append(Relay(s, metrics=False).start())

        # The SUB resends its subscription to the new relay, which hands it to the ingestor
        # (back on the new relay too) before the grace period ends: the stream never stopped.
        def resubscribed() -> bool:
            watcher.read()
            return relays[-1]._watched.watched(ticker)

        wait_for(resubscribed, timeout=30)
        wait_for(lambda: relays[-1].has_ingestor("SIMD"), timeout=30)
        wait_for(lambda: ing.demand.watched(ticker), timeout=30)
        assert ing.jobs.get(stream_key(ticker)) is job and not job.stop.is_set()
        before = len(all_ticks_of(s, ticker))
        assert len(ticks_of(s, ticker, before + 20, timeout=30)) >= before + 20
        assert ing.jobs.get(stream_key(ticker)) is job and not job.stop.is_set()
    finally:
        watcher.close()
        ing.stop()
        for r in relays:
            r.stop()


def test_a_relay_gone_for_good_takes_its_subscribers_demand_with_it(broker_settings, ctx) -> None:
    """Demand is a lease on the relay's connection: a relay that goes down and stays down
    leaves nobody watching, so the stream stops a grace later (a dialling socket would
    otherwise keep the dead relay's subscriptions while it redials, for ever)."""
    s = broker_settings
    ticker = "SIMD:A/USDT"
    relay = Relay(s, metrics=False).start()
    ing = start_ingestor(s, sim("SIMD"), grace_s=GRACE_S)
    watcher = Watcher(ctx, s, ticker, "tick")
    try:
        wait_for(lambda: streaming([ing], ticker), timeout=30)
        job = ing.jobs[stream_key(ticker)]
        relay.stop()
        wait_for(lambda: not ing.demand.watched(ticker), timeout=30)
        wait_for(lambda: not streaming([ing], ticker), timeout=GRACE_S + 30)
        assert job.stop.is_set()
    finally:
        watcher.close()
        ing.stop()
        relay.stop()


def test_several_relays_count_their_subscribers_together(relay, ctx) -> None:
    a = relay.settings
    b = a.model_copy(update={"host": "127.0.0.2", "bind_host": "127.0.0.2"})  # another host
    other = Relay(b, metrics=False).start()
    ticker = "SIMD:A/USDT"
    both = a.model_copy(update={"relay_hosts": [a.host, b.host]})
    ing = start_ingestor(both, sim("SIMD"), grace_s=GRACE_S)
    on_a, on_b = Watcher(ctx, a, ticker, "tick"), Watcher(ctx, b, ticker, "tick")
    try:
        wait_for(lambda: streaming([ing], ticker), timeout=10)
        job = ing.jobs[stream_key(ticker)]
        # B's subscription to the same topic has reached the ingestor before A's leaves:
        # a probe topic subscribed after it on B's connection, and then its removal, have.
        tick, probe = market_data_topic(ticker, "tick"), market_data_topic(ticker, "ohlc:60")
        on_b.sock.subscribe(probe)
        wait_for(lambda: demand_topics(ing, ticker) == {tick, probe}, timeout=30)
        on_b.sock.unsubscribe(probe)
        wait_for(lambda: demand_topics(ing, ticker) == {tick}, timeout=30)
        on_a.close()
        time.sleep(3 * GRACE_S)
        assert ing.jobs.get(stream_key(ticker)) is job, "a subscriber on relay B still watches"
        on_b.close()
        wait_for(lambda: not streaming([ing], ticker), timeout=GRACE_S + 5)
    finally:
        ing.stop()
        other.stop()


def test_each_cancel_reaches_a_live_relay_while_another_is_down(relay, ctx) -> None:
    """The peers hear every cancel: none is queued for a relay that is down (127.0.0.2)."""
    s = relay.settings
    with_dead = s.model_copy(update={"relay_hosts": [s.host, "127.0.0.2"]})
    ing = start_ingestor(with_dead, sim("SIMD"), grace_s=GRACE_S)
    control = ctx.socket(zmq.SUB)
    control.subscribe(work_prefix("SIMD"))
    control.connect(s.connect("control"))
    try:
        time.sleep(1.0)  # past warm-up
        for ticker in ("SIMD:A/USDT", "SIMD:B/USDT", "SIMD:A/USDT"):  # round robin's turns
            watcher = Watcher(ctx, s, ticker, "tick")
            wait_for(lambda t=ticker: streaming([ing], t), timeout=10)
            watcher.close()
            wait_for(lambda t=ticker: not streaming([ing], t), timeout=GRACE_S + 5)
            assert control.poll(5000), f"the cancel of {ticker} went to the relay that is down"
            _, msg = decode_sub(control.recv_multipart())
            assert (msg.action, msg.ticker) == (rq.CANCEL_REALTIME, ticker)
    finally:
        control.close()
        ing.stop()


def heartbeat_work(settings: Settings, ctx: zmq.Context, exchange: str) -> dict[str, set[str]]:
    """What each live ingestor of an exchange says it is working on, from its heartbeats."""
    sub = ctx.socket(zmq.SUB)
    sub.subscribe(ingestor_topic(exchange))
    sub.connect(settings.connect("market_data"))
    seen: dict[str, set[str]] = {}
    deadline = time.monotonic() + 2.5
    try:
        while time.monotonic() < deadline:
            if sub.poll(100):
                _, hb = decode_sub(sub.recv_multipart())
                seen[hb.ingestor_id] = set(hb.working)
    finally:
        sub.close(linger=0)
    return seen


def test_another_ingestor_picks_the_stream_up_after_kill_9(relay, ctx) -> None:
    s = relay.settings
    ticker = "SIMK:ETH/USDT"
    procs = {i: subprocess_ingestor(s, i, "SIMK=sim") for i in ("k1", "k2")}
    watcher = Watcher(ctx, s, ticker, "tick")
    key = stream_key(ticker)
    try:

        def owner() -> str | None:
            work = heartbeat_work(s, ctx, "SIMK")
            return next((i for i, keys in work.items() if key in keys), None)

        first = wait_for(owner, timeout=30, interval=0.1)
        procs[first].send_signal(signal.SIGKILL)
        procs[first].wait()
        survivor = next(i for i in procs if i != first)
        wait_for(lambda: owner() == survivor, timeout=20, interval=0.1)
        before = len(all_ticks_of(s, ticker))
        assert len(ticks_of(s, ticker, before + 5, timeout=30)) >= before + 5
    finally:
        watcher.close()
        for p in procs.values():
            p.kill()
            p.wait()


def test_unknown_ticker_gets_its_error(relay) -> None:
    ing = start_ingestor(relay.settings, sim("SIMD"), grace_s=GRACE_S)
    try:
        time.sleep(1.0)
        with Client(relay.settings) as client, pytest.raises(SubscriptionFailed) as info:
            next(client.subscribe("SIMD:NOPE/USDT", "tick", idle_timeout=15))
    finally:
        ing.stop()
    assert info.value.reason == "UNKNOWN_SYMBOL"
    assert info.value.error.source == ing.id and "NOPE/USDT" in str(info.value)


def test_exchange_without_live_ingestor_gets_its_error(relay) -> None:
    with Client(relay.settings) as client, pytest.raises(SubscriptionFailed) as info:
        next(client.subscribe("NOBODY:BTC/USDT", "ohlc:60", idle_timeout=15))
    assert info.value.reason == "NO_INGESTOR" and info.value.error.source == "relay"


def test_the_watched_tickers_are_walked_a_few_times_a_second_not_every_pass(relay) -> None:
    """The walk is over every ticker any subscriber watches: on every pass of the relay's
    loop (a pass per request, per subscription), 200,000 tickers made each request wait
    seconds. Counted over a second of subscriptions arriving one by one."""
    from relay.server import UNSERVED_SCAN_S

    walks, tickers = [0], relay._watched.tickers

    def counted() -> list[str]:
        walks[0] += 1
        return tickers()

    relay._watched.tickers = counted
    ctx = zmq.Context.instance()
    sub = ctx.socket(zmq.SUB)
    sub.connect(relay.settings.connect("market_data"))
    try:
        started = time.monotonic()
        for i in range(200):  # each a pass of the loop
            sub.subscribe(f"NOBODY{i}:A/B|tick")
            time.sleep(0.005)
        elapsed = time.monotonic() - started
        time.sleep(0.3)
    finally:
        sub.close(linger=0)
        relay._watched.tickers = tickers
    assert 1 <= walks[0] <= (elapsed + 0.3) / UNSERVED_SCAN_S + 2


def test_a_book_subscriber_of_an_exchange_without_live_ingestor_gets_its_error(relay) -> None:
    from journal.service import JournalService

    journal = JournalService(relay.settings, metrics=False).start()
    try:
        with Client(relay.settings) as client, pytest.raises(SubscriptionFailed) as info:
            next(client.subscribe("NOBODY:BTC/USDT", "book", idle_timeout=15))
    finally:
        journal.stop()
    assert info.value.reason == "NO_INGESTOR" and info.value.error.source == "relay"


def test_a_book_subscriber_starts_the_book_stream_alone_and_checked_records_land(
    relay, ctx
) -> None:
    """``T|book`` demand (#38): the book job starts, not the trade stream, and a client
    replaying candlewire.books gets SIM's own book; leaving stops it after the grace."""
    from candlewire.book import Book, BookSync, Verdict
    from candlewire.kafka import BOOKS
    from ingest.service import book_key
    from proto import book_pb2
    from tests.support import read_topic

    s, ticker = relay.settings, "SIMK:A/USDT"
    exchange = sim("SIMK")
    ing = start_ingestor(s, exchange, grace_s=GRACE_S, ingestor_id="k1")
    try:
        time.sleep(1.0)  # past warm-up
        watcher = Watcher(ctx, s, ticker, "book")
        wait_for(lambda: book_key(ticker) in ing.jobs)
        assert stream_key(ticker) not in ing.jobs, "a book subscriber streams no trades"

        def mine(rs: list) -> list:
            return [r for r in rs if getattr(r, "ticker", None) == ticker]

        records = mine(read_topic(s, BOOKS.name, lambda rs: len(mine(rs)) >= 30))
        assert isinstance(records[0], book_pb2.BookSnapshot)
        client = BookSync(ticker)
        client.on_snapshot(records[0])
        assert all(client.on_delta(d) is Verdict.APPLIED for d in records[1:])
        assert client.book is not None
        truth = Book.from_snapshot(exchange.book_at(ticker, client.book.seq))
        assert client.book.same_levels(truth)

        watcher.close()
        wait_for(lambda: book_key(ticker) not in ing.jobs, timeout=GRACE_S + 5)
        assert book_key(ticker) not in ing.pending
    finally:
        ing.stop()


def test_an_exchange_without_books_fails_book_subscribers_and_no_one_else(relay) -> None:
    """A venue whose adapter serves no book: the book subscriber hears NO_BOOK on the
    ticker's error topic, which a trade subscriber of the same ticker passes over."""
    from candlewire._protocol import MarketFilter
    from ingest.exchanges.base import Exchange
    from journal.service import JournalService

    class Bookless(SimExchange):
        book_snapshot = Exchange.book_snapshot
        book_deltas = Exchange.book_deltas

    s, ticker = relay.settings, "SIMN:A/USDT"
    journal = JournalService(s, metrics=False).start()
    ing = start_ingestor(s, Bookless("SIMN", symbols={"A/USDT": 10.0}), grace_s=GRACE_S)
    try:
        time.sleep(1.0)  # past warm-up
        with Client(s) as client, pytest.raises(SubscriptionFailed) as failed:
            next(iter(client.subscribe(ticker, "book", idle_timeout=30)))
        assert failed.value.reason == "NO_BOOK"
        frames = [f"{ticker}|error".encode(), *encode(failed.value.error)]
        ticks = MarketFilter(market_data_topic(ticker, "tick"), f"{ticker}|error")
        assert ticks.accept(frames) is None
        books = MarketFilter(market_data_topic(ticker, "book"), f"{ticker}|error")
        with pytest.raises(SubscriptionFailed):
            books.accept(frames)
    finally:
        ing.stop()
        journal.stop()
