"""The live query: what subscribers see, ahead of the commits.

Every ``stream_live_trigger_s`` it judges each record in Kafka order exactly as the
committing query will (:mod:`streaming.feeds`), publishes each tick that is not a resend on
``{ticker}|tick`` (the Kafka value already is the envelope; the publisher appends its
position, with the record's Kafka partition and offset), and each updated or newly
closed candle on ``{ticker}|ohlc:{period}``; a late tick is published but changes no
candle. It decodes on the driver (no Python worker round trip, no shuffle) and writes
nothing, so a batch costs milliseconds, not the seconds a commit takes. Its checkpoint is
thrown away: every start begins at the recorded offsets with the recorded state, so after a
restart it replays what the commits had not yet covered and its candles end on the
committed values.

It also sees first which feeds went quiet: :meth:`LiveQuery.idle_marks` names the feeds
whose idle mark would close a candle, and the job writes those marks into the ticks topic.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import threading
import time
from collections.abc import Iterable
from decimal import Decimal

from pyspark.sql import DataFrame

from candlewire.config import PERIODS_S
from candlewire.kafka import TICKS
from candlewire.topics import market_data_topic, ohlc_type, tick_type
from proto import market_pb2
from streaming.candles import Candle, changed, partial_candles
from streaming.context import JobContext
from streaming.decode import parse_tick
from streaming.feeds import Verdict
from streaming.recovery import Restored


def scratch_checkpoint() -> str:
    """The live query's checkpoint, thrown away on exit: in memory where there is /dev/shm,
    since writing offsets and commits to disk was most of a live batch's time."""
    shm = "/dev/shm" if os.path.isdir("/dev/shm") else None
    return tempfile.mkdtemp(prefix="candlewire-live-", dir=shm)


def live_source(
    ctx: JobContext,
    offsets: dict[int, int],
    max_per_trigger: int | None = 500_000,
    columns: tuple[str, ...] = ("value", "partition", "offset"),
) -> DataFrame:
    """The ticks topic from where the commits stand (``offsets``: next offset per partition;
    a partition without one starts at its beginning)."""
    start = {str(p): o for p, o in offsets.items()}
    start.update({str(p): -2 for p in range(TICKS.partitions) if str(p) not in start})
    return ctx.kafka(
        TICKS.name,
        max_per_trigger,
        startingOffsets=json.dumps({TICKS.name: start}),
        failOnDataLoss="false",
    ).select(*columns)


class LiveQuery:
    name = "live"

    def __init__(self, ctx: JobContext, restored: Restored) -> None:
        self.ctx = ctx
        self.trigger_s = ctx.settings.stream_live_trigger_s
        self.feeds = restored.feeds(ctx.settings)
        self.forming = restored.forming(self.feeds)
        self.offsets = dict(restored.offsets)
        # ticker → (monotonic arrival of its last trade, that trade's event time); restored
        # feeds count as heard now, so a feed quiet across a restart still gets its marks.
        now = time.monotonic()
        self.heard = {t: (now, clock) for t, clock in restored.clocks.items()}
        self._marked: dict[str, float] = {}
        self._lock = threading.Lock()  # the batch thread and the idle-mark writer
        self.checkpoint = scratch_checkpoint()

    def source(self) -> DataFrame:
        return live_source(self.ctx, self.offsets)

    def publish_faults(self) -> tuple[int, int, int]:
        """(dropped, journal errors, refused frames) beyond the job's publisher's: none, it
        publishes there."""
        return 0, 0, 0

    def close(self) -> None:
        shutil.rmtree(self.checkpoint, ignore_errors=True)

    def batch(self, df: DataFrame, batch_id: int) -> None:
        started = time.perf_counter()
        table = df.toArrow()
        records = zip(
            *(table.column(c).to_pylist() for c in ("value", "partition", "offset")), strict=True
        )
        with self._lock:
            frames, updated, closed, resent = self._judge(records)
        metrics = self.ctx.metrics
        if frames:
            self.ctx.publisher.publish_ticks(frames)
        self._publish_candles(updated, closed)
        if any(c.revision for c in closed):
            self.ctx.commit_due.revised()
        self.ctx.commit_due.read(table.num_rows)
        metrics.published.labels("tick").inc(len(frames))
        metrics.published.labels("ohlc").inc(len(updated) + len(closed))
        metrics.duplicates.labels(self.name).inc(resent)
        metrics.batches.labels(self.name).inc()
        metrics.busy.labels(self.name).inc(time.perf_counter() - started)

    def _judge(
        self, records: Iterable[tuple[bytes, int, int]]
    ) -> tuple[list[tuple[bytes, bytes, int, int]], list[Candle], list[Candle], int]:
        topics: dict[str, bytes] = {}
        frames: list[tuple[bytes, bytes, int, int]] = []
        timely: list[tuple[str, int, Decimal, Decimal]] = []
        revising: list[tuple[str, int, Decimal, Decimal]] = []
        resent = 0
        now = time.monotonic()
        for record, partition, offset in records:
            t = parse_tick(record)
            if t is None:
                continue
            if isinstance(t, market_pb2.FeedIdle):
                self.feeds.mark(t.ticker, t.event_time_ns)
                continue
            verdict = self.feeds.admit(t.ticker, t.trade_id, t.exchange_time_ns)
            if verdict is Verdict.DUPLICATE:
                resent += 1
                continue
            topic = topics.get(t.ticker)
            if topic is None:
                topic = topics[t.ticker] = market_data_topic(t.ticker, tick_type()).encode()
            frames.append((topic, record, partition, offset))
            self.heard[t.ticker] = (now, self.feeds.clock_ns(t.ticker))
            if verdict is Verdict.KEEP or verdict is Verdict.REVISE:
                tick = (t.ticker, t.exchange_time_ns, Decimal(t.price), Decimal(t.size))
                (timely if verdict is Verdict.KEEP else revising).append(tick)
        updated = self.forming.merge(partial_candles(timely, PERIODS_S))
        revised: list[Candle] = []
        if revising:
            forming, revised = self.forming.revise(
                partial_candles(revising, PERIODS_S), self.feeds.watermark_ms
            )
            updated += forming
        closed = self.forming.evict(self.feeds.watermark_ms, self.feeds.horizon_start_ms)
        return frames, updated, closed + revised, resent

    def idle_marks(self, now: float | None = None) -> list[market_pb2.FeedIdle]:
        """Marks for feeds quiet for the idle timeout whose clock, moved on by the time they
        have been quiet, would close a forming candle; at most one per feed per timeout."""
        now = time.monotonic() if now is None else now
        timeout = self.ctx.settings.stream_idle_timeout_s
        marks = []
        with self._lock:
            for ticker, first_end_ms in self.forming.tickers().items():
                heard_at, last_ns = self.heard.get(ticker, (now, self.feeds.clock_ns(ticker)))
                quiet = now - heard_at
                if quiet < timeout or now - self._marked.get(ticker, -timeout) < timeout:
                    continue
                at_ns = last_ns + int(quiet * 1e9)
                if at_ns - self.feeds.allowance_ns < first_end_ms * 1_000_000:
                    continue  # nothing would close yet
                self._marked[ticker] = now
                marks.append(
                    market_pb2.FeedIdle(ticker=ticker, event_time_ns=at_ns, last_trade_ns=last_ns)
                )
        return marks

    def _publish_candles(self, updated: list[Candle], closed: list[Candle]) -> None:
        now_ms = int(time.time() * 1000)
        items = []
        for c, is_closed in changed(updated, closed):
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
                closed=is_closed,
                update_time_ms=now_ms,
                revision=c.revision,
            )
            items.append((market_data_topic(c.ticker, ohlc_type(c.period_s)).encode(), candle))
        if items:
            self.ctx.publisher.publish_sequenced(items)
