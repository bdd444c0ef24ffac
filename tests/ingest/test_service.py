"""The ingestor end to end: relay work queue in, the real Kafka broker out."""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
import uuid

import pytest

from candlewire import Client
from candlewire.kafka import OHLC_BATCHES, TICKS
from candlewire.testing import candlewire_command
from candlewire.topics import ingestor_topic, work_prefix
from ingest.exchanges.base import Page
from ingest.exchanges.replay import ReplayExchange
from ingest.exchanges.sim import SimExchange
from ingest.peers import TAKING_WORK, PeerView
from ingest.service import Ingestor, stream_key
from proto import market_pb2
from proto import requests_pb2 as rq
from relay import Relay
from tests.support import counted, read_topic, read_topic_to_end, relay_call, wait_for

DAY = 86_400_000
T0 = 1_700_006_400_000  # a day boundary


@pytest.fixture
def live(broker_settings):
    relay = Relay(broker_settings, metrics=False).start()
    yield broker_settings
    relay.stop()


# Two peers in one test process (one interpreter lock) on a loaded machine can stall for
# more than 3 missed beats of 0.2 s, and each then thinks the other dead: beats of 0.5 s.
PEER_BEAT_S = 0.5
# Where a test asserts that two peers never both take the same work, even a 1.5 s stall
# of the process (3 missed beats of 0.5 s) must not make either think the other dead:
# with beats of 2 s that takes a stall of over 4 s.
STEADY_BEAT_S = 2.0


def start_ingestor(
    settings, *exchanges, heartbeat_s: float = 0.2, warmup_beats: int = 2, **kw
) -> Ingestor:
    return Ingestor(
        settings,
        list(exchanges),
        heartbeat_s=heartbeat_s,
        warmup_beats=warmup_beats,
        metrics=False,
        **kw,
    ).start()


def batches(
    settings, request_id: str, complete=None, timeout: float = 60.0
) -> list[market_pb2.OHLCBatch]:
    def mine(records):
        return [
            r for r in records if isinstance(r, market_pb2.OHLCBatch) and r.request_id == request_id
        ]

    def done(records):
        got = mine(records)
        if complete is not None:
            return complete(got)
        meta = [b.metadata for b in got if b.HasField("metadata")]
        return any(b.error for b in got) or (
            bool(meta) and len({b.page for b in got}) >= meta[0].expected_pages
        )

    return mine(read_topic(settings, OHLC_BATCHES.name, done, timeout))


def test_sim_history_pages_with_metadata_first(live) -> None:
    ing = start_ingestor(live, SimExchange())
    try:
        with Client(live) as client:
            ack = client.submit("SIM:BTC/USDT", 60, T0, T0 + DAY)
        got = batches(live, ack.request_id)
    finally:
        ing.stop()
    assert [b.page for b in got] == [0, 1]
    meta = got[0].metadata
    assert (meta.request_id, meta.ticker, meta.period_s, meta.expected_pages) == (
        ack.request_id,
        "SIM:BTC/USDT",
        60,
        2,
    )
    assert meta.notification_topic == ack.notification_topic and meta.client_id == client.client_id
    assert not got[1].HasField("metadata")
    rows = [r for b in got for r in b.rows]
    want = SimExchange().ohlc_page("SIM:BTC/USDT", 60, Page(0, T0, T0 + DAY))

    def fields(c):
        return (c.open_time_ms, c.open, c.high, c.low, c.close, c.volume, c.trade_count)

    assert len(rows) == 1440 and [fields(r) for r in rows] == [fields(c) for c in want]


def test_replay_history(live) -> None:
    replay = ReplayExchange()
    start, end = replay.recorded_range("REPLAY:ETH/USDT", 3600)
    ing = start_ingestor(live, replay)
    try:
        with Client(live) as client:
            ack = client.submit("REPLAY:ETH/USDT", 3600, start, end)
        got = batches(live, ack.request_id)
    finally:
        ing.stop()
    rows = [r for b in got for r in b.rows]
    assert len(rows) == 24 and rows == replay.ohlc_page(
        "REPLAY:ETH/USDT", 3600, Page(0, start, end)
    )


@pytest.mark.parametrize(
    ("ticker", "start", "reason"),
    [
        ("SIM:NOPE/USDT", T0, "does not list SIM:NOPE/USDT"),
        ("SIM:BTC/USDT", 1_500_000_000_000, "history starts"),
    ],
)
def test_error_marker(live, ticker, start, reason) -> None:
    ing = start_ingestor(live, SimExchange())
    try:
        with Client(live) as client:
            ack = client.submit(ticker, 3600, start, start + DAY, notify="request")
        got = batches(live, ack.request_id)
    finally:
        ing.stop()
    (marker,) = [b for b in got if b.error]
    assert reason in marker.error
    assert marker.metadata.notification_topic == f"HISTORY_READY:{ack.request_id}"


def sees_taking(ingestor: Ingestor, other: Ingestor, exchange: str = "SIM") -> bool:
    """``ingestor`` counts ``other`` alive and taking work (past its warm-up)."""
    view = ingestor.views[exchange]
    peer = view.alive(time.monotonic()).get(other.id)
    taking = ingestor.state(time.monotonic()) in TAKING_WORK
    return taking and peer is not None and peer.state in TAKING_WORK


def test_competing_ingestors_fetch_each_request_once(live) -> None:
    a = start_ingestor(live, SimExchange(), ingestor_id="ing-a", heartbeat_s=STEADY_BEAT_S)
    b = start_ingestor(live, SimExchange(), ingestor_id="ing-b", heartbeat_s=STEADY_BEAT_S)
    try:
        # Both past warm-up and each taking work in the other's view; then 16 requests
        # leave rendezvous hashing a 2 in 65,536 chance of giving them all to one.
        deadline = time.monotonic() + 30
        while not all(sees_taking(x, y) for x, y in ((a, b), (b, a))):
            assert time.monotonic() < deadline, "the ingestors never saw each other"
            time.sleep(0.1)
        with Client(live) as client:
            acks = [
                client.submit("SIM:ETH/USDT", 300, T0 + i * DAY, T0 + (i + 1) * DAY)
                for i in range(16)
            ]
        time.sleep(3.0)
        ids = {ack.request_id for ack in acks}
        records = read_topic(
            live,
            OHLC_BATCHES.name,
            lambda rs: {r.request_id for r in rs if r.HasField("metadata")} >= ids,
        )
    finally:
        a.stop()
        b.stop()
    mine = [r for r in records if r.request_id in ids]
    assert len(mine) == len(ids), "a request was fetched more than once"
    owners = {r.metadata.ingestor_id for r in mine}
    assert owners == {"ing-a", "ing-b"}, f"work was not shared: {owners}"


def test_an_ingestor_takes_work_from_every_relay_and_a_request_sent_to_two_once(live) -> None:
    """A client that failed over sends the same request (same id) to a second relay; both
    relays pass it on, and the ingestor, hearing both, still fetches it once."""
    a = live.model_copy(update={"relay_hosts": ["127.0.0.1", "127.0.0.2"]})
    on_b = a.model_copy(update={"host": "127.0.0.2", "bind_host": "127.0.0.2"})
    other = Relay(on_b, metrics=False).start()
    ing = start_ingestor(a, SimExchange(), ingestor_id="ing-both")
    twice, only_b = f"req-twice-{uuid.uuid4().hex[:8]}", f"req-b-{uuid.uuid4().hex[:8]}"
    try:
        wait_for(lambda: other.has_ingestor("SIM"), timeout=30)
        with Client(live) as via_a, Client(on_b) as via_b:  # A's: retried until it is served
            for client, ticker, request_id in (
                (via_a, "SIM:ETH/USDT", twice),
                (via_b, "SIM:ETH/USDT", twice),
                (via_b, "SIM:SOL/USDT", only_b),
            ):
                ack = client.submit(ticker, 300, T0, T0 + DAY, request_id=request_id)
                assert ack.status == rq.SUBMIT_OK
        both_seen: list[float] = []

        def settled(records: list) -> bool:
            """Both fetched, and 3 s more for a second fetch of the same request to show."""
            ids = [r.request_id for r in records if r.HasField("metadata")]
            if ids.count(twice) > 1:
                return True
            if not both_seen and twice in ids and only_b in ids:
                both_seen.append(time.monotonic())
            return bool(both_seen) and time.monotonic() - both_seen[0] > 3.0

        records = read_topic(live, OHLC_BATCHES.name, settled, timeout=90)
    finally:
        ing.stop()
        other.stop()
    metas = [r.request_id for r in records if r.HasField("metadata")]
    assert metas.count(twice) == 1, "a request sent to two relays was fetched twice"
    assert metas.count(only_b) == 1, "work sent through relay B was not fetched"


def subprocess_ingestor(
    settings, ingestor_id: str, exchange: str = "SIM", stream: list[str] = ()
) -> subprocess.Popen:
    """``candlewire ingest`` as a process of its own (kill -9 tests); ``stream``: always on."""
    env = {**os.environ, **settings.to_env(), "CANDLEWIRE_PORTS__INGEST_METRICS": "0"}
    return subprocess.Popen(
        candlewire_command(
            "ingest",
            "--exchange",
            exchange,
            "--id",
            ingestor_id,
            *(("--stream", ",".join(stream)) if stream else ()),
        ),
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


def wait_available(settings, exchange: str, ids: set[str], timeout: float = 60.0) -> None:
    """Until each of ``ids`` has said in a heartbeat that it takes work (past its warm-up)."""
    import zmq

    from proto.envelope import decode_sub

    sub = zmq.Context.instance().socket(zmq.SUB)
    sub.subscribe(ingestor_topic(exchange))
    sub.connect(settings.connect("market_data"))
    ready: set[str] = set()
    deadline = time.monotonic() + timeout
    try:
        while ready != ids:
            assert time.monotonic() < deadline, f"only {ready} of {ids} took work"
            if sub.poll(200):
                _, hb = decode_sub(sub.recv_multipart())
                if hb.ingestor_id in ids and hb.state == rq.AVAILABLE:
                    ready.add(hb.ingestor_id)
    finally:
        sub.close(linger=0)


def test_takeover_after_kill_9_of_busy_ingestor(live) -> None:
    procs = {i: subprocess_ingestor(live, i) for i in ("ing-x", "ing-y")}
    try:
        wait_available(live, "SIM", set(procs))  # both started and past warm-up
        with Client(live) as client:
            ack = client.submit(
                "SIM:SOL/USDT", 60, T0, T0 + 365 * DAY
            )  # ~526 pages, seconds of work
        first = batches(
            live, ack.request_id, complete=lambda got: any(b.HasField("metadata") for b in got)
        )
        owner = next(b.metadata.ingestor_id for b in first if b.HasField("metadata"))
        procs[owner].send_signal(signal.SIGKILL)
        procs[owner].wait()
        survivor = next(i for i in procs if i != owner)

        def survivor_finished(got):
            starts = [
                i
                for i, b in enumerate(got)
                if b.HasField("metadata") and b.metadata.ingestor_id == survivor
            ]
            return bool(starts) and {b.page for b in got[starts[0] :]} >= set(range(526))

        got = batches(live, ack.request_id, complete=survivor_finished, timeout=120)
        assert survivor_finished(got), "the surviving ingestor did not take the request over"
    finally:
        for p in procs.values():
            p.kill()
            p.wait()


def subscribe(settings, ticker: str, exchange: str) -> None:
    req = rq.DataRequest(
        request_id=f"rt-{ticker}", kind=rq.REALTIME_SUBSCRIBE, ticker=ticker, exchange=exchange
    )
    resp = None
    for _ in range(50):
        resp = relay_call(settings, req)
        if resp.status == rq.SUBMIT_OK:
            return
        time.sleep(0.1)
    raise AssertionError(resp)


def cancel(settings, ticker: str, exchange: str) -> None:
    ctl = rq.IngestorControl(action=rq.CANCEL_REALTIME, ticker=ticker, exchange=exchange)
    assert relay_call(settings, ctl).status == rq.SUBMIT_OK


def ticks_of(settings, ticker: str, at_least: int, timeout: float = 30.0) -> list[market_pb2.Tick]:
    def mine(rs):
        return [r for r in rs if isinstance(r, market_pb2.Tick) and r.ticker == ticker]

    return mine(read_topic(settings, TICKS.name, lambda rs: len(mine(rs)) >= at_least, timeout))


def all_ticks_of(settings, ticker: str) -> list[market_pb2.Tick]:
    """Every tick of ``ticker`` the topic holds now."""
    return [
        r
        for r in read_topic_to_end(settings, TICKS.name)
        if isinstance(r, market_pb2.Tick) and r.ticker == ticker
    ]


def test_realtime_stream_and_cancel(live) -> None:
    ing = start_ingestor(live, SimExchange(name="SIMC", symbols={"C1/USDT": 10.0}, rate=20.0))
    try:
        subscribe(live, "SIMC:C1/USDT", "SIMC")
        assert len(ticks_of(live, "SIMC:C1/USDT", 20)) >= 20
        job = ing.jobs[stream_key("SIMC:C1/USDT")]
        cancel(live, "SIMC:C1/USDT", "SIMC")
        wait_for(lambda: not ing.jobs, timeout=30)
        wait_for(job.future.done, timeout=30)  # its thread has sent its last tick
        ing._sink.flush(30)
        settled = len(all_ticks_of(live, "SIMC:C1/USDT"))
        time.sleep(2.0)
        assert len(all_ticks_of(live, "SIMC:C1/USDT")) == settled
    finally:
        ing.stop()


def test_broker_restart_mid_stream_loses_and_duplicates_nothing(live, kafka) -> None:
    ing = start_ingestor(live, SimExchange(name="SIMR", symbols={"R1/USDT": 10.0}, rate=20.0))
    try:
        subscribe(live, "SIMR:R1/USDT", "SIMR")
        ticks_of(live, "SIMR:R1/USDT", 20)
        kafka.stop()
        time.sleep(2.0)  # trades keep coming while the broker is down
        kafka.start()
        time.sleep(3.0)
        cancel(live, "SIMR:R1/USDT", "SIMR")
        wait_for(lambda: not ing.jobs, timeout=10)
        ing._sink.flush(60)
        got = all_ticks_of(live, "SIMR:R1/USDT")
    finally:
        ing.stop()
    ids = [int(t.trade_id) for t in got]
    assert len(ids) == len(set(ids)), "duplicated ticks"
    assert sorted(ids) == list(range(min(ids), max(ids) + 1)), "lost ticks"
    assert len(ids) >= 20 * 6


def test_heartbeats_are_visible_through_the_relay(live, ctx) -> None:
    import zmq

    from proto.envelope import decode_sub

    # The subscriber first, and a warm-up of 10 s (50 beats of 0.2 s): the subscription has
    # that long to reach the ingestor for a READY beat to come through, even on a loaded
    # machine.
    sub = ctx.socket(zmq.SUB)
    sub.subscribe(ingestor_topic("SIMH"))
    sub.connect(live.connect("market_data"))
    ing = start_ingestor(live, SimExchange(name="SIMH"), ingestor_id="ing-h", warmup_beats=50)
    try:
        states = []
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and rq.AVAILABLE not in states:
            if sub.poll(200):
                _, hb = decode_sub(sub.recv_multipart())
                assert hb.ingestor_id == "ing-h" and hb.exchange == "SIMH"
                states.append(hb.state)
        assert states[0] == rq.READY and rq.AVAILABLE in states
    finally:
        sub.close()
        ing.stop()


def test_a_work_item_of_an_unknown_kind_is_dropped_and_counted(broker_settings) -> None:
    """A kind this build cannot name (a newer sender's): counted and dropped, and the loop
    goes on; naming it raised and ended the ingestor's loop, and with it every ingestor of
    the exchange at once (they all read the same work)."""
    ing = Ingestor(broker_settings, [SimExchange(name="SIM")], metrics=False)
    try:
        before = counted(ing.metrics.dropped).get(("work_queue",), 0)
        ing._on_work(rq.DataRequest(request_id="k", kind=99, exchange="SIM", ticker="SIM:X/Y"))
        assert counted(ing.metrics.dropped)[("work_queue",)] == before + 1
        assert not ing.pending
        ing._on_work(rq.DataRequest(request_id="h", kind=rq.HISTORICAL, exchange="SIM"))
        assert "h" in ing.pending  # a known kind still taken
    finally:
        ing.stop()


@pytest.mark.parametrize("request_id", ["book:x", "stream:x"])
def test_a_fetch_whose_id_is_a_live_jobs_key_is_dropped_and_counted(
    broker_settings, request_id: str
) -> None:
    """A fetch's job key is its request_id: one named like a live job's key took that job's
    place (``book:…`` started a book stream, ``stream:…`` was never marked done)."""
    ing = Ingestor(broker_settings, [SimExchange(name="SIM")], metrics=False)
    try:
        for kind in (rq.HISTORICAL, rq.SYMBOL_METADATA):
            ing._on_work(rq.DataRequest(request_id=request_id, kind=kind, exchange="SIM"))
        assert counted(ing.metrics.dropped)[("work_queue",)] == 2
        assert not ing.pending
    finally:
        ing.stop()


def test_malformed_work_off_the_wire_is_dropped_and_counted_and_the_loop_goes_on(
    broker_settings,
) -> None:
    """Frames on the work queue that are no work item (no version frame, a type byte no
    build knows, a body that does not parse) are dropped and counted: the ingestor's loop
    goes on and takes the next item. The relay checks what it forwards; this is the
    ingestor's own guard, with a PUB bound where the relay's would be."""
    import zmq

    from proto.envelope import encode_topic

    ctx = zmq.Context()
    pub = ctx.socket(zmq.PUB)
    pub.setsockopt(zmq.LINGER, 0)
    pub.bind(broker_settings.bind("work_queue"))
    ing = Ingestor(broker_settings, [SimExchange(name="SIM")], metrics=False).start()
    topic = work_prefix("SIM").encode()
    bad = ([topic], [topic, b"\x01", b"\xee\x00"], [topic, b"\x01", b"\x05\xff\xff\xff"])
    good = rq.DataRequest(request_id="", kind=rq.REALTIME_CANCEL, exchange="SIM", ticker="SIM:Q/W")

    def taken() -> float:
        return counted(ing.metrics.received).get(("realtime_cancel",), 0)

    try:
        # The SUB joins a moment after the start: each round is three bad items, then one
        # good; the good one of the second round taken means the round's bad ones came first.
        def send_round() -> None:
            for frames in bad:
                pub.send_multipart(frames)
            pub.send_multipart(encode_topic(work_prefix("SIM"), good))

        wait_for(lambda: send_round() or taken() >= 2, timeout=30)
        assert counted(ing.metrics.dropped)[("work_queue",)] >= len(bad)
        assert ing._thread.is_alive()
    finally:
        ing.stop()
        pub.close()
        ctx.term()


def test_fetches_start_as_the_pool_has_room(settings, monkeypatch: pytest.MonkeyPatch) -> None:
    """Beyond its workers a fetch waits in ``pending``, not in the pool's queue (unbounded,
    and listed in every heartbeat as held work: 8,000 made a heartbeat past the relay's
    message size). The loop is not started: its steps are called as it calls them."""
    import ingest.service as service

    release, started = threading.Event(), []

    def fetch(req, *_args) -> None:
        started.append(req.request_id)
        release.wait(10)

    monkeypatch.setattr(service, "run_history", fetch)
    ingestor = Ingestor(settings, [SimExchange()], workers=2, warmup_beats=0, metrics=False)
    try:
        for i in range(5):
            ingestor._on_work(
                rq.DataRequest(request_id=f"r-{i}", kind=rq.HISTORICAL, exchange="SIM")
            )
        assert list(ingestor.pending) == [f"r-{i}" for i in range(5)]
        ingestor._schedule(time.monotonic())
        assert len(ingestor.jobs) == 2
        wait_for(lambda: len(started) == 2, timeout=10)
        release.set()
        wait_for(lambda: all(j.future.done() for j in ingestor.jobs.values()), timeout=10)
        ingestor._reap(time.monotonic())
        ingestor._schedule(time.monotonic())
        assert len(ingestor.jobs) == 2 and set(ingestor.jobs).isdisjoint(started)
    finally:
        release.set()
        ingestor.stop(flush_s=0)


def test_a_fetch_beyond_the_queue_bound_is_answered_with_an_error_not_held(
    settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every ingestor holds every request until one does it, so a flood of requests grew
    ``pending`` without bound. Beyond the bound a request is refused: its owner writes the
    error marker (the requester's HistoryReady ERROR) and marks it done for the peers."""
    import ingest.service as service

    release = threading.Event()
    monkeypatch.setattr(service, "run_history", lambda *_a: release.wait(10))
    monkeypatch.setattr(service, "MAX_QUEUED_FETCHES", 3)
    ingestor = Ingestor(settings, [SimExchange()], workers=1, warmup_beats=0, metrics=False)
    sent: list[market_pb2.OHLCBatch] = []
    monkeypatch.setattr(ingestor._sink, "send", lambda _topic, _key, msg: sent.append(msg))

    def request(i: int) -> None:
        ingestor._on_work(
            rq.DataRequest(
                request_id=f"r-{i}",
                kind=rq.HISTORICAL,
                exchange="SIM",
                ticker="SIM:BTC/USDT",
                period_s=60,
                start_ms=T0,
                end_ms=T0 + DAY,
            )
        )

    try:
        for i in range(5):
            request(i)
        assert list(ingestor.pending) == ["r-0", "r-1", "r-2"]
        assert [(m.request_id, m.metadata.request_id) for m in sent] == [
            ("r-3", "r-3"),
            ("r-4", "r-4"),
        ]
        assert all("fetches queued" in m.error and m.metadata.expected_pages for m in sent)
        assert {"r-3", "r-4"} <= set(ingestor.views["SIM"].done)
        assert list(ingestor.recent_done["SIM"]) == ["r-3", "r-4"]
        assert counted(ingestor.metrics.fetches_dropped)[("queue_full",)] == 2
        ingestor._schedule(time.monotonic())  # one starts: room for one more
        assert len(ingestor.jobs) == 1
        request(5)
        request(6)
        assert "r-5" in ingestor.pending and "r-6" not in ingestor.pending
        assert [m.request_id for m in sent] == ["r-3", "r-4", "r-6"]
    finally:
        release.set()
        ingestor.stop(flush_s=0)


def heard(view: PeerView, peer: str, now: float, working: list[str] | None = None) -> None:
    """A live, work-taking peer's heartbeat on SIM, as heard at ``now``."""
    beat = rq.IngestorControl(
        action=rq.HEARTBEAT,
        exchange="SIM",
        ingestor_id=peer,
        state=rq.AVAILABLE,
        interval_ms=1000,
        working=working or [],
    )
    view.observe(beat, now)


def test_a_refused_fetch_a_peer_owns_is_left_to_it_and_a_stale_one_is_dropped(
    settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The owner alone answers a refused request. A queued fetch a live peer owns and has
    not taken for QUEUED_STALE_S is dropped; one we own waits however long it takes."""
    import ingest.service as service

    release = threading.Event()
    monkeypatch.setattr(service, "run_history", lambda *_a: release.wait(10))
    monkeypatch.setattr(service, "MAX_QUEUED_FETCHES", 3)
    ingestor = Ingestor(settings, [SimExchange()], workers=1, warmup_beats=0, metrics=False)
    sent: list[object] = []
    monkeypatch.setattr(ingestor._sink, "send", lambda *a: sent.append(a))
    view = ingestor.views["SIM"]
    now = time.monotonic()
    heard(view, "peer", now)
    ids = [f"r-{i}" for i in range(40)]
    theirs = [i for i in ids if view.owner(i, now, True) == "peer"]
    ours = [i for i in ids if view.owner(i, now, True) == ingestor.id]
    busy, mine, peers = ours[0], ours[1], theirs[:2]
    try:
        for rid in (busy, mine, *peers):
            ingestor._on_work(rq.DataRequest(request_id=rid, kind=rq.HISTORICAL, exchange="SIM"))
        assert sent == [] and peers[1] not in ingestor.pending  # the peer answers it
        assert counted(ingestor.metrics.fetches_dropped)[("queue_full",)] == 1
        ingestor._schedule(now)
        assert list(ingestor.jobs) == [busy]  # our one slot; `mine` waits for it
        later = now + service.QUEUED_STALE_S + 1
        heard(view, "peer", later)
        ingestor._schedule(later)
        assert set(ingestor.pending) == {busy, mine}
        assert counted(ingestor.metrics.fetches_dropped)[("stale",)] == 1
        # One the peer works on is kept: if it dies, another takes it over.
        taken = theirs[2]
        ingestor._on_work(rq.DataRequest(request_id=taken, kind=rq.HISTORICAL, exchange="SIM"))
        ingestor._schedule(later)
        latest = later + service.QUEUED_STALE_S + 1
        heard(view, "peer", latest, working=[taken])
        ingestor._schedule(latest)
        assert taken in ingestor.pending
    finally:
        release.set()
        ingestor.stop(flush_s=0)


def test_the_fetch_queue_is_bounded_per_exchange(settings, monkeypatch: pytest.MonkeyPatch) -> None:
    """One exchange's full queue refuses none of another's requests (a peer may serve only
    that one, its queue empty)."""
    import ingest.service as service

    monkeypatch.setattr(service, "MAX_QUEUED_FETCHES", 2)
    ingestor = Ingestor(
        settings, [SimExchange(), SimExchange(name="SIMB")], warmup_beats=0, metrics=False
    )
    monkeypatch.setattr(ingestor._sink, "send", lambda *_a: None)
    try:
        for rid, exchange in (("a1", "SIM"), ("a2", "SIM"), ("a3", "SIM"), ("b1", "SIMB")):
            ingestor._on_work(rq.DataRequest(request_id=rid, kind=rq.HISTORICAL, exchange=exchange))
        assert list(ingestor.pending) == ["a1", "a2", "b1"]
    finally:
        ingestor.stop(flush_s=0)
