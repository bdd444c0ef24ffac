"""The metadata query: complete snapshots of an exchange's markets into ``symbol_metadata``.

Ingestors write each market as a record carrying its snapshot's size; once a snapshot is
complete (staged in PostgreSQL, so it may span micro-batches) it is MERGEd, symbols no longer
listed become DELISTED, and SymbolMetadataUpdated goes out on METADATA_UPDATE with the added,
removed and changed counts, after the commit.
"""

from __future__ import annotations

import time
from decimal import Decimal

from pyiceberg.types import DecimalType
from pyspark.sql import DataFrame, Row
from pyspark.sql import functions as F

from candlewire.amounts import held
from candlewire.kafka import SYMBOL_METADATA
from candlewire.lake import SYMBOL_METADATA_SCHEMA
from candlewire.spark import commit_sql
from candlewire.topics import metadata_update_topic
from proto import market_pb2
from proto.envelope import Names
from streaming.decode import decode_records, staged_market
from streaming.queries import TopicQuery
from streaming.sql import literal, staged_columns, staging_ddl

STAMP = "update_time"  # set at the commit, not staged
STATUSES = Names.of(market_pb2.MarketStatus)
DECIMALS = {f.name for f in SYMBOL_METADATA_SCHEMA.fields if isinstance(f.field_type, DecimalType)}
IDENTITY = ("ticker", "exchange")


class MetadataQuery(TopicQuery):
    name = "metadata"
    topic = SYMBOL_METADATA.name

    def batch(self, df: DataFrame, batch_id: int) -> None:
        values = [r.value for r in df.select("value").collect()]
        decoded, bad = decode_records(values, market_pb2.Market)
        markets = [staged_market(m) for m in decoded]
        self.ctx.metrics.bad.labels(SYMBOL_METADATA.name).inc(bad)
        for request_id, snapshot in self.ctx.progress.stage_markets(markets).items():
            self._commit(request_id, snapshot)
            self.ctx.progress.forget_snapshot(request_id)
        self.ctx.metrics.batches.labels(self.name).inc()

    def _commit(self, request_id: str, snapshot: list[market_pb2.Market]) -> None:
        spark, table = self.ctx.spark, self.ctx.tables["symbol_metadata"]
        exchange = snapshot[0].exchange
        current = {
            r.ticker: r for r in spark.table(table).where(F.col("exchange") == exchange).collect()
        }
        fresh = {m.ticker: m for m in snapshot}
        rows = [market_row(m) for m in fresh.values()]
        added = sorted(set(fresh) - set(current))
        removed = sorted(t for t, r in current.items() if t not in fresh and r.status != "DELISTED")
        changed = sum(
            1 for r in rows if r["ticker"] in current and differs(r, current[r["ticker"]])
        )
        rows += [delisted(current[t]) for t in removed]
        (
            spark.createDataFrame(rows, staging_ddl(SYMBOL_METADATA_SCHEMA, skip=[STAMP]))
            .select(
                *staged_columns(SYMBOL_METADATA_SCHEMA, skip=[STAMP]),
                F.current_timestamp().alias(STAMP),
            )
            .createOrReplaceTempView("cw_markets")
        )
        commit_sql(
            spark,
            f"MERGE INTO {table} t USING cw_markets s ON t.ticker = s.ticker "
            f"AND t.exchange = {literal(exchange)} "
            "WHEN MATCHED THEN UPDATE SET * WHEN NOT MATCHED THEN INSERT *",
        )
        note = market_pb2.SymbolMetadataUpdated(
            exchange=exchange,
            symbol_count=len(fresh),
            added=len(added),
            removed=len(removed),
            changed=changed,
            update_time_ms=int(time.time() * 1000),
            snapshot_id=self.ctx.tables.snapshot_id("symbol_metadata"),
            request_id=request_id,
            added_tickers=added,
        )
        self.ctx.symbols_changed.set()
        self.ctx.publisher.notify(metadata_update_topic(), note)
        self.ctx.metrics.notifications.labels("metadata").inc()


def market_row(m: market_pb2.Market) -> dict:
    """A Market record as a staged row: decimals as strings, empty ones null, and so is one
    that is no decimal or that DECIMAL(38,18) does not hold (the venue's listing is kept, its
    bad field left out: the cast failed the MERGE); a status this build does not name as
    its number."""
    return {
        "ticker": m.ticker,
        "exchange": m.exchange,
        "base": m.base,
        "quote": m.quote,
        "exchange_symbol": m.exchange_symbol,
        **{name: _decimal(getattr(m, name)) for name in sorted(DECIMALS)},
        "status": STATUSES[m.status],
    }


def _decimal(text: str) -> str | None:
    return text if text and held(text) else None  # DECIMAL(38,18) holds it exactly


def delisted(row: Row) -> dict:
    """A listed symbol the new snapshot lacks, staged again as DELISTED."""
    staged = {
        k: (str(v) if v is not None and k in DECIMALS else v)
        for k, v in row.asDict().items()
        if k != STAMP
    }
    return {**staged, "status": "DELISTED"}


def differs(row: dict, current: Row) -> bool:
    """A staged row against the table's: decimals compared by value, not by text."""
    for key, new in row.items():
        if key in IDENTITY:
            continue
        old = getattr(current, key)
        if key in DECIMALS:
            new, old = (Decimal(new) if new else None), (Decimal(old) if old is not None else None)
        if new != old:
            return True
    return False
