"""The committing query's pace: every ``stream_ticks_trigger_s``, and sooner when a closed
candle was revised (#37) or a batch's worth of ticks is waiting (#34).

The query runs on a processing-time trigger of the interval, as one long-running query, so
its state store opens its RocksDB instances once: each new run of a query opens one a state
partition, and Spark 4.1's leaks about 500 KiB of native memory with each (SPARK-56523; the
driver's RSS grew some 4 MiB a minute when every commit was a run of its own). A processing-
time trigger cannot be woken early, though, and each Iceberg commit costs seconds of Spark
work whatever its size, so the interval cannot simply be short. So when :class:`CommitDue`,
which the live path tells what it reads, says a commit is due before the interval is up, the
driver stops the query between batches and starts it again on the same checkpoint and state,
and the new run's first batch commits what Kafka holds: a late trade folded into a closed
candle, so a repaired gap reaches ``ohlc`` in seconds, not at the next interval; and every
``stream_ticks_commit_after`` ticks, so a burst is committed as soon as there is a batch's
worth of it, as a Kafka Connect sink flushes at a size or an interval. A hurried start comes
at least ``HURRY_GAP_S`` after the last batch ended, so late trades or a flood cannot keep the
commits running back to back, nor while the run's own trigger is about to fire or has not yet
reported (a stop would meet it as it plans a batch). A start brought forward by a batch's
worth of ticks also waits while the live path is still reading the burst (up to
``BURST_WAIT_S`` from when it was due, and never while a revised candle waits for it): the
burst then goes into one batch instead of the part Kafka held at the threshold and a second
after the gap, and the live path keeps the cores while it reads. Only a hurry, or a failed
run that may start again, starts a run, so at a steady rate below a batch's worth an interval
the query runs for good.

Each run is a new query on a new JVM thread, and that thread's first call into Python (the
batch function) opens a py4j connection, with a thread in this process to serve it, that
outlives the run: py4j keeps it for a thread that will never call again. So when a run ends,
the driver shuts the connections its batches came in on.
"""

from __future__ import annotations

import ast
import contextlib
import logging
import math
import threading
import time
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from py4j.java_gateway import JavaObject
    from pyspark.sql import DataFrame
    from pyspark.sql.streaming.query import StreamingQuery
    from pyspark.sql.streaming.readwriter import DataStreamWriter

    from streaming.queries import Query

log = logging.getLogger("candlewire.stream")

# After a hurry: let the rest of a refetched burst reach Kafka before the run fixes its end.
SETTLE_S = 0.5
# Idle time between a batch's end and a hurried run's start, at the least.
HURRY_GAP_S = 2.0
# How often the driver reads the running query's progress and state.
WATCH_S = 1.0
# A burst has passed once the live path has read nothing for QUIET_S (it reports ten times a
# second); a run brought forward by a burst waits for that at most BURST_WAIT_S.
QUIET_S = 0.5
BURST_WAIT_S = 5.0
# After a run's first trigger, Spark's ProcessingTimeExecutor fires one on each of the epoch's
# multiples of the interval that it is not busy at. A hurry waits while one is less than
# TRIGGER_LEAD_S away, or has come and not yet reported (for up to TRIGGER_WAIT_S): a stop as it
# fires would cut the batch it plans (SPARK-55271 on the restart), and a batch that catches up
# takes what was due.
TRIGGER_LEAD_S = 1.0
TRIGGER_WAIT_S = 2.0


class CommitDue:
    """What brings the committing query's next run forward; the live path's threads call it."""

    def __init__(self, after_ticks: int) -> None:
        self.event = threading.Event()
        self.after_ticks = after_ticks
        self._burst = False  # a batch's worth of ticks read since the last run started
        self._revised = False  # a revised candle since the last run started
        self._revised_at = -math.inf  # time.monotonic() when it was last flagged
        self._read = 0
        self._last_read = -math.inf  # time.monotonic() of the last read reported
        self._lock = threading.Lock()

    def clear(self) -> None:
        """A run starts: what is flagged from here on needs a run after this one."""
        with self._lock:
            self._burst = self._revised = False
            self._read = 0  # the run takes what the live path has read so far
            self.event.clear()

    def batch_began(self) -> None:
        """A batch of the running query starts: it takes what the live path has read so far,
        so a burst flagged before it needs no run of its own. A revised candle stays flagged:
        its trade may have reached Kafka after the batch fixed its end (:meth:`held`)."""
        with self._lock:
            self._burst = False
            self._read = 0
            if not self._revised:
                self.event.clear()

    def held(self, as_of: float) -> None:
        """Iceberg holds every record Kafka held at ``as_of`` (time.monotonic()): candles
        revised before it need no run of their own, since their trades were in Kafka when the
        live path read them."""
        with self._lock:
            if self._revised and self._revised_at <= as_of:
                self._revised = False
                if not self._burst:
                    self.event.clear()

    def revised(self) -> None:
        """A closed candle changed: ``ohlc`` holds a stale value."""
        with self._lock:
            self._revised_at = time.monotonic()  # the latest: a trigger before it missed it
            self._revised = True
            self.event.set()

    def read(self, n: int) -> None:
        """``n`` more records of the ticks topic arrived."""
        if n <= 0:
            return
        with self._lock:
            self._last_read = time.monotonic()
            self._read += n
            due = self._read >= self.after_ticks
            if due:
                self._read = 0
                self._burst = True
                self.event.set()

    def burst_unread(self) -> bool:
        """Whether the run is due for a burst the live path is still reading (it read records
        in the last ``QUIET_S``), and no revised candle waits for it."""
        with self._lock:
            quiet = time.monotonic() - self._last_read >= QUIET_S
            return self._burst and not self._revised and not quiet


BatchFunction = Callable[["DataFrame", int], None]


def batch_writer(
    df: DataFrame, batch: BatchFunction, checkpoint: str | Path, name: str | None = None
) -> DataStreamWriter:
    """``df``'s micro-batches to ``batch``, on ``checkpoint``: how the job's queries start,
    the trigger left to the caller."""
    writer = df.writeStream.foreachBatch(batch).option("checkpointLocation", str(checkpoint))
    return writer if name is None else writer.queryName(name)


def start_every(
    df: DataFrame,
    batch: BatchFunction,
    checkpoint: str | Path,
    every_s: float,
    name: str | None = None,
) -> StreamingQuery:
    """A query with a batch every ``every_s`` (when Kafka holds anything new), the first at
    once."""
    writer = batch_writer(df, batch, checkpoint, name)
    return writer.trigger(processingTime=f"{_interval_ms(every_s)} milliseconds").start()


def _interval_ms(every_s: float) -> int:
    """A processing-time trigger's interval, as Spark is given it."""
    return int(every_s * 1000)


def jvm_caller() -> tuple[JavaObject, JavaObject] | None:
    """py4j's client in the JVM and its connection on which the JVM called this thread, if it
    did: py4j runs this thread's calls on the JVM thread that called it, whose connection
    that is."""
    from pyspark import SparkContext

    try:
        client = SparkContext._gateway.java_gateway_server.getCallbackClient()  # type: ignore[union-attr]
        connection = client.getPerThreadConnection()
    except Exception:  # not py4j's pinned threads: nothing to end
        return None
    return None if connection is None else (client, connection)  # None: no JVM thread called


class PacedQuery:
    """The committing query, run by the driver's clock; quacks like the ``StreamingQuery`` the
    job checks (``isActive``, ``exception()``, ``stop()``)."""

    def __init__(
        self,
        q: Query,
        start: Callable[[BatchFunction], StreamingQuery],
        due: CommitDue,
        retry: Callable[[BaseException], bool],
    ) -> None:
        """``start`` starts the query with the batch function it is given, a batch every
        ``q.trigger_s`` (:func:`start_every`); ``due`` brings a batch forward; ``retry`` says
        whether a run that failed may simply start again."""
        self.q, self._start, self._due, self._retry = q, start, due, retry
        # The run's py4j connections (the JVM's end), each with the client that keeps it.
        self._callers: list[tuple[JavaObject, JavaObject]] = []
        self._stopping = threading.Event()
        self._run: StreamingQuery | None = None
        self._error: BaseException | None = None
        self.runs = 0
        self._in_batch = False
        self._batch_ended = -math.inf  # time.monotonic()
        self._progress_seen: str | None = None
        self._trigger_began = -math.inf  # time.time() of the last trigger that reported
        # When the last trigger that caught up with Kafka began (time.monotonic()): Iceberg's
        # ticks and ohlc hold every record Kafka held then, since its batch (or none, when
        # nothing was new) ended at Kafka's latest offsets, read after the trigger began.
        self.holds_as_of: float | None = None
        self._thread = threading.Thread(target=self._loop, name=f"pace-{q.name}", daemon=True)
        self._thread.start()

    @property
    def isActive(self) -> bool:
        return self._thread.is_alive()

    def exception(self) -> BaseException | None:
        return self._error

    def stop(self) -> None:
        """The query stops (a batch in flight is cut, as a running query's stop does)."""
        self._stopping.set()
        self._due.event.set()
        self._thread.join()

    def behind_s(self) -> float:
        """Seconds since :attr:`holds_as_of`; NaN before a trigger that caught up."""
        as_of = self.holds_as_of
        return float("nan") if as_of is None else time.monotonic() - as_of

    def _loop(self) -> None:
        try:
            while not self._stopping.is_set():
                self._due.clear()
                if not self._run_until_hurried():
                    return
        except Exception as exc:  # the query ends with it, as on a failed run
            if not self._stopping.is_set():  # not the JVM going away under a stop
                log.exception("query %s: its pacing failed", self.q.name)
                self._error = exc
        finally:
            self._end_run()

    def _run_until_hurried(self) -> bool:
        """Starts a run and watches it until a hurry ends it (True), or it failed (True when
        it may start again), or the query stops (False)."""
        self.runs += 1
        try:
            self._run = self._start(self._batch)
        except Exception as exc:
            return self._failed(exc)
        while not self._stopping.is_set():
            run = self._run
            self._note_progress(run)
            if not run.isActive or (self._due.event.wait(WATCH_S) and self._hurried(run)):
                self._end_run()
                error = run.exception()  # it failed, or may have as the hurry came
                return error is None or self._failed(error)
        return False

    def _hurried(self, run: StreamingQuery) -> bool:
        """Whether, once the waits are over, a batch is still due before the interval: the
        run then stops between batches, for a new one to start at once. Not when a batch of
        the run took what was due meanwhile, or the run ended."""
        give_up = time.monotonic() + BURST_WAIT_S
        settled = time.monotonic() + SETTLE_S
        while not self._stopping.is_set():
            # The clock, then its state, then its progress: a trigger that begins after the
            # clock is read shows as busy, and one that ends between the two is seen.
            wall = time.time()
            busy = self._in_batch or _trigger_active(run)
            self._note_progress(run)
            now = time.monotonic()
            if not self._due.event.is_set() or not run.isActive:
                return False
            # Never cut a batch (one planned is in the offset log), nor meet the run's trigger
            # as it fires, nor stop a run before its first trigger has reported: that trigger
            # reads Kafka's latest, after what is due.
            ready = max(settled, self._batch_ended + HURRY_GAP_S)
            near = _trigger_near(self.q.trigger_s, wall, self._trigger_began)
            if busy or near or run.lastProgress is None:
                self._stopping.wait(0.1)
            elif now < ready:
                self._stopping.wait(ready - now)
            elif self._due.burst_unread() and now < give_up:
                self._stopping.wait(0.1)
            else:
                return True
        return False

    def _failed(self, error: BaseException) -> bool:
        if self._stopping.is_set():
            return False
        if self._retry(error):
            return True
        log.error("query %s stopped: %s", self.q.name, error)
        self._error = error
        return False

    def _end_run(self) -> None:
        run, self._run = self._run, None
        if run is None:
            return
        try:
            run.stop()
            self._note_progress(run)  # its last batch's
        except Exception:  # the JVM is stopping
            log.exception("query %s: its run did not stop cleanly", self.q.name)
        finally:
            self._hang_up()
        log.debug("%s run %d ended", self.q.name, self.runs)

    def _note_progress(self, run: StreamingQuery) -> None:
        """A batch, or an idle trigger, whose end offsets are Kafka's latest when it began:
        Iceberg holds every record Kafka held then. A batch that took only the most one may
        (a backlog), a failed one, or one cut by a stop, reports no such progress."""
        progress = run.lastProgress
        if not progress or progress.get("timestamp") == self._progress_seen:
            return
        self._progress_seen = progress["timestamp"]
        began = datetime.fromisoformat(progress["timestamp"]).timestamp()
        self._trigger_began = max(self._trigger_began, began)
        sources = progress.get("sources") or []
        if sources and all(_caught_up(s) for s in sources):
            self.holds_as_of = time.monotonic() - max(0.0, time.time() - began)
            self._due.held(self.holds_as_of)

    def _batch(self, df: DataFrame, batch_id: int) -> None:
        self._in_batch = True
        try:
            caller = jvm_caller()
            if caller is not None and not any(caller[1].equals(c) for _, c in self._callers):
                self._callers.append(caller)
            self._due.batch_began()
            self.q.batch(df, batch_id)
        finally:
            self._batch_ended = time.monotonic()
            self._in_batch = False

    def _hang_up(self) -> None:
        """The run's thread is gone: its connections end. The JVM closes its end, and its
        client lets go of it (py4j tells it only of connections Python opened); the Python
        thread serving it reads the end and stops."""
        while self._callers:
            client, connection = self._callers.pop()
            with contextlib.suppress(Exception):  # the JVM is stopping: it ends them all
                connection.shutdown()
                client.connectionStopped(connection)


def _offsets(value: object) -> object:
    """A source's offsets as progress reports them: PySpark 4.1 gives each as the ``str()`` of
    the parsed JSON (a dict's repr, or ``"None"``)."""
    if isinstance(value, str):
        try:
            return None if value == "null" else ast.literal_eval(value)
        except (ValueError, SyntaxError):
            return value
    return value


def _caught_up(source: dict) -> bool:
    """The batch (or idle trigger) ended at the offsets Kafka held when it was planned."""
    latest = _offsets(source.get("latestOffset"))
    return latest is not None and _offsets(source.get("endOffset")) == latest


def _trigger_near(every_s: float, now: float, reported: float) -> bool:
    """Whether a run started by :func:`start_every` with ``every_s`` may be about to plan a
    batch at ``now`` (time.time()): its next trigger is less than ``TRIGGER_LEAD_S`` away, or
    the last one's time came less than ``TRIGGER_WAIT_S`` ago and no trigger has reported since
    (``reported``: when the last that did began). Never for an interval too short to wait for
    one: the wait would run into the next."""
    every_ms = _interval_ms(every_s)
    if every_ms / 1000 <= 2 * (TRIGGER_LEAD_S + TRIGGER_WAIT_S):
        return False
    now_ms = now * 1000
    last_ms = now_ms // every_ms * every_ms  # its trigger reports a start at or after it
    if last_ms + every_ms - now_ms < TRIGGER_LEAD_S * 1000:
        return True
    return now_ms - last_ms < TRIGGER_WAIT_S * 1000 and reported * 1000 < last_ms


def _trigger_active(run: StreamingQuery) -> bool:
    """Whether the run is planning or running a batch: stopped then, the batch it has logged
    runs again after the restart, and Spark 4.1.1 fails reporting it (SPARK-55271)."""
    return bool(run.status.get("isTriggerActive"))
