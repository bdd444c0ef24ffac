"""The history query: OHLCBatch pages from ingestors into ``ohlc``, then HistoryReady.

Pages are upserted (asking twice leaves one copy); a range with no rows yet is appended
instead of MERGEd. When all pages of a request are in, or its error marker arrives,
HistoryReadyNotification goes out on the request's topic, only after the commit. A candle
whose price or volume is not a finite decimal is dropped, counted, and left out of the
notification's ``row_count``.
"""

from __future__ import annotations

import logging
import time

from pyspark.sql import DataFrame

from candlewire.kafka import OHLC_BATCHES
from proto import market_pb2
from proto import requests_pb2 as rq
from proto.envelope import derive
from streaming.decode import (
    CandleKey,
    candle_key,
    candles_table,
    decode_records,
    kept_count,
    ledger_page,
)
from streaming.metrics import Laps
from streaming.progress import Completed
from streaming.queries import TopicQuery

log = logging.getLogger("candlewire.stream")


class HistoryQuery(TopicQuery):
    name = "history"
    topic = OHLC_BATCHES.name
    max_per_trigger = 2000

    def batch(self, df: DataFrame, batch_id: int) -> None:
        metrics = self.ctx.metrics
        lap = Laps()
        values = [r.value for r in df.select("value").collect()]
        decoded, bad = decode_records(values, market_pb2.OHLCBatch)
        batches = [ledger_page(b) for b in decoded]
        lap("decode")
        metrics.bad.labels(OHLC_BATCHES.name).inc(bad)
        # One row per key; a page the ingestor sent twice is in the batch twice.
        candles = list({candle_key(c): c for b in batches if not b.error for c in b.rows}.values())
        dropped: set[CandleKey] = set()
        if candles:
            rows, dropped = candles_table(candles, "history")
            metrics.bad.labels(OHLC_BATCHES.name).inc(len(dropped))
            lap("rows")
            if rows.num_rows:
                self.ctx.tables.upsert_ohlc(rows, "cw_history_rows", append_if_new=True, lap=lap)
            metrics.rows.labels("ohlc").inc(rows.num_rows)
        done = self.ctx.progress.record_history(
            [b.metadata for b in batches if b.HasField("metadata")],
            [(b.request_id, b.page, kept_count(b.rows, dropped)) for b in batches if not b.error],
            {b.request_id: b.error for b in batches if b.error},
        )
        snapshot = self.ctx.tables.snapshot_id("ohlc") if done else 0
        for c in done:
            self._notify(c, snapshot)
        metrics.batches.labels(self.name).inc()
        if values:
            log.info(
                "history batch %d: %d pages, %d rows, %d ready; %s",
                batch_id,
                len(batches),
                len(candles),
                len(done),
                lap,
            )

    def _notify(self, c: Completed, snapshot: int) -> None:
        m = c.meta
        note = derive(
            rq.HistoryReadyNotification,
            m,
            status=rq.HISTORY_ERROR if c.error else rq.HISTORY_OK,
            row_count=0 if c.error else c.rows,
            iceberg_table=self.ctx.tables["ohlc"],
            error_message=c.error or "",
            snapshot_id=snapshot,
            completed_time_ms=int(time.time() * 1000),
        )
        self.ctx.publisher.notify(m.notification_topic, note)
        self.ctx.metrics.notifications.labels("history_error" if c.error else "history_ok").inc()
