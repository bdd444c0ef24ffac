"""The live query: what subscribers see, ahead of the commits.

Every ``stream_live_trigger_s`` it publishes each tick on ``{ticker}|tick`` (the Kafka value
already is the envelope) and each updated forming candle on ``{ticker}|ohlc:{period}``. It
decodes on the driver (no Python worker round trip, no shuffle) and writes nothing, so a
batch costs milliseconds, not the seconds a commit takes. Its checkpoint is thrown away: every
start begins at the recorded offsets with the recorded candles, so after a restart it replays
what the commits had not yet covered and its candles end on the committed values.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import time
from decimal import Decimal

from pyspark.sql import DataFrame

from candlewire.config import PERIODS_S
from candlewire.kafka import TICKS
from candlewire.topics import market_data_topic, ohlc_type, tick_type
from proto import market_pb2
from streaming.candles import Candle, next_watermark, partial_candles
from streaming.context import JobContext
from streaming.decode import parse_tick
from streaming.recovery import Restored


class LiveQuery:
    name = "live"

    def __init__(self, ctx: JobContext, restored: Restored) -> None:
        self.ctx = ctx
        self.trigger_s = ctx.settings.stream_live_trigger_s
        self.forming = restored.forming()
        self.watermark_ms = restored.watermark_ms
        self.offsets = dict(restored.offsets)
        # Thrown away on exit: keep it in memory where there is /dev/shm, since writing
        # offsets and commits to disk was most of a live batch's time.
        shm = "/dev/shm" if os.path.isdir("/dev/shm") else None
        self.checkpoint = tempfile.mkdtemp(prefix="candlewire-live-", dir=shm)

    def source(self) -> DataFrame:
        """The ticks topic from where the commits stand."""
        start = {str(p): o for p, o in self.offsets.items()}
        start.update({str(p): -2 for p in range(TICKS.partitions) if str(p) not in start})
        return self.ctx.kafka(
            TICKS.name, startingOffsets=json.dumps({TICKS.name: start}), failOnDataLoss="false"
        ).select("value")

    def close(self) -> None:
        shutil.rmtree(self.checkpoint, ignore_errors=True)

    def batch(self, df: DataFrame, batch_id: int) -> None:
        started = time.perf_counter()
        late_ns = self.watermark_ms * 1_000_000
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
        metrics = self.ctx.metrics
        self.ctx.publisher.publish_raw(frames)
        watermark = next_watermark(self.watermark_ms, max_ns, self.ctx.settings.stream_watermark_s)
        updated = self.forming.merge(partial_candles(kept, PERIODS_S))
        self._publish_candles(updated, watermark)
        metrics.published.labels("tick").inc(len(frames))
        metrics.published.labels("ohlc").inc(len(updated))
        self.watermark_ms = watermark
        self.forming.evict(watermark)
        metrics.batches.labels(self.name).inc()
        metrics.busy.labels(self.name).inc(time.perf_counter() - started)

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
            self.ctx.publisher.publish(market_data_topic(c.ticker, ohlc_type(c.period_s)), candle)
