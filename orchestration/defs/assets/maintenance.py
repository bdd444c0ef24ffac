"""Iceberg maintenance: compaction and cleanup of the tables the streaming job writes.

It runs while the job writes. ``ticks`` only receives appends, which never conflict with a
rewrite. ``ohlc`` and ``symbol_metadata`` receive MERGEs; a rewrite that commits between a
MERGE's read and its commit makes that MERGE fail validation, and the streaming job runs it
again; a maintenance step that loses such a race runs again the same way
(``candlewire.spark.commit_sql``). Rewrites use partial progress, so a file group that loses
a race is left for the next run instead of failing the others.

Spark, pyiceberg and their helpers are imported in the functions that use them: the code
server only lists definitions; a run imports them when it runs (#36).
"""

from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor, as_completed
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING

import dagster as dg

from candlewire.config import Settings
from orchestration.defs.assets.lineage import iceberg_key

# For an annotation only (a local variable's, never evaluated). Not ``from __future__ import
# annotations``: Dagster checks an op's ``context`` annotation as a class, which a string fails.
if TYPE_CHECKING:
    from dagster_pyspark import PySparkResource

ORPHAN_AGE = timedelta(hours=24)
MAINTAIN_AT_ONCE = 3  # tables maintained side by side
KEEP_SNAPSHOTS = 100  # the streaming job finds its last committed batch in recent snapshots


def file_stats(spark, table: str) -> dict[str, int]:  # noqa: ANN001
    row = spark.sql(
        f"SELECT count(*) AS files, coalesce(sum(file_size_in_bytes), 0) AS bytes, "
        f"coalesce(sum(record_count), 0) AS records FROM {table}.data_files"
    ).collect()[0]
    return {"files": int(row.files), "bytes": int(row.bytes), "records": int(row.records)}


Stats = dict[str, dict[str, int]]


def maintain(spark, settings: Settings, table: str) -> tuple[Stats, list[str]]:  # noqa: ANN001
    """Compact data files and manifests, expire old snapshots, delete orphan files; the
    files before and after, and what failed. Each step runs whatever the one before did: a
    compaction that fails must not keep expiry and orphan removal from ever running."""
    # Imported when a run maintains a table, not at load: candlewire.lake and candlewire.spark
    # import pyiceberg, which the code server, listing definitions only, never needs.
    from candlewire.lake import table_name
    from candlewire.spark import commit_sql

    # Named with their catalog: Iceberg's procedures resolve a table's first part as a catalog
    # first, and ``market.ticks`` logged a CatalogNotFoundException with its stack each time.
    full = table_name(settings, table)
    system = f"{settings.catalog_name}.system"
    cutoff = (datetime.now(UTC) - ORPHAN_AGE).strftime("%Y-%m-%d %H:%M:%S")
    before = file_stats(spark, full)
    # ``ohlc``'s month partitions hold every ticker's candles: rewritten in the table's sort
    # order (ticker first), a read of one ticker skips the other tickers' row groups.
    strategy = "strategy => 'sort', " if table == "ohlc" else ""
    # On object storage, list through the table's FileIO (S3FileIO lists prefixes); Hadoop's
    # filesystems know no s3:// scheme.
    listing = ", prefix_listing => true" if settings.on_s3() else ""
    steps = {
        "rewrite_data_files": f"CALL {system}.rewrite_data_files(table => '{full}', {strategy}"
        "options => map('partial-progress.enabled', 'true', 'min-input-files', '2', "
        "'max-concurrent-file-group-rewrites', '4'))",
        "rewrite_manifests": f"CALL {system}.rewrite_manifests(table => '{full}')",
        "expire_snapshots": f"CALL {system}.expire_snapshots(table => '{full}', "
        f"older_than => TIMESTAMP '{cutoff}', retain_last => {KEEP_SNAPSHOTS})",
        "remove_orphan_files": f"CALL {system}.remove_orphan_files(table => '{full}', "
        f"older_than => TIMESTAMP '{cutoff}'{listing})",
    }
    failed = []
    for step, sql in steps.items():
        try:
            commit_sql(spark, sql)
        except Exception as exc:
            failed.append(f"{table} {step}: {type(exc).__name__}: {exc}")
    return {"before": before, "after": file_stats(spark, full)}, failed


def maintain_all(
    spark,  # noqa: ANN001
    settings: Settings,
    tables: list[str],
    report: Callable[[str, Stats], None],
) -> list[str]:
    """Every table side by side, each reported as it finishes; every failure, of a step or
    of a whole table, in the list returned (the first one raised hid the others)."""
    failures: list[str] = []
    with ThreadPoolExecutor(MAINTAIN_AT_ONCE, thread_name_prefix="maintain") as pool:
        running = {pool.submit(maintain, spark, settings, table): table for table in tables}
        for done in as_completed(running):
            try:
                stats, failed = done.result()
            except Exception as exc:
                failures.append(f"{running[done]}: {type(exc).__name__}: {exc}")
                continue
            report(running[done], stats)
            failures += failed
    return failures


# The resource by key rather than as a ``PySparkResource`` parameter: Dagster reads a
# parameter's annotation when the op is defined, which would import dagster_pyspark (and
# pyspark) in the code server, which only lists definitions.
@dg.op(required_resource_keys={"pyspark"})
def compact_tables(context: dg.OpExecutionContext) -> None:
    """Maintain every platform table; record files and bytes before and after on each."""
    # Imported when the op runs: pyiceberg is not needed to list definitions.
    from candlewire.lake import TABLES

    settings = Settings()
    pyspark: PySparkResource = context.resources.pyspark
    spark = pyspark.spark_session
    # The tables side by side: each step is a small Spark job and a catalog commit, mostly
    # waiting, so one table at a time left the cores idle (the run took the sum of the
    # tables' times). Each table's result is reported as it finishes.
    failures = maintain_all(
        spark, settings, list(TABLES), lambda table, stats: report(context, table, stats)
    )
    for failure in failures:
        context.log.error(f"maintenance failed: {failure}")
    if failures:
        raise dg.Failure(
            description=f"{len(failures)} maintenance steps failed",
            metadata={"failed": dg.MetadataValue.text("\n".join(failures))},
        )


def report(context: dg.OpExecutionContext, table: str, stats: Stats) -> None:
    """Log one table's files and bytes before and after, and record them on its asset."""
    b, a = stats["before"], stats["after"]
    context.log.info(f"{table}: {b['files']} → {a['files']} files, {b['bytes']} → {a['bytes']} B")
    context.log_event(
        dg.AssetObservation(
            asset_key=iceberg_key(table),
            metadata={
                "files_before": b["files"],
                "files_after": a["files"],
                "bytes_before": b["bytes"],
                "bytes_after": a["bytes"],
                "records": a["records"],
            },
        )
    )


@dg.job(description="Compact and clean up the Iceberg tables (safe while streaming writes).")
def iceberg_maintenance() -> None:
    compact_tables()


@dg.definitions
def maintenance() -> dg.Definitions:
    return dg.Definitions(jobs=[iceberg_maintenance])
