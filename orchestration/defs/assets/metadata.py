"""``symbol_metadata``: an exchange's markets, refreshed through the relay, per exchange.

The refresh is the platform's own metadata flow: a DataRequest over the relay, an ingestor
writes the markets to Kafka, the streaming job MERGEs them into Iceberg and publishes
SymbolMetadataUpdated on METADATA_UPDATE, which is what this asset waits for. Tickers the
exchange lists join ``ohlc_history``'s ticker partitions.
"""

import os

import dagster as dg

from candlewire.topics import valid
from orchestration.defs.assets.history import TICKERS
from orchestration.defs.assets.lineage import iceberg_key
from orchestration.defs.resources import CandlewireResource
from proto import market_pb2

EXCHANGES = dg.StaticPartitionsDefinition(
    [e for e in os.environ.get("CANDLEWIRE_METADATA_EXCHANGES", "SIM,BINANCE").split(",") if e]
)


def listed_tickers(candlewire: CandlewireResource, exchange: str) -> list[str]:
    # Imported when a refresh runs, not at load: pyiceberg (and the pyarrow and SQLAlchemy
    # under it) is not needed by the code server, which only lists definitions.
    from pyiceberg.expressions import And, EqualTo

    from candlewire.lake import load_table

    table = load_table(candlewire.settings(), "symbol_metadata")
    rows = table.scan(
        row_filter=And(
            EqualTo("exchange", exchange),
            EqualTo("status", market_pb2.MarketStatus.Name(market_pb2.TRADING)),
        ),
        selected_fields=("ticker",),
    ).to_arrow()
    # A venue lists symbols no ticker can name (lower case, other scripts): kept in the
    # table as listed, but no partition, whose every run the relay would refuse.
    return sorted(t for t in rows["ticker"].to_pylist() if valid(t))


REFRESH_CRON = os.environ.get("CANDLEWIRE_METADATA_CRON", "0 1 * * *")  # daily, 01:00 UTC

# Every exchange partition once per cron tick, unless a refresh of it is already running. The
# table it waits on is written outside Dagster, so "dependencies updated" cannot gate it.
REFRESH = dg.AutomationCondition.cron_tick_passed(REFRESH_CRON, "UTC") & ~(
    dg.AutomationCondition.in_progress()
)


@dg.asset(
    partitions_def=EXCHANGES,
    automation_condition=REFRESH,
    deps=[iceberg_key("symbol_metadata")],
    kinds={"iceberg"},
    group_name="history",
)
def symbol_metadata(
    context: dg.AssetExecutionContext, candlewire: CandlewireResource
) -> dg.MaterializeResult:
    """Refresh one exchange's markets; report added, removed and changed symbols."""
    exchange = context.partition_key
    with candlewire.client() as client:
        update = client.refresh_metadata(exchange, timeout=candlewire.history_timeout_s)
    tickers = listed_tickers(candlewire, exchange)
    known = set(context.instance.get_dynamic_partitions(TICKERS.name))
    new = [t for t in tickers if t not in known]
    if new:
        context.instance.add_dynamic_partitions(TICKERS.name, new)
    context.log.info(f"{exchange}: {len(tickers)} listed, {len(new)} new ticker partitions")
    return dg.MaterializeResult(
        metadata={
            "symbols": int(update.symbol_count),
            "added": int(update.added),
            "removed": int(update.removed),
            "changed": int(update.changed),
            "added_tickers": dg.MetadataValue.json(list(update.added_tickers)),
            "new_ticker_partitions": dg.MetadataValue.json(new),
            "iceberg_snapshot_id": str(update.snapshot_id),
        }
    )


@dg.definitions
def metadata() -> dg.Definitions:
    return dg.Definitions(assets=[symbol_metadata])
