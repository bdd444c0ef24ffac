"""The committing query: ticks into ``ticks``, candles into ``ohlc``, exactly once.

Judging and candles run in Spark's tasks (``jvm/decoder``'s ``Commit``): the batch's records
are grouped by feed, and each feed is judged in Kafka order by the same rules the real-time
live path runs (``FeedState``: duplicates, late ticks, idle marks, each feed's clock), and
its timely trades folded into its forming candles. A feed's clock, trade ids and forming
candles live in Spark's checkpointed state store, so a cluster's executors share the work,
the driver holds no per-tick state, and a batch replayed after a crash is judged again from
the state before it.

Each ``stream_ticks_trigger_s`` one pass judges the batch and appends its stored ticks (kept
and late; stamped with the run and batch id, see :mod:`streaming.recovery`), while Spark
gathers beside the write (``observe``) all the driver takes: each feed's clock and offsets,
the counts and the changed candles. The driver then MERGEs those candles, by their absolute
values, into ``ohlc``, and records the batch. A
late tick lands in ``ticks``; within the dedup horizon it also revises its candles, a closed
one with its ``revision`` one higher (``FeedState``'s REVISE), and beyond it changes none.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import Column, DataFrame, Observation, Row
from pyspark.sql import functions as F

from candlewire.config import PERIODS_S
from candlewire.kafka import TICKS
from candlewire.lake import TICKS_SCHEMA
from streaming.context import JobContext
from streaming.decode import (
    CONTROL,
    CONTROL_SQL,
    CandleKey,
    decimal_column,
    held_rows,
    ohlc_rows,
)
from streaming.metrics import Laps
from streaming.queries import TopicQuery
from streaming.recovery import Ledger, Restored
from streaming.sql import columns_from_decoded

log = logging.getLogger("candlewire.stream")
JUDGE_JOB = "candlewire: judge the ticks of batch"
# The kinds of the stateful plan's rows (Commit.java's TICK, CANDLE, FEED).
TICK, CANDLE, FEED = 0, 1, 2
UNSTORABLE_KEPT = 10_000
# The ticks write must read the judged rows once: the table's range distribution would run
# the stateful plan a second time to sample it. Nor are they sorted (the sort was 12 % of the
# committing query's CPU): each task's rows come out of the stateful plan grouped by feed,
# a day at a time, in Kafka order (Commit.java), so Iceberg's clustered writer takes them with
# one file open per task. A feed's ticks stay near exchange-time order, which is what a read
# of one ticker's day skips by.
ONE_PASS = {"use-table-distribution-and-ordering": "false", "fanout-enabled": "false"}
# The changed candles as the driver MERGEs them (Commit.java's OUT names and types).
CANDLES = pa.schema(
    [
        ("ticker", pa.string()),
        ("period_s", pa.int32()),
        ("open_ms", pa.int64()),
        *((f, pa.string()) for f in ("open", "high", "low", "close", "volume")),
        ("trade_count", pa.int64()),
        ("closed", pa.bool_()),
        ("first_trade_ns", pa.int64()),
        ("last_trade_ns", pa.int64()),
        ("revision", pa.int32()),
    ]
)
CANDLE_FIELDS = tuple(CANDLES.names)
COUNTS = (
    "kept",
    "late_count",
    "revised_count",
    "duplicates",
    "marks",
    "no_trade_id",
    "bad",
    "registrations",
)


class TicksQuery(TopicQuery):
    name = "ticks"
    topic = TICKS.name

    def __init__(self, ctx: JobContext, ledger: Ledger, restored: Restored) -> None:
        super().__init__(ctx)
        self.ledger = ledger
        self.trigger_s = ctx.settings.stream_ticks_trigger_s
        # What the ledger records with each batch, for the live path's restore: every feed's
        # clock (one number a feed) and the next offset of each partition.
        self.clocks = dict(restored.clocks)
        self.offsets = dict(restored.offsets)
        self.committed_ticks = restored.ticks_batch
        self.committed_candles = restored.candles_batch
        # The tickers and earliest window of the candle MERGEs since the last compaction.
        self.compact_s = ctx.settings.stream_ohlc_compact_s
        self.merged: set[str] = set()
        # The candles past DECIMAL(38,18) deleted from ``ohlc`` (ticker, period_s, open ms).
        self.unstorable: set[CandleKey] = set()
        self.merged_since_ms: int | None = None
        self.compacted = time.monotonic()

    def source(self) -> DataFrame:
        settings = self.ctx.settings
        records = self.ctx.kafka(
            self.topic, settings.stream_ticks_batch_max, group=self.name
        ).select("value", "partition", "offset", F.expr(CONTROL_SQL).alias(CONTROL.name))
        return judged_in_tasks(
            records, settings.stream_watermark_s, settings.stream_dedup_horizon_s
        )

    def batch(self, df: DataFrame, batch_id: int) -> None:
        started = time.perf_counter()
        try:
            self._commit(df, batch_id)
        finally:
            self.ctx.metrics.busy.labels(self.name).inc(time.perf_counter() - started)

    def _commit(self, df: DataFrame, batch_id: int) -> None:
        """One pass over the batch: the stateful plan judges it (a replay reaches the same
        verdicts from the state before it) and its stored ticks go straight into ``ticks``,
        while Spark gathers the feeds' summary and the changed candles beside the write
        (``observe``). Caching the judged rows for a second pass cost as much as the judging.
        The writes a crash already made are skipped."""
        metrics, lap = self.ctx.metrics, Laps()
        observation = Observation(f"ticks-{batch_id}")
        judged = df.observe(observation, *batch_summary())
        # Named in Spark's UI and REST API: the job that runs the stateful judging stage.
        self.ctx.spark.sparkContext.setJobDescription(f"{JUDGE_JOB} {batch_id}")
        write_ticks = batch_id > self.committed_ticks
        try:
            if write_ticks:
                (
                    stored_ticks(judged)
                    .writeTo(self.ctx.tables["ticks"])
                    .options(**self.ledger.commit_properties(batch_id), **ONE_PASS)
                    .append()
                )
                self.committed_ticks = batch_id
            else:  # the ticks are in: the batch is judged again for its state and candles
                judged.where(f"kind <> {TICK}").write.format("noop").mode("overwrite").save()
        finally:
            self.ctx.spark.sparkContext.setJobDescription(None)
        summary = observation.get
        counts = batch_counts(summary)
        stored = counts["kept"] + counts["late_count"]
        if write_ticks:
            metrics.rows.labels("ticks").inc(stored)
        lap("judge_and_ticks" if write_ticks else "judge")
        if batch_id <= self.committed_candles:
            return  # committed before a crash: the snapshot properties say so
        for feed in summary["feeds"]:
            p = feed["partition"]
            self.offsets[p] = max(self.offsets.get(p, 0), feed["offset"] + 1)
            if feed["ticker"]:
                self.clocks[feed["ticker"]] = feed["clock_ns"]
        metrics.bad.labels(TICKS.name).inc(counts["bad"])
        metrics.late.inc(counts["late_count"])
        metrics.revised.inc(counts["revised_count"])
        metrics.duplicates.labels(self.name).inc(counts["duplicates"])
        metrics.no_trade_id.inc(counts["no_trade_id"])
        candles = pa.Table.from_pylist([c.asDict() for c in summary["candles"]], CANDLES)
        changed = candles.num_rows
        if changed:
            self._merge_candles(candles, lap)
        # Every batch is recorded, even one that changed no candle: the clocks it moved
        # and its offsets are where the live path restarts.
        self.ledger.record(batch_id, self.clocks, self.offsets)
        self.committed_candles = batch_id
        lap("record")
        if (
            self.compact_s
            and self.merged_since_ms is not None
            and time.monotonic() - self.compacted > self.compact_s
        ):
            if self.ctx.tables.compact_ohlc(self.merged, self.merged_since_ms):
                self.merged, self.merged_since_ms = set(), None
            self.compacted = time.monotonic()
            lap("compact")
        metrics.batches.labels(self.name).inc()
        log.info(
            "ticks batch %d: %d ticks (%d late, %d of them revising candles, %d resent, "
            "%d idle marks), %d candles changed; %s",
            batch_id,
            stored,
            counts["late_count"],
            counts["revised_count"],
            counts["duplicates"],
            counts["marks"],
            changed,
            lap,
        )

    def _merge_candles(self, candles: pa.Table, lap: Laps) -> None:
        """MERGE the candles' absolute values; the closed ones say so."""
        columns = {f: candles[f] for f in CANDLE_FIELDS if f != "open_ms"}
        decimals = ("open", "high", "low", "close", "volume")
        for f in decimals:
            columns[f] = decimal_column(candles[f].to_pylist())
        columns["open_time_ms"] = candles["open_ms"]
        held = held_rows(columns[f] for f in decimals)
        if held is not None:
            # Every trade fits the table, yet a candle's volume is their sum: past 20 digits
            # no DECIMAL(38,18) holds it, and a null failed the MERGE at every restart. The
            # candle is left out of ``ohlc`` (live shows it), counted and logged.
            lost = candles.filter(pc.invert(held))
            self.ctx.metrics.unstorable.inc(lost.num_rows)
            log.error("candles left out of ohlc, a value past DECIMAL(38,18): %s", lost.to_pylist())
            # A candle a commit before stored, as it was then: out of the table too, once
            # (a forming day's candle is changed, and left out, every batch of its day).
            keys = (lost[c].to_pylist() for c in ("ticker", "period_s", "open_ms"))
            gone = set(zip(*keys, strict=True)) - self.unstorable
            self.ctx.tables.delete_ohlc(gone)
            if len(self.unstorable) > UNSTORABLE_KEPT:
                self.unstorable.clear()  # at worst a key is deleted once more
            self.unstorable |= gone
            columns = {f: pc.filter(a, held) for f, a in columns.items()}
            candles = candles.filter(held)
            if not candles.num_rows:
                return
        rows = ohlc_rows(columns, "live")
        self.ctx.tables.upsert_ohlc(rows, "cw_live_candles", lap=lap)
        self.merged.update(pc.unique(candles["ticker"]).to_pylist())
        first = pc.min(candles["open_ms"]).as_py()
        self.merged_since_ms = min(first, self.merged_since_ms or first)
        self.ctx.metrics.rows.labels("ohlc").inc(candles.num_rows)


def judged_in_tasks(records: DataFrame, allowance_s: float, horizon_s: float) -> DataFrame:
    """Ticks-topic records (``value``, ``partition``, ``offset``, ``control``) through the
    JVM's stateful plan (``Commit.plan``), which decodes each where it judges it: one row per
    stored tick, per changed candle and per (feed, partition) summary, each ``kind``."""
    spark = records.sparkSession
    plan = spark._jvm.io.candlewire.spark.Commit.plan(  # type: ignore[union-attr]
        records._jdf, float(allowance_s), float(horizon_s), ",".join(map(str, PERIODS_S))
    )
    return DataFrame(plan, spark)


def stored_ticks(judged: DataFrame) -> DataFrame:
    """The judged rows the ``ticks`` table stores, as its columns."""
    return judged.where(f"kind = {TICK}").select(*columns_from_decoded(TICKS_SCHEMA))


def batch_summary() -> list[Column]:
    """What the driver takes from a judged batch, gathered by Spark as the batch is written:
    each feed's clock, counts and last offset per partition, and the changed candles. The
    counts ride on the feeds' rows and are summed by :func:`batch_counts`. Summed by Spark,
    each tick's row (its counts null) went through the sums' generated ``coalesce``, where
    in one run the job's JIT took an uncommon trap at nearly every row (567,000
    deoptimizations of ``SpecificMutableProjection.Coalesce_3$`` in 9 s of a batch, JFR)."""
    kind = F.col("kind")
    feed = F.struct("ticker", "partition", "offset", "clock_ns", *COUNTS)
    return [
        F.collect_list(F.when(kind == FEED, feed)).alias("feeds"),
        F.collect_list(F.when(kind == CANDLE, F.struct(*CANDLE_FIELDS))).alias("candles"),
    ]


def batch_counts(summary: Mapping[str, Any] | Row) -> dict[str, int]:
    """The batch's counts (:data:`COUNTS`), from its feeds' rows in :func:`batch_summary`."""
    return {c: sum(feed[c] or 0 for feed in summary["feeds"]) for c in COUNTS}
