"""The CEP query: firings within a second of the trade that made them (#19).

Every ``stream_cep_trigger_s`` it reads the ticks topic's new records, keeps the trigger
registrations and the records of feeds that have triggers (a filter on the Kafka key, in
Spark: other feeds never reach Python), and evaluates them in Kafka order
(:class:`streaming.cep.Triggers`) from the state the last commit recorded. Each firing is
sent at once on its owner's notification topic, and as the user's alert
(:mod:`streaming.firings`).

The committing query evaluates the same records from the same state and records what fired
with its commit, then sends it again: a firing this query sent, or one it had not reached
when the job died, arrives again with the same (trigger_id, firing), and clients and the
gateways keep the first. Like the live query, its checkpoint is thrown away: each start
begins at the recorded offsets with the recorded state.
"""

from __future__ import annotations

import shutil
import time

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from proto import market_pb2
from streaming.context import JobContext
from streaming.decode import CONTROL_SQL, parse_tick
from streaming.firings import FiringDesk, in_order, registrations_in
from streaming.queries.live import live_source, scratch_checkpoint
from streaming.recovery import Restored


class CepQuery:
    name = "cep"

    def __init__(self, ctx: JobContext, restored: Restored, firings: FiringDesk) -> None:
        self.ctx = ctx
        self.trigger_s = ctx.settings.stream_cep_trigger_s
        self.firings = firings
        self.triggers = firings.restored_state(restored)
        self.offsets = dict(restored.offsets)
        self.checkpoint = scratch_checkpoint()

    def source(self) -> DataFrame:
        return live_source(self.ctx, self.offsets, columns=("key", "value", "partition", "offset"))

    def close(self) -> None:
        shutil.rmtree(self.checkpoint, ignore_errors=True)

    def batch(self, df: DataFrame, batch_id: int) -> None:
        """One Spark action in the usual case: the registrations and the known feeds'
        records together. A registration for a feed that had no trigger yet needs that
        feed's records of the same batch too: a second action, for those feeds only."""
        started = time.perf_counter()
        df = df.withColumn("control", F.expr(CONTROL_SQL))
        known = self.triggers.tickers()
        table = self._read(df, F.col("control").isNotNull(), known)
        registrations = registrations_in(table)
        new = {r.ticker for _, _, r in registrations} - known
        if new:
            more = self._read(df, F.lit(False), new)
            table = pa.concat_tables([table, more])
        regular = table.filter(pc.invert(pc.is_valid(table["control"])))
        rows = [decoded(r) for r in regular.select(["value", "partition", "offset"]).to_pylist()]
        fired = self.triggers.judge(in_order(registrations, rows))
        if fired:
            self.firings.emit(fired)
        metrics = self.ctx.metrics
        metrics.batches.labels(self.name).inc()
        metrics.busy.labels(self.name).inc(time.perf_counter() - started)

    @staticmethod
    def _read(df: DataFrame, also: Column, tickers: set[str]) -> pa.Table:
        wanted = F.col("key").cast("string").isin(sorted(tickers)) if tickers else F.lit(False)
        return df.where(also | wanted).select("value", "partition", "offset", "control").toArrow()


def decoded(row: dict) -> dict:
    """A raw record as :data:`streaming.firings.EVALUATED` (``idle`` also for anything
    that is not a tick: such a record only moves nothing)."""
    t = parse_tick(row["value"])
    out = {"partition": row["partition"], "offset": row["offset"], "idle": True}
    if isinstance(t, market_pb2.FeedIdle):
        return {**out, "ticker": t.ticker, "exchange_time_ns": t.event_time_ns}
    if t is None:
        return {**out, "ticker": "", "exchange_time_ns": 0}
    return {
        **out,
        "idle": False,
        "ticker": t.ticker,
        "exchange_time_ns": t.exchange_time_ns,
        "price": t.price,
        "size": t.size,
        "trade_id": t.trade_id,
    }
