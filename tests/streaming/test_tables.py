"""``ohlc``'s one writer: MERGEs by absolute values, and the compaction that keeps a MERGE's
cost flat (every MERGE leaves a data file and a delete file in each partition it touches)."""

from __future__ import annotations

import threading
import time
import uuid
from datetime import UTC, datetime
from decimal import Decimal

from candlewire.lake import NAMESPACE, catalog
from streaming.decode import ohlc_rows
from streaming.tables import Tables

T0 = 1_790_000_000_000 // 3_600_000 * 3_600_000  # 2026-09: a month no other test writes
_AT = datetime.fromtimestamp(T0 / 1000, UTC)
MONTH = (_AT.year - 1970) * 12 + _AT.month - 1  # T0's, as Iceberg's month transform numbers it
LATER = T0 + 40 * 86_400_000  # another month, for the other test


def candles(ticker: str, n: int, close: int, t0: int = T0) -> object:
    """``n`` one-minute candles and their hour, all closing at ``close``."""
    times = [t0 + i * 60_000 for i in range(n)]
    return ohlc_rows(
        {
            "ticker": [ticker] * (n + 1),
            "period_s": [60] * n + [3600],
            "open_time_ms": [*times, t0],
            **{f: [Decimal(close)] * (n + 1) for f in ("open", "high", "low", "close", "volume")},
            "trade_count": [close] * (n + 1),
            "closed": [False] * (n + 1),
        },
        "live",
    )


def files(lakehouse, month: int) -> dict[int, int]:
    """The live files of ``ohlc``'s partitions of ``month``, by content (0 data, 1 position
    deletes). ``ohlc`` is partitioned by period and month: the test owns T0's month."""
    table = catalog(lakehouse).load_table(f"{NAMESPACE}.ohlc")
    entries = table.inspect.files().to_pylist()
    out: dict[int, int] = {}
    for f in entries:
        if f["partition"]["open_month"] == month:
            out[f["content"]] = out.get(f["content"], 0) + 1
    return out


def test_compaction_leaves_one_file_per_partition_and_every_value(lakehouse, spark) -> None:
    tables = Tables(lakehouse, spark)
    ticker = f"TEST:M{uuid.uuid4().hex[:6].upper()}/USDT"
    for close in range(1, 6):  # five MERGEs of the same windows, as forming candles get
        tables.upsert_ohlc(candles(ticker, 3, close), "cw_test_candles")
    before = files(lakehouse, MONTH)
    assert before.get(1, 0) >= 4 * 2 and before[0] >= 5 * 2, before  # deletes pile up
    tables.compact_ohlc([ticker], T0)
    assert files(lakehouse, MONTH) == {0: 2}  # one data file per partition, no deletes
    table = catalog(lakehouse).load_table(f"{NAMESPACE}.ohlc")
    rows = table.scan(row_filter=f"ticker = '{ticker}'").to_arrow().to_pylist()
    assert sorted((r["period_s"], r["trade_count"], r["close"]) for r in rows) == [
        (60, 5, Decimal(5)),
        (60, 5, Decimal(5)),
        (60, 5, Decimal(5)),
        (3600, 5, Decimal(5)),
    ]


def test_a_candle_deleted_by_key_leaves_its_neighbours(lakehouse, spark) -> None:
    """What a candle past DECIMAL(38,18) comes to when a commit before stored it: gone from
    ``ohlc``, and only it (another ticker's at the same time, its own other periods stay)."""
    tables = Tables(lakehouse, spark)
    gone, kept = (f"TEST:{k}{uuid.uuid4().hex[:6].upper()}/USDT" for k in "DK")
    t0 = LATER + 7 * 86_400_000  # a month no other test writes
    for ticker in (gone, kept):
        tables.upsert_ohlc(candles(ticker, 2, 1, t0), "cw_test_candles")
    tables.delete_ohlc([(gone, 60, t0 + 60_000), (gone, 3600, t0)])
    tables.delete_ohlc([])  # nothing to delete: no statement
    table = catalog(lakehouse).load_table(f"{NAMESPACE}.ohlc")
    rows = table.scan(row_filter=f"ticker IN ('{gone}', '{kept}')").to_arrow().to_pylist()
    left = {(r["ticker"], r["period_s"], int(r["open_time"].timestamp() * 1000)) for r in rows}
    assert left == {
        (gone, 60, t0),
        (kept, 60, t0),
        (kept, 60, t0 + 60_000),
        (kept, 3600, t0),
    }


def committer_threads(spark) -> set[int]:
    """Iceberg's partial-progress committer threads alive in the driver, by thread id."""
    threads = spark._jvm.java.lang.Thread.getAllStackTraces().keySet().toArray()
    return {t.getId() for t in threads if t.getName() == "Committer-Service"}


def test_a_compaction_stopped_midway_leaves_no_thread_spinning(lakehouse, spark) -> None:
    """Stopping the query that compacts interrupts the rewrite before it closes. Iceberg's
    partial-progress committer thread then stays for the life of the driver, spinning a core
    when a finished file group was waiting (apache/iceberg#12086): the job's compaction must
    not start one."""
    tables = Tables(lakehouse, spark)
    before = committer_threads(spark)
    ticker = f"TEST:S{uuid.uuid4().hex[:6].upper()}/USDT"
    for close in range(1, 9):  # many small files and deletes: a rewrite that takes a while
        tables.upsert_ohlc(candles(ticker, 30, close, LATER), "cw_test_stopped")
    started = threading.Event()

    def compact(_df, _batch_id: int) -> None:
        started.set()
        tables.compact_ohlc([ticker], LATER)

    query = (
        spark.readStream.format("rate")
        .option("rowsPerSecond", 1)
        .load()
        .writeStream.foreachBatch(compact)
        .trigger(once=True)
        .start()
    )
    assert started.wait(60)
    status = spark.sparkContext.statusTracker()
    deadline = time.monotonic() + 30
    while not status.getActiveJobsIds() and time.monotonic() < deadline:
        time.sleep(0.02)  # the rewrite's Spark job has started
    query.stop()  # interrupts the stream's thread, and the rewrite in it
    query.awaitTermination(30)
    assert committer_threads(spark) - before == set()
