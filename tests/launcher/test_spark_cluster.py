"""``spark_workers = 2``: a Spark standalone master and two workers from pyspark's own jars,
and the project's Spark sessions running on them: executors on both workers reach Kafka and
the Iceberg warehouse, and a job outlives ``kill -9`` of a worker."""

from __future__ import annotations

import os
import signal
import threading
import time
import uuid
from collections.abc import Iterator

import pytest

from candlewire.config import Settings
from candlewire.kafka import spark_options
from candlewire.lake import catalog, table_name
from candlewire.spark import build_session
from candlewire.testing import free_settings, wait_for
from launcher.local.spark import count_alive, master_workers
from launcher.stack import ProcessService, Stack, spark_services
from tests.candlewire.test_kafka import new_topic, produce
from tests.journal.test_journal import kafka_servers


@pytest.fixture(scope="module")
def cluster(tmp_path_factory, lakehouse, kafka) -> Iterator[tuple[Settings, list[ProcessService]]]:
    settings = free_settings(
        tmp_path_factory.mktemp("spark-cluster"),
        spark_workers=2,
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
