"""Trades lost upstream are found and fetched again (#37): the detector's rules, SIM's faults,
repairs through a stream, and a takeover between two ingestors through Kafka."""

from __future__ import annotations

import io
import threading
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor

import pytest
from rich.console import Console

from candlewire.gaps import read_gaps
from candlewire.kafka import GAPS, TICKS, key_partition
from ingest.exchanges.base import TradeRun
from ingest.exchanges.sim import GENESIS_MS, MINUTE_MS, Faults, Outage, SimExchange, parse_faults
from ingest.gaps import (
    GapDetector,
    GapRepairer,
    GapWatch,
    RecentIds,
    last_delivered,
    new_gap,
    tail_of,
)
from ingest.jobs import run_stream
from ingest.peers import PeerView
from ingest.service import Ingestor, stream_key
from launcher.render import gap_table
from proto import market_pb2
from proto import requests_pb2 as rq
from tests.ingest.test_service import (
    PEER_BEAT_S,
    heard,
    live,  # noqa: F401 - the relay + Kafka fixture
)
from tests.support import RecordingSink, read_topic, read_topic_to_end, wait_for

T = "SIM:BTC/USDT"
S = 1_000_000_000


def tick(trade_id: str | int, at_s: float) -> market_pb2.Tick:
    return market_pb2.Tick(
        ticker=T, trade_id=str(trade_id), price="1", size="1", exchange_time_ns=int(at_s * S)
    )


# -- SIM's faults ----------------------------------------------------------------------------


def test_fault_specs_parse() -> None:
    faults = parse_faults("drop:20s@60s, disconnect:1.5s@0.5s,rest:off,ids:opaque,drop:1s@90s")
    assert faults == Faults(
        (Outage("disconnect", 0.5, 1.5), Outage("drop", 60, 20), Outage("drop", 90, 1)),
        rest_off=True,
        opaque_ids=True,
    )
    assert parse_faults("") == Faults()
    assert not SimExchange(faults="ids:opaque").sequential_ids and SimExchange().sequential_ids


@pytest.mark.parametrize(
    ("spec", "says"),
    [
        ("drop:20@60s", "is not one of"),
        ("drop:20s", "is not one of"),
        ("rest:on", "is not one of"),
        ("lag:5s@1s", "is not one of"),
        ("drop:0s@1s", "above 0 s"),
    ],
)
def test_bad_fault_specs_say_what_is_wrong(spec: str, says: str) -> None:
    with pytest.raises(ValueError, match=says) as err:
        SimExchange(faults=spec)
    assert repr(spec) in str(err.value)


def test_sim_refetch_serves_what_it_streams() -> None:
    m0 = (1_700_006_400_000 - GENESIS_MS) // MINUTE_MS
    for faults in ("", "ids:opaque"):
        sim = SimExchange(rate=2.0, faults=faults)
        batch = sim.trade_batch(T, m0, m0 + 3)
        got = sim.refetch(T, batch[5].exchange_time_ns, batch[200].exchange_time_ns)
        assert got == batch[5:201]
    with pytest.raises(Exception, match="rest:off"):
        SimExchange(faults="rest:off").refetch(T, batch[0].exchange_time_ns, time.time_ns())


# -- the detector ------------------------------------------------------------------------------


def feed(detector: GapDetector, *events: market_pb2.Tick | str) -> list[market_pb2.Gap]:
    gaps = []
    for e in events:
        if e == "reconnect":
            detector.reconnected()
        elif (gap := detector.observe(e)) is not None:  # type: ignore[arg-type]
            gaps.append(gap)
    return gaps


def test_a_skipped_trade_id_is_a_gap() -> None:
    gaps = feed(GapDetector(T, True, "ing-1"), tick(1, 1), tick(2, 2), tick(6, 6), tick(7, 7))
    (gap,) = gaps
    assert (gap.cause, gap.from_trade_id, gap.to_trade_id, gap.from_ns, gap.to_ns) == (
        market_pb2.TRADE_ID_JUMP,
        "2",
        "6",
        2 * S,
        6 * S,
    )
    assert gap.gap_id == f"{T}|TRADE_ID_JUMP|{2 * S}" and gap.status == market_pb2.GAP_OPEN
    assert gap.ingestor_id == "ing-1" and gap.detected_ms > 0


def test_a_reconnect_is_a_gap_only_when_ids_jump_across_it() -> None:
    (gap,) = feed(GapDetector(T, True), tick(1, 1), "reconnect", tick(5, 9))
    assert (gap.cause, gap.from_trade_id, gap.to_trade_id) == (market_pb2.RECONNECT, "1", "5")
    assert feed(GapDetector(T, True), tick(1, 1), "reconnect", tick(2, 9)) == []
    assert feed(GapDetector(T, True), "reconnect", tick(1, 1), tick(2, 2)) == []


def test_without_sequential_ids_every_reconnect_is_a_gap_and_nothing_else() -> None:
    detector = GapDetector(T, False)
    assert feed(detector, tick("b7", 1), tick("a1", 2), tick("zz", 3)) == []
    (gap,) = feed(detector, "reconnect", tick("c3", 9), tick("d4", 10))
    assert (gap.cause, gap.from_trade_id, gap.to_trade_id) == (market_pb2.RECONNECT, "zz", "c3")


def test_a_takeover_starts_from_the_dead_peers_tail() -> None:
    tail = rq.StreamTail(ticker=T, trade_id="10", time_ns=10 * S)
    (gap,) = feed(GapDetector(T, True, tail=tail), tick(15, 15), tick(16, 16))
    assert (gap.cause, gap.from_trade_id, gap.to_trade_id) == (market_pb2.TAKEOVER, "10", "15")
    # The new stream overlaps the old one, or follows it without a hole: nothing lost.
    assert feed(GapDetector(T, True, tail=tail), tick(9, 9), tick(11, 11)) == []
    assert feed(GapDetector(T, True, tail=tail), tick(11, 11)) == []
    (gap,) = feed(GapDetector(T, False, tail=tail), tick("x", 12))
    assert gap.cause == market_pb2.TAKEOVER and gap.from_ns == 10 * S


def test_recent_ids_are_bounded_by_count_and_time() -> None:
    recent = RecentIds(limit=3, horizon_ns=10 * S)
    for i in range(5):
        recent.add(f"t{i}", i * S)
    assert len(recent) == 3 and "t1" not in recent and "t2" in recent
    recent.add("late", 13 * S)  # t2 is now more than 10 s older
    assert "t2" not in recent and {"t3", "t4", "late"} == {x for x in recent._ids}


def test_peers_remember_tails_while_streaming_and_hand_them_over_once() -> None:
    view = PeerView("me")
    tail = rq.StreamTail(ticker=T, trade_id="7", time_ns=time.time_ns())

    def beat(state: int = rq.BUSY, tails: tuple = (tail,)) -> rq.IngestorControl:
        return rq.IngestorControl(
            action=rq.HEARTBEAT, ingestor_id="peer", state=state, interval_ms=100, tails=tails
        )

    now_ns = time.time_ns()
    view.observe(beat(), 100.0)
    assert view.takeover_tail(T, 100.1, now_ns, 600) is None  # the peer is alive
    assert view.takeover_tail(T, 101.0, now_ns, 600) == tail  # dead: 3 beats missed
    assert view.takeover_tail(T, 101.0, now_ns, 600) is None  # handed over once
    view.observe(beat(), 100.0)
    view.observe(beat(tails=()), 100.1)  # it stopped streaming while alive: nothing lost
    assert view.takeover_tail(T, 101.0, now_ns, 600) is None
    view.observe(beat(state=rq.DONE), 100.2)  # it shut down: its tail is handed over
    assert view.takeover_tail(T, 100.3, now_ns, 600) == tail
    view.observe(beat(), 100.0)
    assert view.takeover_tail(T, 101.0, now_ns + 601 * S, 600) is None  # too old


# -- repairs of a SIM stream with faults --------------------------------------------------------


class Sink(RecordingSink):
    def ticks(self) -> list[market_pb2.Tick]:
        return self.sent(TICKS.name)

    def gaps(self) -> list[market_pb2.Gap]:
        return self.sent(GAPS.name)


def stream(
    sim: SimExchange, ticker: str = T, timeout_s: float = 30.0, failed_before: int = 0
) -> Sink:
    """``run_stream`` with gaps found and repaired, until the stream's gap has its outcome.

    It stops on that event, not after a fixed time: under a loaded CI the SIM's reconnect can
    come late, and a timer then cut the stream before its gap was even found."""
    sink, stop = Sink(failed_before), threading.Event()

    def settled() -> None:
        deadline = time.monotonic() + timeout_s
        while not stop.wait(0.05) and time.monotonic() < deadline:
            gaps = sink.gaps()
            if gaps and gaps[-1].status != market_pb2.GAP_OPEN:
                stop.wait(0.5)  # and a little more stream: no second gap, nothing doubled
                break
        stop.set()

    with ThreadPoolExecutor(3) as pool:
        repairer = GapRepairer(sink, pool)  # type: ignore[arg-type]
        detector = GapDetector(ticker, sim.sequential_ids, "ing-test")
        watch = GapWatch(detector, lambda gap, recent: repairer.found(sim, gap, recent))
        pool.submit(settled)
        run_stream(ticker, sim, sink, stop, (60, None), gaps=watch)  # type: ignore[arg-type]
    return sink


def test_a_repair_after_an_outage_is_judged_by_its_own_records() -> None:
    # The ingestor's sink counted failures before this stream began (an outage that ended):
    # the repair still closes its gap. It used to raise in flush and leave the gap open.
    sim = SimExchange(symbols={"BTC/USDT": 30_000.0}, rate=50.0, faults="drop:0.5s@0.4s")
    gap = outcome(stream(sim, failed_before=3))
    assert gap.status == market_pb2.GAP_REPAIRED and gap.refetched > 0


def fields(t: market_pb2.Tick) -> tuple:
    return (t.trade_id, t.price, t.size, t.side, t.exchange_time_ns)


def sim_span(sim: SimExchange, ticks: list[market_pb2.Tick]) -> list[tuple]:
    """SIM's trades from the first to the last of ``ticks``, as ``fields``."""
    lo, hi = min(t.exchange_time_ns for t in ticks), max(t.exchange_time_ns for t in ticks)
    m0, m1 = ((ns // 1_000_000 - GENESIS_MS) // MINUTE_MS for ns in (lo, hi))
    return [fields(t) for t in sim.trade_batch(T, m0, m1 + 1) if lo <= t.exchange_time_ns <= hi]


def outcome(sink: Sink) -> market_pb2.Gap:
    """The one gap the stream had, as finally recorded (open first, then its outcome)."""
    records = sink.gaps()
    assert [g.status for g in records] == [market_pb2.GAP_OPEN, records[-1].status]
    assert len({g.gap_id for g in records}) == 1
    return records[-1]


def test_dropped_trades_are_found_by_id_and_fetched_again() -> None:
    sim = SimExchange(symbols={"BTC/USDT": 30_000.0}, rate=50.0, faults="drop:0.5s@0.4s")
    sink = stream(sim)
    ticks = sink.ticks()
    gap = outcome(sink)
    assert (gap.cause, gap.status, gap.reason) == (
        market_pb2.TRADE_ID_JUMP,
        market_pb2.GAP_REPAIRED,
        "",
    )
    lost = int(gap.to_trade_id) - int(gap.from_trade_id) - 1
    assert lost >= 15 and gap.refetched == lost and gap.repaired_ms >= gap.detected_ms
    ids = [t.trade_id for t in ticks]
    assert len(ids) == len(set(ids)), "a trade was produced twice"
    assert sorted(map(fields, ticks)) == sorted(sim_span(sim, ticks))
    assert all(t.ingest_time_ns for t in ticks)


def test_a_venue_that_serves_nothing_leaves_the_gap_unrepairable() -> None:
    sim = SimExchange(symbols={"BTC/USDT": 30_000.0}, rate=50.0, faults="drop:0.5s@0.4s,rest:off")
    sink = stream(sim)
    gap = outcome(sink)
    assert gap.status == market_pb2.GAP_UNREPAIRABLE and gap.refetched == 0
    assert "rest:off" in gap.reason
    ids = [int(t.trade_id) for t in sink.ticks()]
    assert len(ids) == len(set(ids)) and not set(
        range(int(gap.from_trade_id) + 1, int(gap.to_trade_id))
    ) & set(ids)


def test_a_venue_that_serves_part_says_how_much() -> None:
    sim = SimExchange(symbols={"BTC/USDT": 30_000.0}, rate=50.0, faults="drop:0.5s@0.4s")
    serve = sim.refetch
    sim.refetch = lambda *a: serve(*a)[::2]  # type: ignore[method-assign]
    sink = stream(sim)
    gap = outcome(sink)
    missing = int(gap.to_trade_id) - int(gap.from_trade_id) - 1
    assert gap.status == market_pb2.GAP_UNREPAIRABLE and 0 < gap.refetched < missing
    assert gap.reason == f"the venue served {gap.refetched} of {missing} missing trades"
    ids = [t.trade_id for t in sink.ticks()]
    assert len(ids) == len(set(ids))


def test_without_sequential_ids_a_reconnect_refetches_its_window_and_doubles_nothing() -> None:
    sim = SimExchange(
        symbols={"BTC/USDT": 30_000.0}, rate=50.0, faults="ids:opaque,disconnect:0.3s@0.4s"
    )
    sink = stream(sim)  # down at 0.4 s, back after run_stream's 1 s pause
    ticks = sink.ticks()
    gap = outcome(sink)
    assert (gap.cause, gap.status) == (market_pb2.RECONNECT, market_pb2.GAP_REPAIRED)
    assert gap.refetched >= 40  # about a second of trades at 50 a second
    ids = [t.trade_id for t in ticks]
    assert len(ids) == len(set(ids)), "a trade was produced twice"
    assert sorted(map(fields, ticks)) == sorted(sim_span(sim, ticks))


# -- a takeover between two ingestors, through Kafka -------------------------------------------


class Freezable(SimExchange):
    """SIM whose stream can go quiet without ending, as a hung process's would."""

    def __init__(self, **kw: object) -> None:
        super().__init__(**kw)  # type: ignore[arg-type]
        self.frozen = threading.Event()

    def trade_runs(
        self, ticker: str, stop: threading.Event
    ) -> Iterator[market_pb2.Tick | TradeRun]:
        for t in super().trade_runs(ticker, stop):
            if self.frozen.is_set():
                stop.wait()
                return
            yield t


def hears_working(ingestor: Ingestor, exchange: str, peer_id: str, key: str) -> bool:
    peer = ingestor.views[exchange].alive(time.monotonic()).get(peer_id)
    return peer is not None and key in peer.working


def test_a_peer_takes_a_dead_ingestors_stream_over_and_fills_the_gap(live) -> None:  # noqa: F811
    name = f"GAP{uuid.uuid4().hex[:6].upper()}"
    ticker, key = f"{name}:G1/USDT", stream_key(f"{name}:G1/USDT")

    def ingestor(ingestor_id: str) -> Ingestor:
        sim = Freezable(name=name, symbols={"G1/USDT": 10.0}, rate=50.0)
        return Ingestor(
            live,
            [sim],
            ingestor_id=ingestor_id,
            heartbeat_s=PEER_BEAT_S,
            warmup_beats=2,
            metrics=False,
            always_on=[ticker],
            on_demand=False,
        ).start()

    first = ingestor("ing-first")
    second = None
    try:
        wait_for(lambda: key in first.jobs, timeout=10)
        second = ingestor("ing-second")  # after: it hears the first streaming, and waits
        # ... and has heard of a trade it sent: the tail the takeover starts from (a loaded
        # machine can take seconds to the stream's first trade).
        wait_for(
            lambda: (
                hears_working(second, name, "ing-first", key) and ticker in second.views[name].tails
            ),
            timeout=30,
        )
        time.sleep(PEER_BEAT_S)
        first.exchanges[name].frozen.set()  # type: ignore[attr-defined]
        time.sleep(PEER_BEAT_S)  # the trade in hand, if any, is sent; then none

        def heard_last() -> bool:  # its heartbeats still announce the last trade it sent
            tail = first.jobs[key].gaps.detector.tail  # type: ignore[union-attr]
            return second.views[name].tails[ticker][1].trade_id == tail.trade_id

        wait_for(heard_last, timeout=30)
        first._heartbeat = lambda *a, **k: None  # type: ignore[method-assign] - then it dies
        first.stop()

        def repaired() -> bool:
            gaps = [g for g in read_gaps(live, 2).listed() if g.ticker == ticker]
            return any(g.status != market_pb2.GAP_OPEN for g in gaps)

        wait_for(repaired, timeout=60)
        time.sleep(0.5)
        job = second.jobs[key]
        second.stop()
        wait_for(job.future.done, timeout=5)  # type: ignore[union-attr]
        last = int(job.gaps.detector.tail.trade_id)  # type: ignore[union-attr]
        second._sink.flush(30)
        first._sink.flush(30)
    finally:
        first.stop()
        if second is not None:
            second.stop()
    (gap,) = [g for g in read_gaps(live, 3).listed() if g.ticker == ticker]
    assert (gap.cause, gap.status, gap.ingestor_id) == (
        market_pb2.TAKEOVER,
        market_pb2.GAP_REPAIRED,
        "ing-second",
    )
    # The repair takes the minute before the announced trade too (the dead peer may not have
    # delivered it): those it did deliver are in the topic twice, resends the stream drops.
    assert gap.refetched >= int(gap.to_trade_id) - int(gap.from_trade_id) - 1 > 0

    def mine(records: list) -> list[market_pb2.Tick]:
        return [r for r in records if isinstance(r, market_pb2.Tick) and r.ticker == ticker]

    def ids_of(records: list) -> list[int]:
        return [int(t.trade_id) for t in mine(records)]

    ids = ids_of(read_topic(live, TICKS.name, lambda rs: last in ids_of(rs), timeout=30))
    twice = {i for i, n in Counter(ids).items() if n > 1}
    assert all(i <= int(gap.from_trade_id) for i in twice), "a trade after the tail is twice"
    assert sorted(set(ids)) == list(range(min(ids), max(ids) + 1)), "a trade is missing"
    assert int(gap.from_trade_id) in ids and int(gap.to_trade_id) in ids
    out = Console(width=160, file=io.StringIO())
    out.print(gap_table([gap]))
    shown = out.file.getvalue()  # type: ignore[attr-defined]
    assert all(word in shown for word in (ticker, "TAKEOVER", "REPAIRED", str(gap.refetched)))


def test_the_tail_is_the_last_trade_through_runs_of_consecutive_ids_and_a_jump() -> None:
    """Consecutive ids take the detector's fast path; the tail a heartbeat announces and the
    gap a jump opens still name the last trade exactly."""
    d = GapDetector(T, True)
    assert [d.observe(tick(i, i)) for i in range(1, 6)] == [None] * 5
    assert d.tail is not None and (d.tail.trade_id, d.tail.time_ns) == ("5", 5 * S)
    gap = d.observe(tick(9, 9))
    assert gap is not None and (gap.from_trade_id, gap.to_trade_id) == ("5", "9")
    assert d.observe(tick(8, 8)) is None, "an id already passed opens nothing"
    assert d.tail.trade_id == "9"
    assert d.observe(tick(10, 10)) is None and d.tail.trade_id == "10"
    d.reconnected()
    gap = d.observe(tick(12, 12))
    assert gap is not None and gap.cause == market_pb2.RECONNECT


@pytest.mark.parametrize("ids", ["", "ids:opaque"])
def test_a_takeover_repair_refetches_what_the_dead_peer_may_not_have_delivered(ids: str) -> None:
    """The dead peer announced the last trade it had *received*: the ones it held for Kafka
    (a stall, its producer's last moments), that trade included, were lost with it. The
    repair takes a minute before it as well; a resend of one it did deliver costs nothing."""
    sim = SimExchange(symbols={"BTC/USDT": 30_000.0}, rate=5.0, faults=ids)
    now = time.time_ns()
    happened = sim.refetch(T, now - 300 * S, now - 5 * S)
    tail = next(t for t in happened if t.exchange_time_ns >= now - 120 * S)
    first = happened[-1]  # the new stream's first trade
    gap = new_gap(T, market_pb2.TAKEOVER, tail_of(tail), tail_of(first), "ing-b")
    sink = Sink()
    with ThreadPoolExecutor(1) as pool:
        done = GapRepairer(sink, pool).repair(sim, gap, None)  # type: ignore[arg-type]
    lost = [
        t.trade_id
        for t in happened
        if tail.exchange_time_ns - 60 * S <= t.exchange_time_ns and t is not first
    ]
    assert tail.trade_id in lost and len(lost) > 250
    assert sorted(t.trade_id for t in sink.ticks()) == sorted(lost)
    assert done.status == market_pb2.GAP_REPAIRED and done.refetched == len(lost)


def test_a_takeover_repair_looks_back_no_further_than_the_horizon_allows() -> None:
    """A resend older than the stream's dedup horizon would be stored again as a late trade:
    near the horizon the look-back shrinks, down to none."""
    sim = SimExchange(symbols={"BTC/USDT": 30_000.0}, rate=5.0)
    now = time.time_ns()
    happened = sim.refetch(T, now - 300 * S, now - 5 * S)
    tail = next(t for t in happened if t.exchange_time_ns >= now - 120 * S)
    first = happened[-1]
    gap = new_gap(T, market_pb2.TAKEOVER, tail_of(tail), tail_of(first), "ing-b")
    sink = Sink()
    with ThreadPoolExecutor(1) as pool:
        GapRepairer(sink, pool, horizon_s=100).repair(sim, gap, None)  # type: ignore[arg-type]
    lost = [t.trade_id for t in happened if t.exchange_time_ns >= tail.exchange_time_ns]
    assert sorted(t.trade_id for t in sink.ticks()) == sorted(lost[:-1])


def test_trades_a_venue_sends_again_on_resubscribing_do_not_close_the_gap() -> None:
    """Without sequential ids, the first trade after a reconnect closed the gap even when
    the venue had sent it before (some replay their last trades on subscribing): the gap
    ran backwards, nothing was fetched, and the trades lost after it stayed lost."""
    found: list[market_pb2.Gap] = []
    watch = GapWatch(GapDetector(T, False), lambda gap, _recent: found.append(gap))
    for i in range(1, 6):
        watch.observe(tick(f"id{i}", i))
    watch.detector.reconnected()
    for i in (3, 4, 5, 5):  # sent again, one at the tail's own time
        watch.observe(tick(f"id{i}", i))
    assert found == []
    watch.observe(tick("id9", 9))  # 6 to 8 were lost
    (gap,) = found
    assert (gap.from_trade_id, gap.to_trade_id, gap.from_ns, gap.to_ns) == (
        "id5",
        "id9",
        5 * S,
        9 * S,
    )
    # Without the ids (the detector alone): an older trade keeps the question open too.
    (gap,) = feed(GapDetector(T, False), tick("a", 5), "reconnect", tick("b", 3), tick("c", 9))
    assert (gap.from_trade_id, gap.to_trade_id) == ("a", "c")


def test_a_repair_kafka_refuses_leaves_the_gap_open_for_the_sweep() -> None:
    """Its flush raised out of the repair, which nothing read: the gap stayed open with no
    word of why. It is left open, said in the log, for the sweep to repair again."""
    from ingest.sink import SinkError

    class Refusing(Sink):
        def flush(self, timeout: float = 60.0, *, since: int = 0) -> None:
            raise SinkError("3 records failed")

    sim = SimExchange(symbols={"BTC/USDT": 30_000.0}, rate=5.0)
    now = time.time_ns()
    happened = sim.refetch(T, now - 100 * S, now - 50 * S)
    gap = new_gap(T, market_pb2.TRADE_ID_JUMP, tail_of(happened[0]), tail_of(happened[-1]), "ing-a")
    sink = Refusing()
    with ThreadPoolExecutor(1) as pool:
        left = GapRepairer(sink, pool).repair(sim, gap, None)  # type: ignore[arg-type]
    assert left.status == market_pb2.GAP_OPEN and sink.gaps() == []


def test_a_gap_left_open_by_a_dead_ingestor_is_repaired_by_the_sweep(broker_settings) -> None:
    """An ingestor killed while it repaired a gap left it open, and nothing tried again:
    its trades were lost for good. The owner of a gap open for OPEN_STALE_S repairs it."""
    from confluent_kafka import Producer

    from candlewire.kafka import producer_config
    from proto.envelope import to_record

    ticker = f"SIM{uuid.uuid4().hex[:4].upper()}:BTC/USDT"
    name = ticker.partition(":")[0]
    sim = SimExchange(name=name, symbols={"BTC/USDT": 30_000.0}, rate=5.0)
    now = time.time_ns()
    happened = sim.refetch(ticker, now - 300 * S, now - 250 * S)
    gap = new_gap(
        ticker, market_pb2.TRADE_ID_JUMP, tail_of(happened[0]), tail_of(happened[-1]), "ing-dead"
    )
    gap.detected_ms = int(time.time() * 1000) - 300_000  # five minutes open
    producer = Producer(producer_config(broker_settings))
    producer.produce(GAPS.name, to_record(gap), gap.gap_id.encode())
    assert producer.flush(30) == 0
    ingestor = Ingestor(broker_settings, [sim], warmup_beats=0, metrics=False)
    try:
        assert ingestor.sweep_gaps(time.monotonic()) == [gap.gap_id]

        def repaired() -> market_pb2.Gap | None:
            held = read_gaps(broker_settings).gaps.get(gap.gap_id)
            return held if held is not None and held.status != market_pb2.GAP_OPEN else None

        done = wait_for(repaired, timeout=60)
        assert done.status == market_pb2.GAP_REPAIRED and done.refetched == len(happened) - 2
        ids = {
            t.trade_id
            for t in read_topic_to_end(broker_settings, TICKS.name)
            if isinstance(t, market_pb2.Tick) and t.ticker == ticker
        }
        assert ids == {t.trade_id for t in happened[1:-1]}
        assert ingestor.sweep_gaps(time.monotonic()) == []  # repaired: not again
    finally:
        ingestor.stop(flush_s=10)


def test_a_gap_repaired_past_the_horizon_says_its_candles_were_not_mended() -> None:
    """Its trades reach ``ticks``, but trades older than the dedup horizon change no candle:
    the gap said REPAIRED and nothing more, while its candles stayed wrong for good."""
    sim = SimExchange(symbols={"BTC/USDT": 30_000.0}, rate=5.0)
    now = time.time_ns()
    happened = sim.refetch(T, now - 200 * S, now - 150 * S)
    gap = new_gap(T, market_pb2.TRADE_ID_JUMP, tail_of(happened[0]), tail_of(happened[-1]), "ing-a")
    with ThreadPoolExecutor(1) as pool:
        old = GapRepairer(Sink(), pool, horizon_s=100).repair(sim, gap, None)  # type: ignore[arg-type]
        fresh = GapRepairer(Sink(), pool, horizon_s=600).repair(sim, gap, None)  # type: ignore[arg-type]
    assert old.status == fresh.status == market_pb2.GAP_REPAIRED
    assert "change no candle" in old.reason and fresh.reason == ""


def test_an_ingestor_that_restarted_repairs_its_own_downtime(broker_settings) -> None:
    """With no peer to hear its streams' tails, an ingestor that restarted (the local stack
    runs one) began its streams afresh: the trades of its downtime were lost with no gap.
    Its streams of the first minute now resume from each ticker's last trade in Kafka."""
    from ingest.sink import KafkaSink

    ticker = f"SIM{uuid.uuid4().hex[:4].upper()}:BTC/USDT"
    sim = SimExchange(name=ticker.partition(":")[0], symbols={"BTC/USDT": 30_000.0}, rate=5.0)
    now = time.time_ns()
    delivered = sim.refetch(ticker, now - 200 * S, now - 100 * S)  # by the run before
    sink = KafkaSink(broker_settings)
    for t in delivered:
        sink.send(TICKS.name, ticker, t)
    sink.flush(30)
    ingest = broker_settings.ingest.model_copy(update={"resume_within_s": 60.0})
    settings = broker_settings.model_copy(update={"ingest": ingest})
    ingestor = Ingestor(
        settings,
        [sim],
        warmup_beats=0,
        metrics=False,
        always_on=[ticker],
        on_demand=False,
    ).start()
    try:

        def repaired() -> market_pb2.Gap | None:
            gaps = [g for g in read_gaps(settings).listed() if g.ticker == ticker]
            return gaps[0] if gaps and gaps[0].status != market_pb2.GAP_OPEN else None

        gap = wait_for(repaired, timeout=60)
    finally:
        ingestor.stop(flush_s=10)
    assert (gap.cause, gap.status, gap.from_trade_id) == (
        market_pb2.TAKEOVER,
        market_pb2.GAP_REPAIRED,
        delivered[-1].trade_id,
    )
    ids = {
        int(t.trade_id)
        for t in read_topic_to_end(settings, TICKS.name)
        if isinstance(t, market_pb2.Tick) and t.ticker == ticker
    }
    assert ids == set(range(min(ids), max(ids) + 1)), "a trade of the downtime is missing"
    assert int(gap.to_trade_id) - int(delivered[-1].trade_id) > 300  # 100 s at 5 a second


def test_the_last_delivered_trade_is_found_behind_any_number_of_other_tickers_records(
    broker_settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Peers stream on while an ingestor restarts: more than the first window's records of
    other tickers on the partition after its ticker's last trade. The resume still finds
    that trade; and none when nothing was written since the dedup horizon's start. (A first
    window of 40 records here: the session's ticks topic is every test's, read whole by
    some.)"""
    from ingest import gaps
    from ingest.sink import KafkaSink

    monkeypatch.setattr(gaps, "LOOKUP_RECORDS", 40)

    ticker = f"SIM{uuid.uuid4().hex[:4].upper()}:BTC/USDT"
    part = key_partition(TICKS, ticker.encode())
    other = next(
        t
        for t in (f"SIM{uuid.uuid4().hex[:4].upper()}:ETH/USDT" for _ in range(1000))
        if key_partition(TICKS, t.encode()) == part
    )
    sim = SimExchange(name=ticker.partition(":")[0], symbols={"BTC/USDT": 30_000.0}, rate=5.0)
    now = time.time_ns()
    mine = sim.refetch(ticker, now - 60 * S, now - 50 * S)
    sink = KafkaSink(broker_settings)
    for t in mine:
        sink.send(TICKS.name, ticker, t)
    after = market_pb2.Tick(ticker=other, price="1", size="1", exchange_time_ns=now)
    for i in range(gaps.LOOKUP_RECORDS * 5):
        after.trade_id = str(i)
        sink.send(TICKS.name, other, after)
    sink.flush(60)
    latest = max(mine, key=lambda t: t.exchange_time_ns)
    found = last_delivered(broker_settings, ticker, timeout_s=30, since_ns=now - 600 * S)
    assert found is not None and found.trade_id == latest.trade_id
    assert last_delivered(broker_settings, ticker, since_ns=time.time_ns() + 60 * S) is None


def test_the_sweep_leaves_a_gap_to_its_live_recorder_and_to_its_repair_under_way(
    settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A gap still being repaired, here or by its recorder alive elsewhere, is not repaired
    again (a second repair's resends past the horizon would be stored twice); one whose
    range began before the dedup horizon is given up, said so, not repaired."""
    sim = SimExchange(symbols={"BTC/USDT": 30_000.0}, rate=5.0)
    ingestor = Ingestor(settings, [sim], warmup_beats=0, metrics=False)
    submitted: list[str] = []

    def submit(_f, _e, gap, _r) -> Future:
        submitted.append(gap.gap_id)
        return Future()

    monkeypatch.setattr(ingestor._pool, "submit", submit)
    ingestor._repairer.sink = sink = Sink()
    now_ns, now = time.time_ns(), time.monotonic()
    heard(ingestor.views["SIM"], "ing-live", now)

    def gap(name: str, recorder: str, age_s: float = 60) -> market_pb2.Gap:
        before = rq.StreamTail(ticker=T, trade_id=f"{name}1", time_ns=now_ns - int(age_s * S))
        after = rq.StreamTail(ticker=T, trade_id=f"{name}9", time_ns=now_ns - 10 * S)
        made = new_gap(T, market_pb2.TRADE_ID_JUMP, before, after, recorder)
        made.detected_ms = int(time.time() * 1000) - 300_000
        return made

    alive, busy, dead, old = (
        gap("a", "ing-live", age_s=70),
        gap("b", ingestor.id, age_s=80),
        next(  # one this ingestor owns among the live (the other is ing-live)
            g
            for g in (gap(f"c{i}", "ing-gone", age_s=100 + i) for i in range(40))
            if ingestor.views["SIM"].owner(g.gap_id, now, True) == ingestor.id
        ),
        next(
            g
            for g in (gap(f"d{i}", "ing-gone", age_s=900 + i) for i in range(40))
            if ingestor.views["SIM"].owner(g.gap_id, now, True) == ingestor.id
        ),
    )
    ingestor._repairer._repairing.add(busy.gap_id)
    try:
        assert ingestor.resweep([alive, busy, dead, old], now) == [dead.gap_id]
        assert submitted == [dead.gap_id]
        (given_up,) = sink.gaps()
        assert given_up.gap_id == old.gap_id and given_up.status == market_pb2.GAP_UNREPAIRABLE
        assert "dedup horizon" in given_up.reason
    finally:
        ingestor.stop(flush_s=0)
