"""What the live ``ohlc`` MERGE costs per batch under each partition layout (#34).

Each committing batch MERGEs every forming candle it changed: with ``--tickers`` tickers
trading, that is six rows a ticker, one per period. This runs the job's own MERGE and compaction
statements (``streaming.tables``) over ``--batches`` such batches, 30 s of market time apart,
compacting every 10 as the job does every 300 s, into an ``ohlc`` table per layout:

- ``ticker``: partitioned by ticker, period and month (the layout before 2026-11-26);
- ``period``: the table's layout today (``candlewire.lake.TABLES``).

A local Spark session and an Iceberg Hadoop catalog in a temporary folder: no stack, so the
figures are the layout's own. Per layout, the mean MERGE time of batches 1-5 (batch 0 pays
for the session's warm-up) and of the last 5. The last line is JSON.

    python -m bench.ohlc_layout [--tickers 50] [--batches 15]
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import pyarrow as pa
from pyiceberg.partitioning import PartitionSpec
from pyiceberg.transforms import DayTransform, IdentityTransform, MonthTransform
from pyiceberg.types import DecimalType
from pyspark.sql import SparkSession

from candlewire.config import PERIODS_S, Settings
from candlewire.lake import OHLC_SCHEMA, TABLES
from candlewire.spark import spark_jars
from streaming.decode import decimal_column, ohlc_rows
from streaming.sql import ts_literal
from streaming.tables import compact_statement, key_bounds, merge_statement

START_MS = 1_764_237_600_000  # 2025-11-27 10:00 UTC
COMPACT_EVERY = 10  # batches: the job's 300 s compaction over its 30 s commits
TRANSFORMS = {IdentityTransform: "{}", MonthTransform: "months({})", DayTransform: "days({})"}
SPARK_TYPES = {"string": "string", "int": "int", "long": "bigint", "boolean": "boolean"}
BEFORE = "ticker, period_s, months(open_time)"


def partitioned_by(spec: PartitionSpec) -> str:
    names = {f.field_id: f.name for f in OHLC_SCHEMA.fields}
    return ", ".join(TRANSFORMS[type(f.transform)].format(names[f.source_id]) for f in spec.fields)


def columns() -> str:
    def spark_type(t: object) -> str:
        if isinstance(t, DecimalType):
            return f"decimal({t.precision},{t.scale})"
        return "timestamp" if str(t) == "timestamptz" else SPARK_TYPES[str(t)]

    return ", ".join(f"{f.name} {spark_type(f.field_type)}" for f in OHLC_SCHEMA.fields)


def session(warehouse: Path) -> SparkSession:
    spark = (
        SparkSession.builder.master("local[2]")
        .appName("candlewire-bench-ohlc-layout")
        .config("spark.jars", ",".join(spark_jars(Settings())))
        .config(
            "spark.sql.extensions",
            "org.apache.iceberg.spark.extensions.IcebergSparkSessionExtensions",
        )
        .config("spark.sql.catalog.bench", "org.apache.iceberg.spark.SparkCatalog")
        .config("spark.sql.catalog.bench.type", "hadoop")
        .config("spark.sql.catalog.bench.warehouse", str(warehouse))
        .config("spark.sql.shuffle.partitions", "4")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def forming(tickers: int, at_ms: int) -> pa.Table:
    """Every ticker's forming candle of every period at ``at_ms``."""
    keys = [(f"BENCH:T{i}/USDT", p) for i in range(tickers) for p in PERIODS_S]
    n = len(keys)
    price = decimal_column(["100.5"] * n)
    return ohlc_rows(
        {
            "ticker": [t for t, _ in keys],
            "period_s": [p for _, p in keys],
            "open_time_ms": [at_ms - at_ms % (p * 1000) for _, p in keys],
            **dict.fromkeys(("open", "high", "low", "close", "volume"), price),
            "trade_count": [5] * n,
            "closed": [False] * n,
        },
        "live",
    )


def run(
    spark: SparkSession, layout: str, partitions: str, tickers: int, batches: int
) -> dict[str, float]:
    table = f"bench.market.ohlc_{layout}"
    spark.sql(
        f"CREATE TABLE {table} ({columns()}) USING iceberg PARTITIONED BY ({partitions}) "
        "TBLPROPERTIES ('format-version'='2', 'write.delete.mode'='merge-on-read', "
        "'write.update.mode'='merge-on-read', 'write.merge.mode'='merge-on-read')"
    )
    merges, compactions = [], []
    for b in range(batches):
        rows = forming(tickers, START_MS + b * 30_000)
        spark.createDataFrame(rows).createOrReplaceTempView("bench_candles")
        t0 = time.perf_counter()
        spark.sql(merge_statement(table, "bench_candles", key_bounds(rows))).collect()
        merges.append(time.perf_counter() - t0)
        line = f"{layout}: batch {b} MERGE {merges[-1]:.2f}s"
        if (b + 1) % COMPACT_EVERY == 0:
            t0 = time.perf_counter()
            where = f"open_time >= {ts_literal(START_MS - START_MS % 86_400_000)}"
            spark.sql(compact_statement("bench.system", table.split(".", 1)[1], where)).collect()
            compactions.append(time.perf_counter() - t0)
            line += f", compaction {compactions[-1]:.2f}s"
        print(line, flush=True)
    return {
        "first5_s": round(statistics.mean(merges[1:6]), 2),
        "last5_s": round(statistics.mean(merges[-5:]), 2),
        "compaction_s": round(statistics.mean(compactions), 2) if compactions else 0.0,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tickers", type=int, default=50)
    parser.add_argument("--batches", type=int, default=15)
    args = parser.parse_args()
    layouts = {"ticker": BEFORE, "period": partitioned_by(TABLES["ohlc"][1])}
    warehouse = Path(tempfile.mkdtemp(prefix="candlewire-bench-layout-"))
    spark = session(warehouse)
    try:
        result = {
            layout: run(spark, layout, partitions, args.tickers, args.batches)
            for layout, partitions in layouts.items()
        }
    finally:
        spark.stop()
        shutil.rmtree(warehouse, ignore_errors=True)
    result.update(tickers=args.tickers, batches=args.batches)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
