"""``candlewire stream``: Kafka → Iceberg tables and live ZMQ market data, with PySpark.

The job starts its streaming queries (:mod:`streaming.queries`, one module each) on one
Spark session and shares with them the tables, the ZMQ publisher, the PostgreSQL progress
record and the metrics (:class:`streaming.context.JobContext`). Before they start, the
committing query's state is restored (:mod:`streaming.recovery`), and the live query starts
from the same point; the CEP triggers go on from their own record (:mod:`streaming.firings`),
evaluated by the real-time live path itself or, on the micro-batch engine, by a query of
their own. Beside them, the trigger desk (:mod:`streaming.desk`) takes CEP trigger
registrations.

A candle exists only for an interval with at least one trade: nothing is invented for quiet
intervals.
"""

from __future__ import annotations

import logging
import threading
import time
from functools import partial

import pyarrow as pa
from confluent_kafka import Producer
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.streaming.query import StreamingQuery

from candlewire.config import Settings
from candlewire.kafka import TICKS, ensure_topics, producer_config
from candlewire.runtime import MetricsServer, run_until_signal
from candlewire.spark import build_session
from proto.envelope import to_record
from streaming.context import JobContext
from streaming.desk import TriggerDesk
from streaming.firings import FiringDesk
from streaming.pacing import BatchFunction, PacedQuery, start_every
from streaming.queries import Query
from streaming.queries.books import BooksLiveQuery, BooksQuery
from streaming.queries.history import HistoryQuery
from streaming.queries.live import LiveQuery, local_master
from streaming.queries.metadata import MetadataQuery
from streaming.queries.ticks import TicksQuery
from streaming.recovery import Ledger

log = logging.getLogger("candlewire.stream")


class StreamingJob:
    def __init__(
        self, settings: Settings, spark: SparkSession | None = None, metrics: bool = True
    ) -> None:
        realtime = settings.stream_live_engine == "realtime"
        ensure_topics(settings)  # a broker from an older release lacks the newer topics
        if spark is None:
            if realtime:
                settings = settings.model_copy(
                    update={"spark_master": local_master(settings.spark_master_url())}
                )
            spark = build_session(settings, "candlewire-stream")
        self.ctx = JobContext.open(settings, spark)
        ledger = Ledger(self.ctx)
        restored = ledger.restore()
        self.desk = TriggerDesk(self.ctx)
        self.firings = FiringDesk(self.ctx, ledger.run_id, self.desk)
        # Either engine's live path evaluates the CEP triggers too, in the JVM.
        live = LiveQuery(self.ctx, restored, self.firings)
        self.live = live
        publisher = self.ctx.publisher
        self.ctx.metrics.journal_errors.set_function(
            lambda: publisher.journal_errors + live.publish_faults()[1]
        )
        self.ctx.metrics.publish_dropped.set_function(
            lambda: publisher.dropped + live.publish_faults()[0]
        )
        self.ctx.metrics.refused_frames.set_function(
            lambda: publisher.refused_frames + live.publish_faults()[2]
        )
        self.queries: list[Query] = [
            live,
            TicksQuery(self.ctx, ledger, restored),
            HistoryQuery(self.ctx),
            MetadataQuery(self.ctx),
            BooksLiveQuery(self.ctx),
            BooksQuery(self.ctx),
        ]
        self.idle = IdleMarkWriter(self.ctx, live)
        self._serve_metrics = metrics
        self._http: MetricsServer | None = None
        self.running: dict = {}
        self._restarts: dict[str, list[float]] = {q.name: [] for q in self.queries}

    def start(self) -> StreamingJob:
        settings = self.ctx.settings
        if self._serve_metrics:  # first: a port that is taken stops the job before it starts
            self._http = MetricsServer(self.ctx.metrics.registry, settings, "stream_metrics")
        for q in self.queries:
            self._start(q)
        self.idle.start()
        self.desk.start()
        self.ctx.metrics.up.set(1)
        log.info("streaming job running: %s", ", ".join(self.running))
        return self

    def _start(self, q: Query) -> None:
        if isinstance(q, LiveQuery):
            self._pool(q)
            self.running[q.name] = q.start()
        elif isinstance(q, TicksQuery):
            paced = PacedQuery(
                q,
                lambda batch: self._stream(q, batch),
                self.ctx.commit_due,
                lambda error: self._may_restart(q, error),
            )
            self.ctx.metrics.iceberg_behind.set_function(paced.behind_s)
            self.running[q.name] = paced
        else:
            self.running[q.name] = self._stream(q, q.batch)

    def _pool(self, q: Query | LiveQuery) -> None:
        """One FAIR pool per query (spark_conf sets FAIR mode): commits and MERGEs do not
        hold up the live query's next batch, which is what subscribers wait for. A local
        property of the calling thread, which the query's own thread inherits."""
        self.ctx.spark.sparkContext.setLocalProperty("spark.scheduler.pool", q.name)

    def _stream(self, q: Query, batch: BatchFunction) -> StreamingQuery:
        self._pool(q)
        each = partial(_batch, batch)
        return start_every(q.source(), each, q.checkpoint, q.trigger_s, f"candlewire-{q.name}")

    def stop(self) -> None:
        """Each query stops: Spark cancels a batch in flight, which runs again from the
        checkpoint at the next start (the ledger skips the writes it made); the log says how
        long each query took."""
        self.idle.close()
        self.desk.close()
        for name, running in self.running.items():
            began = time.monotonic()
            try:
                running.stop()
            except Exception:  # the others must still stop
                log.exception("query %s did not stop cleanly", name)
            log.info("query %s stopped in %.1f s", name, time.monotonic() - began)
        self.ctx.metrics.up.set(0)
        for q in self.queries:
            q.close()
        self.firings.close()
        self.ctx.publisher.close()
        if self._http is not None:
            self._http.close()

    def run(self) -> None:
        run_until_signal(self.start, self.stop, healthy=self._all_active)

    def _all_active(self) -> bool:
        failed = [q for q in self.queries if not self.running[q.name].isActive]
        for q in failed:
            error = self.running[q.name].exception()
            if self._may_restart(q, error):
                self._start(q)
                continue
            log.error("query %s stopped: %s", q.name, error)
            return False
        if not self.live.healthy():
            log.error("the live path's publishing thread stopped")
            return False
        return True

    def _may_restart(self, q: Query | LiveQuery, error: object) -> bool:
        """A query that stopped on a passing fault starts again on its checkpoint, as after
        a kill -9: at most ``RESTARTS`` times in ``RESTART_WINDOW_S``, each after a longer
        pause, so a fault that stays (PostgreSQL down for good) still stops the job."""
        why = transient(error)
        now = time.monotonic()
        recent = [t for t in self._restarts[q.name] if now - t < RESTART_WINDOW_S]
        if why is None or len(recent) >= RESTARTS:
            return False
        self._restarts[q.name] = [*recent, now]
        pause = RESTART_PAUSE_S * 2 ** len(recent)
        log.warning("query %s stopped on %s; restarting in %.0f s", q.name, why, pause)
        time.sleep(pause)
        return True


RESTARTS = 3
RESTART_WINDOW_S = 600.0
RESTART_PAUSE_S = 1.0

# Spark 4.1.1's Kafka source throws a NullPointerException while reporting progress for the
# first batch after a restart when that batch was planned before the restart (SPARK-55271;
# no later 4.1 release has its whole Kafka connector on Central, see pyproject.toml).
# It is thrown after the batch ran and its commit was logged, so a query started again on
# the same checkpoint plans its next batch afresh and does not hit it again.
_SPARK_55271 = ('IterableOps.map(scala.Function1)" because the return value', "Option.get()")
# The catalog's PostgreSQL went away under a commit (restarted, or the connection ended
# twice in a row, past the catalog's one retry): the next run finds it back.
_CATALOG_LOST = ("org.postgresql.util.PSQLException", "sqlalchemy.exc.OperationalError")


def transient(error: object) -> str | None:
    """What passing fault stopped a query, or None when it is not one that a restart on
    the same checkpoint mends."""
    if error is None:
        return None
    text = str(error)
    if all(part in text for part in _SPARK_55271):
        return "SPARK-55271 after its batch committed"
    if any(part in text for part in _CATALOG_LOST):
        return "a lost connection to the catalog's PostgreSQL"
    return None


class IdleMarkWriter(threading.Thread):
    """Writes the live query's idle marks into the ticks topic, keyed by ticker so each
    lands in its feed's partition, after the feed's trades (``FeedState``)."""

    def __init__(self, ctx: JobContext, live: LiveQuery) -> None:
        super().__init__(name="idle-marks", daemon=True)
        self.ctx, self.live = ctx, live
        self.every_s = max(0.5, min(ctx.settings.stream_idle_timeout_s / 4, 5.0))
        self._stopping = threading.Event()
        self._producer = Producer(producer_config(ctx.settings))

    def run(self) -> None:
        while not self._stopping.wait(self.every_s):
            for mark in self.live.idle_marks():
                self._producer.produce(TICKS.name, key=mark.ticker.encode(), value=to_record(mark))
                self.ctx.metrics.idle_marks.inc()
                log.info("feed %s idle: its clock moves to %d", mark.ticker, mark.event_time_ns)
            self._producer.poll(0)

    def close(self) -> None:
        self._stopping.set()
        if self.is_alive():
            self.join(5)
        self._producer.flush(5)


def main(settings: Settings | None = None) -> None:
    """Entry point for `candlewire stream` and for spark-submit (streaming/main.py)."""
    StreamingJob(settings or Settings()).run()


def _batch(batch: BatchFunction, df: DataFrame, batch_id: int) -> None:
    """One batch, then Arrow's pool (mimalloc) gives back the pages the batch freed, which it
    would otherwise keep for reuse: the driver's Arrow region grew from 4 to 20 MiB in the
    first 10 minutes of ``bench.soak`` without it (#36)."""
    try:
        batch(df, batch_id)
    finally:
        pa.default_memory_pool().release_unused()
