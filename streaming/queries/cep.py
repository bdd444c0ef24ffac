"""The CEP query of the micro-batch engine: firings within a second of the trade that made
them (#19). The real-time engine has no such query: its live path evaluates the triggers
in the JVM as it reads each record (:mod:`streaming.queries.realtime`).

Every ``stream_cep_trigger_s`` it reads the ticks topic's new records, keeps the trigger
registrations and the records of feeds that have triggers (a filter on the Kafka key, in
Spark: other feeds are never decoded nor reach Python), decodes those as the committing
query does, and evaluates them in Kafka order (:class:`streaming.cep.Triggers`). Each
firing is sent at once on its owner's notification topic, and as the user's alert; every
``stream_cep_record_s`` the state is recorded with the offsets read
(:mod:`streaming.firings`: exactly once across restarts). Like the live query's, its Spark
checkpoint is thrown away: each start begins at the recorded offsets with the recorded
state.
"""

from __future__ import annotations

import logging
import shutil
import time

import pyarrow as pa
from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from streaming.context import JobContext
from streaming.decode import CONTROL_SQL, decoded_ticks, events_in, registrations_in
from streaming.firings import FiringDesk
from streaming.metrics import LapTotals
from streaming.queries.live import live_source, scratch_checkpoint
from streaming.recovery import Restored

log = logging.getLogger("candlewire.stream.cep")


class CepQuery:
    name = "cep"

    def __init__(self, ctx: JobContext, restored: Restored, firings: FiringDesk) -> None:
        self.ctx = ctx
        self.trigger_s = ctx.settings.stream_cep_trigger_s
        self.record_s = ctx.settings.stream_cep_record_s
        self.firings = firings
        self.triggers, self.offsets = firings.restore(restored)
        self.checkpoint = scratch_checkpoint()
        self._recorded = time.monotonic()
        self._changed = False
        self.laps = LapTotals(log, self.name)

    def source(self) -> DataFrame:
        return live_source(
            self.ctx, self.offsets, columns=("key", "value", "partition", "offset")
        ).withColumn("control", F.expr(CONTROL_SQL))

    def batch(self, df: DataFrame, batch_id: int) -> None:
        """One Spark action in the usual case: the registrations and the known feeds'
        records together. A registration for a feed that had no trigger yet needs that
        feed's records of the same batch too: a second action, for those feeds only."""
        started = time.perf_counter()
        self.laps("between")  # the trigger's wait, and Spark's planning of this batch
        known = self.triggers.tickers()
        table = self._read(df, F.col("control").isNotNull(), known)
        new = {r.ticker for _, _, r in registrations_in(table)} - known
        if new:
            table = pa.concat_tables([table, self._read(df, F.lit(False), new)])
        self.laps("read")
        fired = self.triggers.judge(events_in(table))
        self.laps("judge")
        if fired:
            self.firings.emit(fired)
        self.laps("send")
        self._read_up_to(table)
        if self._changed and time.monotonic() - self._recorded >= self.record_s:
            self._record()
            self.laps("record")
        metrics = self.ctx.metrics
        metrics.batches.labels(self.name).inc()
        metrics.busy.labels(self.name).inc(time.perf_counter() - started)
        self.laps.batch(table.num_rows, len(fired))

    def _read(self, df: DataFrame, also: Column, tickers: set[str]) -> pa.Table:
        wanted = F.col("key").cast("string").isin(sorted(tickers)) if tickers else F.lit(False)
        records = df.where(also | wanted).select("value", "partition", "offset", "control")
        return decoded_ticks(self.ctx.spark, self.ctx.settings.stream_decoder, records).toArrow()

    def _read_up_to(self, table: pa.Table) -> None:
        """The next offset per partition after the records read. Records that were not read
        (feeds without triggers) are not judged, so a restart may read them again."""
        if not table.num_rows:
            return
        last = table.group_by("partition").aggregate([("offset", "max")])
        for partition, offset in zip(*(c.to_pylist() for c in last.columns), strict=True):
            self.offsets[partition] = max(self.offsets.get(partition, 0), offset + 1)
        self._changed = True

    def _record(self) -> None:
        self.firings.record(self.triggers, self.offsets)
        self._recorded, self._changed = time.monotonic(), False

    def close(self) -> None:
        """After the query stopped: its state as it ends, so a restart evaluates nothing
        twice."""
        try:
            if self._changed:
                self._record()
        except Exception:
            log.exception("CEP state not recorded on stop: the restart evaluates again")
        shutil.rmtree(self.checkpoint, ignore_errors=True)
