"""The Iceberg tables across releases: ensure_tables brings an older release's tables to
this release's columns and partitioning without losing a row."""

from __future__ import annotations

import asyncio
import gc
import os
import uuid
from datetime import UTC, datetime
from decimal import Decimal

import pyarrow as pa
import pytest
from pyiceberg.partitioning import PartitionField, PartitionSpec
from pyiceberg.schema import Schema
from pyiceberg.transforms import DayTransform, IdentityTransform

from candlewire import AsyncClient, CatalogUnavailable, Client
from candlewire.config import db_parts
from candlewire.lake import (
    BOOK_TABLES,
    FILE_PROPERTIES,
    NAMESPACE,
    OHLC_SCHEMA,
    TABLE_PROPERTIES,
    TABLES,
    catalog,
    catalog_health,
    ensure_tables,
    load_table,
)

NEW_COLUMNS = ("first_trade_ns", "last_trade_ns", "revision")


def test_an_older_ohlc_table_gains_columns_and_month_partitions(lakehouse, tmp_path) -> None:
    # A catalog of its own, in a warehouse of its own, holding the previous release's table.
    settings = lakehouse.model_copy(
        update={"catalog_name": f"old_{uuid.uuid4().hex[:8]}", "warehouse": tmp_path.as_uri()}
    )
    cat = catalog(settings)
    cat.create_namespace(NAMESPACE)
    old_schema = Schema(
        *(f for f in OHLC_SCHEMA.fields if f.name not in NEW_COLUMNS),
        identifier_field_ids=[1, 2, 3],
    )
    old = cat.create_table(
        f"{NAMESPACE}.ohlc",
        old_schema,
        partition_spec=PartitionSpec(
            PartitionField(1, 1000, IdentityTransform(), "ticker"),
            PartitionField(2, 1001, IdentityTransform(), "period_s"),
            PartitionField(3, 1002, DayTransform(), "open_day"),
        ),
    )
    when = datetime(2025, 3, 4, 5, 6, tzinfo=UTC)
    price = pa.array([Decimal("1.5")], pa.decimal128(38, 18))
    old.append(
        pa.table(
            {
                "ticker": ["X:A/B"],
                "period_s": pa.array([60], pa.int32()),
                "open_time": pa.array([when], pa.timestamp("us", tz="UTC")),
                **dict.fromkeys(("open", "high", "low", "close", "volume"), price),
                "trade_count": pa.array([3], pa.int64()),
                "closed": [True],
                "source": ["history"],
                "update_time": pa.array([when], pa.timestamp("us", tz="UTC")),
            },
            schema=old_schema.as_arrow(),
        )
    )

    created = [f"{NAMESPACE}.{t}" for t in ("ticks", "symbol_metadata", *BOOK_TABLES)]
    assert ensure_tables(settings) == created
    ensure_tables(settings)  # a second run changes nothing more

    table = cat.load_table(f"{NAMESPACE}.ohlc")
    assert [f.name for f in table.schema().fields] == [f.name for f in OHLC_SCHEMA.fields]
    assert [f.name for f in table.spec().fields] == [f.name for f in TABLES["ohlc"][1].fields]
    assert len(table.specs()) == 2  # the day spec stays for the files written under it
    # Sorted by ticker, with small row groups: reads of one ticker skip the others'.
    wanted_order = [f.source_id for f in TABLES["ohlc"][2].fields]
    assert [f.source_id for f in table.sort_order().fields] == wanted_order
    assert TABLE_PROPERTIES["ohlc"].items() <= table.properties.items()
    # Every table, made now or by an older release, names its codec: Iceberg's Java writer
    # would fall back to gzip.
    for name in TABLES:
        properties = cat.load_table(f"{NAMESPACE}.{name}").properties
        assert FILE_PROPERTIES.items() <= properties.items(), name
    rows = table.scan(row_filter="ticker = 'X:A/B' and period_s = 60").to_arrow().to_pylist()
    assert len(rows) == 1
    assert rows[0]["trade_count"] == 3 and rows[0]["first_trade_ns"] is None
    assert rows[0]["revision"] is None


def connections_to(port: int) -> int:
    """This process's open TCP connections to ``port``."""
    mine = set()
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if target.startswith("socket:["):
            mine.add(target[8:-1])
    count = 0
    for table in ("/proc/self/net/tcp", "/proc/self/net/tcp6"):
        with open(table) as f:
            for line in f.readlines()[1:]:
                cols = line.split()
                remote_port, inode = int(cols[2].split(":")[1], 16), cols[9]
                count += remote_port == port and inode in mine
    return count


def test_short_uses_of_the_catalog_leave_no_connection_open(lakehouse) -> None:
    """Health checks, table loads and history reads close their catalog's connections. An
    engine left to the garbage collector holds one until a cyclic collection, which a busy
    process may not run for a long while: held off here, ten checks held ten connections."""
    from candlewire.history import read_history

    port = lakehouse.port("postgres")
    gc.collect()
    gc.disable()
    try:
        before = connections_to(port)
        for _ in range(4):
            assert catalog_health(lakehouse) is None
            assert load_table(lakehouse, "ohlc").name()[-1] == "ohlc"
            read_history(lakehouse, "SIM:NOTHING/USD", 60, 0, 60_000)
        ensure_tables(lakehouse)
        after = connections_to(port)
        held = catalog(lakehouse)  # what opened() and load_table() close: one each, kept
        assert connections_to(port) == after + 1
        held.engine.dispose()
    finally:
        gc.enable()
    assert after == before


def test_a_history_read_without_its_catalog_says_where_it_looked(settings, lakehouse) -> None:
    """Nothing listening (the ``settings`` fixture's free ports), or a catalog that holds no
    tables yet: one error a user can act on, from both clients, not a driver's traceback."""
    empty = lakehouse.model_copy(update={"catalog_name": f"empty_{uuid.uuid4().hex[:8]}"})
    for where, says in ((settings, "cannot be read"), (empty, "has no")):
        address = db_parts(where.catalog_db())[0]
        with Client(where) as client, pytest.raises(CatalogUnavailable, match=says) as raised:
            client.history("BINANCE:BTC/USDT", 60, "2024-01-01", "2024-01-02")
        assert address in str(raised.value)

        async def read(where=where) -> None:
            async with AsyncClient(where) as client:
                await client.history("BINANCE:BTC/USDT", "book", at="2024-01-01")

        with pytest.raises(CatalogUnavailable, match=says):
            asyncio.run(read())
