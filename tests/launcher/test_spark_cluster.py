"""``spark_workers = 2``: a Spark standalone master and two workers from pyspark's own jars,
and the project's Spark sessions running on them: executors on both workers reach Kafka and
the Iceberg warehouse, a job outlives ``kill -9`` of a worker, and the committing query
judges and folds candles on the executors, not the driver."""

from __future__ import annotations

import json
import os
import signal
import threading
import time
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka import Producer

from candlewire.config import PERIODS_S, Settings
from candlewire.kafka import producer_config, spark_options
from candlewire.lake import NAMESPACE, catalog, table_name
from candlewire.spark import build_session, class_archive
from candlewire.testing import free_settings, maps_file, wait_for
from launcher.local.spark import count_alive, master_workers
from launcher.stack import ProcessService, Stack, spark_services
from proto.envelope import to_record
from streaming.context import JobContext
from streaming.queries.ticks import JUDGE_JOB, TicksQuery
from streaming.recovery import Ledger
from streaming.sql import literals
from tests.candlewire.test_kafka import new_topic, produce
from tests.journal.test_journal import kafka_servers
from tests.streaming.test_job import assert_candles, make_ticks, with_resends


@pytest.fixture(scope="module")
def cluster(tmp_path_factory, lakehouse, kafka) -> Iterator[tuple[Settings, list[ProcessService]]]:
    settings = free_settings(
        tmp_path_factory.mktemp("spark-cluster"),
        spark_workers=2,
        spark_ui=True,  # the REST API says where a stage's tasks ran
        kafka_bootstrap=kafka_servers(kafka),
        catalog_url=lakehouse.catalog_db(),
        warehouse=lakehouse.warehouse_uri(),
    )
    stack = Stack(settings, spark_services(settings))
    try:
        stack.up(echo=lambda _: None)
        yield settings, stack.services
    finally:
        stack.down(echo=lambda _: None)


@pytest.fixture(scope="module")
def spark(cluster):
    session = build_session(cluster[0], "candlewire-cluster-tests")
    yield session
    session.stop()


def workers(settings: Settings) -> list[dict]:
    return master_workers(f"http://{settings.host}:{settings.port('spark_master_ui')}/json/")


def test_sessions_run_on_the_standalone_master_with_an_executor_per_worker(cluster, spark) -> None:
    settings, _ = cluster
    assert spark.sparkContext.master == f"spark://127.0.0.1:{settings.port('spark_master')}"
    executors = lambda: spark.sparkContext._jsc.sc().statusTracker().getExecutorInfos()  # noqa: E731
    wait_for(lambda: len(executors()) == 3, timeout=60)  # the driver and one per worker
    assert {w["state"] for w in workers(settings)} == {"ALIVE"}
    # Every JVM of the cluster maps the driver's class archive: the master, the workers and
    # the executors they started (which run in the workers' work directories).
    archive = class_archive(settings)
    daemons = [service.pid() for service in cluster[1]]
    assert len(daemons) == 3 and all(maps_file(pid, archive) for pid in daemons)
    # Two once any extra has exited: the clean-clone run of c1e277d found three executor
    # JVMs once while the driver knew two (likely one the master replaced, still exiting).
    work = settings.state_dir / "spark"
    wait_for(lambda: len(executor_pids(work)) == 2, timeout=60, interval=0.5)
    assert all(maps_file(pid, archive) for pid in executor_pids(work))


def executor_pids(work_dir: Path) -> list[int]:
    """The executor JVMs working under ``work_dir``."""
    pids = []
    for proc in Path("/proc").iterdir():
        try:
            if (
                proc.name.isdigit()
                and (proc / "cwd").resolve().is_relative_to(work_dir)
                and b"CoarseGrainedExecutorBackend" in (proc / "cmdline").read_bytes()
            ):
                pids.append(int(proc.name))
        except OSError:
            continue
    return pids


def test_executors_read_kafka_and_write_iceberg(cluster, spark) -> None:
    settings, _ = cluster
    topic = new_topic(settings, partitions=4)
    values = [f"trade-{i}" for i in range(400)]
    produce(settings, topic, [v.encode() for v in values])
    name = f"cluster_{uuid.uuid4().hex[:8]}"
    target = table_name(settings, name)
    (
        spark.read.format("kafka")
        .options(**spark_options(settings))
        .option("subscribe", topic)
        .option("startingOffsets", "earliest")
        .load()
        .selectExpr("CAST(value AS STRING) AS v", "partition")
        .repartition(4)
        .writeTo(target)
        .create()
    )
    rows = catalog(settings).load_table(f"market.{name}").scan().to_arrow()
    assert sorted(rows.column("v").to_pylist()) == sorted(values)
    spark.sql(f"DROP TABLE {target} PURGE")


def rest(url: str) -> object:
    """A Spark REST API answer (a long plan list takes seconds to write)."""
    with urllib.request.urlopen(url, timeout=60) as r:
        return json.loads(r.read())


def judging_executors(spark) -> set[str]:
    """The executors that ran the committing query's stateful judging: the stage of each
    judging job (named by the query) that reads its shuffle, from the driver's REST API."""
    api = f"{spark.sparkContext.uiWebUrl}/api/v1/applications/{spark.sparkContext.applicationId}"
    stages = {
        s
        for job in rest(f"{api}/jobs")
        if job.get("description", "").startswith(JUDGE_JOB)
        for s in job["stageIds"]
    }
    return {
        t["executorId"]
        for s in stages
        for attempt in rest(f"{api}/stages/{s}?details=true")
        if attempt["shuffleReadRecords"] > 0
        for t in attempt.get("tasks", {}).values()
    }


def test_the_committing_query_judges_on_the_executors_and_its_candles_equal_pandas(
    cluster, spark
) -> None:
    settings, _ = cluster
    topic = new_topic(settings, partitions=4)
    tickers = [f"TEST:K{i}{uuid.uuid4().hex[:5].upper()}/USDT" for i in range(6)]
    start = int(time.time() * 1000) // 3_600_000 * 3_600_000 - 2 * 3_600_000
    ticks = {t: make_ticks(t, start, 400, seed=i) for i, t in enumerate(tickers)}
    producer = Producer(producer_config(settings))

    def send(part: slice) -> None:
        for t, trades in ticks.items():
            for tick in with_resends(trades[part], seed=7, earlier=trades[: part.start or 0]):
                producer.produce(topic, key=t.encode(), value=to_record(tick))
        assert producer.flush(30) == 0

    began_ms = int(time.time() * 1000)
    send(slice(0, 200))  # two batches at least, so the rewrites have MERGEs to compact
    # Compacting after every candle MERGE: the rewrites must leave every candle as it was.
    ctx = JobContext.open(settings.model_copy(update={"stream_ohlc_compact_s": 0.01}), spark)
    ledger = Ledger(ctx)
    query = TicksQuery(ctx, ledger, ledger.restore())
    query.topic = topic
    running = (
        query.source()
        .writeStream.foreachBatch(query.batch)
        .option("checkpointLocation", query.checkpoint)
        .trigger(processingTime="1 second")
        .start()
    )
    ohlc = catalog(settings).load_table(f"{NAMESPACE}.ohlc")

    def counted(n: int) -> bool:
        ohlc.refresh()
        got = ohlc.scan(row_filter=f"period_s = 60 and ticker in ({literals(tickers)})")
        return sum(got.to_arrow()["trade_count"].to_pylist()) == n * len(tickers)

    def rewritten() -> bool:
        ohlc.refresh()
        return any(
            s.summary and s.summary.operation.value == "replace" and s.timestamp_ms > began_ms
            for s in ohlc.snapshots()
        )

    try:
        wait_for(lambda: counted(200), timeout=240, interval=2.0)
        send(slice(200, 400))
        wait_for(lambda: counted(400), timeout=240, interval=2.0)
        wait_for(rewritten, timeout=120, interval=1.0)  # after the last MERGE, in its batch
    finally:
        running.stop()
        ctx.publisher.close()
    for t, trades in ticks.items():
        for period in PERIODS_S:
            assert_candles(ohlc, t, trades, period)
    executors = judging_executors(spark)
    # An executor on each worker, never the driver.
    assert len(executors) == 2 and "driver" not in executors, executors


def test_a_job_outlives_kill_9_of_a_worker(cluster, spark) -> None:
    settings, services = cluster
    result: list[int] = []

    def slow_square(x: int) -> int:  # defined here: pickled by value, as executors need
        time.sleep(0.02)
        return x * x

    job = spark.sparkContext.parallelize(range(600), 24).map(slow_square)
    runner = threading.Thread(target=lambda: result.append(job.sum()))
    runner.start()
    time.sleep(2)  # tasks on both workers
    victim = services[2]
    pid = victim.pid()
    assert pid is not None and runner.is_alive(), "the job must still be running"
    os.killpg(pid, signal.SIGKILL)  # the worker and the executor it launched
    runner.join(180)
    assert result == [sum(x * x for x in range(600))]
    wait_for(lambda: count_alive(workers(settings)) == 1, timeout=90)
