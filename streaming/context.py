"""What every query of the job shares: one Spark session, the tables, the ZMQ publisher, the
PostgreSQL progress record and the metrics."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

from pyspark.sql import DataFrame, SparkSession

from candlewire.config import Settings
from candlewire.kafka import spark_options
from streaming.metrics import StreamMetrics
from streaming.pacing import CommitDue
from streaming.progress import Progress
from streaming.publisher import StreamPublisher, next_epoch
from streaming.tables import Tables

# A micro-batch's read ends at the log's end, and its tasks' last fetch waited the broker's
# fetch.max.wait.ms (500 ms by default) for records past it: half a second of every batch's
# Kafka stage whatever its size (Spark's REST API: 62 records, 520 ms of wall and 9 ms of CPU
# a task; 62-66 ms with 20). Only micro-batch reads: real-time mode polls without end, and a
# shorter wait would only make an idle topic's broker answer more often.
BATCH_FETCH_WAIT_MS = 20


@dataclass
class JobContext:
    settings: Settings
    spark: SparkSession
    tables: Tables
    publisher: StreamPublisher
    progress: Progress
    metrics: StreamMetrics
    # Told by the live path what it reads: the committing query's next batch comes sooner.
    commit_due: CommitDue
    # Set by the metadata query once a new snapshot of symbol metadata is in, before it
    # says so on METADATA_UPDATE: the trigger desk then reloads before judging a ticker.
    symbols_changed: threading.Event = field(default_factory=threading.Event)

    @classmethod
    def open(cls, settings: Settings, spark: SparkSession) -> JobContext:
        """A context with its own tables, publisher (bound), progress record and metrics."""
        return cls(
            settings=settings,
            spark=spark,
            tables=Tables(settings, spark),
            publisher=StreamPublisher(settings, epoch=next_epoch(settings)),
            progress=Progress(settings),
            metrics=StreamMetrics(),
            commit_due=CommitDue(settings.stream_ticks_commit_after),
        )

    def kafka(
        self,
        topic: str,
        max_per_trigger: int | None = 500_000,
        group: str | None = None,
        **options: str,
    ) -> DataFrame:
        """A streaming read of one Kafka topic from the earliest offset (or ``options``);
        ``max_per_trigger`` None for real-time mode, which has no triggers to cap.

        ``group`` names a query that is started again and again (the committing query, on
        each hurried commit: ``streaming.pacing``): its runs then share one consumer group.
        Spark pools its consumers by group and partition and makes a new group for every
        query start, so each run left one idle consumer per partition, with its fetch
        buffers and metrics, for the pool's five minutes (#36's soak)."""
        if max_per_trigger is not None:
            options = {
                "maxOffsetsPerTrigger": str(max_per_trigger),
                "kafka.fetch.max.wait.ms": str(BATCH_FETCH_WAIT_MS),
                **options,
            }
        if group is not None:
            # Spark's readers assign partitions and commit no offsets, so the group only
            # names the pool's key: no broker-side membership to share.
            options = {"kafka.group.id": f"candlewire-stream-{group}", **options}
        return (
            self.spark.readStream.format("kafka")
            .options(**spark_options(self.settings))
            .option("subscribe", topic)
            .option("startingOffsets", "earliest")
            .options(**options)
            .load()
        )
