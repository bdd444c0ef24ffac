"""SQL text the job builds: escaped literals and columns derived from the table schemas."""

from __future__ import annotations

import pytest

from candlewire.lake import SYMBOL_METADATA_SCHEMA, TICKS_SCHEMA
from candlewire.spark import build_session
from streaming.sql import columns_from_decoded, literal, staged_columns, staging_ddl

NASTY = ["plain", "it's", "back\\slash", "\\'", "'; DROP TABLE x; --", "two ''", 'dq"', "ünï"]


@pytest.fixture(scope="module")
def spark(lakehouse, kafka):
    session = build_session(lakehouse, "candlewire-sql-tests")
    yield session
    session.stop()


def test_literals_read_back_as_the_same_string(spark) -> None:
    """A value with quotes or backslashes is one literal holding exactly that value (the old
    doubling of quotes made Spark read two adjacent literals)."""
    row = spark.sql("SELECT " + ", ".join(literal(v) for v in NASTY)).first()
    assert list(row) == NASTY


def test_decoded_ticks_become_the_ticks_table_s_columns(spark) -> None:
    decoded = spark.createDataFrame(
        [
            (
                "SIM:A/B",
                "7",
                "1.50",
                "2",
                "BUY",
                1_700_000_000_123_456_789,
                1_700_000_000_200_000_000,
            )
        ],
        "ticker string, trade_id string, price string, size string, side string, "
        "exchange_time_ns bigint, ingest_time_ns bigint",
    )
    out = decoded.select(*columns_from_decoded(TICKS_SCHEMA))
    assert out.columns == [f.name for f in TICKS_SCHEMA.fields]
    types = dict(out.dtypes)
    assert types["price"] == types["size"] == "decimal(38,18)"
    assert types["exchange_time"] == "timestamp" and types["exchange_time_ns"] == "bigint"
    row = out.first()
    assert str(row.price) == "1.500000000000000000"
    assert row.exchange_time.timestamp() == pytest.approx(1_700_000_000.123456)


def test_staged_metadata_rows_take_the_table_s_types(spark) -> None:
    ddl = staging_ddl(SYMBOL_METADATA_SCHEMA, skip=["update_time"])
    row = {f.name: None for f in SYMBOL_METADATA_SCHEMA.fields if f.name != "update_time"}
    row |= {"ticker": "SIM:A/B", "exchange": "SIM", "base": "A", "quote": "B", "status": "X"}
    row["tick_size"] = "0.01"
    staged = spark.createDataFrame([row], ddl).select(
        *staged_columns(SYMBOL_METADATA_SCHEMA, skip=["update_time"])
    )
    assert staged.columns == [f.name for f in SYMBOL_METADATA_SCHEMA.fields][:-1]
    assert dict(staged.dtypes)["tick_size"] == "decimal(38,18)"
    assert str(staged.first().tick_size) == "0.010000000000000000"
