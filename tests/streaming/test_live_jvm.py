"""The live path (jvm/decoder's Live, which both engines run) against the reference rules
(tests.reference.feeds, tests.reference.candles): for the same records, the same ticks published in the
same order with the same positions, and the same last update of every candle window, closed
or not, also from a restored state.

The records mix everything a feed sends: trades out of order within the lateness allowance,
late ones, resends, trades without an id, idle marks and malformed records; the reference
judges them in randomly cut micro-batches, which must not matter.
"""

from __future__ import annotations

import random
import time
from collections import Counter
from decimal import Decimal

import zmq

from candlewire.config import PERIODS_S
from candlewire.testing import free_settings, wait_for
from candlewire.topics import market_data_topic, tick_type
from candlewire.zmqutil import HWM
from proto import market_pb2
from proto.envelope import from_record, to_record
from streaming.decode import parse_tick
from streaming.queries.live import live_conf, parse_counters, restore_file
from streaming.recovery import Restored
from tests.fuzz import FRAMES, SETTLE_S, blast, not_subscription, peer
from tests.reference.candles import (
    Candle,
    FormingCandles,
    candle_from_row,
    changed,
    partial_candles,
)
from tests.reference.feeds import Feeds, Verdict, held

MINUTE_NS = 60_000_000_000
# Prices and sizes the tables' DECIMAL(38,18) does not hold: folded, the first failed the
# committing query's write at every restart, and the second was rounded three ways.
UNHELD = [
    {"price": "100000000000000000000", "size": "1"},
    {"price": "1", "size": "0.0000000000000000005"},
    {"price": "1.0000000000000000025", "size": "1"},
    {"price": "1e+20000000", "size": "1"},
    {"price": "1", "size": "2e20"},
]
PROBE_PARTITION = 1_000  # no restored state's: the live path judges every probe
T0 = 1_789_999_200 * 1_000_000_000  # a whole hour
# The positions' epoch, as the job passes it (streaming/publisher.py's next_epoch): not the
# JVM's clock, which a step back over a restart would put below the last run's. In the past,
# so the session's journal holds no epoch ahead of the clock for the tests after.
EPOCH = 1_700_000_000_000


class JvmLive:
    """Live started in the test's Spark JVM, with a SUB on its XPUB."""

    def __init__(self, spark, settings, restored: Restored, tmp_path) -> None:
        self.live = spark._jvm.io.candlewire.spark.Live
        self.live.start(live_conf(settings, restore_file(restored, str(tmp_path)), EPOCH))
        self.ctx = zmq.Context()
        self.sub = self.ctx.socket(zmq.SUB)
        self.sub.setsockopt(zmq.SUBSCRIBE, b"")
        self.sub.connect(settings.connect("stream_live"))
        self.ticks: list[tuple[str, str, market_pb2.StreamPosition]] = []
        self.candles: dict[tuple[str, int, int], market_pb2.OHLC] = {}
        self.heads = 0
        try:
            self._warm_up()
        except BaseException:  # closed here: a context left open hangs the worker at exit
            self.close()
            raise

    def _warm_up(self) -> None:
        """Until the SUB's subscription has reached the XPUB (nothing is dropped after)."""
        probe = to_record(
            market_pb2.Tick(ticker="PROBE:X/Y", price="1", size="1", exchange_time_ns=T0)
        )
        for i in range(300):
            self.live.offer(probe, PROBE_PARTITION, i)
            if self.sub.poll(100):
                break
        else:
            raise AssertionError("the live path's XPUB never delivered")
        time.sleep(0.2)
        while self.sub.poll(50):
            self.sub.recv_multipart()

    def counters(self) -> dict[str, int]:
        return parse_counters(self.live.counters())

    def offer(self, records: list[tuple[bytes, int, int]]) -> None:
        for value, partition, offset in records:
            self.live.offer(value, partition, offset)

    def receive(self) -> None:
        """What has come, each message waited for 20 ms at most."""
        while self.sub.poll(20):
            topic, version, body = self.sub.recv_multipart()
            msg = from_record(version + body)
            if isinstance(msg, market_pb2.StreamHead):
                self.heads += 1
            elif isinstance(msg, market_pb2.Tick):
                if msg.ticker != "PROBE:X/Y":
                    self.ticks.append((topic.decode(), msg.trade_id, msg.stream))
            else:
                assert isinstance(msg, market_pb2.OHLC)
                if msg.ticker != "PROBE:X/Y":  # the warm-up's, which may come after it
                    self.candles[(msg.ticker, msg.period_s, msg.open_time_ms)] = msg

    def drain(self, ticks: int, candles: dict[tuple[str, int, int], tuple] | None = None) -> None:
        """Receive until ``ticks`` ticks arrived (and with ``candles``, until every candle's
        last update has these values: Live publishes a round's candles after its ticks), then
        what comes a short while after (what should not come, the caller's asserts see)."""

        def done() -> bool:
            self.receive()
            return len(self.ticks) >= ticks and (candles is None or self.candle_values() == candles)

        deadline = time.monotonic() + 60  # not in time: the caller's asserts say what differs
        while not done() and time.monotonic() < deadline:
            pass
        time.sleep(0.3)
        self.receive()

    def candle_values(self) -> dict[tuple[str, int, int], tuple]:
        return {k: as_values(c) for k, c in self.candles.items()}

    def close(self) -> None:
        self.live.stop()
        self.sub.close(0)
        self.ctx.term()


def judge(
    feeds: Feeds, forming: FormingCandles, records: list[tuple[bytes, int, int]]
) -> tuple[list[tuple[str, int]], list[Candle], list[Candle]]:
    """One micro-batch by the reference rules: the ticks published (topic, offset), and the
    candles updated and closed."""
    published: list[tuple[str, int]] = []
    timely: list[tuple[str, int, Decimal, Decimal]] = []
    revising: list[tuple[str, int, Decimal, Decimal]] = []
    for record, _partition, offset in records:
        t = parse_tick(record)
        if t is None:
            continue
        if isinstance(t, market_pb2.FeedIdle):
            feeds.mark(t.ticker, t.event_time_ns)
            continue
        if not (held(t.price) and held(t.size)) or t.exchange_time_ns <= 0:
            continue  # bad, as DecodeTick.amounts has it
        verdict = feeds.admit(t.ticker, t.trade_id, t.exchange_time_ns)
        if verdict is Verdict.DUPLICATE:
            continue
        published.append((market_data_topic(t.ticker, tick_type()), offset))
        if verdict is Verdict.KEEP or verdict is Verdict.REVISE:
            tick = (t.ticker, t.exchange_time_ns, Decimal(t.price), Decimal(t.size))
            (timely if verdict is Verdict.KEEP else revising).append(tick)
    updated = forming.merge(partial_candles(timely, PERIODS_S))
    revised: list[Candle] = []
    if revising:
        more, revised = forming.revise(partial_candles(revising, PERIODS_S), feeds.watermark_ms)
        updated += more
    closed = forming.evict(feeds.watermark_ms, feeds.horizon_start_ms)
    return published, updated, closed + revised


def reference(settings, restored: Restored, records, seed: int):
    """The reference rules in random micro-batch cuts: published ticks and last updates."""
    feeds = Feeds(settings.stream_watermark_s, settings.stream_dedup_horizon_s)
    feeds.restore(restored.clocks, restored.trades)
    forming = FormingCandles()
    forming.restore(map(candle_from_row, restored.rows), feeds.watermark_ms, feeds.horizon_start_ms)
    verdicts: Counter[Verdict] = Counter()
    admit = feeds.admit

    def counted(*args: object) -> Verdict:
        verdicts[v := admit(*args)] += 1  # type: ignore[arg-type]
        return v

    feeds.admit = counted  # type: ignore[method-assign]
    rng = random.Random(seed)
    ticks: list[tuple[str, int]] = []
    last: dict[tuple[str, int, int], tuple] = {}
    i = 0
    while i < len(records):
        n = rng.randint(1, 400)
        published, updated, closed = judge(feeds, forming, records[i : i + n])
        ticks += published
        for c, is_closed in changed(updated, closed):
            last[c.key] = (c.open, c.high, c.low, c.close, c.volume, c.trade_count, is_closed)
        i += n
    return ticks, last, verdicts[Verdict.REVISE]


def as_values(c: market_pb2.OHLC) -> tuple:
    d = [Decimal(x) for x in (c.open, c.high, c.low, c.close, c.volume)]
    return (*d, c.trade_count, c.closed)


def feed_records(seed: int, n: int, tickers: list[str]) -> list[tuple[bytes, int, int]]:
    """A hostile but realistic mix, in Kafka order (a ticker's records in one partition)."""
    rng = random.Random(seed)
    clocks = dict.fromkeys(tickers, T0)
    sent: dict[str, list[market_pb2.Tick]] = {t: [] for t in tickers}
    out: list[tuple[bytes, int, int]] = []
    for i in range(n):
        ticker = rng.choice(tickers)
        roll = rng.random()
        clocks[ticker] += rng.choice([0, 0, 1, 2, 3]) * 10**9  # ties: equal times
        if roll < 0.06 and sent[ticker]:
            value = to_record(rng.choice(sent[ticker]))  # a resend
        elif roll < 0.08:
            value = to_record(
                market_pb2.FeedIdle(ticker=ticker, event_time_ns=clocks[ticker] + 30 * 10**9)
            )
        elif roll < 0.09:
            value = rng.choice([b"\x01\x04\xff\xff", b"", to_record(market_pb2.Tick(ticker=""))])
        elif roll < 0.095:  # a price or size no table holds, or no time: bad
            value = to_record(
                market_pb2.Tick(
                    ticker=ticker,
                    trade_id=f"{ticker}-{i}",
                    exchange_time_ns=rng.choice([clocks[ticker], 0, -2]),
                    **rng.choice([*UNHELD, {"price": "1.5", "size": "1"}]),
                )
            )
        else:
            if roll < 0.2:
                t_ns = clocks[ticker] - rng.randint(0, 9 * 10**9)  # within the allowance
            elif roll < 0.25:
                t_ns = clocks[ticker] - rng.randint(11 * 10**9, 200 * 10**9)  # late
            else:
                t_ns = clocks[ticker]
            tick = market_pb2.Tick(
                ticker=ticker,
                trade_id="" if roll > 0.97 else f"{ticker}-{i}",
                price=f"{rng.randint(90, 110)}.{rng.randint(0, 99):02d}",
                size=rng.choice(["0.5", "1", "0.010", "2.25", "1e-3"]),
                side=market_pb2.BUY,
                exchange_time_ns=t_ns,
            )
            sent[ticker].append(tick)
            value = to_record(tick)
        partition = tickers.index(ticker) % 6
        out.append((value, partition, 1000 + i))
    return out


def compare(live: JvmLive, settings, restored: Restored, records, seed: int) -> None:
    want_ticks, want_last, revising = reference(settings, restored, records, seed)
    live.offer(records)
    live.drain(len(want_ticks), want_last)
    got = [(topic, pos.source_offset) for topic, _, pos in live.ticks]
    assert got == want_ticks
    by_topic: dict[str, list[int]] = {}
    for topic, _, pos in live.ticks:
        by_topic.setdefault(topic, []).append(pos.seq)
    for topic, seqs in by_topic.items():
        assert seqs == list(range(seqs[0], seqs[0] + len(seqs))), topic  # no holes
    assert {pos.epoch for _, _, pos in live.ticks} == {EPOCH}
    assert live.candle_values() == want_last
    counters = live.counters()
    marks = sum(1 for v, _, _ in records if v.startswith(b"\x01\x15"))
    assert counters["duplicates"] + counters["bad"] + marks == len(records) - len(want_ticks)
    assert counters["publishing"] == 1
    assert counters["journal_errors"] == 0
    assert counters["revised"] == revising  # what brings the next commit forward


def test_the_jvm_live_path_publishes_what_the_reference_rules_do(
    spark, lakehouse, tmp_path
) -> None:
    settings = free_settings(tmp_path, kafka_bootstrap=lakehouse.kafka_servers())
    live = JvmLive(spark, settings, Restored(), tmp_path)
    try:
        tickers = [f"LIVEJVM:{c}/USD" for c in "ABC"]
        compare(live, settings, Restored(), feed_records(7, 6000, tickers), seed=7)
        assert live.counters()["revised"] > 0
        assert any(c.closed for c in live.candles.values())
        wait_for(lambda: live.receive() or live.heads > 0, timeout=30)  # one each 0.5 s
    finally:
        live.close()


def test_the_jvm_live_path_goes_on_from_a_restored_state(spark, lakehouse, tmp_path) -> None:
    settings = free_settings(tmp_path, kafka_bootstrap=lakehouse.kafka_servers())
    ticker = "LIVEJVM:R/USD"
    minute_ms = (T0 + 5 * MINUTE_NS) // 1_000_000
    restored = Restored(
        offsets={0: 5000},
        clocks={ticker: T0 + 5 * MINUTE_NS + 10 * 10**9},
        rows=[
            {
                "ticker": ticker,
                "period_s": 60,
                "open_ms": minute_ms,
                "open": Decimal("100.5"),
                "high": Decimal("101"),
                "low": Decimal("99"),
                "close": Decimal("100"),
                "volume": Decimal("3"),
                "trade_count": 3,
                "first_trade_ns": T0 + 5 * MINUTE_NS + 5 * 10**9,
                "last_trade_ns": T0 + 5 * MINUTE_NS + 10 * 10**9,
            }
        ],
        trades=[(ticker, "r-1", T0 + 5 * MINUTE_NS + 10 * 10**9)],
    )

    def tick(trade_id: str, seconds: int, price: str) -> bytes:
        return to_record(
            market_pb2.Tick(
                ticker=ticker,
                trade_id=trade_id,
                price=price,
                size="1",
                exchange_time_ns=T0 + 5 * MINUTE_NS + seconds * 10**9,
            )
        )

    records = [
        (tick("r-1", 10, "100"), 0, 5000),  # a replayed trade the commits hold: a resend
        (tick("r-2", 14, "102"), 0, 5001),  # into the restored forming minute: sets close
        (tick("r-3", 4, "98"), 0, 5002),  # out of order, within the allowance: sets open
        (tick("r-4", 75, "97"), 0, 5003),  # the next minute
        (tick("r-5", 200, "96"), 0, 5004),  # closes both earlier minutes
    ]
    live = JvmLive(spark, settings, restored, tmp_path)
    try:
        # Before the restored offset: the state holds it. The query reads it again when the
        # CEP triggers' state stands earlier; the live path must skip it.
        live.offer([(tick("r-0", 12, "150"), 0, 4990)])
        compare(live, settings, restored, records, seed=1)
        first = live.candles[(ticker, 60, minute_ms)]
        assert as_values(first) == (
            Decimal("98"),
            Decimal("102"),
            Decimal("98"),
            Decimal("102"),
            Decimal("5"),
            5,
            True,
        )
        assert [trade_id for _, trade_id, _ in live.ticks] == ["r-2", "r-3", "r-4", "r-5"]
    finally:
        live.close()


def test_what_a_relay_sends_up_the_live_xpub_that_is_no_subscription_is_counted(
    spark, lakehouse, tmp_path
) -> None:
    """Hostile frames up the JVM's XPUB (tests/fuzz.py) while it publishes: each is counted,
    and every tick offered meanwhile arrives."""
    settings = free_settings(tmp_path, kafka_bootstrap=lakehouse.kafka_servers())
    live = JvmLive(spark, settings, Restored(), tmp_path)
    fuzzer = peer(live.ctx, zmq.XSUB, settings.connect("stream_live"))
    rng = random.Random("live")
    try:
        records = feed_records(11, 2000, ["LIVEFUZZ:A/USD"])
        want_ticks, *_ = reference(settings, Restored(), records, seed=11)
        for i in range(0, len(records), 100):
            live.offer(records[i : i + 100])
            blast(fuzzer, lambda: [not_subscription(rng)], FRAMES // 20)
        live.drain(len(want_ticks))
        assert [(topic, pos.source_offset) for topic, _, pos in live.ticks] == want_ticks
        wait_for(lambda: live.counters()["refused"] >= FRAMES // 20 * 20, timeout=SETTLE_S)
        assert live.counters()["refused"] == FRAMES // 20 * 20
    finally:
        fuzzer.close()
        live.close()


def test_what_the_live_path_sends_before_its_relays_have_redialled_reaches_them(
    spark, lakehouse, tmp_path
) -> None:
    """A restarted job replays at once what its predecessor had not committed, while its
    relays are still redialling (their back-off: up to RECONNECT_IVL_MAX_MS). The live path
    holds its first round until a subscriber is in, so a plain subscriber that connects half
    a second late still gets those ticks and their candle."""
    settings = free_settings(tmp_path, kafka_bootstrap=lakehouse.kafka_servers())
    ticker = "LIVEJVM:W/USD"
    live = spark._jvm.io.candlewire.spark.Live
    live.start(live_conf(settings, restore_file(Restored(), str(tmp_path)), EPOCH))
    ctx = zmq.Context()
    sub = ctx.socket(zmq.SUB)
    try:
        for i in range(3):
            tick = market_pb2.Tick(
                ticker=ticker,
                trade_id=f"w-{i}",
                price="100",
                size="1",
                exchange_time_ns=T0 + i * 10**9,
            )
            live.offer(to_record(tick), 0, i)
        time.sleep(0.5)
        sub.setsockopt(zmq.SUBSCRIBE, b"")
        sub.connect(settings.connect("stream_live"))
        ticks: list[str] = []
        candles: dict[int, int] = {}

        def received() -> bool:
            while sub.poll(20):
                msg = from_record(b"".join(sub.recv_multipart()[1:]))
                if isinstance(msg, market_pb2.Tick):
                    ticks.append(msg.trade_id)
                elif isinstance(msg, market_pb2.OHLC):
                    candles[msg.period_s] = msg.trade_count
            return len(ticks) >= 3 and len(candles) == len(PERIODS_S)

        wait_for(received, timeout=30)
        assert ticks == ["w-0", "w-1", "w-2"]
        assert candles == dict.fromkeys(PERIODS_S, 3)
    finally:
        live.stop()
        sub.close(0)
        ctx.term()


def test_a_relay_that_went_down_holds_back_nothing_the_others_get(
    spark, lakehouse, tmp_path
) -> None:
    """The live path dials the relays other than its own host's. One that goes down takes its
    subscriptions with it, so its queue never fills and ``XPUB_NODROP`` never refuses what the
    relay still up gets (``tests/streaming/test_publisher.py``'s case, for the JVM)."""
    settings = free_settings(
        tmp_path,
        kafka_bootstrap=lakehouse.kafka_servers(),
        relay_hosts=["127.0.0.1", "127.0.0.2"],
    )
    (far_ingress,) = settings.dialled_relays()
    hwm, ticker = 1_000, "LIVEJVM:F/USD"
    conf = live_conf(settings, restore_file(Restored(), str(tmp_path)), EPOCH)
    assert f"\nhwm={HWM}\n" in conf
    live = spark._jvm.io.candlewire.spark.Live
    ctx = zmq.Context()
    far = ctx.socket(zmq.XSUB)
    far.bind(far_ingress)
    far.send(b"\x01")  # everything, as a relay subscribes for its clients
    near = ctx.socket(zmq.SUB)
    near.setsockopt(zmq.SUBSCRIBE, b"")
    near.connect(settings.connect("stream_live"))
    live.start(conf.replace(f"\nhwm={HWM}\n", f"\nhwm={hwm}\n"))
    offered = 0
    received: list[str] = []

    def offer(n: int) -> None:
        nonlocal offered
        for i in range(offered, offered + n):
            tick = market_pb2.Tick(
                ticker=ticker,
                trade_id=f"f-{i}",
                price="100",
                size="1",
                exchange_time_ns=T0 + i * 1_000_000,
            )
            live.offer(to_record(tick), 0, i)
        offered += n

    def take(sock: zmq.Socket) -> bool:
        got = False
        while sock.poll(20):
            msg = from_record(b"".join(sock.recv_multipart()[1:]))
            if sock is near and isinstance(msg, market_pb2.Tick):
                received.append(msg.trade_id)
            got = True
        return got

    try:
        heard = {far: False, near: False}

        def both_hear() -> bool:
            offer(1)
            for relay in heard:
                heard[relay] |= take(relay)
            return all(heard.values())

        wait_for(both_hear, timeout=30)
        far.close(linger=0)  # the far relay's host goes down
        dropped, start = parse_counters(live.counters())["dropped"], offered

        def near_has_all() -> bool:
            take(near)
            return received[-1] == f"f-{offered - 1}"

        for _ in range(15):  # three of its queues' worth, a fifth of one at a time
            offer(hwm // 5)
            wait_for(near_has_all, timeout=30)
        assert received[start - offered :] == [f"f-{i}" for i in range(start, offered)]
        assert parse_counters(live.counters())["dropped"] == dropped
    finally:
        live.stop()
        near.close(0)
        ctx.destroy(linger=0)
