"""The committing query: ticks into ``ticks``, candles into ``ohlc``, exactly once.

Judging and candles run in Spark's tasks (``jvm/decoder``'s ``Commit``): the batch's records
are grouped by feed, and each feed is judged in Kafka order by the same rules the real-time
live path runs (``FeedState``: duplicates, late ticks, idle marks, each feed's clock), and
its timely trades folded into its forming candles. A feed's clock, trade ids and forming
candles live in Spark's checkpointed state store, so a cluster's executors share the work,
the driver holds no per-tick state, and a batch replayed after a crash is judged again from
the state before it.

Each ``stream_ticks_trigger_s`` the driver appends the stored ticks (kept and late; stamped
with the run and batch id, see :mod:`streaming.recovery`), MERGEs the candles the batch
changed or closed, by their absolute values, into ``ohlc``, and records the batch. It
collects only one summary row per feed (clock, counts, offsets) and the changed candles. A
late tick lands in ``ticks``; within the dedup horizon it also revises its candles, a closed
one with its ``revision`` one higher (``FeedState``'s REVISE), and beyond it changes none.
"""

from __future__ import annotations

import logging
import time

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from candlewire.config import PERIODS_S
from candlewire.kafka import TICKS
from candlewire.lake import TICKS_SCHEMA
from streaming.context import JobContext
from streaming.decode import CONTROL, CONTROL_SQL, decimal_column, decoded_ticks, ohlc_rows
from streaming.metrics import Laps
from streaming.queries import TopicQuery
from streaming.recovery import Ledger, Restored
from streaming.sql import columns_from_decoded

log = logging.getLogger("candlewire.stream")
JUDGE_JOB = "candlewire: judge the ticks of batch"
# The kinds of the stateful plan's rows (Commit.java's TICK, CANDLE, FEED).
TICK, CANDLE, FEED = 0, 1, 2
CANDLE_FIELDS = (
    "ticker",
    "period_s",
    "open_ms",
    "open",
    "high",
    "low",
    "close",
    "volume",
    "trade_count",
    "closed",
    "first_trade_ns",
    "last_trade_ns",
    "revision",
)
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
        self.merged_since_ms: int | None = None
        self.compacted = time.monotonic()

    def source(self) -> DataFrame:
        settings = self.ctx.settings
        records = self.ctx.kafka(self.topic, settings.stream_ticks_batch_max).select(
            "value", "partition", "offset", F.expr(CONTROL_SQL).alias(CONTROL.name)
        )
        decoded = decoded_ticks(self.ctx.spark, settings.stream_decoder, records)
        return judged_in_tasks(
            decoded, settings.stream_watermark_s, settings.stream_dedup_horizon_s
        )

    def batch(self, df: DataFrame, batch_id: int) -> None:
        started = time.perf_counter()
        df = df.persist()
        try:
            self._commit(df, batch_id)
        finally:
            df.unpersist()
            self.ctx.metrics.busy.labels(self.name).inc(time.perf_counter() - started)

    def _commit(self, df: DataFrame, batch_id: int) -> None:
        """The batch's verdicts are computed by its first action (a replay reaches the same
        ones from the state before it); the writes a crash already made are skipped."""
        metrics, lap = self.ctx.metrics, Laps()
        # Named in Spark's UI and REST API: the job that runs the stateful judging stage.
        self.ctx.spark.sparkContext.setJobDescription(f"{JUDGE_JOB} {batch_id}")
        feeds = df.where(f"kind = {FEED}").select(
            "ticker", "partition", "offset", "clock_ns", *COUNTS
        )
        summary = feeds.toArrow()
        counts = {c: pc.sum(summary[c]).as_py() or 0 for c in COUNTS}
        self.ctx.spark.sparkContext.setJobDescription(None)
        lap("judge")
        if batch_id <= min(self.committed_ticks, self.committed_candles):
            return  # committed before a crash: the snapshot properties say so
        for p, last in _last_offsets(summary).items():
            self.offsets[p] = max(self.offsets.get(p, 0), last + 1)
        for ticker, clock in zip(
            summary["ticker"].to_pylist(), summary["clock_ns"].to_pylist(), strict=True
        ):
            if ticker:
                self.clocks[ticker] = clock
        stored = counts["kept"] + counts["late_count"]
        if batch_id > self.committed_ticks:
            if stored:
                (
                    df.where(f"kind = {TICK}")
                    .select(*columns_from_decoded(TICKS_SCHEMA))
                    .writeTo(self.ctx.tables["ticks"])
                    .options(**self.ledger.commit_properties(batch_id))
                    .append()
                )
                metrics.rows.labels("ticks").inc(stored)
            self.committed_ticks = batch_id
            lap("ticks_commit")
        changed = 0
        if batch_id > self.committed_candles:
            metrics.bad.labels(TICKS.name).inc(counts["bad"])
            metrics.late.inc(counts["late_count"])
            metrics.revised.inc(counts["revised_count"])
            metrics.duplicates.labels(self.name).inc(counts["duplicates"])
            metrics.no_trade_id.inc(counts["no_trade_id"])
            candles = df.where(f"kind = {CANDLE}").select(*CANDLE_FIELDS).toArrow()
            changed = candles.num_rows
            lap("candles")
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
        for f in ("open", "high", "low", "close", "volume"):
            columns[f] = decimal_column(candles[f].to_pylist())
        rows = ohlc_rows({**columns, "open_time_ms": candles["open_ms"]}, "live")
        self.ctx.tables.upsert_ohlc(rows, "cw_live_candles", lap=lap)
        self.merged.update(pc.unique(candles["ticker"]).to_pylist())
        first = pc.min(candles["open_ms"]).as_py()
        self.merged_since_ms = min(first, self.merged_since_ms or first)
        self.ctx.metrics.rows.labels("ohlc").inc(candles.num_rows)


def judged_in_tasks(decoded: DataFrame, allowance_s: float, horizon_s: float) -> DataFrame:
    """Decoded ticks-topic records through the JVM's stateful plan (``Commit.plan``): one row
    per stored tick, per changed candle and per (feed, partition) summary, each ``kind``."""
    spark = decoded.sparkSession
    plan = spark._jvm.io.candlewire.spark.Commit.plan(  # type: ignore[union-attr]
        decoded._jdf, float(allowance_s), float(horizon_s), ",".join(map(str, PERIODS_S))
    )
    return DataFrame(plan, spark)


def _last_offsets(summary: pa.Table) -> dict[int, int]:
    """The last offset read in each partition, from the feeds' summary rows."""
    if not summary.num_rows:
        return {}
    last = summary.group_by("partition").aggregate([("offset", "max")])
    return dict(zip(last["partition"].to_pylist(), last["offset_max"].to_pylist(), strict=True))
