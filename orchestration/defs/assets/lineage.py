"""The platform's own data as external assets, so the UI draws where history comes from.

Ingestors and the Spark streaming job run outside Dagster; these specs only describe what
they produce: exchange feeds → Kafka topics → Iceberg tables. Dagster's own assets
(``symbol_metadata``, ``ohlc_history``) then sit downstream of the tables they fill, and
``gaps`` downstream of the topic it reads.
"""

import dagster as dg

from candlewire.config import NAMESPACE
from candlewire.kafka import GAPS, OHLC_BATCHES, SYMBOL_METADATA, TICKS, TopicSpec

EXCHANGES = dg.AssetKey(["exchanges"])


def kafka_key(topic: TopicSpec) -> dg.AssetKey:
    return dg.AssetKey(["kafka", topic.name.removeprefix("candlewire.").replace("-", "_")])


def iceberg_key(table: str) -> dg.AssetKey:
    return dg.AssetKey(["iceberg", table])


def _topic(topic: TopicSpec, what: str) -> dg.AssetSpec:
    return dg.AssetSpec(
        kafka_key(topic),
        deps=[EXCHANGES],
        description=f"{what}, written by the ingestors (`candlewire ingest`).",
        kinds={"kafka"},
        group_name="platform",
        metadata={"topic": topic.name, "partitions": topic.partitions},
    )


def _table(table: str, sources: list[TopicSpec], what: str) -> dg.AssetSpec:
    return dg.AssetSpec(
        iceberg_key(table),
        deps=[kafka_key(t) for t in sources],
        description=f"{what}, written by the Spark streaming job (`candlewire stream`).",
        kinds={"iceberg", "spark"},
        group_name="platform",
        metadata={"dagster/table_name": f"{NAMESPACE}.{table}"},
    )


SPECS = [
    dg.AssetSpec(
        EXCHANGES,
        description="Exchange REST and websocket feeds, read by the ingestors.",
        kinds={"python"},
        group_name="platform",
    ),
    _topic(TICKS, "Live trades keyed by ticker"),
    _topic(OHLC_BATCHES, "Historical candle pages, first page carrying __metadata"),
    _topic(SYMBOL_METADATA, "Exchange markets snapshots (compacted)"),
    _topic(GAPS, "Gaps in the live trade streams, latest state per gap_id (compacted)"),
    _table("ticks", [TICKS], "Every trade"),
    _table("ohlc", [TICKS, OHLC_BATCHES], "Candles of every period, live and historical"),
    _table("symbol_metadata", [SYMBOL_METADATA], "Markets per exchange"),
]


@dg.definitions
def lineage() -> dg.Definitions:
    return dg.Definitions(assets=SPECS)
