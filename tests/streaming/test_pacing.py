"""The committing query's pace (streaming.pacing): a run at start and every interval, one
soon after the live path revised a candle, one for a burst once the live path has read it,
and a failed run ends the query with its error."""

from __future__ import annotations

import math
import threading
import time
import uuid
from collections.abc import Callable
from types import SimpleNamespace

import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic

from candlewire.kafka import client_auth, producer_config
from candlewire.testing import wait_for
from proto import market_pb2
from proto.envelope import to_record
from streaming import pacing
from streaming.context import JobContext
from streaming.pacing import CommitDue, PacedQuery, start_available_now
from streaming.queries.live import COUNTERS, LiveQuery
from streaming.queries.ticks import TICK, TicksQuery


class Run:
    """A StreamingQuery that terminates at once, or with ``error``."""

    def __init__(self, error: Exception | None = None) -> None:
        self.error, self.stopped = error, False

    def awaitTermination(self) -> None:
        if self.error is not None:
            raise self.error

    def stop(self) -> None:
        self.stopped = True


class Starts:
    def __init__(self, errors: list[Exception | None] | None = None) -> None:
        self.at: list[float] = []
        self.errors = list(errors or [])

    def __call__(self, _batch: object) -> Run:
        self.at.append(time.monotonic())
        return Run(self.errors.pop(0) if self.errors else None)


def paced(
    starts: Callable[[object], Run], interval: float, retry=lambda _: False
) -> tuple[PacedQuery, threading.Event]:
    due = CommitDue(after_ticks=1)
    q = SimpleNamespace(name="ticks", trigger_s=interval)
    return PacedQuery(q, starts, due, retry), due.event  # type: ignore[arg-type]


@pytest.fixture(autouse=True)
def quick(monkeypatch) -> None:
    monkeypatch.setattr(pacing, "SETTLE_S", 0.05)
    monkeypatch.setattr(pacing, "HURRY_GAP_S", 0.2)
    monkeypatch.setattr(pacing, "QUIET_S", 0.3)
    monkeypatch.setattr(pacing, "BURST_WAIT_S", 2.0)


def test_runs_at_start_and_every_interval() -> None:
    starts = Starts()
    query, _ = paced(starts, interval=0.3)
    try:
        wait_for(lambda: len(starts.at) >= 4, timeout=5)
        gaps = [b - a for a, b in zip(starts.at, starts.at[1:], strict=False)]
        assert all(g >= 0.29 for g in gaps), gaps
        assert query.isActive and query.exception() is None
    finally:
        query.stop()
    assert not query.isActive


def test_a_revised_candle_brings_the_next_run_forward_and_stop_ends_it() -> None:
    starts = Starts()
    query, hurry = paced(starts, interval=3600)
    try:
        wait_for(lambda: len(starts.at) == 1, timeout=5)
        time.sleep(0.3)
        assert len(starts.at) == 1  # an hour to the next one
        hurry.set()
        wait_for(lambda: len(starts.at) == 2, timeout=5)
        hurry.set()  # flagged again: another run, no sooner than the gap after the last
        wait_for(lambda: len(starts.at) == 3, timeout=5)
        assert starts.at[2] - starts.at[1] >= 0.2
    finally:
        began = time.monotonic()
        query.stop()
    assert time.monotonic() - began < 5  # not waiting out the interval
    assert not query.isActive


def test_a_run_brought_forward_by_a_burst_waits_until_the_live_path_has_read_it() -> None:
    """A batch's worth of ticks read brings a run forward, but not while the live path is
    still reading the burst: the run then takes all of it at once. A burst that does not
    pause is committed ``BURST_WAIT_S`` after it was due; a revised candle ends the wait."""
    starts = Starts()
    due = CommitDue(after_ticks=1_000)
    q = SimpleNamespace(name="ticks", trigger_s=3600)
    query = PacedQuery(q, starts, due, lambda _: False)  # type: ignore[arg-type]

    def reads(seconds: float, revise_at: float | None = None) -> tuple[float, float]:
        """The live path reporting 400 records read ten times a second (due at the third),
        and a revised candle ``revise_at`` seconds in; when the last read and the revision
        were reported."""
        began = last = time.monotonic()
        revised = math.inf
        while last < began + seconds:
            if revise_at is not None and revised == math.inf and last >= began + revise_at:
                revised = time.monotonic()
                due.revised()
            last = time.monotonic()
            due.read(400)
            time.sleep(0.1)
        return last, revised

    try:
        wait_for(lambda: len(starts.at) == 1, timeout=5)
        last, _ = reads(1.0)
        wait_for(lambda: len(starts.at) == 2, timeout=5)
        assert starts.at[1] - last >= pacing.QUIET_S  # after the reads had paused
        flood = time.monotonic()
        last, _ = reads(pacing.BURST_WAIT_S + 1.5)  # due, and never quiet
        assert starts.at[2] < last  # it did not wait for the flood to end,
        assert starts.at[2] - flood >= pacing.BURST_WAIT_S  # but as long as it may
        wait_for(lambda: len(starts.at) == 4, timeout=5)  # flagged during run 3: ran after it
        last, revised = reads(1.5, revise_at=0.6)  # a burst, and a revised candle amid it
        wait_for(lambda: len(starts.at) >= 5, timeout=5)
        assert starts.at[4] - revised < 0.5 and starts.at[4] < last  # not after the reads
    finally:
        query.stop()


def test_a_failed_run_ends_the_query_unless_it_may_run_again() -> None:
    boom = RuntimeError("SPARK-55271")
    starts = Starts([boom])
    query, _ = paced(starts, interval=0.1, retry=lambda e: e is boom)
    try:
        wait_for(lambda: len(starts.at) >= 3, timeout=5)  # it ran again
        assert query.isActive
    finally:
        query.stop()
    fatal = RuntimeError("disk full")
    starts = Starts([fatal])
    query, _ = paced(starts, interval=0.1)
    wait_for(lambda: not query.isActive, timeout=5)
    assert query.exception() is fatal and len(starts.at) == 1


def test_how_far_iceberg_is_behind_counts_from_the_last_completed_runs_start() -> None:
    """``candlewire_stream_iceberg_behind_seconds``: a run that completes makes Iceberg hold
    what Kafka held when it began; a run in flight or one that failed moves nothing."""
    boom = RuntimeError("SPARK-55271")
    release = threading.Event()

    class Held(Run):
        def awaitTermination(self) -> None:
            release.wait(10)
            super().awaitTermination()

    starts = Starts([None, boom])

    def held(batch: object) -> Run:
        return Held(starts(batch).error)

    query, hurry = paced(held, interval=3600, retry=lambda e: e is boom)
    try:
        wait_for(lambda: len(starts.at) == 1, timeout=5)
        time.sleep(0.2)
        assert math.isnan(query.behind_s())  # the first run has not completed
        release.set()
        wait_for(lambda: query.holds_as_of is not None, timeout=5)
        assert abs(query.holds_as_of - starts.at[0]) < 0.1  # its start, not its end
        time.sleep(0.3)
        assert query.behind_s() >= 0.3
        as_of = query.holds_as_of
        hurry.set()  # a second run, which fails and may run again: nothing new is held
        wait_for(lambda: len(starts.at) == 2, timeout=5)
        time.sleep(0.3)
        assert query.holds_as_of == as_of and query.behind_s() >= 0.6
    finally:
        query.stop()


def test_a_run_cut_short_by_stop_does_not_count_as_complete() -> None:
    """``stop()`` ends the run in flight early; what it committed is not all Kafka held."""
    release = threading.Event()

    class Cut(Run):
        def awaitTermination(self) -> None:
            release.wait(10)

        def stop(self) -> None:
            super().stop()
            release.set()

    starts = Starts()

    def cut(batch: object) -> Run:
        starts(batch)
        return Cut()

    query, _ = paced(cut, interval=3600)
    wait_for(lambda: len(starts.at) == 1, timeout=5)
    query.stop()
    assert query.holds_as_of is None and math.isnan(query.behind_s())


def test_the_real_time_live_path_flags_its_revisions() -> None:
    """The JVM's ``revised`` counter moving makes the next commit due, as does reading a
    batch's worth of records."""
    values = dict.fromkeys(COUNTERS, 0)
    due = CommitDue(after_ticks=1_000)
    ctx = SimpleNamespace(
        commit_due=due,
        metrics=SimpleNamespace(
            published=SimpleNamespace(labels=lambda _: SimpleNamespace(inc=lambda _: None)),
            duplicates=SimpleNamespace(labels=lambda _: SimpleNamespace(inc=lambda _: None)),
        ),
    )
    live = LiveQuery.__new__(LiveQuery)
    live.ctx, live._counted, live._stop = ctx, dict(values), threading.Event()
    live._live = SimpleNamespace(counters=lambda: ",".join(str(values[c]) for c in COUNTERS))
    poller = threading.Thread(target=live._poll, daemon=True)
    poller.start()
    try:
        values["ticks"] = values["read"] = 999
        time.sleep(0.3)
        assert not due.event.is_set()
        values["revised"] = 1
        wait_for(due.event.is_set, timeout=5)
        due.event.clear()
        values["read"] = 1_500
        wait_for(due.event.is_set, timeout=5)  # 1,000 read since the last time
        due.event.clear()
        values["read"] = 2_400
        time.sleep(0.3)
        assert not due.event.is_set()  # 900 since
    finally:
        live._stop.set()
        poller.join(2)


def _paced_runs(
    start: Callable[[pacing.BatchFunction], object],
    batch: Callable[[object, int], None],
    done: Callable[[], bool],
) -> None:
    """Real paced runs of ``start`` until ``done``; none may fail."""
    q = SimpleNamespace(name="ticks", trigger_s=0.1, batch=batch)
    query = PacedQuery(q, start, CommitDue(1), lambda _: False)  # type: ignore[arg-type]
    try:
        wait_for(done, timeout=120)
    finally:
        query.stop()
    assert query.exception() is None


def _kept_connections(spark) -> int:
    """The connections py4j's client in the JVM keeps for reuse (``CallbackClient``'s)."""
    client = spark.sparkContext._gateway.java_gateway_server.getCallbackClient()
    kept = client.getClass().getSuperclass().getDeclaredField("connections")
    kept.setAccessible(True)
    return kept.get(client).size()


def test_each_run_s_py4j_connection_ends_with_it(spark, tmp_path) -> None:
    """A run is a new query on a new JVM thread, whose call into the batch function opens a
    connection with a thread here to serve it: it must end with the run, or a job that runs
    for days keeps two more threads and sockets a minute. The thread ends only when the JVM
    closes its end, and the JVM keeps no connection of it."""
    source, serving, kept = tmp_path / "in", [], _kept_connections(spark)
    source.mkdir()

    def start(batch: pacing.BatchFunction) -> object:
        (source / f"{len(serving)}.json").write_text('{"n": 1}\n')
        df = spark.readStream.schema("n INT").json(str(source))
        return start_available_now(df, batch, tmp_path / "checkpoint")

    def batch(_df: object, _batch_id: int) -> None:
        serving.append(threading.current_thread())

    _paced_runs(start, batch, lambda: len(serving) >= 5)
    assert len(set(serving)) >= 5  # a thread of its own for each run
    wait_for(lambda: not any(t.is_alive() for t in serving), timeout=10)
    assert _kept_connections(spark) <= kept + 1


def _pooled_consumers(spark) -> int:
    """The Kafka consumers Spark's executor-side pool holds (this JVM is the executor)."""
    jvm = spark.sparkContext._jvm
    loader = jvm.java.lang.Thread.currentThread().getContextClassLoader()
    holder = loader.loadClass("org.apache.spark.sql.kafka010.consumer.KafkaDataConsumer$")
    pool = holder.getDeclaredField("consumerPool")
    pool.setAccessible(True)
    return pool.get(None).size()


def test_the_committing_query_s_runs_share_their_kafka_consumers(spark, lakehouse, tmp_path):
    """Each run is a new query, which Spark gives a consumer group of its own: without one
    named group its consumers pile up in the pool, one per partition a run, for minutes."""
    topic = f"test.paced.{uuid.uuid4().hex[:8]}"
    admin = AdminClient(client_auth(lakehouse))
    admin.create_topics([NewTopic(topic, num_partitions=2, replication_factor=1)])[topic].result()
    producers = [Producer(producer_config(lakehouse))]  # let go of at the end, not at exit
    ctx = SimpleNamespace(spark=spark, settings=lakehouse)
    asked: list[dict] = []

    def kafka(_topic: str, *args: object, **kwargs: object) -> object:
        asked.append(kwargs)
        return JobContext.kafka(ctx, topic, *args, **kwargs)  # type: ignore[arg-type]

    ticks = TicksQuery.__new__(TicksQuery)
    ticks.ctx = SimpleNamespace(settings=lakehouse, kafka=kafka)
    ticks.source()  # the job's own committing source names its group
    assert asked == [{"group": "ticks"}]
    before, runs = _pooled_consumers(spark), []

    def start(batch: pacing.BatchFunction) -> object:
        for partition in (0, 1):
            producers[0].produce(topic, b"x", partition=partition)
        producers[0].flush(10)
        return start_available_now(kafka(topic, 1000, **asked[0]), batch, tmp_path / "checkpoint")

    def batch(df, _batch_id: int) -> None:
        runs.append(df.count())

    try:
        _paced_runs(start, batch, lambda: len(runs) >= 5)
    finally:
        producers.clear()
    assert sum(runs) >= 10  # every run read what was produced before it
    assert _pooled_consumers(spark) - before <= 2, "a run's consumers were left in the pool"


def _encoder_runs(spark) -> set[str]:
    """The query runs of the encoders in the RocksDB state store's static cache, in this JVM
    (the executor's)."""
    jvm = spark.sparkContext._jvm
    loader = jvm.java.lang.Thread.currentThread().getContextClassLoader()
    holder = loader.loadClass(
        "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider$"
    )
    field = holder.getDeclaredField("dataEncoderCache")
    field.setAccessible(True)
    keys = field.get(None).cache().asMap().keySet().toArray()
    return {key.queryRunId() for key in keys}


def test_the_committing_query_s_runs_leave_no_state_encoders_behind(spark, lakehouse, tmp_path):
    """Each run is a new query run, for which Spark's RocksDB state store caches an encoder per
    partition, each holding the last feed state it decoded, for an hour after its last use: a
    run's first task here lets go of the older runs' (the soak's heap grew 20 MB every eight
    minutes with them)."""
    topic = f"test.paced.{uuid.uuid4().hex[:8]}"
    admin = AdminClient(client_auth(lakehouse))
    admin.create_topics([NewTopic(topic, num_partitions=2, replication_factor=1)])[topic].result()
    producer = Producer(producer_config(lakehouse))
    ctx = SimpleNamespace(spark=spark, settings=lakehouse)
    ticks = TicksQuery.__new__(TicksQuery)  # the job's own committing source, on this topic
    ticks.ctx = SimpleNamespace(
        settings=lakehouse,
        kafka=lambda _topic, *a, **kw: JobContext.kafka(ctx, topic, *a, **kw),  # type: ignore[arg-type]
    )
    started: list[str] = []
    judged: list[int] = []

    def start(batch: pacing.BatchFunction) -> object:
        for partition in (0, 1):
            tick = market_pb2.Tick(
                ticker=f"SIM:P{partition}/USD",
                trade_id=str(len(started)),
                price="1.5",
                size="2",
                exchange_time_ns=1_700_000_000_000_000_000 + len(started),
            )
            producer.produce(topic, to_record(tick), partition=partition)
        producer.flush(10)
        run = start_available_now(ticks.source(), batch, tmp_path / "checkpoint")
        started.append(run.runId)
        return run

    def batch(df, _batch_id: int) -> None:
        judged.append(df.where(f"kind = {TICK}").count())

    _paced_runs(start, batch, lambda: len(judged) >= 4)
    assert sum(judged) >= 8  # each run judged the two ticks produced before it
    runs = _encoder_runs(spark)
    assert runs, "the committing plan's state store made no encoders"
    # The last run that judged a batch (a run that found nothing new made none).
    assert len(runs) == 1, f"{len(runs)} runs' encoders stayed in the cache"
    assert runs <= set(started)
