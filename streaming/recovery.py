"""Exactly once under ``kill -9``: what the committing query records, and what the live path
restores from it after a (re)start.

- The committing query's own state (each feed's clock, trade ids and forming candles) is in
  Spark's checkpointed state store: a batch replayed after a crash is judged again from the
  state before it (``jvm/decoder``'s ``Commit``).
- Tick appends carry the run and micro-batch id as Iceberg snapshot properties, so a batch
  replayed after a crash recognises that its ticks are already in.
- After each candle MERGE the batch, every feed's event clock, the ``ohlc`` and ``ticks``
  snapshots and the Kafka offsets are recorded in PostgreSQL
  (:class:`streaming.progress.Progress`).
- The live path restarts from that record: the forming candles from ``ohlc`` *as of that
  snapshot* (time travel), and the trade ids to deduplicate against from ``ticks`` as of its
  snapshot (``ticks`` holds each trade once), from the recorded offsets.
"""

from __future__ import annotations

import logging
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import pyarrow as pa

from candlewire.config import Settings
from streaming.context import JobContext
from streaming.progress import CandleCommit
from streaming.sql import ts_literal

log = logging.getLogger("candlewire.stream")
QUERY = "ticks"  # the committing query, whose checkpoint the run id names
DAY_MS = 86_400_000


def run_id(settings: Settings, query: str = QUERY) -> str:
    """Identity of a query's checkpoint (the committing query's by default): batch ids
    restart when the checkpoint is new."""
    root = settings.checkpoints()
    if "://" in root and not root.startswith("file:"):
        return "cluster"  # remote checkpoints: keep them, the id is their location
    path = Path(root.removeprefix("file:")) / f"{query}.run-id"
    if not path.exists() or not (path.parent / query).exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(uuid.uuid4().hex)
    return path.read_text().strip()


def watermark_ms(clock_ns: int, allowance_s: float) -> int:
    """A feed's watermark, as ``FeedState.watermarkMs`` has it: its windows that end at or
    before it are final (0: a feed not heard yet)."""
    return 0 if not clock_ns else (clock_ns - int(allowance_s * 1e9)) // 1_000_000


@dataclass
class Restored:
    """Where the committing query stands after a (re)start."""

    ticks_batch: int = -1  # last batch whose ticks are in ``ticks``
    candles_batch: int = -1  # last batch whose candles are in ``ohlc`` and recorded
    offsets: dict[int, int] = field(default_factory=dict)  # next offset per ticks partition
    clocks: dict[str, int] = field(default_factory=dict)  # each feed's event clock
    # ``ohlc``'s forming live rows, and ``ticks``' trades within the dedup horizon, as of
    # ``candles_batch``: the live path's state (``streaming.queries.live.restore_file``)
    rows: list[dict] = field(default_factory=list)
    trades: list[tuple[str, str, int]] = field(default_factory=list)


class Ledger:
    def __init__(self, ctx: JobContext) -> None:
        self.ctx = ctx
        self.run_id = run_id(ctx.settings)

    def commit_properties(self, batch_id: int) -> dict[str, str]:
        """Write options that stamp a commit with this run and batch."""
        props = {"query": QUERY, "run": self.run_id, "batch": batch_id}
        return {f"snapshot-property.candlewire.{k}": str(v) for k, v in props.items()}

    def record(self, batch_id: int, clocks: dict[str, int], offsets: dict[int, int]) -> None:
        """After a candle MERGE: where the live path restarts (each feed's event clock, the
        Kafka offsets, and the snapshots its state is read from)."""
        tables = self.ctx.tables
        allowance_s = self.ctx.settings.stream_watermark_s
        commit = CandleCommit(
            batch=batch_id,
            watermark_ms=min((watermark_ms(c, allowance_s) for c in clocks.values()), default=0),
            snapshot_id=tables.snapshot_id("ohlc"),
            offsets=dict(offsets),
            clocks=dict(clocks),
            ticks_snapshot_id=tables.snapshot_id("ticks"),
        )
        self.ctx.progress.record_candles(self.run_id, commit)

    def restore(self) -> Restored:
        ticks_batch = self.ctx.tables.last_batch("ticks", QUERY, self.run_id)
        last = self.ctx.progress.last_candles(self.run_id)
        if last is None:
            return Restored(ticks_batch=ticks_batch)
        allowance_ms = int(self.ctx.settings.stream_watermark_s * 1000)
        if last.clocks:
            oldest_ms = min(last.clocks.values()) // 1_000_000 - allowance_ms
        else:
            oldest_ms = last.watermark_ms
        # The forming candles, and the closed ones the dedup horizon may still revise.
        horizon_ms = int(self.ctx.settings.stream_dedup_horizon_s * 1000)
        revisable_ms = oldest_ms + allowance_ms - horizon_ms
        rows = self._as_of(
            "ohlc",
            last.snapshot_id,
            "SELECT ticker, period_s, unix_millis(open_time) AS open_ms, open, high, low, "
            "close, volume, trade_count, first_trade_ns, last_trade_ns, "
            "coalesce(closed, false) AS closed, coalesce(revision, 0) AS revision FROM {table} "
            "WHERE source = 'live' AND first_trade_ns IS NOT NULL "
            f"AND open_time >= {ts_literal(min(oldest_ms, revisable_ms) - DAY_MS)} "
            "AND (NOT coalesce(closed, false) OR "
            f"unix_millis(open_time) + period_s * 1000 > {revisable_ms})",
        ).to_pylist()
        # A record of a release before per-feed time holds one watermark for every feed.
        clocks = last.clocks or {
            r["ticker"]: (last.watermark_ms + allowance_ms) * 1_000_000 for r in rows
        }
        trades: list[tuple[str, str, int]] = []
        if last.ticks_snapshot_id and clocks:
            # The oldest event time any feed still deduplicates against.
            horizon_ns = int(self.ctx.settings.stream_dedup_horizon_s * 1e9)
            starts = [c - horizon_ns for c in clocks.values() if c]
            since_ms = max(0, min(starts, default=0)) // 1_000_000
            table = self._as_of(
                "ticks",
                last.ticks_snapshot_id,
                "SELECT ticker, trade_id, exchange_time_ns FROM {table} "
                f"WHERE exchange_time >= {ts_literal(since_ms)} AND trade_id <> '' "
                "ORDER BY exchange_time_ns",
            )
            trades = list(zip(*(table[c].to_pylist() for c in table.column_names), strict=True))
        log.info(
            "restored %d forming candles, %d feeds and %d trade ids as of batch %d",
            len(rows),
            len(clocks),
            len(trades),
            last.batch,
        )
        return Restored(ticks_batch, last.batch, last.offsets, clocks, rows, trades)

    def _as_of(self, table: str, snapshot_id: int, query: str) -> pa.Table:
        """A query on ``{table}`` as of a recorded snapshot. If maintenance expired it (it
        keeps 100 snapshots and a day), the table as it is now: it holds the same rows, unless
        the crash fell between a later batch's write and its record, which that batch's
        replay would then count twice."""
        name, spark = self.ctx.tables[table], self.ctx.spark
        if not self.ctx.tables.holds_snapshot(table, snapshot_id):
            log.warning("%s snapshot %d is gone; restoring from the table", table, snapshot_id)
            return spark.sql(query.format(table=name)).toArrow()
        # Any other failure (the catalog away a moment) is the restart's: taken for an expired
        # snapshot, the table as it is now counted a batch twice that had no need to.
        return spark.sql(query.format(table=f"{name} VERSION AS OF {int(snapshot_id)}")).toArrow()
