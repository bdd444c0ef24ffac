"""An Iceberg warehouse on S3 (``warehouse = s3://…``), on the S3Proxy the stack runs:
Spark writes through Iceberg's S3FileIO, pyiceberg reads through pyarrow's S3 filesystem,
and maintenance (compaction, snapshot expiry, orphan removal) works on it unchanged."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path

import pyarrow.fs as pafs
import pytest

from candlewire.config import Settings
from candlewire.lake import catalog, ensure_tables, s3_filesystem, storage_health, table_name
from candlewire.spark import build_session
from candlewire.testing import free_settings
from launcher.stack import s3_service
from orchestration.defs.assets.maintenance import maintain

WAREHOUSE = "s3://lake/warehouse"


@pytest.fixture(scope="module")
def s3(tmp_path_factory, lakehouse) -> Iterator[Settings]:
    """The session's catalog database under a catalog name of its own, and a warehouse in
    a bucket of a local S3Proxy."""
    settings = free_settings(
        tmp_path_factory.mktemp("s3"),
        warehouse=WAREHOUSE,
        catalog_name="candlewire_s3",
        catalog_url=lakehouse.catalog_db(),
    )
    svc = s3_service(settings)
    svc.start()
    try:
        ensure_tables(settings)
        yield settings
    finally:
        svc.stop()


@pytest.fixture(scope="module")
def spark(s3):
    session = build_session(s3, "candlewire-s3-tests")
    yield session
    session.stop()


def objects(settings: Settings, under: str) -> dict[str, pafs.FileInfo]:
    infos = s3_filesystem(settings).get_file_info(pafs.FileSelector(under, recursive=True))
    return {i.path: i for i in infos if i.type == pafs.FileType.File}


def test_tables_are_made_in_the_bucket_and_nothing_on_local_disk(s3) -> None:
    assert storage_health(s3) is None
    metadata = [p for p in objects(s3, "lake/warehouse") if p.endswith(".metadata.json")]
    assert any("/ohlc/" in p for p in metadata), metadata
    assert not (s3.state_dir / "warehouse").exists()


def test_the_wrong_secret_key_is_refused(s3, monkeypatch) -> None:
    monkeypatch.setenv("CANDLEWIRE_SECRET_S3_SECRET_KEY", "not-the-key")
    assert storage_health(s3) is not None


def insert_candles(spark, settings: Settings, ticker: str, batches: int) -> None:
    """One statement per batch: one small data file each."""
    for b in range(batches):
        spark.sql(
            f"INSERT INTO {table_name(settings, 'ohlc')} "
            f"(ticker, period_s, open_time, open, high, low, close, volume, trade_count) "
            f"VALUES ('{ticker}', 60, TIMESTAMP '2026-01-0{b + 1} 00:00:00+00:00', "
            f"{b + 1}, {b + 2}, {b + 0.5}, {b + 1.5}, 10, {b + 1})"
        )


def test_spark_writes_and_pyiceberg_reads_the_same_rows(s3, spark) -> None:
    insert_candles(spark, s3, "S3:A/USDT", 3)
    table = catalog(s3).load_table("market.ohlc")
    rows = table.scan(row_filter="ticker == 'S3:A/USDT'").to_arrow().to_pylist()
    assert sorted(int(r["trade_count"]) for r in rows) == [1, 2, 3]
    assert all(f.file.file_path.startswith(WAREHOUSE) for f in table.scan().plan_files())


def test_maintenance_compacts_expires_and_removes_orphans_on_s3(s3, spark) -> None:
    insert_candles(spark, s3, "S3:B/USDT", 4)
    table = catalog(s3).load_table("market.ohlc")
    data_dir = table.location().removeprefix("s3://") + "/data"
    orphan = f"{data_dir}/orphan-{time.time_ns()}.parquet"
    with s3_filesystem(s3).open_output_stream(orphan) as f:
        f.write(b"not referenced by any snapshot")
    # S3Proxy serves a file's mtime as its Last-Modified: make the orphan three days old.
    backing = Path(s3.state_dir / "s3proxy" / "data" / orphan)
    old = time.time() - 3 * 86_400
    os.utime(backing, (old, old))

    stats, failed = maintain(spark, s3, "ohlc")
    assert failed == []
    assert stats["after"]["files"] < stats["before"]["files"], stats
    assert stats["after"]["records"] == stats["before"]["records"]
    assert orphan not in objects(s3, data_dir), "the orphan was not removed"

    snapshots = len(catalog(s3).load_table("market.ohlc").snapshots())
    assert snapshots > 1
    spark.sql(
        f"CALL {s3.catalog_name}.system.expire_snapshots(table => '{table_name(s3, 'ohlc')}', "
        "older_than => current_timestamp(), retain_last => 1)"
    )
    table = catalog(s3).load_table("market.ohlc")
    assert len(table.snapshots()) == 1
    lists = [p for p in objects(s3, table.location().removeprefix("s3://")) if "/snap-" in p]
    assert len(lists) == 1, "expired snapshots' manifest lists are still in the bucket"
    rows = table.scan(row_filter="ticker == 'S3:B/USDT'").to_arrow()
    assert sorted(rows.column("trade_count").to_pylist()) == [1, 2, 3, 4]
