"""The committing query: ticks into ``ticks``, candles into ``ohlc``, exactly once.

Every ``stream_ticks_trigger_s`` it appends the batch's valid ticks (stamped with the run
and batch id, see :mod:`streaming.recovery`), reduces them to partial candles for every
period in one stateless Spark aggregation, folds those into the forming candles, MERGEs the
updated ones' absolute values into ``ohlc`` and records the batch. A tick older than the
watermark still lands in ``ticks`` (candles can be rebuilt from there) but changes no candle.
"""

from __future__ import annotations

import logging
import time

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from candlewire.config import PERIODS_S
from candlewire.kafka import TICKS
from candlewire.lake import TICKS_SCHEMA
from streaming.candles import Candle, candle_from_row, next_watermark
from streaming.context import JobContext
from streaming.decode import TICK_STRUCT, decode_ticks, ohlc_rows
from streaming.metrics import Laps
from streaming.queries import TopicQuery
from streaming.recovery import Ledger, Restored
from streaming.sql import DEC, columns_from_decoded

log = logging.getLogger("candlewire.stream")
TRADE_TIMES = ("first_trade_ns", "last_trade_ns")  # live candles only
CANDLE_FIELDS = ("ticker", "period_s", "open", "high", "low", "close", "volume", "trade_count")


class TicksQuery(TopicQuery):
    name = "ticks"
    topic = TICKS.name

    def __init__(self, ctx: JobContext, ledger: Ledger, restored: Restored) -> None:
        super().__init__(ctx)
        self.ledger = ledger
        self.trigger_s = ctx.settings.stream_ticks_trigger_s
        self.forming = restored.forming()
        self.watermark_ms = restored.watermark_ms
        self.offsets = dict(restored.offsets)
        self.committed_ticks = restored.ticks_batch
        self.committed_candles = restored.candles_batch

    def source(self) -> DataFrame:
        return (
            self.ctx.kafka(self.topic, self.ctx.settings.stream_ticks_batch_max)
            .select("value", "partition", "offset")
            .mapInArrow(decode_ticks, TICK_STRUCT)
        )

    def batch(self, df: DataFrame, batch_id: int) -> None:
        if batch_id <= min(self.committed_ticks, self.committed_candles):
            return  # committed before a crash: the snapshot properties say so
        started = time.perf_counter()
        df = df.persist()
        try:
            self._commit(df, batch_id)
        finally:
            df.unpersist()
            self.ctx.metrics.busy.labels(self.name).inc(time.perf_counter() - started)

    def _commit(self, df: DataFrame, batch_id: int) -> None:
        metrics = self.ctx.metrics
        late_ns = self.watermark_ms * 1_000_000
        lap = Laps()
        counts = df.agg(
            F.sum(F.when(~F.col("valid"), 1).otherwise(0)).alias("bad"),
            F.sum(
                F.when(F.col("valid") & (F.col("exchange_time_ns") < late_ns), 1).otherwise(0)
            ).alias("late"),
            F.sum(F.when(F.col("valid"), 1).otherwise(0)).alias("good"),
            F.max("exchange_time_ns").alias("max_ns"),
        ).first()
        metrics.bad.labels(TICKS.name).inc(counts.bad or 0)
        lap("decode")
        if not counts.good:
            self.committed_ticks = self.committed_candles = batch_id
            return
        good = df.where("valid")
        for r in df.groupBy("partition").agg(F.max("offset").alias("last")).collect():
            self.offsets[r.partition] = max(self.offsets.get(r.partition, 0), r.last + 1)
        watermark = next_watermark(
            self.watermark_ms, counts.max_ns or 0, self.ctx.settings.stream_watermark_s
        )
        updated: list[Candle] = []
        if batch_id > self.committed_candles:
            partials = partials_in_spark(good.where(F.col("exchange_time_ns") >= late_ns))
            updated = self.forming.merge(map(candle_from_row, partials.toArrow().to_pylist()))
            metrics.late.inc(counts.late or 0)
            lap("candles")
        if batch_id > self.committed_ticks:
            (
                good.select(*columns_from_decoded(TICKS_SCHEMA))
                .writeTo(self.ctx.tables["ticks"])
                .options(**self.ledger.commit_properties(batch_id))
                .append()
            )
            self.committed_ticks = batch_id
            metrics.rows.labels("ticks").inc(counts.good)
            lap("ticks_commit")
        if batch_id > self.committed_candles:
            if updated:
                self._commit_candles(updated, batch_id, watermark)
            self.committed_candles = batch_id
            lap("candles_commit")
        self.watermark_ms = watermark
        self.forming.evict(watermark)
        metrics.batches.labels(self.name).inc()
        log.info(
            "ticks batch %d: %d ticks, %d candles; %s", batch_id, counts.good, len(updated), lap
        )

    def _commit_candles(self, candles: list[Candle], batch_id: int, watermark_ms: int) -> None:
        """MERGE the updated candles' absolute values, then record the batch, the watermark
        and the snapshot, from which a restart restores the forming candles."""
        rows = ohlc_rows(
            {
                **{f: [getattr(c, f) for c in candles] for f in CANDLE_FIELDS},
                "open_time_ms": [c.open_ms for c in candles],
                "closed": [c.is_final(watermark_ms) for c in candles],
                **{f: [getattr(c, f) for c in candles] for f in TRADE_TIMES},
            },
            "live",
        )
        self.ctx.tables.upsert_ohlc(rows, "cw_live_candles")
        self.ledger.record(batch_id, watermark_ms, self.offsets)
        self.ctx.metrics.rows.labels("ohlc").inc(len(candles))


def partials_in_spark(ticks: DataFrame) -> DataFrame:
    """One partial candle per (ticker, period, window) of a batch: a stateless aggregation
    over every period at once. Windows are aligned to the epoch, like Spark's ``window``."""
    t = F.col("exchange_time_ns")
    return (
        ticks.select(
            "ticker",
            F.col("price").cast(DEC).alias("price"),
            F.col("size").cast(DEC).alias("size"),
            t,
            F.explode(F.array(*(F.lit(p) for p in PERIODS_S))).alias("period_s"),
        )
        .withColumn(
            "open_ms",
            F.expr("exchange_time_ns DIV 1000000 DIV (period_s * 1000) * period_s * 1000"),
        )
        .groupBy("ticker", "period_s", "open_ms")
        .agg(
            F.min_by("price", t).alias("open"),
            F.max("price").alias("high"),
            F.min("price").alias("low"),
            F.max_by("price", t).alias("close"),
            F.sum("size").alias("volume"),
            F.count(F.lit(1)).alias("trade_count"),
            F.min(t).alias("first_trade_ns"),
            F.max(t).alias("last_trade_ns"),
        )
    )
