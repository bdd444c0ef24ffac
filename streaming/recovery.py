"""Exactly once under ``kill -9``: what the committing query records, and what a restart
restores from it.

- Tick appends carry the run and micro-batch id as Iceberg snapshot properties, so a batch
  replayed after a crash recognises that its ticks are already in.
- After each candle MERGE the batch, watermark, ``ohlc`` snapshot and Kafka offsets are
  recorded in PostgreSQL (:class:`streaming.progress.Progress`).
- A restart restores the forming candles from ``ohlc`` *as of that snapshot* (time travel),
  so a batch whose MERGE landed but was not recorded is replayed onto the state before it,
  not counted twice. The live query starts at the recorded offsets with the same candles.
"""

from __future__ import annotations

import logging
import uuid
from dataclasses import dataclass, field
from pathlib import Path

from candlewire.config import Settings
from streaming.candles import FormingCandles, candle_from_row
from streaming.context import JobContext
from streaming.progress import CandleCommit
from streaming.sql import ts_literal

log = logging.getLogger("candlewire.stream")
QUERY = "ticks"  # the committing query, whose checkpoint the run id names


def run_id(settings: Settings) -> str:
    """Identity of the ticks checkpoint: batch ids restart when the checkpoint is new."""
    root = settings.checkpoints()
    if "://" in root and not root.startswith("file:"):
        return "cluster"  # remote checkpoints: keep them, the id is their location
    path = Path(root.removeprefix("file:")) / f"{QUERY}.run-id"
    if not path.exists() or not (path.parent / QUERY).exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(uuid.uuid4().hex)
    return path.read_text().strip()


@dataclass
class Restored:
    """Where the committing query stands after a (re)start."""

    ticks_batch: int = -1  # last batch whose ticks are in ``ticks``
    candles_batch: int = -1  # last batch whose candles are in ``ohlc`` and recorded
    watermark_ms: int = 0
    offsets: dict[int, int] = field(default_factory=dict)  # next offset per ticks partition
    # ``ohlc``'s live rows as of ``candles_batch``; each query makes its own candles of them
    rows: list[dict] = field(default_factory=list)

    def forming(self) -> FormingCandles:
        state = FormingCandles()
        state.restore(map(candle_from_row, self.rows), self.watermark_ms)
        return state


class Ledger:
    def __init__(self, ctx: JobContext) -> None:
        self.ctx = ctx
        self.run_id = run_id(ctx.settings)

    def commit_properties(self, batch_id: int) -> dict[str, str]:
        """Write options that stamp a commit with this run and batch."""
        props = {"query": QUERY, "run": self.run_id, "batch": batch_id}
        return {f"snapshot-property.candlewire.{k}": str(v) for k, v in props.items()}

    def record(self, batch_id: int, watermark_ms: int, offsets: dict[int, int]) -> None:
        """After a candle MERGE: the state a restart restores."""
        snapshot = self.ctx.tables.snapshot_id("ohlc")
        commit = CandleCommit(batch_id, watermark_ms, snapshot, dict(offsets))
        self.ctx.progress.record_candles(self.run_id, commit)

    def restore(self) -> Restored:
        ticks_batch = self.ctx.tables.last_batch("ticks", QUERY, self.run_id)
        last = self.ctx.progress.last_candles(self.run_id)
        if last is None:
            return Restored(ticks_batch=ticks_batch)
        query = (
            "SELECT ticker, period_s, unix_millis(open_time) AS open_ms, open, high, low, "
            "close, volume, trade_count, first_trade_ns, last_trade_ns "
            f"FROM {self.ctx.tables['ohlc']} {{version}} WHERE source = 'live' "
            "AND first_trade_ns IS NOT NULL "
            f"AND open_time >= {ts_literal(last.watermark_ms - 86_400_000)}"
        )
        spark = self.ctx.spark
        try:
            version = f"VERSION AS OF {int(last.snapshot_id)}"
            table = spark.sql(query.format(version=version)).toArrow()
        except Exception:
            # Expired by maintenance (it keeps 100 snapshots and a day): the table as it is now
            # holds the same live rows, unless the crash fell between a later batch's MERGE
            # and its record, which that batch's replay would then count twice.
            log.warning("ohlc snapshot %d is gone; restoring from the table", last.snapshot_id)
            table = spark.sql(query.format(version="")).toArrow()
        rows = table.to_pylist()
        log.info("restored %d candles as of batch %d", len(rows), last.batch)
        return Restored(ticks_batch, last.batch, last.watermark_ms, last.offsets, rows)
