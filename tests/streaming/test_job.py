"""The streaming job as a real process: Kafka in, Iceberg and ZMQ out, and a kill -9."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import threading
import time
import uuid
from decimal import Decimal
from pathlib import Path

import pandas as pd
import pytest
import zmq
from confluent_kafka import Producer

from candlewire import Client
from candlewire.config import PERIODS_S
from candlewire.kafka import TICKS, producer_config
from candlewire.lake import NAMESPACE, catalog
from candlewire.topics import market_data_topic, metadata_update_topic, ohlc_type, work_prefix
from ingest.exchanges.base import Page
from ingest.exchanges.sim import SimExchange
from proto import market_pb2
from proto import requests_pb2 as rq
from proto.envelope import decode_sub, to_record
from streaming.decode import ohlc_rows
from streaming.progress import Progress
from tests.support import RUNNING, FakeIngestor, relay_call, start_job, stream_metric, wait_for

DAY = 86_400_000
T0 = 1_700_006_400_000


def produce_ticks(settings, ticks: list[market_pb2.Tick]) -> None:
    producer = Producer(producer_config(settings))
    for t in ticks:
        producer.produce(TICKS.name, key=t.ticker.encode(), value=to_record(t))
    assert producer.flush(30) == 0


def make_ticks(ticker: str, start_ms: int, n: int, seed: int) -> list[market_pb2.Tick]:
    """Ticks every ~7 s across hour and day boundaries, a few out of order, some exactly on
    a boundary (a window includes its start)."""
    rng = random.Random(seed)
    times = [start_ms + i * 7_000 + rng.randint(0, 6_000) for i in range(n)]
    if n > 10:
        times[10] = start_ms + 3_600_000  # exactly on an hour boundary
    for i in range(20, n - 1, 15):  # swap neighbours: out of order within the watermark
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


def expected_candles(ticks: list[market_pb2.Tick], period_s: int) -> pd.DataFrame:
    df = pd.DataFrame(
        {
            "time": pd.to_datetime([t.exchange_time_ns for t in ticks], unit="ns", utc=True),
            "price": [Decimal(t.price) for t in ticks],
            "size": [Decimal(t.size) for t in ticks],
        }
    ).sort_values("time")
    r = df.set_index("time").resample(f"{period_s}s")
    out = pd.DataFrame(
        {
            "open": r["price"].first(),
            "high": r["price"].max(),
            "low": r["price"].min(),
            "close": r["price"].last(),
            "volume": r["size"].sum(),
            "trade_count": r["price"].count(),
        }
    )
    return out[out["trade_count"] > 0]  # resample invents empty bins; candlewire does not


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
    got = rows()
    for period in PERIODS_S:
        want = expected_candles(ticks, period)
        mine = got[got["period_s"] == period].set_index("open_time").sort_index()
        assert list(mine.index) == list(want.index), period
        for col in ("open", "high", "low", "close", "volume", "trade_count"):
            assert [Decimal(str(v)) for v in mine[col]] == [Decimal(str(v)) for v in want[col]], (
                period,
                col,
            )


def test_ticks_land_in_iceberg_and_late_ticks_are_counted(pipeline) -> None:
    ticker = f"TEST:L{uuid.uuid4().hex[:6].upper()}/USDT"
    now = int(time.time() * 1000)
    before = stream_metric(pipeline, "candlewire_stream_late_ticks_total")
    # Four days old: beyond the test job's two-day watermark for every tick. make_ticks puts
    # tick 10 an hour after the first, so with three days it stopped being late after 23:10
    # UTC (the watermark follows the first test's ticks, which end near midnight).
    produce_ticks(pipeline, make_ticks(ticker, now - 4 * DAY, 30, seed=2))
    ticks = catalog(pipeline).load_table(f"{NAMESPACE}.ticks")

    def landed() -> int:
        ticks.refresh()
        return len(ticks.scan(row_filter=f"ticker = '{ticker}'").to_arrow())

    wait_for(lambda: landed() == 30, timeout=60, interval=1.0)
    try:
        wait_for(
            lambda: stream_metric(pipeline, "candlewire_stream_late_ticks_total") - before >= 30,
            timeout=30,
        )
    except AssertionError:
        log = (pipeline.state_dir / "stream.log").read_text().splitlines()
        raise AssertionError(
            "\n".join(x for x in log if "candlewire" in x or "rror" in x)[-3000:]
        ) from None


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
    now = int(time.time() * 1000)
    # The test plays the TEST exchange's ingestor (it produces to Kafka), so it serves TEST's
    # work queue: the relay would otherwise tell the subscriber no ingestor serves it.
    with Client(pipeline) as client, zmq.Context() as ctx:
        fake = FakeIngestor(ctx, pipeline, [work_prefix("TEST")])
        updates = client.subscribe(ticker, "ohlc:60", idle_timeout=60)
        time.sleep(1.0)  # the subscription reaches the job through the relay
        produce_ticks(pipeline, make_ticks(ticker, now, 3, seed=3))
        candle = next(updates)
        fake.close()
    assert candle.ticker == ticker and candle.period_s == 60 and candle.trade_count >= 1


def test_first_subscriber_starts_a_cold_ticker_end_to_end(pipeline) -> None:
    """Nobody asked SIM:SOL/USDT to stream: subscribing is enough, and the first tick comes
    through ingest → Kafka → streaming → relay."""
    t0 = time.time()
    with Client(pipeline) as client:
        tick = next(client.subscribe("SIM:SOL/USDT", "tick", idle_timeout=120))
    assert tick.ticker == "SIM:SOL/USDT"
    assert tick.exchange_time_ns / 1e9 >= t0 - 5, "a live trade, not an old one"


def test_exactly_once_under_kill_9(pipeline) -> None:
    """kill -9 while batches are in flight; after a restart the tables hold each row once,
    and the live candles a subscriber sees through the relay end on the same values."""
    ticker = f"TEST:K{uuid.uuid4().hex[:6].upper()}/USDT"
    start = int(time.time() * 1000) - 3_600_000
    ticks = make_ticks(ticker, start, 3000, seed=4)
    live = LiveCandles(pipeline, market_data_topic(ticker, ohlc_type(3600)))
    # The module's job keeps running: stop it so this test owns the checkpoints.
    job = next(p for p in _jobs(pipeline))
    ohlc = catalog(pipeline).load_table(f"{NAMESPACE}.ohlc")
    table = catalog(pipeline).load_table(f"{NAMESPACE}.ticks")

    def ticks_in_table() -> int:
        table.refresh()
        return len(table.scan(row_filter=f"ticker = '{ticker}'").to_arrow())

    def minute_trades() -> int:
        ohlc.refresh()
        rows = ohlc.scan(row_filter=f"ticker = '{ticker}' and period_s = 60").to_arrow()
        return sum(rows["trade_count"].to_pylist())

    # The first 1,000 ticks' candles committed, so the restart has forming candles to restore
    # (a tick append alone is not enough: the kill could then land before the candle commit);
    # then a kill while the next batches are in flight.
    produce_ticks(pipeline, ticks[:1000])
    wait_for(lambda: minute_trades() == 1000, timeout=90, interval=0.5)
    produce_ticks(pipeline, ticks[1000:2000])
    time.sleep(1.5)
    os.kill(job, signal.SIGKILL)
    produce_ticks(pipeline, ticks[2000:])
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
        want = assert_hourly_candles(ohlc, ticker, ticks)
        hours = {int(t.timestamp() * 1000): int(n) for t, n in want["trade_count"].items()}
        wait_for(lambda: live.last_counts() == hours, timeout=60, interval=0.5)
        over = {t: n for t, n in live.most.items() if n > hours.get(t, 0)}
        assert not over, f"live candles counted ticks twice: {over} against {hours}"
    finally:
        live.close()
        restarted.terminate()
        restarted.wait(60)
        # Leave a running job for the module's teardown and later tests.
        _replace_module_job(pipeline)


def test_restart_after_maintenance_expired_the_recorded_snapshot(pipeline) -> None:
    """The forming candles are restored from ``ohlc`` as of the last recorded commit. If
    snapshot expiry removed that snapshot while the job was down, the table as it is now
    holds the same live rows, and the candles still end exactly right."""
    ticker = f"TEST:E{uuid.uuid4().hex[:6].upper()}/USDT"
    ticks = make_ticks(ticker, int(time.time() * 1000) - 3_600_000, 600, seed=5)
    ohlc = catalog(pipeline).load_table(f"{NAMESPACE}.ohlc")

    def trades(period_s: int) -> int:
        ohlc.refresh()
        rows = ohlc.scan(row_filter=f"ticker = '{ticker}' and period_s = {period_s}").to_arrow()
        return sum(rows["trade_count"].to_pylist())

    run_id = (Path(pipeline.checkpoints()) / "ticks.run-id").read_text().strip()
    progress = Progress(pipeline)

    def recorded() -> bool:
        """The last candle MERGE is recorded: killed now, the restart must restore."""
        last = progress.last_candles(run_id)
        ohlc.refresh()
        return last is not None and last.snapshot_id == ohlc.current_snapshot().snapshot_id

    produce_ticks(pipeline, ticks[:300])
    wait_for(lambda: all(trades(p) == 300 for p in PERIODS_S), timeout=90, interval=0.5)
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
    produce_ticks(pipeline, ticks[300:])
    RUNNING.append(start_job(pipeline))  # the module's job from here on
    wait_for(lambda: all(trades(p) == 600 for p in PERIODS_S), timeout=180, interval=1.0)
    restart_log = _lines(log, logged)
    assert any("is gone; restoring from the table" in line for line in restart_log), "\n".join(
        line for line in restart_log if "candlewire" in line
    )[-4000:]
    assert_hourly_candles(ohlc, ticker, ticks)


def assert_hourly_candles(ohlc, ticker: str, ticks: list[market_pb2.Tick]) -> pd.DataFrame:
    """The ticker's hourly candles in ``ohlc`` equal pandas over the same ticks; returns those."""
    ohlc.refresh()
    got = (
        ohlc.scan(row_filter=f"ticker = '{ticker}' and period_s = 3600")
        .to_pandas()
        .set_index("open_time")
        .sort_index()
    )
    want = expected_candles(ticks, 3600)
    assert list(got.index) == list(want.index)
    for column in ("open", "high", "low", "close", "volume"):
        assert [Decimal(str(v)) for v in got[column]] == [Decimal(str(v)) for v in want[column]]
    assert [int(v) for v in got["trade_count"]] == [int(v) for v in want["trade_count"]]
    return want


def _lines(path, skip: int) -> list[str]:
    return path.read_text().splitlines()[skip:]


class LiveCandles:
    """Candle updates of one topic through the relay, collected on a thread."""

    def __init__(self, settings, topic: str) -> None:
        self._ctx = zmq.Context()
        self._sub = self._ctx.socket(zmq.SUB)
        self._sub.subscribe(topic)
        self._sub.connect(settings.connect("market_data"))
        self.updates: list[market_pb2.OHLC] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        time.sleep(1.0)  # the subscription reaches the job through the relay

    def _run(self) -> None:
        while not self._stop.is_set():
            if self._sub.poll(100):
                self.updates.append(decode_sub(self._sub.recv_multipart())[1])

    def last_counts(self) -> dict[int, int]:
        return {u.open_time_ms: u.trade_count for u in list(self.updates)}

    @property
    def most(self) -> dict[int, int]:
        out: dict[int, int] = {}
        for u in list(self.updates):
            out[u.open_time_ms] = max(out.get(u.open_time_ms, 0), u.trade_count)
        return out

    def close(self) -> None:
        self._stop.set()
        self._thread.join(2)
        self._sub.close(linger=0)
        self._ctx.term()


def _jobs(settings):
    out = subprocess.run(["pgrep", "-f", "bin/candlewire stream"], capture_output=True, text=True)
    for pid in map(int, out.stdout.split()):
        with open(f"/proc/{pid}/environ", "rb") as f:
            env = f.read().split(b"\0")
        if f"CANDLEWIRE_PORTS__STREAM_METRICS={settings.port('stream_metrics')}".encode() in env:
            yield pid


@pytest.fixture
def pipeline(live_pipeline):
    return live_pipeline


def _replace_module_job(settings) -> None:
    RUNNING.append(start_job(settings))
