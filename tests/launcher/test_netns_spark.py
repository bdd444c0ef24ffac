"""The data platform's distributed engines on hosts of their own (network namespaces): three
Kafka brokers, S3Proxy, a Spark standalone master and two workers; the driver (this test)
runs a Kafka → Iceberg-on-S3 job on them and ``kill -9``s a worker and then a broker in the
middle of it: every record is written once. ``make scale`` runs it (root; a few minutes)."""

from __future__ import annotations

import os
import signal
import threading
import time
import uuid

import pytest
from confluent_kafka.admin import AdminClient, NewTopic

from bench.scale import MASTER_PORT, kafka_bootstrap, start_kafka, start_s3, start_spark
from candlewire.kafka import client_auth, spark_options
from candlewire.lake import catalog, ensure_tables, storage_health, table_name
from candlewire.spark import build_session
from candlewire.testing import free_settings, wait_for
from launcher.netns import Lab
from tests.candlewire.test_kafka import produce

pytestmark = [
    pytest.mark.scale,
    pytest.mark.skipif(Lab.available() is not None, reason=str(Lab.available())),
]
SUBNET = "10.79.0"
SECRET = "netns-" + uuid.uuid4().hex
RECORDS = 1200


def test_a_job_on_the_cluster_outlives_a_worker_and_a_broker(tmp_path, lakehouse) -> None:
    os.environ["CANDLEWIRE_SECRET_S3_SECRET_KEY"] = SECRET
    try:
        with Lab(prefix="cws", subnet=SUBNET) as lab:
            for name in (
                "kafka-1",
                "kafka-2",
                "kafka-3",
                "s3",
                "spark-master",
                "spark-1",
                "spark-2",
            ):
                lab.add(name)
            procs = start_kafka(lab, tmp_path)
            endpoint = start_s3(lab, tmp_path, SECRET)
            procs |= start_spark(lab, tmp_path)
            settings = free_settings(
                tmp_path / "driver",
                host=lab.gateway,  # the driver: executors on the workers' hosts call it here
                bind_host=lab.gateway,
                spark_master=f"spark://{lab.hosts['spark-master'].address}:{MASTER_PORT}",
                kafka_bootstrap=kafka_bootstrap(lab),
                warehouse="s3://lake/warehouse",
                s3={"endpoint": endpoint},
                catalog_name="candlewire_netns",
                catalog_url=lakehouse.catalog_db(),  # the JDBC catalog: the driver's only
            )
            wait_for(lambda: storage_health(settings) is None, timeout=60)
            ensure_tables(settings)
            spark = build_session(settings, "candlewire-netns-spark")
            try:
                tracker = spark.sparkContext._jsc.sc().statusTracker()
                wait_for(lambda: len(tracker.getExecutorInfos()) == 3, timeout=120)
                run(lab, settings, spark, procs)
            finally:
                spark.stop()
            for host in ("spark-2", "s3", "kafka-1"):
                assert lab.stray(host) == [], host
    finally:
        del os.environ["CANDLEWIRE_SECRET_S3_SECRET_KEY"]


def run(lab: Lab, settings, spark, procs) -> None:
    topic = f"netns-{uuid.uuid4().hex[:8]}"  # on every broker: one may die under the job
    admin = AdminClient(client_auth(settings))
    replicated = NewTopic(topic, 6, 3, config={"min.insync.replicas": "2"})
    admin.create_topics([replicated])[topic].result()
    values = [f"trade-{i}" for i in range(RECORDS)]
    produce(settings, topic, [v.encode() for v in values])
    name = f"netns_{uuid.uuid4().hex[:8]}"

    def slow(v: str) -> str:  # pickled by value: the executors run it
        time.sleep(0.01)
        return v

    from pyspark.sql.functions import udf

    source = (
        spark.read.format("kafka")
        .options(**spark_options(settings))
        .option("subscribe", topic)
        .option("startingOffsets", "earliest")
        .load()
        .selectExpr("CAST(value AS STRING) AS v")
        .repartition(12)
        .select(udf(slow, "string")("v").alias("v"))
    )
    failed: list[BaseException] = []

    def write() -> None:
        try:
            source.writeTo(table_name(settings, name)).create()
        except BaseException as exc:
            failed.append(exc)

    job = threading.Thread(target=write)
    job.start()
    time.sleep(6.0)
    assert job.is_alive(), "the job must still be running when the worker dies"
    os.killpg(procs["spark-1"].pid, signal.SIGKILL)
    time.sleep(2.0)
    os.killpg(procs["kafka-2"].pid, signal.SIGKILL)
    job.join(300)
    assert not job.is_alive() and not failed, failed
    got = catalog(settings).load_table(f"market.{name}").scan().to_arrow().column("v").to_pylist()
    assert sorted(got) == sorted(values)
