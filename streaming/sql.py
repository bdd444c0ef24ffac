"""Spark SQL text and column lists, derived from the table schemas in :mod:`candlewire.lake`.

Values that reach SQL text go through :func:`literal` (escaped as Spark's parser reads
string literals) or are numbers and timestamps we format ourselves; columns and types come
from the schemas, so a schema change cannot leave a hand-written copy behind.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import UTC, datetime

from pyiceberg.schema import Schema
from pyiceberg.types import DecimalType, IcebergType, TimestamptzType
from pyspark.sql import Column
from pyspark.sql import functions as F

from candlewire.lake import DEC as LAKE_DEC

DEC = f"DECIMAL({LAKE_DEC.precision},{LAKE_DEC.scale})"  # the tables' decimal, in Spark SQL


def literal(value: str) -> str:
    """A Spark SQL string literal. Spark unescapes backslashes and does *not* read ``''`` as a
    quote (adjacent literals concatenate), so both are escaped with a backslash."""
    return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"


def literals(values: Iterable[str]) -> str:
    """``'a', 'b'`` for an ``IN (…)`` list, sorted so the text is stable."""
    return ", ".join(literal(v) for v in sorted(values))


def ts_literal(ms: int) -> str:
    """A UTC timestamp literal for epoch milliseconds."""
    when = datetime.fromtimestamp(ms / 1000, UTC)
    return when.strftime("TIMESTAMP'%Y-%m-%d %H:%M:%S.%f'")


_SPARK_TYPES = {
    "string": "STRING",
    "long": "BIGINT",
    "int": "INT",
    "boolean": "BOOLEAN",
    "timestamptz": "TIMESTAMP",
}


def _spark_type(t: IcebergType) -> str:
    if isinstance(t, DecimalType):
        return f"DECIMAL({t.precision},{t.scale})"
    return _SPARK_TYPES[str(t)]


def columns_from_decoded(schema: Schema) -> list[Column]:
    """A table's columns from decoded rows: decimals arrive as strings and timestamps as
    ``<name>_ns`` nanoseconds; everything else has the table's own name and type."""
    out = []
    for f in schema.fields:
        if isinstance(f.field_type, DecimalType):
            out.append(F.col(f.name).cast(_spark_type(f.field_type)).alias(f.name))
        elif isinstance(f.field_type, TimestamptzType):
            out.append(F.timestamp_micros(F.expr(f"{f.name}_ns DIV 1000")).alias(f.name))
        else:
            out.append(F.col(f.name))
    return out


def staging_ddl(schema: Schema, *, skip: Iterable[str] = ()) -> str:
    """A DDL string for staging rows of a table from Python values: decimals as strings
    (exact; cast by :func:`staged_columns`), other columns with the table's type."""
    skipped = set(skip)
    return ", ".join(
        f"{f.name} {'STRING' if isinstance(f.field_type, DecimalType) else _spark_type(f.field_type)}"
        for f in schema.fields
        if f.name not in skipped
    )


def staged_columns(schema: Schema, *, skip: Iterable[str] = ()) -> list[Column]:
    """The staged rows' columns cast to the table's types (see :func:`staging_ddl`)."""
    skipped = set(skip)
    return [
        F.col(f.name).cast(_spark_type(f.field_type)).alias(f.name)
        if isinstance(f.field_type, DecimalType)
        else F.col(f.name)
        for f in schema.fields
        if f.name not in skipped
    ]
