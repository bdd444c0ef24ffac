"""The committing query's pace: every ``stream_ticks_trigger_s``, and sooner when a closed
candle was revised (#37) or a batch's worth of ticks is waiting (#34).

A processing-time trigger cannot be woken early, and each Iceberg commit costs seconds of
Spark work whatever its size, so the commit interval cannot simply be short. Instead the
driver runs the query as a series of ``availableNow`` runs, each committing what Kafka holds
when it starts (in batches of at most ``stream_ticks_batch_max``) on the same checkpoint and
state store, so the result is the processing-time trigger's. Between runs it waits for the
interval, or for :class:`CommitDue`, which the live path tells what it reads: a late trade
folded into a closed candle, so a repaired gap reaches ``ohlc`` in seconds, not at the next
interval; and every ``stream_ticks_commit_after`` ticks, so a burst is committed as soon as
there is a batch's worth of it, as a Kafka Connect sink flushes at a size or an interval. A
hurried run starts at least ``HURRY_GAP_S`` after the last one ended, so late trades or a
flood cannot keep the commits running back to back. A run brought forward by a batch's worth
of ticks also waits while the live path is still reading the burst (up to ``BURST_WAIT_S``
from when it was due, and never while a revised candle waits for it): the burst then goes into
one run instead of the part Kafka held at the threshold and a second run after the gap, and
the live path keeps the cores while it reads.

Each run is a new query on a new JVM thread, and that thread's first call into Python (the
batch function) opens a py4j connection, with a thread in this process to serve it, that
outlives the run: py4j keeps it for a thread that will never call again. Two a minute at the
default interval, each a Python thread and a socket at both ends, for as long as the job
runs; so when a run ends, the driver shuts the connections its batches came in on.
"""

from __future__ import annotations

import contextlib
import logging
import math
import threading
import time
from collections.abc import Callable
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
# Idle time between a run's end and a hurried run's start, at the least.
HURRY_GAP_S = 2.0
# A burst has passed once the live path has read nothing for QUIET_S (it reports ten times a
# second); a run brought forward by a burst waits for that at most BURST_WAIT_S.
QUIET_S = 0.5
BURST_WAIT_S = 5.0


class CommitDue:
    """What brings the committing query's next run forward; the live path's threads call it."""

    def __init__(self, after_ticks: int) -> None:
        self.event = threading.Event()
        self.after_ticks = after_ticks
        self._burst = False  # a batch's worth of ticks read since the last run started
        self._revised = False  # a revised candle since the last run started
        self._read = 0
        self._last_read = -math.inf  # time.monotonic() of the last read reported
        self._lock = threading.Lock()

    def clear(self) -> None:
        """A run starts: what is flagged from here on needs a run after this one."""
        with self._lock:
            self._burst = self._revised = False
            self._read = 0  # the run takes what the live path has read so far
            self.event.clear()

    def revised(self) -> None:
        """A closed candle changed: ``ohlc`` holds a stale value."""
        with self._lock:
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


def start_available_now(
    df: DataFrame, batch: BatchFunction, checkpoint: str | Path, name: str | None = None
) -> StreamingQuery:
    """One paced run: what ``df`` holds when it starts, in batches, then it ends."""
    return batch_writer(df, batch, checkpoint, name).trigger(availableNow=True).start()


def jvm_caller() -> tuple[JavaObject, JavaObject] | None:
    """py4j's client in the JVM and its connection on which the JVM called this thread, if it
    did: py4j runs this thread's calls on the JVM thread that called it, whose connection
    that is."""
    from pyspark import SparkContext

    try:
        client = SparkContext._gateway.java_gateway_server.getCallbackClient()  # type: ignore[union-attr]
        return client, client.getPerThreadConnection()
    except Exception:  # not py4j's pinned threads: nothing to end
        return None


class PacedQuery:
    """A query run by the driver's clock; quacks like the ``StreamingQuery`` the job checks
    (``isActive``, ``exception()``, ``stop()``)."""

    def __init__(
        self,
        q: Query,
        start: Callable[[BatchFunction], StreamingQuery],
        due: CommitDue,
        retry: Callable[[BaseException], bool],
    ) -> None:
        """``start`` starts one ``availableNow`` run with the batch function it is given;
        ``due`` brings a run forward; ``retry`` says whether a failed run may simply run
        again."""
        self.q, self._start, self._due, self._retry = q, start, due, retry
        # The run's py4j connections (the JVM's end), each with the client that keeps it.
        self._callers: list[tuple[JavaObject, JavaObject]] = []
        self._stopping = threading.Event()
        self._run: StreamingQuery | None = None
        self._error: BaseException | None = None
        self.runs = 0
        # When the last completed run began (time.monotonic()): Iceberg's ticks and ohlc hold
        # every record Kafka held then, since an availableNow run fixes its end offsets after
        # it is started.
        self.holds_as_of: float | None = None
        self._thread = threading.Thread(target=self._loop, name=f"pace-{q.name}", daemon=True)
        self._thread.start()

    @property
    def isActive(self) -> bool:
        return self._thread.is_alive()

    def exception(self) -> BaseException | None:
        return self._error

    def stop(self) -> None:
        """The run in flight stops after its batch, as a running query's stop does."""
        self._stopping.set()
        self._due.event.set()
        run = self._run
        if run is not None:
            run.stop()
        self._thread.join()

    def _loop(self) -> None:
        interval = self.q.trigger_s
        while not self._stopping.is_set():
            began = time.monotonic()
            self._due.clear()
            if not self._run_once():
                return
            ended = time.monotonic()
            if self._due.event.wait(max(0.0, began + interval - ended)):
                if self._stopping.is_set():
                    return
                give_up = time.monotonic() + BURST_WAIT_S
                self._stopping.wait(max(SETTLE_S, ended + HURRY_GAP_S - time.monotonic()))
                while self._due.burst_unread() and time.monotonic() < give_up:
                    if self._stopping.wait(0.1):
                        return

    def _run_once(self) -> bool:
        self.runs += 1
        began, as_of = time.perf_counter(), time.monotonic()
        try:
            self._run = self._start(self._batch)
            started = time.perf_counter()
            if self._stopping.is_set():
                self._run.stop()
            self._run.awaitTermination()
            if not self._stopping.is_set():  # a stopped run may have ended early
                self.holds_as_of = as_of
            log.debug(
                "%s run %d: started in %.2f s, done in %.2f s",
                self.q.name,
                self.runs,
                started - began,
                time.perf_counter() - began,
            )
            return True
        except Exception as exc:
            if self._stopping.is_set():
                return False
            if self._retry(exc):
                return True
            log.error("query %s stopped: %s", self.q.name, exc)
            self._error = exc
            return False
        finally:
            self._run = None
            self._hang_up()

    def behind_s(self) -> float:
        """Seconds since :attr:`holds_as_of`; NaN before the first run completes."""
        as_of = self.holds_as_of
        return float("nan") if as_of is None else time.monotonic() - as_of

    def _batch(self, df: DataFrame, batch_id: int) -> None:
        caller = jvm_caller()
        if caller is not None and not any(caller[1].equals(c) for _, c in self._callers):
            self._callers.append(caller)
        self.q.batch(df, batch_id)

    def _hang_up(self) -> None:
        """The run's thread is gone: its connections end. The JVM closes its end, and its
        client lets go of it (py4j tells it only of connections Python opened); the Python
        thread serving it reads the end and stops."""
        while self._callers:
            client, connection = self._callers.pop()
            with contextlib.suppress(Exception):  # the JVM is stopping: it ends them all
                connection.shutdown()
                client.connectionStopped(connection)
