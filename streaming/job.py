"""``candlewire stream``: Kafka → Iceberg tables and live ZMQ market data, with PySpark.

Four streaming queries. Each micro-batch reduces its ticks to partial candles for every
period (stateless), and :mod:`streaming.candles` folds them into the candles still forming.

- **ticks** (every ``stream_ticks_trigger_s``, checkpointed under ``checkpoint_dir``): appends
  the ticks to ``ticks`` with the run and batch id as Iceberg snapshot properties, MERGEs the
  updated candles' absolute values into ``ohlc``, then records the batch, watermark, snapshot
  and Kafka offsets in PostgreSQL. A batch replayed after a crash skips what is committed,
  and the forming candles come back from ``ohlc`` as of the recorded snapshot: exactly once.
- **live** (every ``stream_live_trigger_s``): publishes each tick on ``{ticker}|tick`` and
  each updated candle on ``{ticker}|ohlc:{period}`` (a chart draws the forming candle). It
  writes nothing, so its batches take milliseconds, not the seconds a commit takes. Its
  checkpoint is thrown away: every start begins at the recorded offsets with the recorded
  candles, so after a restart it replays what the commits had not yet covered and its
  candles end on the committed values.
- **history**: OHLCBatch pages are MERGEd into ``ohlc``; when a request's pages are all in
  (or its error marker arrives), HistoryReady is published, only after the commit.
- **metadata**: complete snapshots of an exchange's markets are MERGEd into
  ``symbol_metadata`` (missing symbols marked DELISTED), then SymbolMetadataUpdated is
  published on METADATA_UPDATE.

A candle exists only for an interval with at least one trade: nothing is invented for quiet
intervals.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import tempfile
import threading
import time
import uuid
from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
from prometheus_client import CollectorRegistry, Counter, Gauge
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from candlewire.config import PERIODS_S, Settings
from candlewire.kafka import OHLC_BATCHES, SYMBOL_METADATA, TICKS
from candlewire.lake import table_name
from candlewire.runtime import MetricsServer, run_until_signal
from candlewire.spark import build_session, commit_sql
from candlewire.topics import market_data_topic, metadata_update_topic, ohlc_type, tick_type
from proto import market_pb2
from proto import requests_pb2 as rq
from streaming.candles import Candle, FormingCandles, candle_from_row, partial_candles
from streaming.decode import (
    DECIMAL,
    TICK_DDL,
    CandleKey,
    candle_key,
    candles_table,
    decode_records,
    decode_ticks,
    kept_count,
    ohlc_rows,
    parse_tick,
)
from streaming.progress import CandleCommit, Progress
from streaming.publisher import StreamPublisher

log = logging.getLogger("candlewire.stream")
DEC = f"DECIMAL({DECIMAL.precision},{DECIMAL.scale})"  # the tables' type, in Spark SQL
TRADE_TIMES = ("first_trade_ns", "last_trade_ns")  # live candles only
OHLC_KEY = [("ticker", "ascending"), ("period_s", "ascending"), ("open_time", "ascending")]


class StreamMetrics:
    def __init__(self) -> None:
        r = self.registry = CollectorRegistry()
        self.batches = Counter(
            "candlewire_stream_batches", "Micro-batches processed", ["query"], registry=r
        )
        self.busy = Counter(
            "candlewire_stream_batch_seconds",
            "Time spent processing micro-batches: rows over this is the rate while busy",
            ["query"],
            registry=r,
        )
        self.rows = Counter(
            "candlewire_stream_rows", "Rows committed to Iceberg", ["table"], registry=r
        )
        self.late = Counter(
            "candlewire_stream_late_ticks",
            "Ticks older than the watermark (kept in ticks, not in candles)",
            registry=r,
        )
        self.bad = Counter(
            "candlewire_stream_bad_records",
            "Undecodable Kafka records dropped",
            ["topic"],
            registry=r,
        )
        self.published = Counter(
            "candlewire_stream_published",
            "Market data published by the live query",
            ["kind"],
            registry=r,
        )
        self.notifications = Counter(
            "candlewire_stream_notifications", "Notifications published", ["kind"], registry=r
        )
        self.up = Gauge("candlewire_stream_up", "1 while the queries run", registry=r)


def _ts(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, UTC).strftime("TIMESTAMP'%Y-%m-%d %H:%M:%S.%f'")


def _quoted(values: set[str]) -> str:
    return ", ".join("'" + v.replace("'", "''") + "'" for v in sorted(values))


class StreamingJob:
    def __init__(
        self, settings: Settings, spark: SparkSession | None = None, metrics: bool = True
    ) -> None:
        self.settings = settings
        self.spark = spark or build_session(settings, "candlewire-stream")
        self.tables = {
            name: table_name(settings, name) for name in ("ticks", "ohlc", "symbol_metadata")
        }
        self.publisher = StreamPublisher(settings)
        self.progress = Progress(settings)
        self.metrics = StreamMetrics()
        self._serve_metrics = metrics
        self._http: MetricsServer | None = None
        self.queries: dict = {}
        self.run_id = self._run_id()
        self.committed_ticks = self._last_committed("ticks")
        # Forming candles twice: the commits' (the truth) and the live query's, which runs
        # ahead. Both start from the last commit; the live query from its Kafka offsets.
        self.forming, self.live = FormingCandles(), FormingCandles()
        self.offsets: dict[int, int] = {}
        self.committed_candles, self.watermark_ms = self._restore_candles()
        self.live_watermark_ms = self.watermark_ms
        # Its checkpoint is thrown away on exit: keep it in memory where there is /dev/shm,
        # since writing offsets and commits to disk was most of a live batch's time.
        shm = "/dev/shm" if os.path.isdir("/dev/shm") else None
        self._live_dir = tempfile.mkdtemp(prefix="candlewire-live-", dir=shm)
        self._ohlc_lock = threading.Lock()  # both the ticks and the history query write ohlc

    # -- exactly-once bookkeeping -----------------------------------------------------

    def _checkpoint(self, name: str) -> str:
        return f"{self.settings.checkpoints()}/{name}"

    def _run_id(self) -> str:
        """Identity of the ticks checkpoint: batch ids restart if the checkpoint is new."""
        root = self.settings.checkpoints()
        if "://" in root and not root.startswith("file:"):
            return "cluster"  # remote checkpoints: keep them, the id is their location
        path = Path(root.removeprefix("file:")) / "ticks.run-id"
        if not path.exists() or not (path.parent / "ticks").exists():
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(uuid.uuid4().hex)
        return path.read_text().strip()

    def _last_committed(self, query: str) -> int:
        rows = self.spark.sql(
            f"SELECT summary['candlewire.batch'] AS b FROM {self.tables['ticks']}.snapshots "
            f"WHERE summary['candlewire.query'] = '{query}' AND summary['candlewire.run'] = '{self.run_id}'"
        ).collect()
        return max((int(r.b) for r in rows), default=-1)

    def _restore_candles(self) -> tuple[int, int]:
        """(last batch whose candles are in ``ohlc``, the watermark after it). The forming
        candles come back from ``ohlc``'s live rows as of that batch's snapshot, so a batch
        whose MERGE landed but was not recorded is replayed onto the state before it."""
        last = self.progress.last_candles(self.run_id)
        if last is None:
            return -1, 0
        query = (
            f"SELECT ticker, period_s, unix_millis(open_time) AS open_ms, open, high, low, "
            f"close, volume, trade_count, first_trade_ns, last_trade_ns "
            f"FROM {self.tables['ohlc']} {{version}} WHERE source = 'live' "
            f"AND first_trade_ns IS NOT NULL AND open_time >= {_ts(last.watermark_ms - 86_400_000)}"
        )
        try:
            rows = self.spark.sql(
                query.format(version=f"VERSION AS OF {last.snapshot_id}")
            ).toArrow()
        except Exception:
            # Expired by maintenance (it keeps 100 snapshots and a day): the table as it is now
            # holds the same live rows, unless the crash fell between a later batch's MERGE
            # and its record, which that batch's replay would then count twice.
            log.warning("ohlc snapshot %d is gone; restoring from the table", last.snapshot_id)
            rows = self.spark.sql(query.format(version="")).toArrow()
        candles = rows.to_pylist()
        self.forming.restore(map(candle_from_row, candles), last.watermark_ms)
        self.live.restore(map(candle_from_row, candles), last.watermark_ms)
        self.offsets = last.offsets
        log.info("restored %d forming candles as of batch %d", len(self.forming), last.batch)
        return last.batch, last.watermark_ms

    # -- sources -------------------------------------------------------------------------

    def _kafka(self, topic: str, max_per_trigger: int = 500_000, **options: str) -> DataFrame:
        return (
            self.spark.readStream.format("kafka")
            .option("kafka.bootstrap.servers", self.settings.kafka_servers())
            .option("subscribe", topic)
            .option("startingOffsets", "earliest")
            .option("maxOffsetsPerTrigger", str(max_per_trigger))
            .options(**options)
            .load()
        )

    def _ticks(self) -> DataFrame:
        return (
            self._kafka(TICKS.name, self.settings.stream_ticks_batch_max)
            .select("value", "partition", "offset")
            .mapInArrow(decode_ticks, TICK_DDL)
        )

    def _live_ticks(self) -> DataFrame:
        """The ticks topic from where the commits stand: a throwaway checkpoint, so the
        query starts there on every start, with the forming candles of that commit."""
        start = {str(p): o for p, o in self.offsets.items()}
        start.update({str(p): -2 for p in range(TICKS.partitions) if str(p) not in start})
        return self._kafka(
            TICKS.name, startingOffsets=json.dumps({TICKS.name: start}), failOnDataLoss="false"
        ).select("value")

    # -- queries ---------------------------------------------------------------------------

    def start(self) -> StreamingJob:
        writers = {
            "live": self._live_ticks().writeStream.foreachBatch(self._live_batch),
            "ticks": self._ticks().writeStream.foreachBatch(self._ticks_batch),
            "history": self._kafka(OHLC_BATCHES.name, 2000).writeStream.foreachBatch(
                self._history_batch
            ),
            "metadata": self._kafka(SYMBOL_METADATA.name).writeStream.foreachBatch(
                self._metadata_batch
            ),
        }
        for name, writer in writers.items():
            # One FAIR pool per query (spark_conf sets FAIR mode): commits and MERGEs do not
            # hold up the live query's next batch, which is what subscribers wait for.
            self.spark.sparkContext.setLocalProperty("spark.scheduler.pool", name)
            every = {
                "live": self.settings.stream_live_trigger_s,
                "ticks": self.settings.stream_ticks_trigger_s,
            }.get(name, self.settings.stream_trigger_s)
            checkpoint = self._live_dir if name == "live" else self._checkpoint(name)
            self.queries[name] = (
                writer.queryName(f"candlewire-{name}")
                .option("checkpointLocation", checkpoint)
                .trigger(processingTime=f"{int(every * 1000)} milliseconds")
                .start()
            )
        if self._serve_metrics:
            self._http = MetricsServer(
                self.metrics.registry, self.settings.bind_host, self.settings.port("stream_metrics")
            )
        self.metrics.up.set(1)
        log.info("streaming job running: %s", ", ".join(self.queries))
        return self

    def stop(self) -> None:
        for q in self.queries.values():
            q.stop()
        self.metrics.up.set(0)
        shutil.rmtree(self._live_dir, ignore_errors=True)
        self.publisher.close()
        if self._http is not None:
            self._http.close()

    def run(self) -> None:
        run_until_signal(self.start, self.stop, healthy=self._all_active)

    def _all_active(self) -> bool:
        failed = [n for n, q in self.queries.items() if not q.isActive]
        for n in failed:
            log.error("query %s stopped: %s", n, self.queries[n].exception())
        return not failed

    # -- ticks -----------------------------------------------------------------------------

    def _ticks_batch(self, df: DataFrame, batch_id: int) -> None:
        if batch_id <= min(self.committed_ticks, self.committed_candles):
            return  # committed before a crash: the snapshot properties say so
        started = time.perf_counter()
        df = df.persist()
        try:
            self._ticks_and_candles(df, batch_id)
        finally:
            df.unpersist()
            self.metrics.busy.labels("ticks").inc(time.perf_counter() - started)

    def _ticks_and_candles(self, df: DataFrame, batch_id: int) -> None:
        # Late ticks (older than the watermark) still land in `ticks`, but change no candle.
        late_ns = self.watermark_ms * 1_000_000
        lap = _Laps()
        counts = df.agg(
            F.sum(F.when(~F.col("valid"), 1).otherwise(0)).alias("bad"),
            F.sum(
                F.when(F.col("valid") & (F.col("exchange_time_ns") < late_ns), 1).otherwise(0)
            ).alias("late"),
            F.sum(F.when(F.col("valid"), 1).otherwise(0)).alias("good"),
            F.max("exchange_time_ns").alias("max_ns"),
        ).first()
        self.metrics.bad.labels(TICKS.name).inc(counts.bad or 0)
        lap("decode")
        if not counts.good:
            self.committed_ticks = self.committed_candles = batch_id
            return
        good = df.where("valid")
        for r in df.groupBy("partition").agg(F.max("offset").alias("last")).collect():
            self.offsets[r.partition] = max(self.offsets.get(r.partition, 0), r.last + 1)
        watermark = self._next_watermark(self.watermark_ms, counts.max_ns or 0)
        updated: list[Candle] = []
        if batch_id > self.committed_candles:
            partials = _partials_in_spark(good.where(F.col("exchange_time_ns") >= late_ns))
            updated = self.forming.merge(map(candle_from_row, partials.toArrow().to_pylist()))
            self.metrics.late.inc(counts.late or 0)
            lap("candles")
        if batch_id > self.committed_ticks:
            (
                good.select(
                    "ticker",
                    "trade_id",
                    F.col("price").cast(DEC).alias("price"),
                    F.col("size").cast(DEC).alias("size"),
                    "side",
                    F.timestamp_micros(F.expr("exchange_time_ns DIV 1000")).alias("exchange_time"),
                    F.timestamp_micros(F.expr("ingest_time_ns DIV 1000")).alias("ingest_time"),
                    "exchange_time_ns",
                )
                .writeTo(self.tables["ticks"])
                .options(**self._commit_properties("ticks", batch_id))
                .append()
            )
            self.committed_ticks = batch_id
            self.metrics.rows.labels("ticks").inc(counts.good)
            lap("ticks_commit")
        if batch_id > self.committed_candles:
            if updated:
                self._commit_candles(updated, batch_id, watermark)
            self.committed_candles = batch_id
            lap("candles_commit")
        self.watermark_ms = watermark
        self.forming.evict(watermark)
        self.metrics.batches.labels("ticks").inc()
        log.info(
            "ticks batch %d: %d ticks, %d candles; %s", batch_id, counts.good, len(updated), lap
        )

    # -- live ------------------------------------------------------------------------------

    def _live_batch(self, df: DataFrame, batch_id: int) -> None:
        """Ticks and forming candles to subscribers, ahead of the commits. Decoded on the
        driver: no Python worker round trip and no shuffle, so a batch costs milliseconds.
        Nothing is written; after a restart the query starts again where the commits are."""
        started = time.perf_counter()
        late_ns = self.live_watermark_ms * 1_000_000
        topics: dict[str, bytes] = {}
        frames: list[tuple[bytes, bytes]] = []
        kept: list[tuple[str, int, Decimal, Decimal]] = []
        max_ns = 0
        for record in df.toArrow().column("value").to_pylist():
            t = parse_tick(record)
            if t is None:
                continue
            topic = topics.get(t.ticker)
            if topic is None:
                topic = topics[t.ticker] = market_data_topic(t.ticker, tick_type()).encode()
            frames.append((topic, record))
            t_ns = t.exchange_time_ns
            max_ns = max(max_ns, t_ns)
            if t_ns >= late_ns:
                kept.append((t.ticker, t_ns, Decimal(t.price), Decimal(t.size)))
        if not frames:
            return
        self.publisher.publish_raw(frames)
        watermark = self._next_watermark(self.live_watermark_ms, max_ns)
        updated = self.live.merge(partial_candles(kept, PERIODS_S))
        self._publish_candles(updated, watermark)
        self.metrics.published.labels("tick").inc(len(frames))
        self.metrics.published.labels("ohlc").inc(len(updated))
        self.live_watermark_ms = watermark
        self.live.evict(watermark)
        self.metrics.batches.labels("live").inc()
        self.metrics.busy.labels("live").inc(time.perf_counter() - started)

    def _next_watermark(self, watermark_ms: int, max_event_ns: int) -> int:
        """Spark's rule: the largest event time seen so far minus the allowed delay."""
        delay_ms = int(self.settings.stream_watermark_s * 1000)
        return max(watermark_ms, max_event_ns // 1_000_000 - delay_ms)

    def _commit_properties(self, query: str, batch_id: int) -> dict[str, str]:
        props = {"query": query, "run": self.run_id, "batch": batch_id}
        return {f"snapshot-property.candlewire.{k}": str(v) for k, v in props.items()}

    # -- candles ----------------------------------------------------------------------------

    def _upsert_ohlc(
        self, rows: pa.Table, view: str, *, append_if_new: bool = False, lap: _Laps | None = None
    ) -> None:
        """Upsert by (ticker, period_s, open_time); literal bounds let Iceberg prune files.

        With ``append_if_new``, rows for a range that holds none yet are appended: the same
        result without MERGE's join, which was most of a year of history's time. The lock
        keeps the other query from writing the range between the check and the append."""
        spark, ohlc = self.spark, self.tables["ohlc"]
        micros = pc.min_max(rows.column("open_time").cast(pa.int64())).as_py()
        lo_ms, hi_ms = micros["min"] // 1000, micros["max"] // 1000
        tickers, periods = (
            set(pc.unique(rows.column(c)).to_pylist()) for c in ("ticker", "period_s")
        )
        bounds = (
            f"{{t}}ticker IN ({_quoted(tickers)}) "
            f"AND {{t}}period_s IN ({', '.join(map(str, sorted(periods)))}) "
            f"AND {{t}}open_time >= {_ts(lo_ms)} AND {{t}}open_time <= {_ts(hi_ms)}"
        )
        lap = lap or _Laps()
        with self._ohlc_lock:
            lap("lock")
            if append_if_new:
                taken = spark.sql(f"SELECT 1 FROM {ohlc} WHERE {bounds.format(t='')} LIMIT 1")
                append_if_new = not taken.take(1)
                lap("check")
            if append_if_new:
                # Sorted by key and written by as many tasks as cores, without Iceberg's
                # range shuffle: a month's rows end up in one file, and twice as fast.
                (
                    spark.createDataFrame(rows.sort_by(OHLC_KEY))
                    .coalesce(spark.sparkContext.defaultParallelism)
                    .writeTo(ohlc)
                    .options(**{"distribution-mode": "none", "fanout-enabled": "true"})
                    .append()
                )
                lap("append")
                return
            spark.createDataFrame(rows).createOrReplaceTempView(view)
            commit_sql(
                spark,
                f"MERGE INTO {ohlc} t USING {view} s "
                f"ON t.ticker = s.ticker AND t.period_s = s.period_s AND t.open_time = s.open_time "
                f"AND {bounds.format(t='t.')} "
                f"WHEN MATCHED THEN UPDATE SET * WHEN NOT MATCHED THEN INSERT *",
            )
            lap("merge")

    def _commit_candles(self, candles: list[Candle], batch_id: int, watermark_ms: int) -> None:
        """MERGE the updated candles' absolute values, then record the batch, the watermark
        and the snapshot, from which a restart restores the forming candles."""
        fields = ("ticker", "period_s", "open", "high", "low", "close", "volume", "trade_count")
        rows = ohlc_rows(
            {
                **{f: [getattr(c, f) for c in candles] for f in fields},
                "open_time_ms": [c.open_ms for c in candles],
                "closed": [c.is_final(watermark_ms) for c in candles],
                **{f: [getattr(c, f) for c in candles] for f in TRADE_TIMES},
            },
            "live",
        )
        self._upsert_ohlc(rows, "cw_live_candles")
        self.progress.record_candles(
            self.run_id,
            CandleCommit(batch_id, watermark_ms, self._snapshot_id("ohlc"), dict(self.offsets)),
        )
        self.metrics.rows.labels("ohlc").inc(len(candles))

    def _publish_candles(self, candles: list[Candle], watermark_ms: int) -> None:
        now_ms = int(time.time() * 1000)
        for c in candles:
            candle = market_pb2.OHLC(
                ticker=c.ticker,
                period_s=c.period_s,
                open_time_ms=c.open_ms,
                open=str(c.open.normalize()),
                high=str(c.high.normalize()),
                low=str(c.low.normalize()),
                close=str(c.close.normalize()),
                volume=str(c.volume.normalize()),
                trade_count=c.trade_count,
                closed=c.is_final(watermark_ms),
                update_time_ms=now_ms,
            )
            self.publisher.publish(market_data_topic(c.ticker, ohlc_type(c.period_s)), candle)

    # -- history -----------------------------------------------------------------------------

    def _history_batch(self, df: DataFrame, batch_id: int) -> None:
        lap = _Laps()
        values = [r.value for r in df.select("value").collect()]
        batches, bad = decode_records(values, market_pb2.OHLCBatch)
        lap("decode")
        self.metrics.bad.labels(OHLC_BATCHES.name).inc(bad)
        # One row per key; a page the ingestor sent twice is in the batch twice.
        candles = list({candle_key(c): c for b in batches if not b.error for c in b.rows}.values())
        dropped: set[CandleKey] = set()
        if candles:
            rows, dropped = candles_table(candles, "history")
            self.metrics.bad.labels(OHLC_BATCHES.name).inc(len(dropped))
            lap("rows")
            self._upsert_ohlc(rows, "cw_history_rows", append_if_new=True, lap=lap)
            self.metrics.rows.labels("ohlc").inc(rows.num_rows)
        done = self.progress.record_history(
            [b.metadata for b in batches if b.HasField("metadata")],
            [(b.request_id, b.page, kept_count(b.rows, dropped)) for b in batches if not b.error],
            {b.request_id: b.error for b in batches if b.error},
        )
        snapshot = self._snapshot_id("ohlc") if done else 0
        for c in done:
            m = c.meta
            note = rq.HistoryReadyNotification(
                request_id=m.request_id,
                status=rq.HISTORY_ERROR if c.error else rq.HISTORY_OK,
                row_count=0 if c.error else c.rows,
                iceberg_table=self.tables["ohlc"],
                ticker=m.ticker,
                period_s=m.period_s,
                start_ms=m.start_ms,
                end_ms=m.end_ms,
                error_message=c.error or "",
                snapshot_id=snapshot,
                completed_time_ms=int(time.time() * 1000),
                client_id=m.client_id,
            )
            self.publisher.notify(m.notification_topic, note)
            self.metrics.notifications.labels("history_error" if c.error else "history_ok").inc()
        self.metrics.batches.labels("history").inc()
        if values:
            log.info(
                "history batch %d: %d pages, %d rows, %d ready; %s",
                batch_id,
                len(batches),
                len(candles),
                len(done),
                lap,
            )

    def _snapshot_id(self, table: str) -> int:
        row = self.spark.sql(
            f"SELECT snapshot_id FROM {self.tables[table]}.snapshots ORDER BY committed_at DESC LIMIT 1"
        ).first()
        return int(row.snapshot_id) if row else 0

    # -- symbol metadata -----------------------------------------------------------------------

    def _metadata_batch(self, df: DataFrame, batch_id: int) -> None:
        spark = df.sparkSession
        markets, bad = decode_records(
            [r.value for r in df.select("value").collect()], market_pb2.Market
        )
        self.metrics.bad.labels(SYMBOL_METADATA.name).inc(bad)
        for request_id, snapshot in self.progress.stage_markets(markets).items():
            exchange = snapshot[0].exchange
            current = {
                r.ticker: r
                for r in spark.table(self.tables["symbol_metadata"])
                .where(F.col("exchange") == exchange)
                .collect()
            }
            fresh = {m.ticker: m for m in snapshot}
            rows = [
                {
                    "ticker": m.ticker,
                    "exchange": m.exchange,
                    "base": m.base,
                    "quote": m.quote,
                    "exchange_symbol": m.exchange_symbol,
                    "tick_size": m.tick_size or None,
                    "lot_size": m.lot_size or None,
                    "min_notional": m.min_notional or None,
                    "status": market_pb2.MarketStatus.Name(m.status),
                }
                for m in fresh.values()
            ]
            added = sorted(set(fresh) - set(current))
            removed = sorted(
                t for t, r in current.items() if t not in fresh and r.status != "DELISTED"
            )
            changed = sum(
                1
                for row in rows
                if row["ticker"] in current and _differs(row, current[row["ticker"]])
            )
            for t in removed:
                old = current[t].asDict()
                rows.append(
                    {
                        **{
                            k: (str(v) if v is not None and k.endswith(("size", "notional")) else v)
                            for k, v in old.items()
                            if k != "update_time"
                        },
                        "status": "DELISTED",
                    }
                )
            view = spark.createDataFrame(
                rows,
                "ticker string, exchange string, base string, quote string, exchange_symbol string, tick_size string, lot_size string, min_notional string, status string",
            ).select(
                "ticker",
                "exchange",
                "base",
                "quote",
                "exchange_symbol",
                *(F.col(c).cast(DEC).alias(c) for c in ("tick_size", "lot_size", "min_notional")),
                "status",
                F.current_timestamp().alias("update_time"),
            )
            view.createOrReplaceTempView("cw_markets")
            commit_sql(
                spark,
                f"MERGE INTO {self.tables['symbol_metadata']} t USING cw_markets s ON t.ticker = s.ticker "
                f"AND t.exchange = '{exchange}' WHEN MATCHED THEN UPDATE SET * WHEN NOT MATCHED THEN INSERT *",
            )
            note = market_pb2.SymbolMetadataUpdated(
                exchange=exchange,
                symbol_count=len(fresh),
                added=len(added),
                removed=len(removed),
                changed=changed,
                update_time_ms=int(time.time() * 1000),
                snapshot_id=self._snapshot_id("symbol_metadata"),
                request_id=request_id,
                added_tickers=added,
            )
            self.publisher.notify(metadata_update_topic(), note)
            self.progress.forget_snapshot(request_id)
            self.metrics.notifications.labels("metadata").inc()
        self.metrics.batches.labels("metadata").inc()


class _Laps:
    """Seconds per step of a batch, for the log: where a slow batch spends its time."""

    def __init__(self) -> None:
        self._last = time.perf_counter()
        self._laps: list[str] = []

    def __call__(self, step: str) -> None:
        now = time.perf_counter()
        self._laps.append(f"{step} {now - self._last:.2f}s")
        self._last = now

    def __str__(self) -> str:
        return ", ".join(self._laps)


def _partials_in_spark(ticks: DataFrame) -> DataFrame:
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


def _differs(row: dict, current: object) -> bool:
    for key in ("base", "quote", "exchange_symbol", "status"):
        if row[key] != getattr(current, key):
            return True
    for key in ("tick_size", "lot_size", "min_notional"):
        new, old = row[key], getattr(current, key)
        if (Decimal(new) if new else None) != (Decimal(old) if old is not None else None):
            return True
    return False


def main(settings: Settings | None = None) -> None:
    """Entry point for `candlewire stream` and for spark-submit (streaming/main.py)."""
    StreamingJob(settings or Settings()).run()
