"""The committing query: ticks into ``ticks``, candles into ``ohlc``, exactly once.

Every ``stream_ticks_trigger_s`` it judges the batch's records in Kafka order
(:func:`streaming.feeds.judge`: duplicates, late ticks, idle marks, each feed's clock), then
appends the ticks that are not resends (stamped with the run and batch id, see
:mod:`streaming.recovery`), reduces the timely ones to partial candles for every period in
one stateless Spark aggregation, folds those into the forming candles, MERGEs the updated
and the newly closed candles' absolute values into ``ohlc``, and records the batch. A late
tick still lands in ``ticks`` (candles can be rebuilt from there) but changes no candle.
"""

from __future__ import annotations

import logging
import time

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from candlewire.config import PERIODS_S
from candlewire.kafka import TICKS
from candlewire.lake import TICKS_SCHEMA
from streaming.candles import Candle, candle_from_row, changed
from streaming.context import JobContext
from streaming.decode import CONTROL, CONTROL_SQL, decoded_ticks, ohlc_rows, registrations_in
from streaming.feeds import judge
from streaming.metrics import Laps
from streaming.queries import TopicQuery
from streaming.recovery import Ledger, Restored
from streaming.sql import DEC, columns_from_decoded

log = logging.getLogger("candlewire.stream")
TRADE_TIMES = ("first_trade_ns", "last_trade_ns")  # live candles only
CANDLE_FIELDS = ("ticker", "period_s", "open", "high", "low", "close", "volume", "trade_count")
JUDGED = ("valid", "idle", "ticker", "trade_id", "exchange_time_ns", "partition", "offset")


class TicksQuery(TopicQuery):
    name = "ticks"
    topic = TICKS.name

    def __init__(self, ctx: JobContext, ledger: Ledger, restored: Restored) -> None:
        super().__init__(ctx)
        self.ledger = ledger
        self.trigger_s = ctx.settings.stream_ticks_trigger_s
        self.feeds = restored.feeds(ctx.settings)
        self.forming = restored.forming(self.feeds)
        self.offsets = dict(restored.offsets)
        self.committed_ticks = restored.ticks_batch
        self.committed_candles = restored.candles_batch

    def source(self) -> DataFrame:
        records = self.ctx.kafka(self.topic, self.ctx.settings.stream_ticks_batch_max).select(
            "value", "partition", "offset", F.expr(CONTROL_SQL).alias(CONTROL.name)
        )
        return decoded_ticks(self.ctx.spark, self.ctx.settings.stream_decoder, records)

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
        metrics, lap = self.ctx.metrics, Laps()
        judged = df.select(*JUDGED, CONTROL.name).toArrow()
        verdicts = judge(self.feeds, judged)
        verdicts.bad -= len(registrations_in(judged))  # CEP triggers: not ticks, not malformed
        lap("judge")
        for partition, offset in verdicts.next_offsets.items():
            self.offsets[partition] = max(self.offsets.get(partition, 0), offset)
        stored = self._without(df.where("valid"), verdicts.duplicates)
        updated: list[Candle] = []
        if batch_id > self.committed_candles:
            timely = self._without(stored, verdicts.late)
            if verdicts.kept:
                partials = partials_in_spark(timely).toArrow().to_pylist()
                updated = self.forming.merge(map(candle_from_row, partials))
            metrics.bad.labels(TICKS.name).inc(verdicts.bad)
            metrics.late.inc(len(verdicts.late))
            metrics.duplicates.labels(self.name).inc(len(verdicts.duplicates))
            metrics.no_trade_id.inc(verdicts.no_trade_id)
            lap("candles")
        if batch_id > self.committed_ticks:
            if verdicts.stored:
                (
                    stored.select(*columns_from_decoded(TICKS_SCHEMA))
                    .writeTo(self.ctx.tables["ticks"])
                    .options(**self.ledger.commit_properties(batch_id))
                    .append()
                )
                metrics.rows.labels("ticks").inc(verdicts.stored)
            self.committed_ticks = batch_id
            lap("ticks_commit")
        closed = self.forming.evict(self.feeds.watermark_ms)
        if batch_id > self.committed_candles:
            if updated or closed:
                self._merge_candles(updated, closed)
            # Every batch is recorded, even one that changed no candle: its trade ids and
            # the clocks it moved are state a restart must not lose.
            self.ledger.record(batch_id, self.feeds, self.offsets)
            self.committed_candles = batch_id
            lap("candles_commit")
        metrics.batches.labels(self.name).inc()
        log.info(
            "ticks batch %d: %d ticks (%d late, %d resent, %d idle marks), %d candles "
            "updated, %d closed; %s",
            batch_id,
            verdicts.stored,
            len(verdicts.late),
            len(verdicts.duplicates),
            verdicts.marks,
            len(updated),
            len(closed),
            lap,
        )

    def _without(self, df: DataFrame, positions: list[tuple[int, int]]) -> DataFrame:
        """The rows not at these Kafka positions (usually none: no join then)."""
        if not positions:
            return df
        drop = self.ctx.spark.createDataFrame(positions, "partition int, offset bigint")
        return df.join(F.broadcast(drop), ["partition", "offset"], "left_anti")

    def _merge_candles(self, updated: list[Candle], closed: list[Candle]) -> None:
        """MERGE the candles' absolute values; the closed ones say so."""
        changes = changed(updated, closed)
        candles = [c for c, _ in changes]
        rows = ohlc_rows(
            {
                **{f: [getattr(c, f) for c in candles] for f in CANDLE_FIELDS},
                "open_time_ms": [c.open_ms for c in candles],
                "closed": [is_closed for _, is_closed in changes],
                **{f: [getattr(c, f) for c in candles] for f in TRADE_TIMES},
            },
            "live",
        )
        self.ctx.tables.upsert_ohlc(rows, "cw_live_candles")
        self.ctx.metrics.rows.labels("ohlc").inc(len(candles))


def partials_in_spark(ticks: DataFrame) -> DataFrame:
    """One partial candle per (ticker, period, window) of a batch, windows aligned to the
    epoch like Spark's ``window``. Ticks fold into minutes first, then minutes into every
    period (as :func:`streaming.candles.partial_candles` does), so the batch is aggregated
    once, not once per period. Trades at the same time are ordered by their Kafka offset (a
    ticker's trades share a partition), so open and close are the ones the live path, folding
    in Kafka order, has."""
    t = F.col("exchange_time_ns")
    arrival = F.struct(t.alias("t"), F.col("offset").alias("offset"))
    minutes = (
        ticks.select(
            "ticker",
            F.col("price").cast(DEC).alias("price"),
            F.col("size").cast(DEC).alias("size"),
            arrival.alias("arrival"),
            F.expr("exchange_time_ns DIV 60000000000 * 60000").alias("minute_ms"),
        )
        .groupBy("ticker", "minute_ms")
        .agg(
            F.min_by("price", "arrival").alias("open"),
            F.max("price").alias("high"),
            F.min("price").alias("low"),
            F.max_by("price", "arrival").alias("close"),
            F.sum("size").alias("volume"),
            F.count(F.lit(1)).alias("trade_count"),
            F.min("arrival").alias("first"),
            F.max("arrival").alias("last"),
        )
    )
    return (
        minutes.select("*", F.explode(F.array(*(F.lit(p) for p in PERIODS_S))).alias("period_s"))
        .withColumn("open_ms", F.expr("minute_ms DIV (period_s * 1000) * period_s * 1000"))
        .groupBy("ticker", "period_s", "open_ms")
        .agg(
            F.min_by("open", "first").alias("open"),
            F.max("high").alias("high"),
            F.min("low").alias("low"),
            F.max_by("close", "last").alias("close"),
            F.sum("volume").alias("volume"),
            F.sum("trade_count").alias("trade_count"),
            F.min("first.t").alias("first_trade_ns"),
            F.max("last.t").alias("last_trade_ns"),
        )
    )
