"""The live query: ticks and forming candles reach subscribers milliseconds after Kafka has
them, and the CEP triggers fire on the record that makes them (#18, #19).

The per-record work is Java, whichever engine reads the records: ``jvm/decoder``'s ``Live``
decodes each record, judges it against its feed (``FeedState``, the rules the committing
query runs too), folds the forming candles, evaluates the triggers (``Triggers``), and
sequences, journals and publishes ticks and candles on its own XPUB (``stream_live``, which
the relay's XSUB also connects to). One implementation, so every engine's verdicts and
candles are the committing query's (#34). The engines differ only in how records reach it:

- ``realtime`` (the default): Spark's real-time mode runs long-lived tasks, one per
  partition of the ticks topic, that hand each record to ``LiveWriter`` as it is read. In
  pyspark 4.1.1 only JVM code gets rows that way, and the tasks run in the driver's JVM,
  where ``Live`` is, so a local master is required; its thread count is raised to hold every
  task at once (:func:`local_master`). ``REALTIME_BATCH`` is only how often the tasks
  restart (real-time mode's checkpoint interval); latency does not depend on it.
- ``microbatch`` (any master, a cluster's): every ``stream_live_trigger_s`` a batch is
  collected to the driver and handed to ``Live`` in the JVM (``LiveBatches``), no Python per
  record.

This module starts that side with the committing query's restored state, starts the query,
and carries the JVM's counters into the job's metrics. A thread takes the JVM's firings as
they come and hands them to :class:`streaming.firings.FiringDesk` (the owner's topic, the
user's alert), and every ``stream_cep_record_s`` records the triggers' state with the offsets
it stands at, after sending the firings made before it.

The query's checkpoint is thrown away: each start begins at the recorded offsets with the
recorded state, or earlier where the triggers' state stands (the JVM then skips for the live
path what its state already holds), so after a restart it replays what the commits had not
yet covered and its candles end on the committed values. It also sees first which feeds went
quiet: :meth:`LiveQuery.idle_marks` names the feeds whose idle mark would close a candle, and
the job writes those marks into the ticks topic.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import tempfile
import threading
import time
from collections.abc import Iterable
from pathlib import Path

from pyspark.sql import DataFrame
from pyspark.sql.streaming.query import StreamingQuery

from candlewire.config import PERIODS_S, Settings
from candlewire.curve import PUBLISHER_KEY, client_conf
from candlewire.kafka import JOURNAL, TICKS, spark_options
from candlewire.runtime import pid_alive
from candlewire.topics import market_data_topic, ohlc_type, tick_type
from candlewire.zmqutil import HWM, RECONNECT_IVL_MAX_MS
from proto import cep_pb2, live_pb2, market_pb2
from proto.envelope import from_record
from streaming.context import JobContext
from streaming.firings import FiringDesk
from streaming.progress import CepCommit
from streaming.publisher import next_epoch
from streaming.recovery import Restored

log = logging.getLogger("candlewire.stream.live")
FIRINGS_WAIT_MS = 100  # how long one call for the JVM's firings waits for the first

REALTIME_BATCH = "5 minutes"
SUBMITTED_WITHIN_S = 60  # how long start() waits for the first batch's job
# Threads beyond the real-time tasks, for the committing, history and metadata queries.
SPARE_TASK_SLOTS = 4
# Live.counters(), in order.
COUNTERS = (
    "read",
    "ticks",
    "candles",
    "duplicates",
    "late",
    "bad",
    "dropped",
    "journal_errors",
    "publishing",
    "refused",
    "revised",
)


SCRATCH = "candlewire-live-"


def scratch_dir(kind: str, base: str | None = None) -> str:
    """A directory the job throws away on exit, named by its pid. One that a job left when it
    died without exiting (kill -9, the OOM killer) is removed by the next job on the host:
    a hundred such checkpoints had piled up in /dev/shm, which is memory."""
    base = base or tempfile.gettempdir()
    prefix = f"{SCRATCH}{kind}-"
    for entry in Path(base).glob(f"{prefix}*-*"):
        pid = entry.name.removeprefix(prefix).split("-", 1)[0]
        if pid.isdigit() and not pid_alive(int(pid), ours=False):
            shutil.rmtree(entry, ignore_errors=True)
    return tempfile.mkdtemp(prefix=f"{prefix}{os.getpid()}-", dir=base)


def scratch_checkpoint() -> str:
    """The live query's checkpoint, thrown away on exit: in memory where there is /dev/shm,
    since writing offsets and commits to disk was most of a live batch's time."""
    return scratch_dir("checkpoint", "/dev/shm" if os.path.isdir("/dev/shm") else None)


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


def parse_counters(text: str) -> dict[str, int]:
    """``Live.counters()``: one comma-separated string, so reading them is one py4j call."""
    return dict(zip(COUNTERS, map(int, text.split(",")), strict=True))


def local_master(master: str, cores: int | None = None) -> str:
    """``local[N]`` with room for every real-time task plus the other queries' tasks, or a
    clear error for a master whose executors are not this JVM."""
    m = re.fullmatch(r"local(?:\[(\*|\d+)(?:,\d+)?\])?", master)
    if m is None:
        raise ValueError(
            f"stream_live_engine = 'realtime' needs a local Spark master, not {master!r}: "
            "set stream_live_engine = 'microbatch' for a cluster"
        )
    default = cores or os.cpu_count() or 1
    asked = default if m.group(1) in (None, "*") else int(m.group(1))
    return f"local[{max(asked, TICKS.partitions + SPARE_TASK_SLOTS)}]"


def restore_file(
    restored: Restored,
    directory: str,
    triggers: bytes = b"",
    registered: Iterable[cep_pb2.CEPTriggerRequest] = (),
) -> Path:
    """The restored state as the JVM reads it (``proto/live.proto``), with the CEP triggers'
    recorded state (``CepState``), or the registry's triggers to apply without one."""
    feeds: dict[str, live_pb2.LiveFeed] = {
        t: live_pb2.LiveFeed(ticker=t, clock_ns=c) for t, c in restored.clocks.items()
    }
    for ticker, trade_id, t_ns in restored.trades:
        feed = feeds.get(ticker)
        if feed is not None:
            feed.trade_ids.append(trade_id)
            feed.trade_times_ns.append(t_ns)
    state = live_pb2.LiveRestore(
        feeds=feeds.values(), offsets=restored.offsets, registered=registered
    )
    state.triggers.MergeFromString(triggers)
    for r in restored.rows:
        state.candles.add(
            ticker=r["ticker"],
            period_s=int(r["period_s"]),
            open_ms=int(r["open_ms"]),
            open=str(r["open"]),
            high=str(r["high"]),
            low=str(r["low"]),
            close=str(r["close"]),
            volume=str(r["volume"]),
            trade_count=int(r["trade_count"]),
            first_trade_ns=int(r["first_trade_ns"]),
            last_trade_ns=int(r["last_trade_ns"]),
            closed=bool(r.get("closed") or False),
            revision=int(r.get("revision") or 0),
        )
    path = Path(directory) / "live-restore.pb"
    path.write_bytes(state.SerializeToString())
    return path


def live_conf(settings: Settings, restore: Path, epoch: int) -> str:
    """``Live.start``'s configuration: ``key=value`` lines (java.util.Properties). ``epoch``:
    its positions' (:func:`streaming.publisher.next_epoch`)."""
    conf = {
        "restore": str(restore),
        "epoch": str(epoch),
        "bind": settings.bind("stream_live"),
        "connect": ",".join(settings.dialled_relays()),
        **spark_options(settings),  # kafka.bootstrap.servers and, with SASL, its settings
        "journal_topic": JOURNAL.name,
        "journal_partitions": str(JOURNAL.partitions),
        "periods": ",".join(str(p) for p in PERIODS_S),
        "tick_suffix": market_data_topic("", tick_type()),
        "ohlc_suffixes": ",".join(market_data_topic("", ohlc_type(p)) for p in PERIODS_S),
        "allowance_s": repr(settings.stream_watermark_s),
        "horizon_s": repr(settings.stream_dedup_horizon_s),
        "hwm": str(HWM),
        # A relay's next dial at the latest, and a second for its handshake.
        "subscribers_wait_ms": str(RECONNECT_IVL_MAX_MS + 1_000),
        "max_message_bytes": str(settings.max_message_bytes),
        **client_conf(settings, "relay", PUBLISHER_KEY),
    }
    return "".join(f"{k}={v.replace(chr(92), chr(92) * 2)}\n" for k, v in conf.items())


def start_offsets(live: dict[int, int], triggers: dict[int, int]) -> dict[int, int]:
    """Where the query starts: per partition, the earlier of where the live state and the
    triggers' state stand (a partition neither has starts at its beginning)."""
    return {p: min(live.get(p, 0), triggers.get(p, 0)) for p in {*live, *triggers}}


class LiveQuery:
    name = "live"

    def __init__(self, ctx: JobContext, restored: Restored, firings: FiringDesk) -> None:
        self.ctx = ctx
        self.firings = firings
        self.realtime = ctx.settings.stream_live_engine == "realtime"
        triggers, registered, cep_offsets = firings.restore()
        self.offsets = start_offsets(restored.offsets, cep_offsets)
        self.checkpoint = scratch_checkpoint()
        self._state_dir = scratch_dir("state")
        self._live = ctx.spark._jvm.io.candlewire.spark.Live
        restore = restore_file(restored, self._state_dir, triggers, registered)
        epoch = next_epoch(ctx.settings, after=ctx.publisher.sequencer.epoch)
        self._live.start(live_conf(ctx.settings, restore, epoch))
        self._record()  # the triggers' state as it starts, whatever line it is of
        self._counted = dict.fromkeys(COUNTERS, 0)
        self._stop = threading.Event()
        self._poller = threading.Thread(target=self._poll, name="live-counters", daemon=True)
        self._poller.start()
        self._sender = threading.Thread(target=self._send, name="cep-firings", daemon=True)
        self._sender.start()

    def start(self) -> StreamingQuery:
        spark = self.ctx.spark
        jvm = spark._jvm
        trigger = jvm.org.apache.spark.sql.streaming.Trigger  # type: ignore[union-attr]
        if self.realtime:
            writer = (
                live_source(self.ctx, self.offsets, None)
                ._jdf.writeStream()
                .foreach(jvm.io.candlewire.spark.LiveWriter())  # type: ignore[union-attr]
                .outputMode("update")
                .trigger(trigger.RealTime(REALTIME_BATCH))
            )
        else:
            every_ms = int(self.ctx.settings.stream_live_trigger_s * 1000)
            writer = (
                live_source(self.ctx, self.offsets)
                ._jdf.writeStream()
                .foreachBatch(jvm.io.candlewire.spark.LiveBatches())  # type: ignore[union-attr]
                .trigger(trigger.ProcessingTime(every_ms))
            )
        jquery = (
            writer.queryName(f"candlewire-{self.name}")
            .option("checkpointLocation", self.checkpoint)
            .start()
        )
        query = StreamingQuery(jquery)
        if not self.realtime:
            return query
        # A stop before the first batch's Spark job is submitted finds no job to cancel and
        # then waits out that whole batch (REALTIME_BATCH, minutes): return once it is.
        tracker, group = spark.sparkContext.statusTracker(), str(query.runId)
        deadline = time.monotonic() + SUBMITTED_WITHIN_S
        while not tracker.getJobIdsForGroup(group) and query.isActive:
            if time.monotonic() > deadline:
                log.warning(
                    "the live query's first batch is not running after %d s", SUBMITTED_WITHIN_S
                )
                break
            time.sleep(0.05)
        return query

    def healthy(self) -> bool:
        """The JVM's publishing thread runs: without it nothing reaches subscribers."""
        return bool(self.counters()["publishing"])

    def counters(self) -> dict[str, int]:
        return parse_counters(self._live.counters())

    def publish_faults(self) -> tuple[int, int, int]:
        """(dropped, journal errors, refused frames) of the JVM's publisher, which the job's
        metrics add."""
        c = self._counted
        return c["dropped"], c["journal_errors"], c["refused"]

    def idle_marks(self) -> list[market_pb2.FeedIdle]:
        timeout = self.ctx.settings.stream_idle_timeout_s
        return [from_record(bytes(r)) for r in self._live.idleMarks(float(timeout))]

    def _poll(self) -> None:
        """The JVM's counters into the job's Prometheus counters, ten times a second."""
        metrics = self.ctx.metrics
        while not self._stop.wait(0.1):
            try:
                now = self.counters()
            except Exception:  # the JVM is going away with the job
                return
            delta = {k: now[k] - self._counted[k] for k in COUNTERS}
            self._counted = now
            if delta["read"] < 0:
                continue  # the JVM's live path stopped (the job's end): counted from zero
            metrics.published.labels("tick").inc(delta["ticks"])
            metrics.published.labels("ohlc").inc(delta["candles"])
            metrics.duplicates.labels(self.name).inc(delta["duplicates"])
            if delta["revised"]:
                self.ctx.commit_due.revised()
            self.ctx.commit_due.read(delta["read"])

    def _send(self) -> None:
        """The JVM's firings as they come; the triggers' state every ``stream_cep_record_s``."""
        every = self.ctx.settings.stream_cep_record_s
        due = time.monotonic() + every
        while not self._stop.is_set():
            try:
                self._emit(FIRINGS_WAIT_MS)
                if time.monotonic() >= due:
                    self._record()
                    due = time.monotonic() + every
            except Exception:
                if self._stop.is_set():
                    return  # the JVM is going away with the job
                log.exception("CEP firings: sending or recording failed; trying again")
                time.sleep(1.0)

    def _emit(self, wait_ms: int) -> None:
        data = bytes(self._live.firings(wait_ms))
        if data:
            self.firings.emit_jvm(data)

    def _record(self) -> None:
        """The state, once the firings made before it are sent: a restart goes on from it."""
        state = self._live.triggerState()
        if state is None:
            return
        self._emit(0)
        data = bytes(state)
        offsets = dict(cep_pb2.CepState.FromString(data).offsets)
        self.firings.record_state(CepCommit(offsets, data))

    def close(self) -> None:
        """After the query stopped: the last firings sent and the state recorded, so a
        restart evaluates nothing twice."""
        self._stop.set()
        self._poller.join(1)
        self._sender.join(5)
        try:
            self._emit(0)
            self._record()
        except Exception:
            log.exception("CEP state not recorded on stop: the restart evaluates again")
        self._live.stop()
        shutil.rmtree(self.checkpoint, ignore_errors=True)
        shutil.rmtree(self._state_dir, ignore_errors=True)
