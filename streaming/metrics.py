"""Prometheus metrics of the streaming job, and the per-batch stopwatch its log uses.

One registry per job, so tests and embedders can run several in one process.
"""

from __future__ import annotations

import logging
import time

from prometheus_client import CollectorRegistry, Counter, Gauge

# Read by `candlewire status` too: how far behind Kafka the Iceberg tables are.
ICEBERG_BEHIND = "candlewire_stream_iceberg_behind_seconds"


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
            "Ticks older than their feed's clock less the allowance (kept in ticks; within the "
            "dedup horizon they revise their candles, beyond it they change none)",
            registry=r,
        )
        self.revised = Counter(
            "candlewire_stream_revising_ticks",
            "Late ticks within the dedup horizon, folded into their closed candles as revisions",
            registry=r,
        )
        self.duplicates = Counter(
            "candlewire_stream_duplicate_ticks",
            "Resent trades (a ticker and trade_id seen within the horizon), by query: dropped",
            ["query"],
            registry=r,
        )
        self.no_trade_id = Counter(
            "candlewire_stream_ticks_without_trade_id",
            "Ticks with no trade_id: kept, and never taken for a resend",
            registry=r,
        )
        self.idle_marks = Counter(
            "candlewire_stream_idle_marks",
            "Idle marks written for quiet feeds, so their last candles close",
            registry=r,
        )
        self.bad = Counter(
            "candlewire_stream_bad_records",
            "Undecodable Kafka records dropped",
            ["topic"],
            registry=r,
        )
        self.unstorable = Counter(
            "candlewire_stream_unstorable_candles",
            "Candles left out of ohlc: a value DECIMAL(38,18) does not hold (a volume's sum)",
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
        self.trigger_requests = Counter(
            "candlewire_stream_trigger_requests",
            "CEP trigger requests handed over by the relay: accepted, refused, or dropped "
            "(undecodable or unexpected frames)",
            ["result"],
            registry=r,
        )
        self.trigger_firings = Counter(
            "candlewire_stream_trigger_firings",
            "CEP trigger firings the live path's evaluator made, each sent as it is made",
            registry=r,
        )
        self.up = Gauge("candlewire_stream_up", "1 while the queries run", registry=r)
        self.journal_errors = Gauge(
            "candlewire_stream_journal_errors",
            "Live messages published but not written to the journal (candlewire.live)",
            registry=r,
        )
        self.publish_dropped = Gauge(
            "candlewire_stream_publish_dropped",
            "Messages not sent because a relay's queue was full (subscribers fill market data "
            "from the journal)",
            registry=r,
        )
        self.refused_frames = Gauge(
            "candlewire_stream_refused_frames",
            "Frames a relay sent up the publisher's socket that were no subscription",
            registry=r,
        )
        self.iceberg_behind = Gauge(
            ICEBERG_BEHIND,
            "Seconds since the moment up to which Iceberg's ticks and ohlc hold every tick Kafka "
            "held (the start of the committing query's last trigger that caught up with Kafka): "
            "it swings between about a batch's length and the interval plus a batch, and rises "
            "without end when commits fall behind; NaN from the job's start until the query "
            "first reports a trigger that caught up",
            registry=r,
        )


class Laps:
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


class LapTotals:
    """Seconds per step summed over a frequent query's batches, logged every ``every_s``:
    where its time goes, without a line per batch (and the wait between batches, which is
    Spark's: planning, scheduling, the Kafka offsets)."""

    def __init__(self, log: logging.Logger, query: str, every_s: float = 30.0) -> None:
        self.log, self.query, self.every_s = log, query, every_s
        self._reset(time.perf_counter())

    def _reset(self, now: float) -> None:
        self._since = self._last = now
        self._steps: dict[str, float] = {}
        self._batches = self._rows = self._events = 0

    def __call__(self, step: str) -> None:
        now = time.perf_counter()
        self._steps[step] = self._steps.get(step, 0.0) + now - self._last
        self._last = now

    def batch(self, rows: int, events: int) -> None:
        """The end of a batch; the next one's first step counts from the start of that."""
        self._batches, self._rows, self._events = (
            self._batches + 1,
            self._rows + rows,
            self._events + events,
        )
        now = time.perf_counter()
        if now - self._since >= self.every_s:
            wall = now - self._since
            spent = ", ".join(f"{k} {v / self._batches * 1000:.0f}" for k, v in self._steps.items())
            self.log.info(
                "%s: %d batches in %.0f s (%d rows, %d out); ms per batch: %s",
                self.query,
                self._batches,
                wall,
                self._rows,
                self._events,
                spent,
            )
            self._reset(now)
        else:
            self._last = now
