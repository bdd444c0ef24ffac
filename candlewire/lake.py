"""The Iceberg catalog and the platform's table schemas, defined once.

One catalog name, one PostgreSQL database: Spark reaches it through Iceberg's JDBC catalog
(:func:`spark_catalog_conf`), Python through pyiceberg's ``SqlCatalog`` (:func:`catalog`).
Prices and sizes are DECIMAL(38, 18): exact, like the wire's decimal strings.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from urllib.parse import urlsplit

import pyarrow.fs as pafs
from pyiceberg.catalog.sql import SqlCatalog
from pyiceberg.partitioning import PartitionField, PartitionSpec
from pyiceberg.schema import Schema
from pyiceberg.table import Table
from pyiceberg.table.sorting import SortField, SortOrder
from pyiceberg.transforms import DayTransform, IdentityTransform, MonthTransform
from pyiceberg.types import (
    BooleanType,
    DecimalType,
    IntegerType,
    ListType,
    LongType,
    NestedField,
    StringType,
    StructType,
    TimestamptzType,
)

from candlewire.config import NAMESPACE, S3_SECRET_KEY, Settings, db_parts

DEC = DecimalType(38, 18)


def _fields(*spec: tuple[str, object, bool]) -> list[NestedField]:
    return [NestedField(i, name, typ, required=req) for i, (name, typ, req) in enumerate(spec, 1)]


TICKS_SCHEMA = Schema(
    *_fields(
        ("ticker", StringType(), True),
        ("trade_id", StringType(), True),
        ("price", DEC, True),
        ("size", DEC, True),
        ("side", StringType(), False),
        ("exchange_time", TimestamptzType(), True),
        ("ingest_time", TimestamptzType(), False),
        ("exchange_time_ns", LongType(), True),
    ),
    identifier_field_ids=[1, 2],
)
OHLC_SCHEMA = Schema(
    *_fields(
        ("ticker", StringType(), True),
        ("period_s", IntegerType(), True),
        ("open_time", TimestamptzType(), True),
        ("open", DEC, True),
        ("high", DEC, True),
        ("low", DEC, True),
        ("close", DEC, True),
        ("volume", DEC, True),
        ("trade_count", LongType(), False),
        ("closed", BooleanType(), False),
        ("source", StringType(), False),  # "live" (aggregated here) or "history" (exchange)
        ("update_time", TimestamptzType(), False),
        # Event times of a live candle's first and last trade: a late tick, or the forming
        # candles restored after a restart, then merge exactly. Empty for history rows.
        ("first_trade_ns", LongType(), False),
        ("last_trade_ns", LongType(), False),
        # 0 as first closed; one more each time a late trade revised it (#37). Empty for
        # history rows and rows written before revisions existed.
        ("revision", IntegerType(), False),
    ),
    identifier_field_ids=[1, 2, 3],
)
SYMBOL_METADATA_SCHEMA = Schema(
    *_fields(
        ("ticker", StringType(), True),
        ("exchange", StringType(), True),
        ("base", StringType(), True),
        ("quote", StringType(), True),
        ("exchange_symbol", StringType(), False),
        ("tick_size", DEC, False),
        ("lot_size", DEC, False),
        ("min_notional", DEC, False),
        ("status", StringType(), True),
        ("update_time", TimestamptzType(), True),
    ),
    identifier_field_ids=[1],
)


def _levels(name_id: int, name: str, first_id: int) -> NestedField:
    """A side of a book: a list of (price, size) levels, best first."""
    level = StructType(
        NestedField(first_id + 1, "price", DEC, required=False),
        NestedField(first_id + 2, "size", DEC, required=False),
    )
    return NestedField(name_id, name, ListType(first_id, level, element_required=False))


# L2 books (#38): what the ingestors checked, as written to candlewire.books. Sizes of 0 in a
# delta remove the level. Columns are optional: Spark writes the rows it decoded as they are.
BOOK_SNAPSHOTS_SCHEMA = Schema(
    NestedField(1, "ticker", StringType(), required=False),
    NestedField(2, "venue_seq", LongType(), required=False),
    NestedField(3, "exchange_time", TimestamptzType(), required=False),
    NestedField(4, "exchange_time_ns", LongType(), required=False),
    NestedField(5, "ingest_time", TimestamptzType(), required=False),
    NestedField(6, "reason", StringType(), required=False),
    _levels(7, "bids", 20),
    _levels(8, "asks", 30),
)
BOOK_DELTAS_SCHEMA = Schema(
    NestedField(1, "ticker", StringType(), required=False),
    NestedField(2, "venue_seq", LongType(), required=False),
    NestedField(3, "exchange_time", TimestamptzType(), required=False),
    NestedField(4, "exchange_time_ns", LongType(), required=False),
    NestedField(5, "ingest_time", TimestamptzType(), required=False),
    NestedField(6, "prev_seq", LongType(), required=False),
    _levels(7, "bids", 20),
    _levels(8, "asks", 30),
    NestedField(9, "checksum", LongType(), required=False),
)
BOOK_TABLES = ("book_snapshots", "book_deltas")

# Users ask for one ticker over a time range: ticks partition by ticker and day so a query
# reads only that ticker's days.
TABLES: dict[str, tuple[Schema, PartitionSpec, SortOrder]] = {
    "ticks": (
        TICKS_SCHEMA,
        PartitionSpec(
            PartitionField(1, 1000, IdentityTransform(), "ticker"),
            PartitionField(6, 1001, DayTransform(), "exchange_day"),
        ),
        SortOrder(SortField(6)),
    ),
    # By period and month, not by ticker (#34): the live MERGE touches every ticker's forming
    # candles each batch, and a partition costs it a file to read and two to write, so with
    # the ticker in the spec 50 tickers took 11-16 s a MERGE, growing between compactions,
    # and 1.2 s without it (docs/benchmarks.md, "ohlc layout"). Sorted by ticker, so one
    # ticker's reads skip other tickers' files and row groups by their statistics. By month:
    # a year of 1-minute candles read back as 366 daily files took seconds.
    "ohlc": (
        OHLC_SCHEMA,
        PartitionSpec(
            PartitionField(2, 1000, IdentityTransform(), "period_s"),
            PartitionField(3, 1001, MonthTransform(), "open_month"),
        ),
        SortOrder(SortField(1), SortField(3)),
    ),
    "symbol_metadata": (
        SYMBOL_METADATA_SCHEMA,
        PartitionSpec(PartitionField(2, 1000, IdentityTransform(), "exchange")),
        SortOrder(SortField(1)),
    ),
    # Partitioned like ticks: a book is rebuilt from one ticker's day.
    **{
        name: (
            schema,
            PartitionSpec(
                PartitionField(1, 1000, IdentityTransform(), "ticker"),
                PartitionField(3, 1001, DayTransform(), "exchange_day"),
            ),
            SortOrder(SortField(4)),
        )
        for name, schema in zip(
            BOOK_TABLES, (BOOK_SNAPSHOTS_SCHEMA, BOOK_DELTAS_SCHEMA), strict=True
        )
    },
}


# Every table's Parquet in zstd at level 1. Iceberg's Java writer falls back to gzip for a
# table whose properties name no codec (pyiceberg creates them so): deflate was 13 % of the
# committing query's result stage, and a million ticks appended in 1.42 s with zstd:1 against
# 2.46 s with gzip, in files of 3.9 MB against 7.0 (docs/benchmarks.md, 2026-12-01). Delete
# files and compaction's rewrites take the same codec.
FILE_PROPERTIES = {
    "write.parquet.compression-codec": "zstd",
    "write.parquet.compression-level": "1",
}
# Row groups small enough that a read of one ticker skips the others' by their statistics,
# in the month files compaction writes with every ticker's candles, sorted by ticker.
TABLE_PROPERTIES: dict[str, dict[str, str]] = {name: dict(FILE_PROPERTIES) for name in TABLES}
TABLE_PROPERTIES["ohlc"]["write.parquet.row-group-size-bytes"] = str(8 << 20)


def table_name(settings: Settings, table: str) -> str:
    """Spark's fully qualified name, e.g. ``candlewire.market.ohlc``."""
    return f"{settings.catalog_name}.{NAMESPACE}.{table}"


class StorageError(RuntimeError):
    pass


def s3_environment(settings: Settings) -> dict[str, str]:
    """The AWS SDKs' checksum choice, which they take only from the environment."""
    mode = settings.s3.checksums.upper()
    return {"AWS_REQUEST_CHECKSUM_CALCULATION": mode, "AWS_RESPONSE_CHECKSUM_VALIDATION": mode}


def s3_properties(settings: Settings) -> dict[str, str]:
    """Iceberg's S3 properties (the same keys for Spark's S3FileIO and pyiceberg's pyarrow
    S3 filesystem); empty for a warehouse not on S3."""
    if not settings.on_s3():
        return {}
    secret = settings.secret(S3_SECRET_KEY)
    if not secret:
        raise StorageError(
            "the warehouse is on S3 but there is no secret key: set "
            "CANDLEWIRE_SECRET_S3_SECRET_KEY or run `candlewire up`, which makes "
            f"{settings.state_dir}/secrets/{S3_SECRET_KEY} for the local S3Proxy"
        )
    s3 = settings.s3
    for name, value in s3_environment(settings).items():
        os.environ.setdefault(name, value)  # before the SDKs start: they read it once
    return {
        "s3.endpoint": settings.s3_endpoint(),
        "s3.access-key-id": s3.access_key,
        "s3.secret-access-key": secret,
        "s3.path-style-access": str(s3.path_style).lower(),  # Java's S3FileIO
        "s3.force-virtual-addressing": str(not s3.path_style).lower(),  # pyarrow's
        "s3.region": s3.region,
        "client.region": s3.region,
    }


def s3_filesystem(settings: Settings) -> pafs.S3FileSystem:
    """The warehouse's object store through pyarrow, as pyiceberg reaches it."""
    props = s3_properties(settings)
    return pafs.S3FileSystem(
        access_key=props["s3.access-key-id"],
        secret_key=props["s3.secret-access-key"],
        endpoint_override=props["s3.endpoint"],
        region=props["s3.region"],
        force_virtual_addressing=not settings.s3.path_style,
        connect_timeout=2,
        request_timeout=5,
    )


def warehouse_path(settings: Settings) -> str:
    """``bucket/prefix`` of an s3:// warehouse, as pyarrow's S3 filesystem names it."""
    parts = urlsplit(settings.warehouse_uri())
    return f"{parts.netloc}{parts.path}".rstrip("/")


def warehouse_bucket(settings: Settings) -> str:
    return warehouse_path(settings).split("/", 1)[0]


def storage_health(settings: Settings) -> str | None:
    """None when the warehouse's bucket answers an authenticated request."""
    bucket = warehouse_bucket(settings)
    try:
        info = s3_filesystem(settings).get_file_info(bucket)
    except OSError as exc:
        return f"S3 request failed: {exc}"
    return None if info.type == pafs.FileType.Directory else f"no bucket {bucket}"


def catalog(settings: Settings) -> SqlCatalog:
    """The catalog with a pool of its own: for a process that keeps it (the stream job).
    Anything shorter uses :func:`opened` or :func:`load_table`."""
    return SqlCatalog(
        settings.catalog_name,
        uri=settings.sql_url(),
        warehouse=settings.warehouse_uri(),
        # Spark's JDBC catalog writes the same tables; keep pyiceberg from altering them.
        init_catalog_tables="true",
        # A pooled connection PostgreSQL has closed (a restart, `idle_session_timeout`) is
        # replaced before use rather than failing the commit that picks it.
        pool_pre_ping="true",
        **s3_properties(settings),
    )


@contextmanager
def opened(settings: Settings) -> Iterator[SqlCatalog]:
    """The catalog for one piece of work, its connections closed at the end. An engine left
    to the garbage collector keeps its connection until a cyclic collection (ten health
    checks held ten open), so a gateway seeding charts could run PostgreSQL out of them."""
    cat = catalog(settings)
    try:
        yield cat
    finally:
        cat.engine.dispose()


def load_table(settings: Settings, name: str) -> Table:
    """Table ``name`` of the namespace. Its catalog is closed once it is loaded: a table
    reads its files itself, and a later commit opens a connection again."""
    with opened(settings) as cat:
        return cat.load_table(f"{NAMESPACE}.{name}")


RETRYABLE_SQLSTATES = "57P01,57P02,57P05"


def spark_catalog_conf(settings: Settings) -> dict[str, str]:
    where, user, password = db_parts(settings.catalog_db())
    prefix = f"spark.sql.catalog.{settings.catalog_name}"
    return {
        prefix: "org.apache.iceberg.spark.SparkCatalog",
        f"{prefix}.type": "jdbc",
        f"{prefix}.uri": f"jdbc:postgresql://{where}",
        f"{prefix}.jdbc.user": user,
        f"{prefix}.jdbc.password": password,
        # pyiceberg's SqlCatalog has no iceberg_type column: keep Spark on the V0 layout.
        f"{prefix}.jdbc.schema-version": "V0",
        # Besides the connection failures Iceberg retries (08xxx), a connection PostgreSQL
        # ended on purpose: a restart or pg_terminate_backend (57P01), a crash (57P02), the
        # local server's idle_session_timeout (57P05). Each is retried once on a new
        # connection; without this the commit fails, and with it the committing query.
        f"{prefix}.retryable_status_codes": RETRYABLE_SQLSTATES,
        f"{prefix}.warehouse": settings.warehouse_uri(),
        **{f"{prefix}.{k}": v for k, v in s3_properties(settings).items()},
        **({f"{prefix}.io-impl": "org.apache.iceberg.aws.s3.S3FileIO"} if settings.on_s3() else {}),
    }


def _evolve_layout(table: Table, spec: PartitionSpec, order: SortOrder) -> None:
    """Move a table made by an older release to this release's partitioning, sort order and
    properties. Files already written keep their layout until compaction rewrites them;
    queries prune both."""
    wanted = {f.name: (f.source_id, f.transform) for f in spec.fields}
    current = {f.name: (f.source_id, f.transform) for f in table.spec().fields}
    if wanted != current:
        with table.update_spec() as update:
            for name in current.keys() - wanted.keys():
                update.remove_field(name)
            for name in wanted.keys() - current.keys():
                source_id, transform = wanted[name]
                update.add_field(table.schema().find_column_name(source_id), transform, name)
    sort_key = [(f.source_id, f.transform) for f in order.fields]
    if [(f.source_id, f.transform) for f in table.sort_order().fields] != sort_key:
        with table.update_sort_order() as update:
            for source_id, transform in sort_key:
                update.asc(table.schema().find_column_name(source_id), transform)
    extra = TABLE_PROPERTIES[table.name()[-1]]
    if any(table.properties.get(k) != v for k, v in extra.items()):
        with table.transaction() as tx:
            tx.set_properties(extra)


def ensure_tables(settings: Settings) -> list[str]:
    """Create the namespace and any missing table, and bring tables an older release made
    to this release's columns and partitioning; return the names created."""
    with opened(settings) as cat:
        cat.create_namespace_if_not_exists(NAMESPACE)
        created = []
        for name, (schema, spec, order) in TABLES.items():
            ident = f"{NAMESPACE}.{name}"
            if cat.table_exists(ident):
                table = cat.load_table(ident)
                missing = [f for f in schema.fields if f.name not in table.schema().column_names]
                if missing:
                    with table.update_schema() as update:
                        for f in missing:
                            update.add_column(f.name, f.field_type, f.doc)
                _evolve_layout(table, spec, order)
            else:
                cat.create_table(
                    ident,
                    schema,
                    partition_spec=spec,
                    sort_order=order,
                    properties={
                        "format-version": "2",
                        "write.upsert.enabled": "true",
                        "write.delete.mode": "merge-on-read",
                        "write.update.mode": "merge-on-read",
                        "write.merge.mode": "merge-on-read",
                        "commit.retry.num-retries": "10",
                        **TABLE_PROPERTIES[name],
                    },
                )
                created.append(ident)
        return created


def driver_error(exc: BaseException) -> str:
    """A catalog error in one line: the driver's own first line, without SQLAlchemy's
    wrapping (where it failed: ``connection to server at … failed: Connection refused``)."""
    lines = str(getattr(exc, "orig", None) or exc).strip().splitlines()
    return lines[0] if lines else type(exc).__name__


def catalog_health(settings: Settings) -> str | None:
    try:
        with opened(settings) as cat:
            missing = [t for t in TABLES if not cat.table_exists(f"{NAMESPACE}.{t}")]
    except Exception as exc:
        return f"catalog unreachable: {driver_error(exc)}"
    return f"missing tables: {', '.join(missing)}" if missing else None
