"""What the job must remember across micro-batches and restarts, kept in PostgreSQL.

The forming candles' last commit to ``ohlc`` (batch, watermark, snapshot, Kafka offsets) is
written right after it, so a restart restores them as of that snapshot and replays what came
later.

History requests span pages (possibly several micro-batches); a metadata snapshot spans
records. Both are recorded here only *after* their rows are committed to Iceberg, with
idempotent inserts, so a replayed micro-batch changes nothing and a crash between the
Iceberg commit and this write only means the notification is sent again.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

import sqlalchemy as sa

from candlewire.config import Settings
from proto import market_pb2

INT32_MAX = 2**31 - 1  # PostgreSQL's integer: the ledgers' page counts and snapshot sizes

SCHEMA = """
CREATE TABLE IF NOT EXISTS cw_history_requests (
    request_id text PRIMARY KEY,
    metadata bytea NOT NULL,
    expected_pages integer NOT NULL,
    error text
);
CREATE TABLE IF NOT EXISTS cw_history_pages (
    request_id text NOT NULL,
    page integer NOT NULL,
    rows integer NOT NULL,
    PRIMARY KEY (request_id, page)
);
CREATE TABLE IF NOT EXISTS cw_metadata_staging (
    request_id text NOT NULL,
    ticker text NOT NULL,
    record bytea NOT NULL,
    snapshot_size integer NOT NULL,
    PRIMARY KEY (request_id, ticker)
);
CREATE TABLE IF NOT EXISTS cw_candle_commits (
    run text PRIMARY KEY,
    batch bigint NOT NULL,
    watermark_ms bigint NOT NULL,
    snapshot_id bigint NOT NULL,
    offsets text NOT NULL
);
ALTER TABLE cw_candle_commits ADD COLUMN IF NOT EXISTS clocks text;
ALTER TABLE cw_candle_commits ADD COLUMN IF NOT EXISTS ticks_snapshot_id bigint;
CREATE TABLE IF NOT EXISTS cw_cep_commits (
    run text PRIMARY KEY,
    offsets text NOT NULL,
    state bytea NOT NULL
);
"""


@dataclass
class CandleCommit:
    batch: int
    watermark_ms: int
    snapshot_id: int
    offsets: dict[int, int]
    """Next Kafka offset per ticks partition: where the live query starts after a restart."""
    clocks: dict[str, int] | None = None
    """Each feed's event clock (ns); None in a record of a release before per-feed time."""
    ticks_snapshot_id: int = 0
    """The ``ticks`` snapshot holding the batch: where the trade ids to dedup against are."""


@dataclass
class CepCommit:
    """Where the CEP evaluator stands: the next ticks offset per partition, and the triggers'
    state after the records before it (``jvm/decoder``'s ``Triggers``)."""

    offsets: dict[int, int]
    state: bytes


@dataclass
class Completed:
    meta: market_pb2.HistoryRequestMetadata
    rows: int
    error: str | None


class Progress:
    def __init__(self, settings: Settings) -> None:
        self.engine = sa.create_engine(settings.sql_url(), pool_pre_ping=True)
        with self.engine.begin() as conn:
            for stmt in SCHEMA.split(";"):
                if stmt.strip():
                    conn.execute(sa.text(stmt))

    def record_candles(self, run: str, commit: CandleCommit) -> None:
        with self.engine.begin() as conn:
            conn.execute(
                sa.text(
                    "INSERT INTO cw_candle_commits (run, batch, watermark_ms, snapshot_id, "
                    "offsets, clocks, ticks_snapshot_id) "
                    "VALUES (:r, :b, :w, :s, :o, :c, :t) ON CONFLICT (run) DO UPDATE "
                    "SET batch = :b, watermark_ms = :w, snapshot_id = :s, offsets = :o, "
                    "clocks = :c, ticks_snapshot_id = :t"
                ),
                {
                    "r": run,
                    "b": commit.batch,
                    "w": commit.watermark_ms,
                    "s": commit.snapshot_id,
                    "o": json.dumps(commit.offsets),
                    "c": None if commit.clocks is None else json.dumps(commit.clocks),
                    "t": commit.ticks_snapshot_id,
                },
            )

    def record_cep(self, run: str, commit: CepCommit) -> None:
        with self.engine.begin() as conn:
            conn.execute(
                sa.text(
                    "INSERT INTO cw_cep_commits (run, offsets, state) VALUES (:r, :o, :s) "
                    "ON CONFLICT (run) DO UPDATE SET offsets = :o, state = :s"
                ),
                {"r": run, "o": json.dumps(commit.offsets), "s": commit.state},
            )

    def last_cep(self, run: str) -> CepCommit | None:
        with self.engine.connect() as conn:
            row = conn.execute(
                sa.text("SELECT offsets, state FROM cw_cep_commits WHERE run = :r"), {"r": run}
            ).first()
        if row is None:
            return None
        offsets = {int(p): int(o) for p, o in json.loads(row.offsets).items()}
        return CepCommit(offsets, bytes(row.state))

    def last_candles(self, run: str) -> CandleCommit | None:
        with self.engine.connect() as conn:
            row = conn.execute(
                sa.text(
                    "SELECT batch, watermark_ms, snapshot_id, offsets, clocks, ticks_snapshot_id "
                    "FROM cw_candle_commits WHERE run = :r"
                ),
                {"r": run},
            ).first()
        if row is None:
            return None
        offsets = {int(p): int(o) for p, o in json.loads(row.offsets).items()}
        clocks = None if row.clocks is None else json.loads(row.clocks)
        return CandleCommit(
            row.batch,
            row.watermark_ms,
            row.snapshot_id,
            offsets,
            clocks,
            row.ticks_snapshot_id or 0,
        )

    def record_history(
        self,
        metas: list[market_pb2.HistoryRequestMetadata],
        pages: list[tuple[str, int, int]],
        errors: dict[str, str],
    ) -> list[Completed]:
        """Record pages and errors; return the requests now complete (or failed)."""
        touched = {m.request_id for m in metas} | {p[0] for p in pages} | set(errors)
        with self.engine.begin() as conn:
            for m in metas:
                conn.execute(
                    sa.text(
                        "INSERT INTO cw_history_requests (request_id, metadata, expected_pages) "
                        "VALUES (:r, :m, :e) ON CONFLICT (request_id) DO UPDATE SET metadata = :m, expected_pages = :e"
                    ),
                    {"r": m.request_id, "m": m.SerializeToString(), "e": m.expected_pages},
                )
            for rid, page, rows in pages:
                conn.execute(
                    sa.text(
                        "INSERT INTO cw_history_pages VALUES (:r, :p, :n) "
                        "ON CONFLICT (request_id, page) DO UPDATE SET rows = :n"
                    ),
                    {"r": rid, "p": page, "n": rows},
                )
            for rid, error in errors.items():
                conn.execute(
                    sa.text("UPDATE cw_history_requests SET error = :e WHERE request_id = :r"),
                    {"r": rid, "e": error},
                )
            if not touched:
                return []
            result = conn.execute(
                sa.text(
                    "SELECT r.request_id, r.metadata, r.expected_pages, r.error, "
                    "count(p.page), coalesce(sum(p.rows), 0) FROM cw_history_requests r "
                    "LEFT JOIN cw_history_pages p USING (request_id) WHERE r.request_id = ANY(:ids) "
                    "GROUP BY r.request_id"
                ),
                {"ids": list(touched)},
            )
            done = []
            for _rid, meta, expected, error, pages_seen, rows in result:
                # Every page in is complete, whatever error a second fetch of the same
                # request (two ingestors that both took it) reported before or after.
                complete = pages_seen >= expected
                if complete or error:
                    done.append(
                        Completed(
                            market_pb2.HistoryRequestMetadata.FromString(bytes(meta)),
                            int(rows),
                            None if complete else error,
                        )
                    )
            return done

    def stage_markets(self, markets: list[market_pb2.Market]) -> dict[str, list[market_pb2.Market]]:
        """Stage snapshot records; return the snapshots now complete, by request_id."""
        with self.engine.begin() as conn:
            for m in markets:
                conn.execute(
                    sa.text(
                        "INSERT INTO cw_metadata_staging VALUES (:r, :t, :b, :n) "
                        "ON CONFLICT (request_id, ticker) DO UPDATE SET record = :b"
                    ),
                    {
                        "r": m.request_id,
                        "t": m.ticker,
                        "b": m.SerializeToString(),
                        "n": min(max(m.snapshot_size, 1), INT32_MAX),  # a column's integer
                    },
                )
            ids = list({m.request_id for m in markets})
            rows = conn.execute(
                sa.text(
                    "SELECT request_id, record, snapshot_size FROM cw_metadata_staging WHERE request_id = ANY(:ids)"
                ),
                {"ids": ids},
            ).all()
        groups: dict[str, list[market_pb2.Market]] = {}
        sizes: dict[str, int] = {}
        for rid, record, size in rows:
            groups.setdefault(rid, []).append(market_pb2.Market.FromString(bytes(record)))
            sizes[rid] = size
        return {rid: ms for rid, ms in groups.items() if len(ms) >= sizes[rid]}

    def forget_snapshot(self, request_id: str) -> None:
        with self.engine.begin() as conn:
            conn.execute(
                sa.text("DELETE FROM cw_metadata_staging WHERE request_id = :r"), {"r": request_id}
            )
