"""``candlewire stream``: Kafka → Iceberg tables and live ZMQ market data, with PySpark.

Four streaming queries, each with its own checkpoint under ``checkpoint_dir``:

- **ticks**: append to ``ticks`` and publish each tick on ``{ticker}|tick``. Appends carry
  the micro-batch id as an Iceberg snapshot property, so a batch replayed after a crash is
  recognised and skipped: exactly once.
- **candles**: a stateful 1-minute aggregation (event time, watermark) in update mode; each
  micro-batch MERGEs the updated minutes into ``ohlc``, recomputes the touched 5m…1d candles
  from the committed minutes, MERGEs those too, then publishes every updated candle on
  ``{ticker}|ohlc:{period}``. MERGE of absolute values is idempotent: exactly once.
- **history**: OHLCBatch pages are MERGEd into ``ohlc``; when a request's pages are all in
  (or its error marker arrives), HistoryReady is published, only after the commit.
- **metadata**: complete snapshots of an exchange's markets are MERGEd into
  ``symbol_metadata`` (missing symbols marked DELISTED), then SymbolMetadataUpdated is
  published on METADATA_UPDATE.

A candle exists only for an interval with at least one trade: nothing is invented for quiet
intervals.
"""

from __future__ import annotations

import logging
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path

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
from streaming.decode import TICK_DDL, candles_table, decode_records, decode_ticks
from streaming.progress import Progress
from streaming.publisher import StreamPublisher

log = logging.getLogger("candlewire.stream")
DEC = "DECIMAL(38,18)"
OHLC_COLUMNS = "ticker, period_s, open_time, open, high, low, close, volume, trade_count, closed, source, update_time"
HIGHER = [p for p in PERIODS_S if p != 60]


class StreamMetrics:
    def __init__(self) -> None:
        r = self.registry = CollectorRegistry()
        self.batches = Counter(
            "candlewire_stream_batches", "Micro-batches processed", ["query"], registry=r
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
        self.watermark_ms = 0
        self.run_id = self._run_id()
        self.committed_ticks = self._last_committed("ticks")

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

    # -- sources -------------------------------------------------------------------------

    def _kafka(self, topic: str, max_per_trigger: int = 500_000) -> DataFrame:
        return (
            self.spark.readStream.format("kafka")
            .option("kafka.bootstrap.servers", self.settings.kafka_servers())
            .option("subscribe", topic)
            .option("startingOffsets", "earliest")
            .option("maxOffsetsPerTrigger", str(max_per_trigger))
            .load()
        )

    def _ticks(self) -> DataFrame:
        return self._kafka(TICKS.name).select("value").mapInArrow(decode_ticks, TICK_DDL)

    # -- queries ---------------------------------------------------------------------------

    def start(self) -> StreamingJob:
        trigger = {"processingTime": f"{int(self.settings.stream_trigger_s * 1000)} milliseconds"}
        valid = self._ticks().where("valid")
        minute = (
            valid.withColumn("event_time", F.timestamp_micros(F.expr("exchange_time_ns DIV 1000")))
            .withColumn("price", F.col("price").cast(DEC))
            .withColumn("size", F.col("size").cast(DEC))
            .withWatermark(
                "event_time", f"{int(self.settings.stream_watermark_s * 1000)} milliseconds"
            )
            .groupBy("ticker", F.window("event_time", "60 seconds"))
            .agg(
                F.min_by("price", "exchange_time_ns").alias("open"),
                F.max("price").alias("high"),
                F.min("price").alias("low"),
                F.max_by("price", "exchange_time_ns").alias("close"),
                F.sum("size").alias("volume"),
                F.count(F.lit(1)).alias("trade_count"),
            )
        )
        writers = {
            "ticks": self._ticks().writeStream.foreachBatch(self._ticks_batch),
            "candles": minute.writeStream.outputMode("update").foreachBatch(self._candles_batch),
            "history": self._kafka(OHLC_BATCHES.name, 2000).writeStream.foreachBatch(
                self._history_batch
            ),
            "metadata": self._kafka(SYMBOL_METADATA.name).writeStream.foreachBatch(
                self._metadata_batch
            ),
        }
        for name, writer in writers.items():
            # One FAIR pool per query (spark_conf sets FAIR mode): a long candle MERGE no
            # longer holds up the next ticks batch, which is what live subscribers wait for.
            self.spark.sparkContext.setLocalProperty("spark.scheduler.pool", name)
            self.queries[name] = (
                writer.queryName(f"candlewire-{name}")
                .option("checkpointLocation", self._checkpoint(name))
                .trigger(**trigger)
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
        if batch_id <= self.committed_ticks:
            return  # committed before a crash: the snapshot property says so
        df = df.persist()
        try:
            # Spark's watermark: the largest event time of earlier batches minus the delay.
            # Ticks behind it still land in `ticks`, but no longer change a candle.
            counts = df.agg(
                F.sum(F.when(~F.col("valid"), 1).otherwise(0)).alias("bad"),
                F.sum(
                    F.when(
                        F.col("valid")
                        & (F.col("exchange_time_ns") < F.lit(self.watermark_ms * 1_000_000)),
                        1,
                    ).otherwise(0)
                ).alias("late"),
                F.sum(F.when(F.col("valid"), 1).otherwise(0)).alias("good"),
                F.max("exchange_time_ns").alias("max_ns"),
            ).first()
            good = df.where("valid")
            if counts.good:
                (
                    good.select(
                        "ticker",
                        "trade_id",
                        F.col("price").cast(DEC).alias("price"),
                        F.col("size").cast(DEC).alias("size"),
                        "side",
                        F.timestamp_micros(F.expr("exchange_time_ns DIV 1000")).alias(
                            "exchange_time"
                        ),
                        F.timestamp_micros(F.expr("ingest_time_ns DIV 1000")).alias("ingest_time"),
                        "exchange_time_ns",
                    )
                    .writeTo(self.tables["ticks"])
                    .option("snapshot-property.candlewire.query", "ticks")
                    .option("snapshot-property.candlewire.run", self.run_id)
                    .option("snapshot-property.candlewire.batch", str(batch_id))
                    .append()
                )
                live = good.select("ticker", "record").toArrow()
                topics = {
                    t: market_data_topic(t, tick_type()).encode()
                    for t in set(live["ticker"].to_pylist())
                }
                self.publisher.publish_raw(
                    list(
                        zip(
                            (topics[t] for t in live["ticker"].to_pylist()),
                            live["record"].to_pylist(),
                            strict=True,
                        )
                    )
                )
            self.committed_ticks = batch_id
            self.metrics.late.inc(counts.late or 0)
            if counts.max_ns:
                delay_ms = int(self.settings.stream_watermark_s * 1000)
                self.watermark_ms = max(self.watermark_ms, counts.max_ns // 1_000_000 - delay_ms)
            self.metrics.rows.labels("ticks").inc(counts.good or 0)
            self.metrics.bad.labels(TICKS.name).inc(counts.bad or 0)
            self.metrics.batches.labels("ticks").inc()
        finally:
            df.unpersist()

    # -- candles ----------------------------------------------------------------------------

    def _merge_ohlc(
        self,
        spark: SparkSession,
        view: str,
        tickers: set[str],
        periods: set[int],
        lo_ms: int,
        hi_ms: int,
    ) -> None:
        """Upsert by (ticker, period_s, open_time); literal bounds let Iceberg prune files."""
        commit_sql(
            spark,
            f"MERGE INTO {self.tables['ohlc']} t USING {view} s "
            f"ON t.ticker = s.ticker AND t.period_s = s.period_s AND t.open_time = s.open_time "
            f"AND t.ticker IN ({_quoted(tickers)}) AND t.period_s IN ({', '.join(map(str, sorted(periods)))}) "
            f"AND t.open_time >= {_ts(lo_ms)} AND t.open_time <= {_ts(hi_ms)} "
            f"WHEN MATCHED THEN UPDATE SET * WHEN NOT MATCHED THEN INSERT *",
        )

    def _candles_batch(self, df: DataFrame, batch_id: int) -> None:
        spark = df.sparkSession
        rows = df.select(
            "ticker",
            F.lit(60).alias("period_s"),
            F.col("window.start").alias("open_time"),
            "open",
            "high",
            "low",
            "close",
            "volume",
            F.col("trade_count").cast("bigint").alias("trade_count"),
            F.lit(False).alias("closed"),
            F.lit("live").alias("source"),
            F.current_timestamp().alias("update_time"),
        ).persist()
        try:
            bounds = rows.agg(
                F.min("open_time").alias("lo"),
                F.max("open_time").alias("hi"),
                F.collect_set("ticker").alias("tickers"),
            ).first()
            if bounds.lo is None:
                return
            tickers = set(bounds.tickers)
            lo_ms, hi_ms = (
                int(bounds.lo.replace(tzinfo=UTC).timestamp() * 1000),
                int(bounds.hi.replace(tzinfo=UTC).timestamp() * 1000),
            )
            rows.createOrReplaceTempView("cw_live_minutes")
            self._merge_ohlc(spark, "cw_live_minutes", tickers, {60}, lo_ms, hi_ms)
            day_lo = lo_ms - lo_ms % 86_400_000
            higher = spark.sql(
                f"""
                WITH touched AS (
                  SELECT DISTINCT s.ticker, p.period_s,
                         timestamp_seconds(floor(unix_seconds(s.open_time) / p.period_s) * p.period_s) AS open_time
                  FROM cw_live_minutes s
                  CROSS JOIN (SELECT explode(array({", ".join(map(str, HIGHER))})) AS period_s) p
                )
                SELECT t.ticker, CAST(t.period_s AS INT) AS period_s, t.open_time,
                       min_by(o.open, o.open_time) AS open, max(o.high) AS high, min(o.low) AS low,
                       max_by(o.close, o.open_time) AS close, CAST(sum(o.volume) AS {DEC}) AS volume,
                       sum(o.trade_count) AS trade_count, false AS closed, 'live' AS source,
                       current_timestamp() AS update_time
                FROM touched t JOIN {self.tables["ohlc"]} o
                  ON o.ticker = t.ticker AND o.open_time >= t.open_time
                 AND o.open_time < t.open_time + make_dt_interval(0, 0, 0, t.period_s)
                WHERE o.period_s = 60 AND o.ticker IN ({_quoted(tickers)})
                  AND o.open_time >= {_ts(day_lo)} AND o.open_time <= {_ts(hi_ms)}
                GROUP BY t.ticker, t.period_s, t.open_time
                """
            ).persist()
            higher.createOrReplaceTempView("cw_live_higher")
            self._merge_ohlc(spark, "cw_live_higher", tickers, set(HIGHER), day_lo, hi_ms)
            updated = rows.unionByName(higher).toArrow()
            higher.unpersist()
            self._publish_candles(updated)
            self.metrics.rows.labels("ohlc").inc(updated.num_rows)
            self.metrics.batches.labels("candles").inc()
        finally:
            rows.unpersist()

    def _publish_candles(self, table: object) -> None:
        for r in table.to_pylist():  # type: ignore[attr-defined]
            open_ms = int(r["open_time"].replace(tzinfo=UTC).timestamp() * 1000)
            candle = market_pb2.OHLC(
                ticker=r["ticker"],
                period_s=r["period_s"],
                open_time_ms=open_ms,
                open=str(r["open"].normalize()),
                high=str(r["high"].normalize()),
                low=str(r["low"].normalize()),
                close=str(r["close"].normalize()),
                volume=str(r["volume"].normalize()),
                trade_count=r["trade_count"],
                closed=open_ms + r["period_s"] * 1000 <= self.watermark_ms,
                update_time_ms=int(time.time() * 1000),
            )
            self.publisher.publish(market_data_topic(r["ticker"], ohlc_type(r["period_s"])), candle)

    # -- history -----------------------------------------------------------------------------

    def _history_batch(self, df: DataFrame, batch_id: int) -> None:
        spark = df.sparkSession
        values = [r.value for r in df.select("value").collect()]
        batches, bad = decode_records(values, market_pb2.OHLCBatch)
        self.metrics.bad.labels(OHLC_BATCHES.name).inc(bad)
        candles = [c for b in batches if not b.error for c in b.rows]
        if candles:
            view = (
                spark.createDataFrame(candles_table(candles, "history"))
                .select(
                    "ticker",
                    "period_s",
                    F.timestamp_millis("open_time_ms").alias("open_time"),
                    *(
                        F.col(c).cast(DEC).alias(c)
                        for c in ("open", "high", "low", "close", "volume")
                    ),
                    "trade_count",
                    "closed",
                    "source",
                    F.current_timestamp().alias("update_time"),
                )
                .dropDuplicates(["ticker", "period_s", "open_time"])
            )
            view.createOrReplaceTempView("cw_history_rows")
            times = [c.open_time_ms for c in candles]
            self._merge_ohlc(
                spark,
                "cw_history_rows",
                {c.ticker for c in candles},
                {c.period_s for c in candles},
                min(times),
                max(times),
            )
            self.metrics.rows.labels("ohlc").inc(len(candles))
        done = self.progress.record_history(
            [b.metadata for b in batches if b.HasField("metadata")],
            [(b.request_id, b.page, len(b.rows)) for b in batches if not b.error],
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


def _differs(row: dict, current: object) -> bool:
    from decimal import Decimal

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
