"""Spark's Kafka source as a yardstick: how fast it reads a topic here, with or without a
decode. bench.stream and bench.spark_floor measure against it in the same run."""

from __future__ import annotations

import os
import time
from collections.abc import Callable

from pyspark.sql import DataFrame, SparkSession

from bench.stats import machine_busy_s
from candlewire.config import Settings


def kafka_source(
    spark: SparkSession, settings: Settings, topic: str, stream: bool, starting: str = "earliest"
) -> DataFrame:
    reader = spark.readStream if stream else spark.read
    return (
        reader.format("kafka")
        .option("kafka.bootstrap.servers", settings.kafka_servers())
        .option("subscribe", topic)
        .option("startingOffsets", starting)
        .load()
    )


def read_rate(frame: Callable[[], DataFrame], label: str, runs: int = 3) -> int:
    """Records/s of counting ``frame()``, best of ``runs`` (the first pays for JIT and
    connections). It also prints how many of the machine's cores the best run kept busy,
    beyond what they were busy with for a second before (the broker's share included): an
    estimate of what reading costs, by which a job that reads every record twice on these
    cores, as the live path and the committing query do, commits at most about
    cores / (2 * busy) of the rate."""
    b0 = machine_busy_s()
    time.sleep(1.0)
    before = machine_busy_s() - b0  # cores busy without the read
    best, busy, records = float("inf"), 0.0, 0
    for _ in range(runs):
        t0, b0 = time.perf_counter(), machine_busy_s()
        records = frame().count()
        seconds = time.perf_counter() - t0
        if seconds < best:
            best, busy = seconds, (machine_busy_s() - b0) / seconds - before
    print(
        f"{label}: {records:,} records, best of {runs} {best:.2f}s, {records / best:,.0f}/s, "
        f"{busy:.2f} of the machine's {os.cpu_count()} cores busy reading"
    )
    return round(records / best)
