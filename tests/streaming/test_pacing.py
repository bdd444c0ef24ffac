"""The committing query's pace (streaming.pacing): one long-running query, started again
between batches soon after the live path revised a candle or once it has read a burst; a
failed run ends the query with its error unless it may start again."""

from __future__ import annotations

import math
import threading
import time
import uuid
from collections.abc import Callable
from datetime import UTC, datetime
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
from streaming.pacing import CommitDue, PacedQuery, start_every
from streaming.queries.live import COUNTERS, LiveQuery
from streaming.queries.ticks import TICK, TicksQuery


def _progress(began: float, end: dict, latest: dict | None) -> dict:
    """A StreamingQueryProgress as PySpark's ``lastProgress`` gives it: its trigger began at
    ``began`` (time.time()), each offset the ``str()`` of its JSON."""
    stamp = datetime.fromtimestamp(began, UTC).isoformat(timespec="milliseconds")
    return {
        "timestamp": stamp.replace("+00:00", "Z"),
        "sources": [{"endOffset": str(end), "latestOffset": str(latest)}],
    }


class Run:
    """A running StreamingQuery: active until stopped, or failed with ``error``; its
    ``lastProgress`` and ``status`` are what the test sets."""

    def __init__(self, error: Exception | None = None) -> None:
        self.error, self.stopped = error, False
        # Its first trigger has reported, and caught up with nothing.
        self.lastProgress: dict | None = _progress(0.0, {"t": {"0": 0}}, {"t": {"0": 1}})
        self.status = {"isTriggerActive": False}

    @property
    def isActive(self) -> bool:
        return not self.stopped and self.error is None

    def exception(self) -> Exception | None:
        return self.error

    def stop(self) -> None:
        self.stopped = True


class Starts:
    """The runs started, when, and the batch function each was given."""

    def __init__(self, errors: list[Exception | None] | None = None, kind: type = Run) -> None:
        self.at: list[float] = []
        self.runs: list[Run] = []
        self.errors, self.kind = list(errors or []), kind
        self.batch: Callable[[object, int], None] | None = None

    def __call__(self, batch: Callable[[object, int], None]) -> Run:
        self.batch = batch
        self.runs.append(self.kind(self.errors.pop(0) if self.errors else None))
        self.at.append(time.monotonic())  # last: what the tests wait on
        return self.runs[-1]


def paced(
    starts: Callable[[object], Run],
    due: CommitDue | None = None,
    retry=lambda _: False,
    batch=lambda _df, _id: None,
    trigger_s: float = 3600,
) -> tuple[PacedQuery, CommitDue]:
    due = due or CommitDue(after_ticks=1)
    q = SimpleNamespace(name="ticks", trigger_s=trigger_s, batch=batch)
    return PacedQuery(q, starts, due, retry), due  # type: ignore[arg-type]


@pytest.fixture(autouse=True)
def quick(monkeypatch) -> None:
    monkeypatch.setattr(pacing, "SETTLE_S", 0.05)
    monkeypatch.setattr(pacing, "HURRY_GAP_S", 0.2)
    monkeypatch.setattr(pacing, "QUIET_S", 0.3)
    monkeypatch.setattr(pacing, "BURST_WAIT_S", 2.0)
    monkeypatch.setattr(pacing, "WATCH_S", 0.05)
    monkeypatch.setattr(pacing, "TRIGGER_LEAD_S", 0.3)
    monkeypatch.setattr(pacing, "TRIGGER_WAIT_S", 0.4)


def test_one_run_commits_at_every_trigger_until_stopped() -> None:
    """Nothing due: the query is one run (the trigger's own pace), stopped with the query."""
    starts = Starts()
    query, _ = paced(starts)
    try:
        wait_for(lambda: len(starts.at) == 1, timeout=5)
        for batch_id in range(3):
            starts.batch(None, batch_id)  # type: ignore[misc]
        time.sleep(0.5)
        assert len(starts.at) == 1 and not starts.runs[0].stopped
        assert query.isActive and query.exception() is None
    finally:
        began = time.monotonic()
        query.stop()
    assert time.monotonic() - began < 5  # not waiting out the interval
    assert starts.runs[0].stopped and not query.isActive


def test_a_revised_candle_starts_a_run_between_batches() -> None:
    """A revised candle stops the run for a new one, whose first batch comes at once: no
    sooner than the gap after the last batch, and never in the middle of one, nor while Spark
    plans one."""
    in_batch, release = threading.Event(), threading.Event()

    def batch(_df: object, _batch_id: int) -> None:
        in_batch.set()
        release.wait(10)

    starts = Starts()
    query, due = paced(starts, batch=batch)
    try:
        wait_for(lambda: len(starts.at) == 1, timeout=5)
        due.revised()
        wait_for(lambda: len(starts.at) == 2, timeout=5)
        assert starts.runs[0].stopped
        first = starts.batch
        running = threading.Thread(target=first, args=(None, 0))  # type: ignore[arg-type]
        running.start()
        in_batch.wait(5)
        due.revised()  # during the batch: its trade may have come after the batch's end
        time.sleep(0.5)
        assert len(starts.at) == 2 and not starts.runs[1].stopped  # not cut
        release.set()
        running.join(5)
        wait_for(lambda: len(starts.at) == 3, timeout=5)
        assert starts.at[2] - query._batch_ended >= pacing.HURRY_GAP_S  # the gap after it
        planning = starts.runs[2].status
        planning["isTriggerActive"] = True  # a batch planned, its function not yet called
        due.revised()
        time.sleep(0.8)
        assert len(starts.at) == 3 and not starts.runs[2].stopped
        planning["isTriggerActive"] = False
        wait_for(lambda: len(starts.at) == 4, timeout=5)
        starts.runs[3].lastProgress = None  # starting: its first trigger has not reported
        due.revised()
        time.sleep(0.8)
        assert len(starts.at) == 4 and not starts.runs[3].stopped
        starts.runs[3].lastProgress = _progress(0.0, {"t": {"0": 0}}, {"t": {"0": 1}})
        wait_for(lambda: len(starts.at) == 5, timeout=5)
    finally:
        release.set()
        query.stop()


class TimedRun(Run):
    """A run that notes when (time.time()) it was stopped."""

    stopped_at = math.nan

    def stop(self) -> None:
        self.stopped_at = time.time()
        super().stop()


def test_a_trigger_is_near_just_before_its_time_and_until_it_reports() -> None:
    """The epoch's multiples of the interval, as Spark's processing-time trigger fires on."""
    near = pacing._trigger_near
    assert near(30, 59.8, reported=30.0)  # 0.2 s before 60 (TRIGGER_LEAD_S: 0.3)
    assert not near(30, 59.5, reported=30.0)
    assert near(30, 60.2, reported=30.0)  # its time came; it has not reported
    assert not near(30, 60.2, reported=60.004)  # it reported
    assert not near(30, 60.5, reported=30.0)  # waited long enough (TRIGGER_WAIT_S)
    assert not near(1.0, 59.9, reported=0.0)  # too short an interval to wait for one


def _hurry_at(lead_s: float, every_s: float) -> float:
    """Sleeps until ``lead_s`` before a multiple of ``every_s`` (again if it overslept by more
    than 0.1 s); that multiple."""
    while True:
        time.sleep((-lead_s - time.time()) % every_s)
        now = time.time()
        if lead_s - 0.1 <= -now % every_s <= lead_s:
            return math.ceil(now / every_s) * every_s


def test_a_hurry_waits_for_the_run_s_own_trigger_to_fire_and_report(monkeypatch) -> None:
    """A hurry due just before the run's own trigger waits for it to fire (on the epoch's
    multiples of the interval, as Spark's): a stop as it fires cuts the batch Spark plans. Once
    the trigger has reported, and taken nothing that was due, the run stops. One that never
    reports is waited for a while, then stopped."""
    monkeypatch.setattr(pacing, "TRIGGER_WAIT_S", 0.6)  # the time the test has to report
    starts = Starts(kind=TimedRun)
    query, due = paced(starts, trigger_s=2.0)
    try:
        wait_for(lambda: len(starts.at) == 1, timeout=5)
        trigger = _hurry_at(0.25, 2.0)  # the hurry is ready 0.2 s before it
        due.revised()
        time.sleep(max(0.0, trigger + 0.15 - time.time()))
        assert not starts.runs[0].stopped  # its time came: it may be planning
        starts.runs[0].lastProgress = _progress(trigger + 0.01, {"t": {"0": 0}}, {"t": {"0": 1}})
        wait_for(lambda: len(starts.at) == 2, timeout=5)
        assert trigger + 0.01 <= starts.runs[0].stopped_at < trigger + pacing.TRIGGER_WAIT_S

        trigger = _hurry_at(0.25, 2.0)  # again, and this run's trigger never reports
        due.revised()
        wait_for(lambda: len(starts.at) == 3, timeout=5)
        assert starts.runs[1].stopped_at >= trigger + pacing.TRIGGER_WAIT_S
    finally:
        query.stop()


def test_a_batch_takes_a_burst_flagged_before_it_and_a_revision_once_it_caught_up(
    monkeypatch,
) -> None:
    """A batch that begins takes what the live path has read: the burst needs no run of its
    own. A revised candle needs one until a batch whose trigger began after it caught up with
    Kafka: its trade may have reached Kafka after an earlier batch fixed its end. Nor does an
    earlier trigger take a later revision."""
    monkeypatch.setattr(pacing, "HURRY_GAP_S", 1.0)  # the time the test has to report
    starts = Starts()
    due = CommitDue(after_ticks=1_000)
    query, _ = paced(starts, due=due)
    try:
        wait_for(lambda: len(starts.at) == 1, timeout=5)
        run, caught_up = starts.runs[0], {"t": {"0": 7}}
        due.read(1_000)
        starts.batch(None, 0)  # type: ignore[misc]
        time.sleep(1.5)  # past the quiet, the settling and the gap
        assert len(starts.at) == 1
        starts.batch(None, 1)  # type: ignore[misc]
        due.revised()
        time.sleep(0.01)  # a trigger that began after it (the stamp is in milliseconds)
        run.lastProgress = _progress(time.time(), caught_up, caught_up)  # within the gap
        time.sleep(1.5)
        assert len(starts.at) == 1
        starts.batch(None, 2)  # type: ignore[misc]
        due.revised()
        time.sleep(0.01)
        trigger = time.time()  # a trigger that began after the first revision
        time.sleep(0.01)
        due.revised()  # and before this one: it may have missed its trade
        run.lastProgress = _progress(trigger, caught_up, caught_up)
        wait_for(lambda: len(starts.at) == 2, timeout=5)
    finally:
        query.stop()


def test_a_run_brought_forward_by_a_burst_waits_until_the_live_path_has_read_it() -> None:
    """A batch's worth of ticks read brings a run forward, but not while the live path is
    still reading the burst: the run then takes all of it at once. A burst that does not
    pause is committed ``BURST_WAIT_S`` after it was due; a revised candle ends the wait."""
    starts = Starts()
    due = CommitDue(after_ticks=1_000)
    query, _ = paced(starts, due=due)

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


def test_a_failed_run_ends_the_query_unless_it_may_start_again() -> None:
    boom = RuntimeError("SPARK-55271")
    starts = Starts([boom, boom])
    query, _ = paced(starts, retry=lambda e: e is boom)
    try:
        wait_for(lambda: len(starts.at) == 3, timeout=5)  # it started again, twice
        time.sleep(0.3)
        assert len(starts.at) == 3 and query.isActive  # and the third runs on
    finally:
        query.stop()
    fatal = RuntimeError("disk full")
    starts = Starts([fatal])
    query, _ = paced(starts)
    wait_for(lambda: not query.isActive, timeout=5)
    assert query.exception() is fatal and len(starts.at) == 1

    class FailsAtStop(Run):
        def stop(self) -> None:
            super().stop()
            self.error = fatal  # it failed as the hurry came

    failing = Starts(kind=FailsAtStop)
    query, due = paced(failing)
    wait_for(lambda: len(failing.at) == 1, timeout=5)
    due.revised()
    wait_for(lambda: not query.isActive, timeout=5)
    assert query.exception() is fatal and len(failing.at) == 1

    class Unreadable(Run):
        @property
        def status(self) -> dict:
            raise fatal  # the pacing's own call into the query fails

        @status.setter
        def status(self, _value: dict) -> None:
            pass

    unreadable = Starts(kind=Unreadable)
    query, due = paced(unreadable)
    wait_for(lambda: len(unreadable.at) == 1, timeout=5)
    due.revised()
    wait_for(lambda: not query.isActive, timeout=5)
    assert query.exception() is fatal

    def refused(_batch: object) -> Run:
        raise fatal

    query, _ = paced(refused)
    wait_for(lambda: not query.isActive, timeout=5)
    assert query.exception() is fatal


def test_how_far_iceberg_is_behind_counts_from_the_last_trigger_that_caught_up() -> None:
    """``candlewire_stream_iceberg_behind_seconds``: a batch (or an idle trigger) that ended at
    Kafka's latest offsets makes Iceberg hold what Kafka held when its trigger began; a batch
    that took only the most it may, or none reported, moves nothing."""
    starts = Starts()
    query, _ = paced(starts)
    try:
        wait_for(lambda: len(starts.at) == 1, timeout=5)
        time.sleep(0.2)
        assert math.isnan(query.behind_s())  # no batch has completed
        run, began = starts.runs[0], time.time() - 3.0
        run.lastProgress = _progress(began, {"t": {"0": 7}}, {"t": {"0": 7}})
        wait_for(lambda: query.holds_as_of is not None, timeout=5)
        assert 2.9 < query.behind_s() < 3.5  # its trigger's start, not now
        as_of = query.holds_as_of
        run.lastProgress = _progress(time.time(), {"t": {"0": 9}}, {"t": {"0": 12}})  # capped
        time.sleep(0.3)
        assert query.holds_as_of == as_of
        run.lastProgress = _progress(time.time(), {"t": {"0": 12}}, None)  # no latest known
        time.sleep(0.3)
        assert query.holds_as_of == as_of
        run.lastProgress = _progress(time.time(), None, None)  # no offsets at all
        time.sleep(0.3)
        assert query.holds_as_of == as_of
        run.lastProgress = _progress(time.time() - 0.5, {"t": {"0": 12}}, {"t": {"0": 12}})
        wait_for(lambda: query.holds_as_of != as_of, timeout=5)  # idle, and caught up
        assert 0.5 <= query.behind_s() < 1.0
    finally:
        query.stop()


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
    hurried: bool = True,
) -> PacedQuery:
    """Real runs of ``start``, a batch every 0.1 s, until ``done``; none may fail. ``hurried``:
    each batch revises a candle, so a new run starts after it."""
    due = CommitDue(10**9)

    def each(df: object, batch_id: int) -> None:
        batch(df, batch_id)
        if hurried:
            due.revised()

    q = SimpleNamespace(name="ticks", trigger_s=0.1, batch=each)
    query = PacedQuery(q, start, due, lambda _: False)  # type: ignore[arg-type]
    try:
        wait_for(done, timeout=120)
    finally:
        query.stop()
    assert query.exception() is None
    return query


def _kept_connections(spark) -> int:
    """The connections py4j's client in the JVM keeps for reuse (``CallbackClient``'s)."""
    client = spark.sparkContext._gateway.java_gateway_server.getCallbackClient()
    kept = client.getClass().getSuperclass().getDeclaredField("connections")
    kept.setAccessible(True)
    return kept.get(client).size()


def test_each_run_s_py4j_connection_ends_with_it(spark, tmp_path) -> None:
    """A run is a new query on a new JVM thread, whose call into the batch function opens a
    connection with a thread here to serve it: it must end with the run, or a job whose
    commits are hurried for days keeps two more threads and sockets with each. The thread ends
    only when the JVM closes its end, and the JVM keeps no connection of it."""
    source, serving, kept = tmp_path / "in", [], _kept_connections(spark)
    source.mkdir()

    def start(batch: pacing.BatchFunction) -> object:
        (source / f"{len(serving)}.json").write_text('{"n": 1}\n')
        df = spark.readStream.schema("n INT").json(str(source))
        return start_every(df, batch, tmp_path / "checkpoint", 0.1)

    def batch(_df: object, _batch_id: int) -> None:
        serving.append(threading.current_thread())

    _paced_runs(start, batch, lambda: len(serving) >= 5)
    assert len(set(serving)) >= 5  # a thread of its own for each run
    assert pacing.jvm_caller() is None  # no JVM thread called this one: nothing to end
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


def _topic(settings) -> str:
    topic = f"test.paced.{uuid.uuid4().hex[:8]}"
    admin = AdminClient(client_auth(settings))
    admin.create_topics([NewTopic(topic, num_partitions=2, replication_factor=1)])[topic].result()
    return topic


def test_the_committing_query_s_runs_share_their_kafka_consumers(spark, lakehouse, tmp_path):
    """Each run is a new query, which Spark gives a consumer group of its own: without one
    named group its consumers pile up in the pool, one per partition a run, for minutes."""
    topic = _topic(lakehouse)
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
        return start_every(kafka(topic, 1000, **asked[0]), batch, tmp_path / "checkpoint", 0.1)

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


class Committing:
    """The job's own committing source on a topic of two partitions, a tick in each per
    :meth:`produce`, and what its batches judged."""

    def __init__(self, spark, settings) -> None:
        self.spark, self.topic = spark, _topic(settings)
        self.producer = Producer(producer_config(settings))
        ctx = SimpleNamespace(spark=spark, settings=settings)
        self.ticks = TicksQuery.__new__(TicksQuery)
        self.ticks.ctx = SimpleNamespace(
            settings=settings,
            kafka=lambda _topic, *a, **kw: JobContext.kafka(ctx, self.topic, *a, **kw),  # type: ignore[arg-type]
        )
        self.produced = 0
        self.judged: list[int] = []
        self.runs: list[str] = []  # each batch's query run
        self.judged_at = -math.inf  # time.monotonic() at the last batch's end

    def produce(self) -> None:
        for partition in (0, 1):
            tick = market_pb2.Tick(
                ticker=f"SIM:P{partition}/USD",
                trade_id=str(self.produced),
                price="1.5",
                size="2",
                exchange_time_ns=1_700_000_000_000_000_000 + self.produced,
            )
            self.producer.produce(self.topic, to_record(tick), partition=partition)
        self.producer.flush(10)
        self.produced += 1

    def batch(self, df, _batch_id: int) -> None:
        # StreamExecution names its jobs' group by the run: on this, the run's own thread.
        self.runs.append(self.spark.sparkContext.getLocalProperty("spark.jobGroup.id"))
        self.judged.append(df.where(f"kind = {TICK}").count())
        self.judged_at = time.monotonic()


def test_the_committing_query_s_runs_leave_no_state_encoders_behind(spark, lakehouse, tmp_path):
    """Each run is a new query run, for which Spark's RocksDB state store caches an encoder per
    partition, each holding the last feed state it decoded, for an hour after its last use: a
    run's first task here lets go of the older runs' (the soak's heap grew 20 MB every eight
    minutes with them, when each commit was a run)."""
    committing, started = Committing(spark, lakehouse), []

    def start(batch: pacing.BatchFunction) -> object:
        committing.produce()
        run = start_every(committing.ticks.source(), batch, tmp_path / "checkpoint", 0.1)
        started.append(run.runId)
        return run

    _paced_runs(start, committing.batch, lambda: len(committing.judged) >= 4)
    assert sum(committing.judged) >= 8  # each run judged the two ticks produced before it
    runs = _encoder_runs(spark)
    assert runs, "the committing plan's state store made no encoders"
    # The last run that judged a batch (a run that found nothing new made none).
    assert len(runs) == 1, f"{len(runs)} runs' encoders stayed in the cache"
    assert runs <= set(started)


def test_the_committing_query_unhurried_judges_every_batch_in_one_run(spark, lakehouse, tmp_path):
    """Nothing due early: every batch of the committing plan is judged in one query run, so
    its state store opens its RocksDB instances once, not once a commit. Spark 4.1's leak
    some 500 KiB of native memory each (SPARK-56523): the soak's RSS grew 4 MiB a minute when
    each commit was a run of its own."""
    committing = Committing(spark, lakehouse)

    def start(batch: pacing.BatchFunction) -> object:
        return start_every(committing.ticks.source(), batch, tmp_path / "checkpoint", 0.1)

    def more() -> bool:
        """Ticks produced four times, each once the ones before were judged and a hurry
        would have had the time to start a run."""
        judged = sum(committing.judged)
        quiet = time.monotonic() - committing.judged_at > 4 * pacing.HURRY_GAP_S
        if judged == 2 * committing.produced < 8 and quiet:
            committing.produce()
        return judged == 8

    began = time.monotonic()
    query = _paced_runs(start, committing.batch, more, hurried=False)
    assert len(committing.judged) >= 4
    assert query.runs == 1 and len(set(committing.runs)) == 1
    # Spark's own progress: the last batch ended at Kafka's latest offsets.
    assert query.holds_as_of is not None and query.holds_as_of > began
    assert _encoder_runs(spark) == set(committing.runs)
