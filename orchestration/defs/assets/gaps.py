"""``gaps``: the gaps the ingestors found in their live trade streams, as an Iceberg table.

Ingestors record each gap in the compacted topic ``candlewire.gaps``, keyed by gap id, the
latest record of a gap being its state (open, repaired, unrepairable). The asset reads the
topic from its beginning, keeps the latest record of each gap, and overwrites the table
with them: it is small (one row a gap), and the topic, not the table, is the source of
truth. It skips the commit when nothing changed, so a quiet day adds no snapshots.

confluent-kafka, pyiceberg and pyarrow are imported when the asset runs: the code server
only lists definitions (#36).
"""

import os
import time
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING

import dagster as dg

from candlewire.config import NAMESPACE, Settings
from candlewire.kafka import GAPS, consumer_config
from orchestration.defs.assets.lineage import kafka_key
from orchestration.defs.resources import CandlewireResource
from proto import market_pb2

# For annotations only, quoted where used; see history.py for why not ``__future__``.
if TYPE_CHECKING:
    import pyarrow as pa
    from pyiceberg.schema import Schema

TABLE = "gaps"
READ_TIMEOUT_S = 60.0  # to read the topic to its end
KEEP_SNAPSHOTS_FOR = timedelta(days=7)
GAPS_CRON = os.environ.get("CANDLEWIRE_GAPS_CRON", "*/5 * * * *")

# Once per cron tick unless a run is still going. The topic is written outside Dagster, so
# "dependencies updated" cannot gate it.
REFRESH = dg.AutomationCondition.cron_tick_passed(GAPS_CRON, "UTC") & ~(
    dg.AutomationCondition.in_progress()
)


def read_gaps(settings: Settings, timeout: float = READ_TIMEOUT_S) -> tuple[dict, int]:
    """The latest record of every gap in the topic (a tombstone deletes its gap), and how
    many records could not be decoded (skipped, not fatal: one bad record must not hide
    every other gap)."""
    from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, TopicPartition

    from proto.envelope import EnvelopeError, expect, from_record

    consumer = Consumer(
        consumer_config(settings, "candlewire-dagster-gaps", **{"enable.partition.eof": True})
    )
    try:
        topic = consumer.list_topics(GAPS.name, timeout=10).topics.get(GAPS.name)
        if topic is None or topic.error is not None:
            return {}, 0  # no ingestor has created it yet: no gaps
        parts = [TopicPartition(GAPS.name, p, OFFSET_BEGINNING) for p in topic.partitions]
        consumer.assign(parts)
        todo, gaps, bad = {p.partition for p in parts}, {}, 0
        deadline = time.monotonic() + timeout
        while todo:
            if time.monotonic() > deadline:
                raise dg.Failure(f"{GAPS.name} not read to its end within {timeout:.0f} s")
            for msg in consumer.consume(num_messages=500, timeout=1.0):
                err = msg.error()
                if err is not None:
                    if err.code() != KafkaError._PARTITION_EOF:
                        raise dg.Failure(f"reading {GAPS.name}: {err}")
                    todo.discard(msg.partition())
                    continue
                key = (msg.key() or b"").decode()
                if msg.value() is None:
                    gaps.pop(key, None)
                    continue
                try:
                    gap = expect(from_record(msg.value()), market_pb2.Gap)
                except EnvelopeError:
                    bad += 1
                    continue
                gaps[key or gap.gap_id] = gap
        return gaps, bad
    finally:
        consumer.close()


def gaps_schema() -> "Schema":
    from pyiceberg.schema import Schema
    from pyiceberg.types import LongType, NestedField, StringType, TimestamptzType

    fields = [
        ("gap_id", StringType(), True),
        ("ticker", StringType(), True),
        ("cause", StringType(), True),  # GapCause's name
        ("status", StringType(), True),  # GapStatus's name
        ("from_time", TimestamptzType(), True),  # the last trade before the gap
        ("to_time", TimestamptzType(), True),  # the first trade after it
        ("from_ns", LongType(), True),  # the same, to the nanosecond
        ("to_ns", LongType(), True),
        ("from_trade_id", StringType(), False),
        ("to_trade_id", StringType(), False),
        ("detected_time", TimestamptzType(), True),
        ("repaired_time", TimestamptzType(), False),  # repaired or given up; empty while open
        ("refetched", LongType(), True),
        ("reason", StringType(), False),
        ("ingestor_id", StringType(), False),
    ]
    return Schema(
        *(NestedField(i, n, t, required=r) for i, (n, t, r) in enumerate(fields, 1)),
        identifier_field_ids=[1],
    )


def gaps_table(gaps: dict, schema: "Schema") -> "pa.Table":
    import pyarrow as pa

    def row(g: market_pb2.Gap) -> dict[str, object]:
        return {
            "gap_id": g.gap_id,
            "ticker": g.ticker,
            "cause": market_pb2.GapCause.Name(g.cause),
            "status": market_pb2.GapStatus.Name(g.status),
            "from_time": g.from_ns // 1000,
            "to_time": g.to_ns // 1000,
            "from_ns": g.from_ns,
            "to_ns": g.to_ns,
            "from_trade_id": g.from_trade_id or None,
            "to_trade_id": g.to_trade_id or None,
            "detected_time": g.detected_ms * 1000,
            "repaired_time": g.repaired_ms * 1000 or None,
            "refetched": g.refetched,
            "reason": g.reason or None,
            "ingestor_id": g.ingestor_id or None,
        }

    rows = [row(gaps[k]) for k in sorted(gaps)]
    return pa.Table.from_pylist(rows, schema=schema.as_arrow())


@dg.asset(
    deps=[kafka_key(GAPS)],
    automation_condition=REFRESH,
    kinds={"iceberg"},
    group_name="quality",
    metadata={"dagster/table_name": f"{NAMESPACE}.{TABLE}"},
)
def gaps(context: dg.AssetExecutionContext, candlewire: CandlewireResource) -> dg.MaterializeResult:
    """Every gap the ingestors recorded, one row each in its latest state; counts by status."""
    from candlewire.lake import catalog

    settings = candlewire.settings()
    found, bad = read_gaps(settings)
    if bad:
        context.log.warning(f"{bad} records of {GAPS.name} could not be decoded; skipped")
    cat = catalog(settings)
    cat.create_namespace_if_not_exists(NAMESPACE)
    schema = gaps_schema()
    table = cat.create_table_if_not_exists(
        f"{NAMESPACE}.{TABLE}",
        schema,
        # One snapshot a change: keep the metadata files from piling up with them.
        properties={
            "format-version": "2",
            "write.metadata.delete-after-commit.enabled": "true",
            "write.metadata.previous-versions-max": "20",
        },
    )
    new = gaps_table(found, schema)
    current = table.scan().to_arrow().sort_by("gap_id")
    changed = new.to_pylist() != current.to_pylist()
    if changed:
        table.overwrite(new)
        cutoff = datetime.now(UTC) - KEEP_SNAPSHOTS_FOR
        table.maintenance.expire_snapshots().older_than(cutoff).commit()
    by_status = {name: 0 for name in ("GAP_OPEN", "GAP_REPAIRED", "GAP_UNREPAIRABLE")}
    for g in found.values():
        name = market_pb2.GapStatus.Name(g.status)
        by_status[name] = by_status.get(name, 0) + 1
    snapshot = table.current_snapshot()
    return dg.MaterializeResult(
        metadata={
            "dagster/row_count": len(found),
            "open": by_status["GAP_OPEN"],
            "repaired": by_status["GAP_REPAIRED"],
            "unrepairable": by_status["GAP_UNREPAIRABLE"],
            "open_tickers": dg.MetadataValue.json(
                sorted({g.ticker for g in found.values() if g.status == market_pb2.GAP_OPEN})
            ),
            "undecodable_records": bad,
            "changed": changed,
            "iceberg_snapshot_id": str(snapshot.snapshot_id) if snapshot else "",
        }
    )


@dg.definitions
def gap_defs() -> dg.Definitions:
    return dg.Definitions(assets=[gaps])
