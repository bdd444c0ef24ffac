"""Spark's Kafka source as a yardstick: how fast it reads a topic here, with or without a
decode. bench.stream and bench.spark_floor measure against it in the same run."""

from __future__ import annotations

import time
from collections.abc import Callable

from pyspark.sql import DataFrame, SparkSession

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
    connections)."""
    best, records = float("inf"), 0
    for _ in range(runs):
        t0 = time.perf_counter()
        records = frame().count()
        best = min(best, time.perf_counter() - t0)
    print(f"{label}: {records:,} records, best of {runs} {best:.2f}s, {records / best:,.0f}/s")
    return round(records / best)
