"""The streaming job as a real process: Kafka in, Iceberg and ZMQ out, and a kill -9."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import threading
import time
import uuid
from collections.abc import Iterator
from decimal import Decimal
from itertools import pairwise
from pathlib import Path

import pandas as pd
import pyarrow.parquet as pq
import pytest
import sqlalchemy as sa
import zmq
from confluent_kafka import Producer

from bench.oracle import expected_candles as oracle_candles
from candlewire import Client
from candlewire.book import Book, BookSync, Verdict
from candlewire.config import PERIODS_S
from candlewire.kafka import BOOKS, TICKS, producer_config
from candlewire.lake import NAMESPACE, catalog
from candlewire.market import Tick
from candlewire.topics import (
    ingestor_topic,
    market_data_topic,
    metadata_update_topic,
    ohlc_type,
    work_prefix,
)
from ingest.exchanges.base import Page
from ingest.exchanges.sim import SimExchange
from proto import book_pb2, market_pb2
from proto import requests_pb2 as rq
from proto.envelope import decode_sub, to_record
from streaming.decode import ohlc_rows
from streaming.progress import Progress
from tests.support import (
    IDLE_TIMEOUT_S,
    RELAYS,
    RUNNING,
    FakeIngestor,
    fast_books,
    faulty_books,
    read_topic_to_end,
    relay_call,
    start_job,
    stream_metric,
    wait_for,
)

DAY = 86_400_000
S = 1_000_000_000  # ns per second
FIVE_MINUTES_NS = 300 * S
T0 = 1_700_006_400_000


def produce_ticks(settings, ticks: list[market_pb2.Tick]) -> None:
    producer = Producer(producer_config(settings))
    for t in ticks:
        producer.produce(TICKS.name, key=t.ticker.encode(), value=to_record(t))
    assert producer.flush(30) == 0


def make_ticks(ticker: str, start_ms: int, n: int, seed: int) -> list[market_pb2.Tick]:
    """Ticks every ~7 s across hour and day boundaries, in order but for neighbours less than
    the lateness allowance apart swapped now and then, and one exactly on an hour boundary
    (a window includes its start)."""
    rng = random.Random(seed)
    times = [start_ms + i * 7_000 + rng.randint(0, 6_000) for i in range(n)]
    for i in range(1, n):
        if times[i] // 3_600_000 > times[i - 1] // 3_600_000:
            times[i] -= times[i] % 3_600_000  # exactly on the first hour boundary
            break
    for i in range(20, n - 1, 15):  # swap neighbours: out of order within the allowance
        if times[i + 1] - times[i] < 8_000:
            times[i], times[i + 1] = times[i + 1], times[i]
    return [
        market_pb2.Tick(
            ticker=ticker,
            trade_id=str(i),
            price=f"{100 + rng.randint(-500, 500) / 100:.2f}",
            size=f"{rng.randint(1, 5000) / 1000:.3f}",
            side=market_pb2.BUY,
            exchange_time_ns=t * 1_000_000,
        )
        for i, t in enumerate(times)
    ]


def with_resends(
    ticks: list[market_pb2.Tick], seed: int, earlier: list[market_pb2.Tick] = ()
) -> list[market_pb2.Tick]:
    """The ticks with about one in twenty sent again right after it, a copy of one of the 30
    trades before (possibly from ``earlier``, already sent): well within the dedup horizon."""
    rng = random.Random(seed)
    history, out = list(earlier[-30:]), []
    for t in ticks:
        out.append(t)
        history = [*history[-29:], t]
        if rng.random() < 0.05:
            out.append(rng.choice(history))
    return out


def expected_candles(ticks: list[market_pb2.Tick], period_s: int) -> pd.DataFrame:
    """The benches' pandas reference (:func:`bench.oracle.expected_candles`) over ``ticks``."""
    return oracle_candles([(t.exchange_time_ns, t.price, t.size) for t in ticks], period_s)


def test_candles_equal_pandas_resample_for_every_period(pipeline) -> None:
    ticker = f"TEST:C{uuid.uuid4().hex[:6].upper()}/USDT"
    start = (int(time.time() * 1000) // DAY) * DAY - 2 * 3_600_000 - 600_000  # crosses hours
    ticks = make_ticks(ticker, start, 1200, seed=1)  # ~2.3 hours
    produce_ticks(pipeline, ticks)
    ohlc = catalog(pipeline).load_table(f"{NAMESPACE}.ohlc")

    def rows() -> pd.DataFrame:
        ohlc.refresh()
        return ohlc.scan(row_filter=f"ticker = '{ticker}'").to_pandas()

    def complete() -> bool:
        got = rows()
        return all(
            (got["period_s"] == p).sum() == len(expected_candles(ticks, p))
            and got[got["period_s"] == p]["trade_count"].sum() == len(ticks)
            for p in PERIODS_S
        )

    wait_for(complete, timeout=120, interval=1.0)
    for period in PERIODS_S:
        assert_candles(ohlc, ticker, ticks, period)
    # The job's Spark writes every file in the tables' codec, not Iceberg's gzip fallback.
    ticks_table = catalog(pipeline).load_table(f"{NAMESPACE}.ticks")
    for table in (ticks_table, ohlc):
        assert codecs(table, f"ticker = '{ticker}'") == {"ZSTD"}, table.name()


def codecs(table, row_filter: str) -> set[str]:
    """The compression of every column chunk in the data files a scan would read."""
    out = set()
    for task in table.scan(row_filter=row_filter).plan_files():
        with table.io.new_input(task.file.file_path).open() as f:
            meta = pq.ParquetFile(f).metadata
        for g in range(meta.num_row_groups):
            out |= {meta.row_group(g).column(c).compression for c in range(meta.num_columns)}
    return out


def test_a_late_trade_revises_its_closed_candles_and_one_beyond_the_horizon_changes_none(
    pipeline,
) -> None:
    """Late is relative to the tick's own feed: this feed's trades, 25 minutes behind another
    feed's, all count. A trade two minutes behind its own clock (as a trade fetched again
    after a gap is, #37) is stored, counted, and revises its closed candles: ``ohlc`` and the
    last live update of every window equal pandas over every trade, and its closed 1-minute
    candle comes again with revision 1. One beyond the dedup horizon is stored and counted,
    and changes no candle."""
    ticker, ahead = (f"TEST:{f}{uuid.uuid4().hex[:6].upper()}/USDT" for f in "LM")
    now = int(time.time() * 1000)
    ohlc = catalog(pipeline).load_table(f"{NAMESPACE}.ohlc")
    produce_ticks(pipeline, make_ticks(ahead, now - 5 * 60_000, 20, seed=1))
    wait_for(lambda: trades_in(ohlc, ahead, 60) == 20, timeout=90, interval=0.5)
    live = LiveUpdates(pipeline, [ticker])
    try:
        ticks = make_ticks(ticker, now - 30 * 60_000, 200, seed=2)
        produce_ticks(pipeline, ticks)
        wait_for(lambda: trades_in(ohlc, ticker, 60) == 200, timeout=90, interval=0.5)
        before = stream_metric(pipeline, "candlewire_stream_late_ticks_total")
        clock = max(t.exchange_time_ns for t in ticks)
        horizon_ns = int(pipeline.stream_dedup_horizon_s * S)
        late, too_late = (
            market_pb2.Tick(
                ticker=ticker, trade_id=i, price=p, size="9", exchange_time_ns=clock - behind
            )
            for i, p, behind in (("late", "999", 120 * S), ("too-late", "1", horizon_ns + 60 * S))
        )
        produce_ticks(pipeline, [late, too_late])
        table = catalog(pipeline).load_table(f"{NAMESPACE}.ticks")

        def stored() -> list[str]:
            table.refresh()
            return table.scan(row_filter=f"ticker = '{ticker}'").to_arrow()["trade_id"].to_pylist()

        wait_for(lambda: {"late", "too-late"} <= set(stored()), timeout=60, interval=0.5)
        wait_for(lambda: trades_in(ohlc, ticker, 60) == 201, timeout=60, interval=0.5)
        wait_for(
            lambda: stream_metric(pipeline, "candlewire_stream_late_ticks_total") >= before + 2,
            timeout=30,
        )
        assert len(stored()) == 202
        wants = {p: assert_candles(ohlc, ticker, [*ticks, late], p) for p in PERIODS_S}
        wait_live(live, ticker, wants)  # the live revision is on its way too
        minute = late.exchange_time_ns // 60_000_000_000 * 60_000
        revised = live.last(ticker, 60)[minute]
        assert revised.closed and revised.revision == 1 and revised.high == "999"
        ohlc.refresh()
        row = ohlc.scan(row_filter=f"ticker = '{ticker}' and period_s = 60").to_pandas()
        row = row[row["open_time"] == pd.Timestamp(minute, unit="ms", tz="UTC")]
        assert row["revision"].tolist() == [1] and row["closed"].tolist() == [True]
    finally:
        live.close()


# The window SIM loses in the gap tests; ``make gaps-long`` runs them with 3 minutes.
GAP_S = float(os.environ.get("CANDLEWIRE_TEST_GAP_S", "20"))


def test_lost_windows_are_found_fetched_again_and_corrected_into_every_candle(pipeline) -> None:
    """#37 end to end, three venues side by side. One numbers its trades and drops a window
    of its live stream: the ingestor finds the trade-id jump. The other does not number them
    and drops the connection for as long: only the reconnect gives it away, and the ingestor
    fetches the window around it again. Both ranges are fetched again over SIM's REST and
    produced; the trades more than the allowance behind revise their closed candles. Then,
    for every period, ``ohlc`` and the last live update of each window equal a pandas
    resample of every trade SIM made over the span, the lost ones included, and no trade is
    stored twice. The third drops a window too, but its REST serves nothing: the gap stays
    recorded as unrepairable with its reason, and its candles are pandas over the trades
    it streamed, exactly: nothing changed them."""
    from ingest.service import Ingestor

    tag = uuid.uuid4().hex[:4].upper()
    venues = {
        market_pb2.TRADE_ID_JUMP: SimExchange(
            name=f"GAP{tag}", symbols={"BTC/USDT": 30_000.0}, rate=20, faults=f"drop:{GAP_S}s@2s"
        ),
        market_pb2.RECONNECT: SimExchange(
            name=f"OPQ{tag}",
            symbols={"BTC/USDT": 30_000.0},
            rate=20,
            faults=f"ids:opaque,disconnect:{GAP_S}s@2s",
        ),
    }
    closed = SimExchange(
        name=f"UNR{tag}",
        symbols={"BTC/USDT": 30_000.0},
        rate=20,
        faults=f"drop:{GAP_S}s@2s,rest:off",
    )
    tickers = {cause: f"{sim.name}:BTC/USDT" for cause, sim in venues.items()}
    unrepaired = f"{closed.name}:BTC/USDT"
    live = LiveUpdates(pipeline, [*tickers.values(), unrepaired])
    try:
        ingestor = Ingestor(
            pipeline,
            [*venues.values(), closed],
            always_on=[*tickers.values(), unrepaired],
            heartbeat_s=0.2,
            warmup_beats=2,
            metrics=False,
        ).start()
        try:
            gaps = {
                cause: wait_for(lambda t=t: ended_gap(pipeline, t), timeout=GAP_S + 60)
                for cause, t in tickers.items()
            }
            gap = wait_for(lambda: ended_gap(pipeline, unrepaired), timeout=GAP_S + 60)
            time.sleep(1.0)  # trades after the repair too
        finally:
            ingestor.stop()
        for cause, repaired in gaps.items():
            assert repaired.cause == cause and repaired.status == market_pb2.GAP_REPAIRED
            assert repaired.refetched > 10 * GAP_S
            made = assert_healed(pipeline, venues[cause], tickers[cause], live)
            lost = sum(repaired.from_ns < t.exchange_time_ns < repaired.to_ns for t in made)
            assert lost == repaired.refetched, "the lost trades, fetched again once"
        assert gap.status == market_pb2.GAP_UNREPAIRABLE and gap.refetched == 0
        assert gap.cause == market_pb2.TRADE_ID_JUMP and "would not serve" in gap.reason
        streamed = assert_healed(pipeline, closed, unrepaired, live, lost=gap)
        assert len(closed.trades_between(unrepaired, gap.from_ns, gap.to_ns)) > 10 * GAP_S
        assert not any(gap.from_ns < t.exchange_time_ns < gap.to_ns for t in streamed)
    finally:
        live.close()


def test_a_takeover_after_kill_9_fetches_what_the_dead_ingestor_missed(pipeline, ctx) -> None:
    """#37: two ingestor processes hold the same always-on ticker, and one streams it. After
    kill -9 of that one its peer takes over three heartbeats later; it knows from the dead
    one's last heartbeat where the stream stopped, and fetches the range again. The candles
    then equal pandas over every trade SIM made, and no trade is stored twice (what the dead
    one sent after its last heartbeat comes again, and is dropped as a resend)."""
    from tests.ingest.test_service import subprocess_ingestor

    exchange = f"TKO{uuid.uuid4().hex[:4].upper()}"
    ticker = f"{exchange}:BTC/USDT"
    beats = ctx.socket(zmq.SUB)
    beats.subscribe(ingestor_topic(exchange))
    beats.connect(pipeline.connect("market_data"))

    def streaming() -> str | None:
        """The one ingestor whose latest heartbeat lists the stream (while both still
        start, each may, until the lower-ranked one yields)."""
        latest: dict[str, bool] = {}
        deadline = time.monotonic() + 2.5  # at least two heartbeats of each
        while time.monotonic() < deadline:
            if beats.poll(100):
                _, hb = decode_sub(beats.recv_multipart())
                latest[hb.ingestor_id] = f"stream:{ticker}" in hb.working
        owners = [i for i, listed in latest.items() if listed]
        return owners[0] if len(latest) == 2 and len(owners) == 1 else None

    live = LiveUpdates(pipeline, [ticker])
    spec, ids = f"{exchange}=sim", ("ing-tko-a", "ing-tko-b")
    procs = {i: subprocess_ingestor(pipeline, i, spec, stream=[ticker]) for i in ids}
    try:
        wait_for(streaming, timeout=60)
        time.sleep(2.0)  # trades flowing
        owner = wait_for(streaming, timeout=30)
        procs[owner].send_signal(signal.SIGKILL)
        procs[owner].wait()
        gap = wait_for(lambda: ended_gap(pipeline, ticker), timeout=60, interval=0.5)
        time.sleep(1.0)  # trades after the repair too
        for p in procs.values():
            p.terminate()
            p.wait(30)
        assert gap.status == market_pb2.GAP_REPAIRED
        assert gap.cause == market_pb2.TAKEOVER and gap.ingestor_id != owner
        made = assert_healed(pipeline, SimExchange(name=exchange), ticker, live)
        assert any(gap.from_ns < t.exchange_time_ns < gap.to_ns for t in made)
    finally:
        for p in procs.values():
            p.kill()
            p.wait()
        live.close()
        beats.close(0)


def ended_gap(settings, ticker: str) -> market_pb2.Gap | None:
    """The ticker's gap, once its ingestor recorded it repaired or unrepairable."""
    from candlewire.gaps import read_gaps

    gaps = read_gaps(settings).listed()
    ended = (market_pb2.GAP_REPAIRED, market_pb2.GAP_UNREPAIRABLE)
    return next((g for g in gaps if g.ticker == ticker and g.status in ended), None)


def assert_healed(
    settings, sim: SimExchange, ticker: str, live: LiveUpdates, lost: market_pb2.Gap | None = None
) -> list[market_pb2.Tick]:
    """Once every trade published live is committed: each trade SIM made over the span
    (but those inside an unrepaired gap, ``lost``) is stored once, and for every period
    ``ohlc`` and the last live update of each window equal pandas over them all. Returns
    those trades."""
    ticks = catalog(settings).load_table(f"{NAMESPACE}.ticks")
    ohlc = catalog(settings).load_table(f"{NAMESPACE}.ohlc")

    def stored() -> pd.DataFrame:
        ticks.refresh()
        return ticks.scan(
            row_filter=f"ticker = '{ticker}'", selected_fields=("trade_id", "exchange_time_ns")
        ).to_pandas()

    def committed() -> bool:
        ids = set(stored()["trade_id"])
        return set(live.trades[ticker]) <= ids and trades_in(ohlc, ticker, 60) == len(ids)

    wait_for(committed, timeout=90, interval=1.0)
    got = stored()
    first, last = int(got["exchange_time_ns"].min()), int(got["exchange_time_ns"].max())
    made = sim.trades_between(ticker, first, last)
    if lost is not None:
        made = [t for t in made if not lost.from_ns < t.exchange_time_ns < lost.to_ns]
    assert sorted(got["trade_id"]) == sorted(t.trade_id for t in made), "each trade once"
    wants = {p: assert_candles(ohlc, ticker, made, p) for p in PERIODS_S}
    wait_live(live, ticker, wants)  # the last live updates are on their way too
    return made


def test_history_end_to_end_through_the_relay(pipeline) -> None:
    with Client(pipeline) as client:
        note = client.request_history("SIM:BTC/USDT", 300, T0, T0 + DAY, timeout=120)
        table = client.history("SIM:BTC/USDT", 300, T0, T0 + DAY)
        again = client.request_history("SIM:BTC/USDT", 300, T0, T0 + DAY, timeout=120, read=True)
    assert note.status == rq.HISTORY_OK and note.row_count == 288 and note.snapshot_id != 0
    want = SimExchange().ohlc_page("SIM:BTC/USDT", 300, Page(0, T0, T0 + DAY))
    assert [str(v.normalize()) for v in table["close"].to_pylist()] == [
        str(Decimal(c.close).normalize()) for c in want
    ]
    assert again.num_rows == 288, "asking twice leaves one copy"


def test_history_error_reaches_the_client(pipeline) -> None:
    from candlewire import HistoryFailed

    with Client(pipeline) as client, pytest.raises(HistoryFailed, match="does not list"):
        client.request_history("SIM:NOPE/USDT", 60, T0, T0 + DAY, timeout=120)


def test_metadata_refresh_publishes_metadata_update(pipeline, ctx) -> None:
    sub = ctx.socket(zmq.SUB)
    sub.subscribe(metadata_update_topic().encode())
    sub.connect(pipeline.connect("market_data"))
    time.sleep(0.5)
    resp = relay_call(
        pipeline,
        rq.DataRequest(
            request_id=f"meta-{uuid.uuid4().hex[:8]}", kind=rq.SYMBOL_METADATA, exchange="SIM"
        ),
    )
    assert resp.status == rq.SUBMIT_OK
    assert sub.poll(90_000), "no METADATA_UPDATE"
    topic, note = decode_sub(sub.recv_multipart())
    sub.close()
    assert topic == "METADATA_UPDATE" and note.exchange == "SIM" and note.symbol_count == 3
    table = (
        catalog(pipeline)
        .load_table(f"{NAMESPACE}.symbol_metadata")
        .scan(row_filter="exchange = 'SIM'")
        .to_arrow()
    )
    assert sorted(table["ticker"].to_pylist()) == ["SIM:BTC/USDT", "SIM:ETH/USDT", "SIM:SOL/USDT"]


def test_live_candle_reaches_a_subscriber_through_the_relay(pipeline) -> None:
    ticker = f"TEST:V{uuid.uuid4().hex[:6].upper()}/USDT"
    stop = threading.Event()

    def trade_until_seen() -> None:
        # The subscription reaches the job through the relay in its own time (on a loaded
        # machine, after any fixed pause), and a subscriber without ``since`` is owed only
        # what comes after: a trade every half second until one of its candles gets through.
        for i in range(240):
            now_ns = time.time_ns()
            tick = market_pb2.Tick(
                ticker=ticker, trade_id=str(i), price="100.00", size="1.000",
                side=market_pb2.BUY, exchange_time_ns=now_ns - now_ns % 1_000_000,
            )  # fmt: skip
            produce_ticks(pipeline, [tick])
            if stop.wait(0.5):
                return

    # The test plays the TEST exchange's ingestor (it produces to Kafka), so it serves TEST's
    # work queue: the relay would otherwise tell the subscriber no ingestor serves it.
    with Client(pipeline) as client, zmq.Context() as ctx:
        fake = FakeIngestor(ctx, pipeline, [work_prefix("TEST")])
        updates = client.subscribe(ticker, "ohlc:60", idle_timeout=60)
        trader = threading.Thread(target=trade_until_seen, daemon=True)
        trader.start()
        try:
            candle = next(updates)
        finally:
            stop.set()
            trader.join(30)
            fake.close()
    assert candle.ticker == ticker and candle.period_s == 60 and candle.trade_count >= 1


def test_first_subscriber_starts_a_cold_ticker_end_to_end(pipeline) -> None:
    """Nobody asked SIM:SOL/USDT to stream: subscribing is enough, and the first tick comes
    through ingest → Kafka → streaming → relay."""
    t0 = time.time()
    with Client(pipeline) as client:
        tick = next(client.subscribe("SIM:SOL/USDT", "tick", idle_timeout=120))
    assert tick.ticker == "SIM:SOL/USDT"
    assert tick.time_ns / 1e9 >= t0 - 5, "a live trade, not an old one"


def test_a_book_is_sims_live_whole_at_the_seam_and_rebuilt_from_iceberg(pipeline) -> None:
    """#38 end to end: SIM → ingestor → Kafka → the Spark job → relay. A subscriber's book
    equals SIM's own at every update it yields; a late joiner with ``since=`` reaches the
    same books; the book rebuilt from Iceberg as of an update equals the live one."""
    ticker = "SIM:ETH/USDT"
    sim = SimExchange()  # the pipeline ingestor's twin: the same seed, so the same book
    live: dict[int, tuple[list, list, int]] = {}
    with Client(pipeline) as client:
        sub = client.subscribe(ticker, "book", idle_timeout=120)
        for book in sub:
            assert book.same_levels(Book.from_snapshot(sim.book_at(ticker, book.seq))), book.seq
            live[book.seq] = (book.bids(), book.asks(), book.time_ns)
            if len(live) >= 6:
                break
        sub.close()
        first, last = min(live), max(live)
        late = client.subscribe(ticker, "book", since=live[first][2] // 1_000_000, depth=5)
        seen: dict[int, tuple[list, list]] = {}
        for book in late:
            seen[book.seq] = (book.bids(), book.asks())
            if book.seq >= last:
                break
        late.close()
        assert set(live) <= set(seen), "the late joiner missed updates"
        assert all(seen[s] == (live[s][0][:5], live[s][1][:5]) for s in live)

        at_ms = live[last][2] // 1_000_000

        def rebuilt() -> Book | None:
            try:
                book = client.history(ticker, "book", at=at_ms)
            except LookupError:
                return None
            return book if book.seq == last else None

        book = wait_for(rebuilt, timeout=90, interval=2.0)
    assert (book.bids(), book.asks()) == live[last][:2]


def test_a_book_is_sims_own_at_a_thousand_moments_live_and_late(pipeline) -> None:
    """#38 through the ingestor, Kafka, the Spark job and the relay: a live subscriber over
    1,200 updates, then a late joiner from its first book (replayed from the journal, then
    live, to the live one's last). Every book either is handed equals SIM's own book at that
    update, a thousand and more in all; the late joiner starts at the first live book and
    hands the same book wherever both were handed one.

    Fifty updates a second come in half-second micro-batches, so the live subscriber gets
    each batch's deltas together and its book once a batch; the replay hands one a delta.
    The books are held to SIM's once all are in: made one by one, SIM's book of each update
    cost more than the update interval."""
    sim, ticker = fast_books(), "BOOKS:ETH/USDT"
    live: dict[int, tuple[list, list, int]] = {}
    late: dict[int, tuple[list, list, int]] = {}

    def kept(book: Book) -> tuple[list, list, int]:
        return book.bids(), book.asks(), book.time_ns

    with Client(pipeline) as client:
        sub = client.subscribe(ticker, "book", idle_timeout=120)
        for book in sub:
            live[book.seq] = kept(book)
            if book.seq - min(live) >= 1200:
                break
        sub.close()
        since_ms = live[min(live)][2] // 1_000_000
        joiner = client.subscribe(ticker, "book", since=since_ms, idle_timeout=120)
        for book in joiner:
            late[book.seq] = kept(book)
            if book.seq >= max(live):
                break
        joiner.close()
    assert sub.stats.malformed == 0 and joiner.stats.malformed == 0
    truth = sims_books(sim, ticker, min(live), max(late))
    wrong = [s for s, (bids, asks, _) in [*live.items(), *late.items()] if truth[s] != (bids, asks)]
    assert not wrong, f"books that are not SIM's: {wrong[:5]}"
    assert len(live) + len(late) >= 1000, (len(live), len(late))
    assert all(t >= since_ms * 1_000_000 for _, _, t in late.values()), "handed out before since"
    # From since on (the first live book's millisecond): none of the updates missed there.
    assert min(late) <= min(live), f"the late joiner began at {min(late)}, after {min(live)}"
    assert all(late[s] == live[s] for s in live.keys() & late.keys())


def test_a_checksum_mismatch_and_a_jump_are_resnapshotted_and_the_book_stays_sims(
    pipeline,
) -> None:
    """#38's bad input end to end: the live pipeline's FAULTY venue sends, 2 s into its book
    stream, an update that loses a level change under its true checksum, skips one at 6 s,
    and sends one with a price that is no number at 10 s (``tests.support.faulty_books``).
    The ingestor writes none of them: what Kafka holds for the ticker, applied in order, is
    SIM's own book at every update, and a fresh snapshot follows each fault with its reason
    (the malformed one is dropped, so the next update's gap asks for it), in Kafka and in
    ``book_snapshots``. A subscriber's
    book equals SIM's at every update it is handed, and it is handed one again within
    seconds of each fault: the stream healed rather than stopped."""
    sim, ticker = faulty_books(), "FAULTY:ETH/USDT"
    got: dict[int, tuple[list, list, int]] = {}
    with Client(pipeline) as client:
        sub = client.subscribe(ticker, "book", idle_timeout=120)
        for book in sub:
            got[book.seq] = (book.bids(), book.asks(), book.time_ns)
            if book.time_ns - got[min(got)][2] >= 13 * S:
                break
        sub.close()
    truth = sims_books(sim, ticker, min(got), max(got))
    wrong = [s for s, (bids, asks, _) in got.items() if truth[s] != (bids, asks)]
    assert not wrong, f"books that were not SIM's: {wrong[:5]}"
    times = sorted(t for _, _, t in got.values())
    assert max(b - a for a, b in pairwise(times)) < 5 * S, "no book for seconds"

    records = [
        r for r in read_topic_to_end(pipeline, BOOKS.name) if getattr(r, "ticker", None) == ticker
    ]
    sync, reasons = BookSync(ticker), []
    for r in records:  # one partition per ticker: in the order written
        if isinstance(r, book_pb2.BookSnapshot):
            reasons.append(book_pb2.SnapshotReason.Name(r.reason))
            sync.on_snapshot(r)
        else:
            assert sync.on_delta(r) is Verdict.APPLIED, r.venue_seq
        if r.venue_seq in truth:
            assert (sync.book.bids(), sync.book.asks()) == truth[r.venue_seq], r.venue_seq
    assert reasons[:4] == [
        "SNAPSHOT_START",
        "SNAPSHOT_CHECKSUM",
        "SNAPSHOT_SEQUENCE",
        "SNAPSHOT_SEQUENCE",
    ]
    snapshots = catalog(pipeline).load_table(f"{NAMESPACE}.book_snapshots")

    def stored() -> list[str]:
        snapshots.refresh()
        rows = snapshots.scan(row_filter=f"ticker = '{ticker}'").to_arrow().sort_by("venue_seq")
        return rows["reason"].to_pylist()

    wait_for(lambda: stored() == reasons, timeout=60, interval=1.0)


def test_every_feed_gets_its_own_candles_once_per_trade(pipeline) -> None:
    """Three feeds arrive together: A live, B five minutes behind, C goes quiet. Every feed
    resends recent trades. Each feed's candles in every period equal pandas over its own
    distinct trades, in ``ohlc`` and in the last live update of each window; each trade is
    published live once; C's last candle closes after the idle timeout."""
    tag = uuid.uuid4().hex[:5].upper()
    a, b, c = (f"TEST:{f}{tag}/USDT" for f in "ABC")
    now = int(time.time() * 1000)
    c_end = (now // 60_000 + 1) * 60_000 - 1_000  # C's last trade: a second before a minute
    feeds = {
        a: make_ticks(a, now - 20 * 60_000, 160, seed=21),
        b: make_ticks(b, now - 25 * 60_000, 160, seed=22),
        c: make_ticks(c, c_end - 10 * 60_000, 80, seed=23),
    }
    feeds[c] = [t for t in feeds[c] if t.exchange_time_ns < c_end * 1_000_000]
    feeds[c].append(
        market_pb2.Tick(
            ticker=c, trade_id="last", price="100", size="1", exchange_time_ns=c_end * 10**6
        )
    )
    lag = {a: 0, b: 300 * S, c: 0}
    arriving = sorted(
        (t for ticker, ticks in feeds.items() for t in with_resends(ticks, seed=len(ticks))),
        key=lambda t: t.exchange_time_ns + lag[t.ticker],
    )
    live = LiveUpdates(pipeline, [a, b, c])
    ohlc = catalog(pipeline).load_table(f"{NAMESPACE}.ohlc")
    try:
        produce_ticks(pipeline, arriving)

        def complete() -> bool:
            return all(
                trades_in(ohlc, ticker, p) == len(ticks)
                for ticker, ticks in feeds.items()
                for p in PERIODS_S
            )

        wait_for(complete, timeout=120, interval=1.0)
        last_minute = c_end // 60_000 * 60_000

        def c_closed() -> bool:
            ohlc.refresh()
            rows = ohlc.scan(row_filter=f"ticker = '{c}' and period_s = 60").to_arrow().to_pylist()
            return any(
                int(r["open_time"].timestamp() * 1000) == last_minute and r["closed"] for r in rows
            )

        wait_for(c_closed, timeout=IDLE_TIMEOUT_S + 60, interval=1.0)
        for ticker, ticks in feeds.items():  # the live update that closed it is on its way too
            wait_live(live, ticker, {p: assert_candles(ohlc, ticker, ticks, p) for p in PERIODS_S})
            assert sorted(live.trades[ticker]) == sorted(t.trade_id for t in ticks), ticker
        assert live.last(c, 60)[last_minute].closed
    finally:
        live.close()


def test_exactly_once_under_kill_9(pipeline) -> None:
    """kill -9 while batches are in flight; after a restart the tables hold each row once,
    and the live candles a subscriber sees through the relay end on the same values. A book
    subscriber across it (#38) gets SIM's own book each time; ``book_deltas`` holds each of
    its deltas once, and books rebuilt from Iceberg on either side equal the live ones."""
    ticker = f"TEST:K{uuid.uuid4().hex[:6].upper()}/USDT"
    start = int(time.time() * 1000) - 3_600_000
    ticks = make_ticks(ticker, start, 3000, seed=4)
    live = LiveUpdates(pipeline, [ticker])
    watcher = TickWatcher(pipeline, ticker, 3000)
    books = BookWatcher(pipeline, BOOKED)
    # The module's job keeps running: stop it so this test owns the checkpoints.
    job = next(p for p in _jobs(pipeline))
    ohlc = catalog(pipeline).load_table(f"{NAMESPACE}.ohlc")
    table = catalog(pipeline).load_table(f"{NAMESPACE}.ticks")

    def ticks_in_table() -> int:
        table.refresh()
        return len(table.scan(row_filter=f"ticker = '{ticker}'").to_arrow())

    # The first 1,000 ticks' candles committed, so the restart has forming candles to restore
    # (a tick append alone is not enough: the kill could then land before the candle commit);
    # then a kill while the next batches are in flight. Every phase resends recent trades
    # (the same trade_id), as an exchange does after a reconnect: they change nothing.
    produce_ticks(pipeline, with_resends(ticks[:1000], seed=7))
    wait_for(lambda: trades_in(ohlc, ticker, 60) == 1000, timeout=90, interval=0.5)
    produce_ticks(pipeline, with_resends(ticks[1000:2000], seed=8, earlier=ticks[:1000]))
    time.sleep(1.5)
    jvm = _children(job)
    os.kill(job, signal.SIGKILL)
    # The job's Spark JVM exits once its driver is gone, and until then its real-time live
    # path may still publish: the last third arrives only when nothing of the old job is
    # left, so only the restarted job can deliver it (a second epoch).
    wait_for(lambda: not any(os.path.exists(f"/proc/{pid}") for pid in jvm), timeout=60)
    produce_ticks(pipeline, with_resends(ticks[2000:], seed=9, earlier=ticks[:2000]))
    booked_before = max(books.got, default=0)
    restarted = start_job(pipeline)
    try:
        wait_for(lambda: ticks_in_table() >= 3000, timeout=180, interval=1.0)
        time.sleep(5.0)  # any replayed batch would have landed by now
        table.refresh()
        ids = table.scan(row_filter=f"ticker = '{ticker}'").to_arrow()["trade_id"].to_pylist()
        assert len(ids) == 3000 and len(set(ids)) == 3000, "ticks duplicated or lost"

        def candles_done() -> bool:
            ohlc.refresh()
            got = ohlc.scan(row_filter=f"ticker = '{ticker}'").to_pandas()
            return all(
                int(got[got["period_s"] == p]["trade_count"].sum()) == 3000 for p in PERIODS_S
            )

        wait_for(candles_done, timeout=120, interval=1.0)
        for period in PERIODS_S:
            assert_candles(ohlc, ticker, ticks, period)
        want = expected_candles(ticks, 3600)
        hours = {int(t.timestamp() * 1000): int(n) for t, n in want["trade_count"].items()}
        wait_for(lambda: counts(live.last(ticker, 3600)) == hours, timeout=60, interval=0.5)
        over = {t: n for t, n in live.most(ticker, 3600).items() if n > hours.get(t, 0)}
        assert not over, f"live candles counted ticks twice: {over} against {hours}"
        # A subscriber across the kill and the restart (a new epoch, which replays what the
        # commits had not covered) got every trade once, in Kafka order.
        watcher.join()
        assert [t.trade_id for t in watcher.got] == [t.trade_id for t in ticks]
        offsets = [t.stream.source_offset for t in watcher.got]
        assert offsets == sorted(set(offsets))
        assert len({t.stream.epoch for t in watcher.got}) == 2, watcher.stats
        wait_for(lambda: max(books.got, default=0) > booked_before + 3, timeout=120)
        books.stop()
        books.check_against_iceberg(pipeline, booked_before)
    finally:
        live.close()
        watcher.join()
        books.stop()
        # The restarted job is the module's from here on (its teardown stops it): a third
        # start would cost the run half a minute, and its first batch could meet SPARK-55271.
        if restarted.poll() is None:
            RUNNING.append(restarted)
        else:
            RUNNING.append(start_job(pipeline))


def test_the_catalog_s_connections_ended_by_postgresql_lose_nothing(pipeline) -> None:
    """PostgreSQL ends every connection to the catalog's database between two batches (a
    restart, an operator, ``idle_session_timeout``). The same job process commits on: each
    catalog retries on a new connection, no query restarts for it, and every trade is stored once
    with its candles equal to pandas."""
    ticker = f"TEST:C{uuid.uuid4().hex[:6].upper()}/USDT"
    ticks = make_ticks(ticker, int(time.time() * 1000) - 3_600_000, 600, seed=11)
    job = next(p for p in _jobs(pipeline))
    ohlc = catalog(pipeline).load_table(f"{NAMESPACE}.ohlc")
    log = pipeline.state_dir / "stream.log"
    logged = len(log.read_text().splitlines())

    produce_ticks(pipeline, ticks[:300])
    wait_for(
        lambda: all(trades_in(ohlc, ticker, p) == 300 for p in PERIODS_S), timeout=90, interval=0.5
    )
    engine = sa.create_engine(pipeline.sql_url(), poolclass=sa.pool.NullPool)
    with engine.begin() as db:
        ended = db.execute(
            sa.text(
                "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
                "WHERE datname = current_database() AND pid <> pg_backend_pid()"
            )
        ).scalar_one()
    assert ended >= 2, "the job's catalogs held no connection to end"
    produce_ticks(pipeline, with_resends(ticks[300:], seed=12, earlier=ticks[:300]))
    wait_for(
        lambda: all(trades_in(ohlc, ticker, p) == 600 for p in PERIODS_S), timeout=90, interval=0.5
    )
    for period in PERIODS_S:
        assert_candles(ohlc, ticker, ticks, period)
    table = catalog(pipeline).load_table(f"{NAMESPACE}.ticks")
    ids = table.scan(row_filter=f"ticker = '{ticker}'").to_arrow()["trade_id"].to_pylist()
    assert sorted(ids) == sorted(t.trade_id for t in ticks)
    assert job in _jobs(pipeline), "the job process did not survive"
    # Only the catalog's restarts count: the module's job may have been started again by the
    # test before, and its first batch then meets SPARK-55271 (a restart of its own).
    restarts = [line for line in _lines(log, logged) if "restarting" in line and "catalog" in line]
    assert not restarts, restarts


@pytest.mark.timeout(600)  # run alone, it waits five minutes for the live client
def test_a_late_joiner_from_five_minutes_back_reaches_the_books_of_a_client_live_throughout(
    pipeline, book_tape
) -> None:
    """#38's lossless seam at length: a subscriber with ``since`` five minutes back (the
    journal from the snapshot before it, then live) reaches the same book as the client that
    has been live on SIM's book since this module's first pipeline test, across the kill -9
    and the restarts in between, wherever both were handed one; every book either was
    handed is SIM's own, and the late joiner misses none of the live client's updates.

    ``since`` is ten seconds after one of the ingestor's snapshots (one every 30 s), so the
    joiner has to start from the snapshot before it: with the replay begun at ``since`` it
    would wait for the next one and miss twenty updates. The module's tests take more than
    five minutes; this one waits out whatever is left."""
    began_ns = min(t for _, _, t in book_tape.got.values())
    wait_for(lambda: time.time_ns() - began_ns >= FIVE_MINUTES_NS + 11 * S, timeout=340, interval=1)
    snapshots = catalog(pipeline).load_table(f"{NAMESPACE}.book_snapshots")
    back_ns = time.time_ns() - FIVE_MINUTES_NS
    rows = snapshots.scan(
        row_filter=f"ticker = '{BOOKED}' AND exchange_time_ns >= {began_ns - S}",
        selected_fields=("exchange_time_ns",),
    ).to_arrow()
    since_ms = (
        max(t for t in rows["exchange_time_ns"].to_pylist() if t + 10 * S <= back_ns) + 10 * S
    ) // 1_000_000
    until = max(book_tape.got)
    late: dict[int, tuple[list, list, int]] = {}
    with Client(pipeline) as client:
        joiner = client.subscribe(BOOKED, "book", since=since_ms, idle_timeout=120)
        for book in joiner:
            late[book.seq] = (book.bids(), book.asks(), book.time_ns)
            if book.seq >= until:
                break
        joiner.close()
    assert joiner.stats.malformed == 0
    live = {s: v for s, v in book_tape.got.items() if v[2] >= since_ms * 1_000_000 and s <= until}
    assert len(live) > 200, "the live client's books of those five minutes"
    assert not book_tape.wrong, f"live books that were not SIM's: {book_tape.wrong[:5]}"
    truth = sims_books(SimExchange(), BOOKED, min(late), max(late))
    wrong = [s for s, (bids, asks, _) in late.items() if truth[s] != (bids, asks)]
    assert not wrong, f"late books that were not SIM's: {wrong[:5]}"
    assert all(t >= since_ms * 1_000_000 for _, _, t in late.values()), "handed out before since"
    missed = sorted(live.keys() - late.keys())
    assert not missed, f"updates the live client was handed and the late joiner not: {missed[:5]}"
    assert all(late[s] == live[s] for s in live)


@pytest.mark.long
def test_restart_after_maintenance_expired_the_recorded_snapshot(pipeline) -> None:
    """The forming candles are restored from ``ohlc`` as of the last recorded commit. If
    snapshot expiry removed that snapshot while the job was down, the table as it is now
    holds the same live rows, and the candles still end exactly right.

    The restarted job runs its live query as micro-batches (the other engine), and its
    live candles end on the same values."""
    ticker = f"TEST:E{uuid.uuid4().hex[:6].upper()}/USDT"
    ticks = make_ticks(ticker, int(time.time() * 1000) - 3_600_000, 600, seed=5)
    ohlc = catalog(pipeline).load_table(f"{NAMESPACE}.ohlc")

    run_id = (Path(pipeline.checkpoints()) / "ticks.run-id").read_text().strip()
    progress = Progress(pipeline)

    def recorded() -> bool:
        """The last candle MERGE is recorded: killed now, the restart must restore."""
        last = progress.last_candles(run_id)
        ohlc.refresh()
        return last is not None and last.snapshot_id == ohlc.current_snapshot().snapshot_id

    produce_ticks(pipeline, ticks[:300])
    wait_for(
        lambda: all(trades_in(ohlc, ticker, p) == 300 for p in PERIODS_S), timeout=90, interval=0.5
    )
    wait_for(recorded, timeout=30, interval=0.5)
    job = next(p for p in _jobs(pipeline))
    os.kill(job, signal.SIGKILL)
    # Maintenance while the job is down: one more commit, then every older snapshot expired.
    ohlc.refresh()
    other = ohlc_rows(
        {
            "ticker": ["TEST:OTHER/USDT"],
            "period_s": [60],
            "open_time_ms": [T0],
            **{f: [Decimal(1)] for f in ("open", "high", "low", "close", "volume")},
            "trade_count": [1],
            "closed": [True],
        },
        "history",
    )
    ohlc.append(other)
    old = [s.snapshot_id for s in ohlc.snapshots() if s != ohlc.current_snapshot()]
    ohlc.maintenance.expire_snapshots().by_ids(old).commit()
    log = pipeline.state_dir / "stream.log"
    logged = len(log.read_text().splitlines())
    probe = f"TEST:P{uuid.uuid4().hex[:6].upper()}/USDT"
    live = LiveUpdates(pipeline, [ticker, probe])
    microbatch = pipeline.model_copy(update={"stream_live_engine": "microbatch"})
    RUNNING.append(start_job(microbatch))  # the module's job from here on
    try:
        # Live updates reach us once the relay has reconnected to the new job and passed
        # our subscription on: a probe feed shows when, then the rest of the ticks go.
        probes = iter(make_ticks(probe, int(time.time() * 1000) - 600_000, 500, seed=6))

        def heard() -> bool:
            produce_ticks(pipeline, [next(probes)])
            return bool(live.last(probe, 60))

        wait_for(heard, timeout=60, interval=0.5)
        produce_ticks(pipeline, ticks[300:])
        wait_for(
            lambda: all(trades_in(ohlc, ticker, p) == 600 for p in PERIODS_S),
            timeout=180,
            interval=1.0,
        )
        want = expected_candles(ticks, 3600)
        # The hours the restarted job updates (an hour that closed before the kill went out
        # before we listened): their last live update counts the trades from before the
        # kill too.
        touched = {t.exchange_time_ns // 3_600_000_000_000 * 3_600_000 for t in ticks[300:]}
        hours = {
            ms: int(n)
            for t, n in want["trade_count"].items()
            if (ms := int(t.timestamp() * 1000)) in touched
        }
        wait_for(lambda: counts(live.last(ticker, 3600)) == hours, timeout=60, interval=0.5)
    finally:
        live.close()
    restart_log = _lines(log, logged)
    assert any("is gone; restoring from the table" in line for line in restart_log), "\n".join(
        line for line in restart_log if "candlewire" in line
    )[-4000:]
    assert_candles(ohlc, ticker, ticks, 3600)


def assert_candles(ohlc, ticker: str, ticks: list[market_pb2.Tick], period: int) -> pd.DataFrame:
    """The ticker's candles of one period in ``ohlc`` equal pandas over the same distinct
    trades; returns those."""
    ohlc.refresh()
    got = (
        ohlc.scan(row_filter=f"ticker = '{ticker}' and period_s = {period}")
        .to_pandas()
        .set_index("open_time")
        .sort_index()
    )
    want = expected_candles(ticks, period)
    assert list(got.index) == list(want.index), (ticker, period)
    for column in ("open", "high", "low", "close", "volume"):
        mine = [Decimal(str(v)) for v in got[column]]
        assert mine == [Decimal(str(v)) for v in want[column]], (ticker, period, column)
    assert [int(v) for v in got["trade_count"]] == [int(v) for v in want["trade_count"]]
    return want


def assert_live(updates: dict[int, market_pb2.OHLC], want: pd.DataFrame, what: object) -> None:
    """The last live update of each window equals pandas (and so the ``ohlc`` row)."""
    prices = ("open", "high", "low", "close", "volume")
    got = [
        (t, *(Decimal(getattr(u, f)) for f in prices), u.trade_count)
        for t, u in sorted(updates.items())
    ]
    expected = [
        (int(t.timestamp() * 1000), r.open, r.high, r.low, r.close, r.volume, int(r.trade_count))
        for t, r in want.iterrows()
    ]
    assert got == expected, what


def wait_live(live, ticker: str, wants: dict[int, pd.DataFrame], timeout: float = 30.0) -> None:
    """``assert_live`` for each period, waited for: live updates trail the commit a little,
    and on a loaded machine more than a fixed pause."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            for period, want in wants.items():
                assert_live(live.last(ticker, period), want, (ticker, period))
            break
        except AssertionError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)
    time.sleep(1.0)  # and it stays so: no wrong update after the right one
    for period, want in wants.items():
        assert_live(live.last(ticker, period), want, (ticker, period))


def counts(updates: dict[int, market_pb2.OHLC]) -> dict[int, int]:
    return {t: u.trade_count for t, u in updates.items()}


def trades_in(ohlc, ticker: str, period: int) -> int:
    """Trades counted in the ticker's candles of one period."""
    ohlc.refresh()
    rows = ohlc.scan(row_filter=f"ticker = '{ticker}' and period_s = {period}").to_arrow()
    return sum(rows["trade_count"].to_pylist())


def _lines(path, skip: int) -> list[str]:
    return path.read_text().splitlines()[skip:]


class TickWatcher:
    """``Client.subscribe`` on a thread: the ticks it yields, until it has ``n``."""

    def __init__(self, settings, ticker: str, n: int) -> None:
        self.got: list[Tick] = []
        self.stats = None
        self._ingestor = FakeIngestor(zmq.Context.instance(), settings, [work_prefix("TEST")])
        self._thread = threading.Thread(target=self._run, args=(settings, ticker, n))
        self._thread.start()
        # The subscription reaches the job through the relay: seen by the relay first (on a
        # loaded machine, later than any fixed pause), then passed upstream.
        if RELAYS:
            wait_for(lambda: RELAYS[-1]._watched.watched(ticker), timeout=30)
        time.sleep(1.0)

    def _run(self, settings, ticker: str, n: int) -> None:
        with Client(settings) as client:
            sub = client.subscribe(ticker, idle_timeout=240)
            self.stats = sub.stats
            for tick in sub:
                self.got.append(tick)
                if len(self.got) >= n:
                    break
            sub.close()

    def join(self) -> None:
        self._thread.join(300)
        self._ingestor.close()


BOOKED = "SIM:ETH/USDT"  # the pipeline's SIM ingestor streams its book once watched


def sims_books(sim: SimExchange, ticker: str, first: int, last: int) -> dict[int, tuple]:
    """SIM's own (bids, asks) after each update from ``first`` to ``last``, made in one
    pass (one at a time, each would make its minute's trades again)."""
    return {
        b.seq: (b.bids(), b.asks())
        for b in map(Book.from_snapshot, sim.books(ticker, first, last + 1))
    }


class BookWatcher:
    """``Client.subscribe(ticker, "book")`` on a thread: each book it yields, by its venue
    number, and those that differ from SIM's own book at that number."""

    def __init__(self, settings, ticker: str) -> None:
        self.ticker = ticker
        self.got: dict[int, tuple[list, list, int]] = {}
        self.wrong: list[int] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(settings,), daemon=True)
        self._thread.start()
        wait_for(lambda: self.got, timeout=120)

    def _run(self, settings) -> None:
        sim = SimExchange()  # the pipeline ingestor's twin: the same seed, so the same book
        with Client(settings) as client:
            sub = client.subscribe(self.ticker, "book", idle_timeout=240)
            for book in sub:
                if not book.same_levels(Book.from_snapshot(sim.book_at(self.ticker, book.seq))):
                    self.wrong.append(book.seq)
                self.got[book.seq] = (book.bids(), book.asks(), book.time_ns)
                if self._stop.is_set():
                    break
            sub.close()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(60)

    def check_against_iceberg(self, settings, split: int) -> None:
        """Every book was SIM's; ``book_deltas`` and ``book_snapshots`` hold each record Kafka
        holds for the span once, and nothing else; a book rebuilt from Iceberg equals the live
        one, before ``split`` and after it.

        Kafka is the oracle, not an unbroken run of venue numbers: the ingestor's stream may
        start afresh inside the span (its last subscriber's grace ran out just before this
        one's subscription came), from a snapshot, and the updates in between never exist."""
        assert not self.wrong, f"books that were not SIM's: {self.wrong[:5]}"
        first, last = min(self.got), max(self.got)

        def held(table: str) -> list[int]:
            rows = (
                catalog(settings)
                .load_table(f"{NAMESPACE}.{table}")
                .scan(row_filter=f"ticker = '{self.ticker}' AND venue_seq > {first}")
            )
            return sorted(s for s in rows.to_arrow()["venue_seq"].to_pylist() if s <= last)

        sent: dict[str, list[int]] = {"book_deltas": [], "book_snapshots": []}
        for r in read_topic_to_end(settings, BOOKS.name):  # all the job has read, and more
            if getattr(r, "ticker", None) == self.ticker and first < r.venue_seq <= last:
                sent["book_deltas" if type(r).__name__ == "BookDelta" else "book_snapshots"].append(
                    r.venue_seq
                )
        deltas = sent["book_deltas"]
        assert deltas and min(deltas) <= split < max(deltas), "deltas on both sides of the kill"
        wait_for(
            lambda: all(held(t)[-1:] == sorted(seqs)[-1:] for t, seqs in sent.items()),
            timeout=120,
            interval=1.0,
        )
        for table, seqs in sent.items():
            assert held(table) == sorted(seqs), f"{table}: records lost or stored twice"
        before = [s for s in self.got if s <= split][-2:]
        after = [s for s in self.got if s > split][-2:]
        with Client(settings) as client:
            for seq in before + after:
                bids, asks, time_ns = self.got[seq]
                book = client.history(self.ticker, "book", at=time_ns // 1_000_000)
                assert book.seq == seq and (book.bids(), book.asks()) == (bids, asks), seq


class LiveUpdates:
    """Everything published live for some tickers (trades and every period's candles),
    through the relay, collected on a thread."""

    def __init__(self, settings, tickers: list[str]) -> None:
        self._ctx = zmq.Context()
        self._sub = self._ctx.socket(zmq.SUB)
        self._sub.setsockopt(zmq.RCVHWM, 0)
        for ticker in tickers:
            self._sub.subscribe(market_data_topic(ticker, "tick"))
            for period in PERIODS_S:
                self._sub.subscribe(market_data_topic(ticker, ohlc_type(period)))
        self._sub.connect(settings.connect("market_data"))
        self.candles: list[market_pb2.OHLC] = []
        self.trades: dict[str, list[str]] = {t: [] for t in tickers}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        # The subscription reaches the job through the relay: seen by the relay first (on a
        # loaded machine, later than any fixed pause), then passed upstream.
        if RELAYS:
            wait_for(lambda: all(map(RELAYS[-1]._watched.watched, tickers)), timeout=30)
        time.sleep(1.0)

    def _run(self) -> None:
        while not self._stop.is_set():
            if self._sub.poll(100):
                msg = decode_sub(self._sub.recv_multipart())[1]
                if isinstance(msg, market_pb2.Tick):
                    self.trades[msg.ticker].append(msg.trade_id)
                elif isinstance(msg, market_pb2.OHLC):
                    self.candles.append(msg)

    def last(self, ticker: str, period: int) -> dict[int, market_pb2.OHLC]:
        """The last update of each window."""
        return {
            u.open_time_ms: u
            for u in list(self.candles)
            if u.ticker == ticker and u.period_s == period
        }

    def most(self, ticker: str, period: int) -> dict[int, int]:
        """The largest trade count any update of each window had."""
        out: dict[int, int] = {}
        for u in list(self.candles):
            if u.ticker == ticker and u.period_s == period:
                out[u.open_time_ms] = max(out.get(u.open_time_ms, 0), u.trade_count)
        return out

    def close(self) -> None:
        self._stop.set()
        self._thread.join(2)
        self._sub.close(linger=0)
        self._ctx.term()


def _children(pid: int) -> list[int]:
    out = subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True)
    return [int(p) for p in out.stdout.split()]


def _jobs(settings):
    out = subprocess.run(["pgrep", "-f", "bin/candlewire stream"], capture_output=True, text=True)
    for pid in map(int, out.stdout.split()):
        try:  # a job of another test's may have ended since
            with open(f"/proc/{pid}/environ", "rb") as f:
                env = f.read().split(b"\0")
        except OSError:
            continue
        if f"CANDLEWIRE_PORTS__STREAM_METRICS={settings.port('stream_metrics')}".encode() in env:
            yield pid


@pytest.fixture(scope="module")
def book_tape(live_pipeline) -> Iterator[BookWatcher]:
    """A client live on SIM's book from this module's first pipeline test to its last."""
    tape = BookWatcher(live_pipeline, BOOKED)
    yield tape
    tape.stop()


@pytest.fixture
def pipeline(live_pipeline, book_tape):
    return live_pipeline
