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
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING

import dagster as dg

from candlewire.config import NAMESPACE
from candlewire.gaps import GAP_CAUSES, GAP_STATUSES
from candlewire.kafka import GAPS
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
            "cause": GAP_CAUSES[g.cause],
            "status": GAP_STATUSES[g.status],
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
    from candlewire.gaps import read_gaps
    from candlewire.lake import opened

    settings = candlewire.settings()
    log = read_gaps(settings, READ_TIMEOUT_S)
    if not log.complete:
        raise dg.Failure(f"{GAPS.name} not read to its end within {READ_TIMEOUT_S:.0f} s")
    found, bad = log.gaps, log.undecodable
    if bad:
        context.log.warning(f"{bad} records of {GAPS.name} could not be decoded; skipped")
    with opened(settings) as cat:
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
        name = GAP_STATUSES[g.status]
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
