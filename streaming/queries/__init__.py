"""The job's streaming queries, one module each, in the order a tick meets them:
:mod:`~streaming.queries.live` (publish at once, and fire the CEP triggers),
:mod:`~streaming.queries.ticks` (commit ticks and candles), :mod:`~streaming.queries.history` (history pages), :mod:`~streaming.queries.metadata`
(symbol metadata) and :mod:`~streaming.queries.books` (L2 books, live and committed).

Each is a :class:`Query`: a Kafka source, a trigger, a checkpoint and a ``foreachBatch``
function. :mod:`streaming.job` starts them.
"""

from __future__ import annotations

from typing import Protocol

from pyspark.sql import DataFrame

from streaming.context import JobContext


class Query(Protocol):
    name: str
    trigger_s: float
    checkpoint: str

    def source(self) -> DataFrame: ...

    def batch(self, df: DataFrame, batch_id: int) -> None: ...

    def close(self) -> None: ...


class TopicQuery:
    """A query over one Kafka topic, checkpointed under ``checkpoint_dir/<name>``."""

    name: str
    topic: str
    max_per_trigger = 500_000

    def __init__(self, ctx: JobContext) -> None:
        self.ctx = ctx
        self.trigger_s = ctx.settings.stream_trigger_s
        self.checkpoint = f"{ctx.settings.checkpoints()}/{self.name}"

    def source(self) -> DataFrame:
        return self.ctx.kafka(self.topic, self.max_per_trigger)

    def close(self) -> None:
        pass
