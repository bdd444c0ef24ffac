"""SQL the job builds: escaped literals, columns derived from the table schemas, and the
committing query's candles, folded in Spark's tasks."""

from __future__ import annotations

import random
from decimal import Decimal

import pytest
from pyspark.sql import functions as F

from candlewire.config import PERIODS_S
from candlewire.lake import SYMBOL_METADATA_SCHEMA, TICKS_SCHEMA
from proto import market_pb2
from proto.envelope import to_record
from streaming.pacing import batch_writer
from streaming.queries.ticks import CANDLE, TICK, judged_in_tasks
from streaming.sql import columns_from_decoded, literal, staged_columns, staging_ddl
from tests.reference.candles import partial_candles
from tests.reference.feeds import Feeds, Verdict

# The ticks topic's records as the committing query reads them.
RECORDS = "value binary, partition int, offset bigint, control binary"
NASTY = ["plain", "it's", "back\\slash", "\\'", "'; DROP TABLE x; --", "two ''", 'dq"', "ünï"]


def trade(ticker: str, trade_id: str, price: str, exchange_time_ns: int) -> bytes:
    """One BUY of size 1 as the ticks topic holds it."""
    tick = market_pb2.Tick(
        ticker=ticker,
        trade_id=trade_id,
        price=price,
        size="1",
        side=market_pb2.BUY,
        exchange_time_ns=exchange_time_ns,
    )
    return to_record(tick)


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


def test_tasks_break_equal_times_by_kafka_order_like_the_live_path(spark) -> None:
    """Trades in the same nanosecond (common at a venue's ms resolution): open is the first
    and close the last of them in Kafka order, as the live path folds them, whatever order
    Spark's shuffle hands them to the committing query's stateful judging in."""
    rng = random.Random(3)
    base = 1_789_999_200 * 10**9
    ticks = [
        ("SIM:TIE/USD", base + rng.randint(0, 3) * 10**9, f"{100 + rng.randint(0, 50)}.5", "1")
        for _ in range(400)
    ]  # Kafka order
    rows = [(trade(t, str(i), price, ns), 0, i, None) for i, (t, ns, price, _) in enumerate(ticks)]
    shuffled = rows[:]
    rng.shuffle(shuffled)
    df = spark.createDataFrame(shuffled, RECORDS).repartition(8)
    got = {
        (r["ticker"], r["period_s"], r["open_ms"]): (
            Decimal(r["open"]),
            Decimal(r["close"]),
            r["trade_count"],
        )
        for r in judged_in_tasks(df, 10.0, 600.0).where(f"kind = {CANDLE}").collect()
    }
    ticks = [(t, ns, Decimal(price), Decimal(size)) for t, ns, price, size in ticks]
    want = {c.key: (c.open, c.close, c.trade_count) for c in partial_candles(ticks, PERIODS_S)}
    assert got == want


def test_each_task_s_ticks_come_out_a_ticker_and_day_at_a_time(spark) -> None:
    """The ticks append keeps one file open per task (Iceberg's clustered writer), which fails
    on a (ticker, day) partition it has already closed. So each task's stored ticks come out
    in runs, one per (ticker, day), each run in Kafka order, even when a feed's Kafka order
    goes back across midnight: a late trade of the day before, kept or stored as late."""
    rng = random.Random(5)
    midnight = 1_790_035_200 * 10**9  # a UTC day boundary
    rows, kafka_order = [], {}
    for f in range(12):
        ticker = f"SIM:D{f}/USD"
        times = [midnight + rng.randint(-5, 5) * 10**9 for _ in range(40)]  # across midnight
        times += [midnight - 3_600 * 10**9]  # an hour late: stored, marked late
        for i, ns in enumerate(times):
            offset = len(rows)
            rows.append((trade(ticker, str(i), "100.5", ns), f % 3, offset, None))
            kafka_order[(ticker, str(i))] = offset
    rng.shuffle(rows)
    df = spark.createDataFrame(rows, RECORDS).repartition(4)
    ticks = (
        judged_in_tasks(df, 10.0, 7_200.0)
        .where(f"kind = {TICK}")
        .withColumn("task", F.spark_partition_id())
        .withColumn("at", F.monotonically_increasing_id())  # order within each task
        .collect()
    )
    assert len(ticks) == len(rows)  # every trade stored once, late ones too
    assert any(r["late"] for r in ticks)
    runs: dict[tuple[int, str, int], list[int]] = {}  # (task, ticker, day): Kafka offsets
    last = None
    for r in sorted(ticks, key=lambda r: r["at"]):
        key = (r["task"], r["ticker"], r["exchange_time_ns"] // (86_400 * 10**9))
        assert key == last or key not in runs, f"{key} came out in two runs in one task"
        runs.setdefault(key, []).append(kafka_order[(r["ticker"], r["trade_id"])])
        last = key
    assert len(runs) == 24  # 12 feeds, each on both sides of midnight
    for offsets in runs.values():
        assert offsets == sorted(offsets)  # Kafka order within the run


def test_the_committed_dedup_horizon_survives_batches_in_every_id_form(spark, tmp_path) -> None:
    """The committing query keeps each feed's trade ids in Spark's state store between
    batches, numbers packed as differences and other ids as text (``TradeIds``). Over four
    micro-batches, with resends across them, ids that look like numbers but are not one
    ("007", "-3", 20 digits) and a clock that leaves ids behind the horizon, every verdict
    is the one ``tests.reference.feeds`` reaches over the same records."""
    rng = random.Random(11)
    forms = ["{}", "00{}", "x{}", "-{}", "12345678901234567{:03d}", "{}0000000000000000000"]
    base, records, sent = 1_789_999_200 * 10**9, [], []
    for i in range(1200):
        if sent and rng.random() < 0.15:
            trade_id, t = rng.choice(sent[-400:])  # a resend, perhaps from an earlier batch
        else:
            trade_id = forms[i % len(forms)].format(i // len(forms))  # "7", "007", "x7"...
            t = base + i * 10**8 + rng.randint(-15, 3) * 10**9 + (i // 600) * 90 * 10**9
            sent.append((trade_id, t))
        records.append((trade_id, t))
    source = tmp_path / "in"
    for n, at in enumerate(range(0, len(records), 300)):
        rows = [
            (trade("SIM:IDS/USD", tid, "1.5", t), 0, at + k, None)
            for k, (tid, t) in enumerate(records[at : at + 300])
        ]
        spark.createDataFrame(rows, RECORDS).coalesce(1).write.parquet(str(source / f"b{n}"))
    stored: dict[int, bool] = {}

    def collect(df, _batch_id: int) -> None:
        for r in df.where("kind = 0").select("offset", "late").collect():
            stored[r["offset"]] = r["late"]

    stream = (
        spark.readStream.schema(RECORDS).option("maxFilesPerTrigger", 1).parquet(str(source / "b*"))
    )
    writer = batch_writer(judged_in_tasks(stream, 10.0, 60.0), collect, tmp_path / "checkpoint")
    query = writer.trigger(availableNow=True).start()
    query.awaitTermination(120)
    assert query.lastProgress and query.lastProgress["batchId"] == 3, "four batches"
    oracle = Feeds(allowance_s=10, horizon_s=60)
    want = {}
    for offset, (trade_id, t) in enumerate(records):
        verdict = oracle.admit("SIM:IDS/USD", trade_id, t)
        if verdict != Verdict.DUPLICATE:
            want[offset] = verdict != Verdict.KEEP
    assert stored == want
    assert sum(want.values()) > 0 and len(want) < len(records)


def test_a_price_or_size_no_table_holds_is_bad_in_the_tasks_not_folded_or_stored(
    spark, tmp_path
) -> None:
    """DECIMAL(38,18) holds 20 digits before the point and 18 after. A price of 21 digits
    failed the batch's write of ``ticks`` at every restart (the job stopped for good); a
    19th decimal was rounded one way in ``ticks``, another in ``ohlc`` and not at all live.
    Each is counted bad where it is judged, and folds into no candle; so is a trade without
    a time."""
    from streaming.queries.ticks import batch_counts, batch_summary

    base = 1_789_999_200 * 10**9
    amounts = [
        ("1.5", "1"),
        ("100000000000000000000", "1"),  # 21 digits
        ("1.0000000000000000025", "1"),  # 19 decimals
        ("2", "0.0000000000000000005"),
        ("1e+20000000", "1"),  # digits by the million, as text
        ("2.5", "99999999999999999999.999999999999999999"),  # the largest held
        ("1E2147483647", "1"),  # its digits' count less its scale wrapped in an int
        ("3", "1"),  # held, but without a time (0): a trade of no feed's clock
    ]
    rows = []
    for i, (price, size) in enumerate(amounts):
        tick = market_pb2.Tick(
            ticker="SIM:BIG/USD",
            trade_id=str(i),
            price=price,
            size=size,
            side=market_pb2.BUY,
            exchange_time_ns=base + i * 10**9 if i < 7 else 0,
        )
        rows.append((to_record(tick), 0, i, None))
    judged = judged_in_tasks(spark.createDataFrame(rows, RECORDS), 10.0, 60.0)
    assert sorted(r["offset"] for r in judged.where(f"kind = {TICK}").collect()) == [0, 5]
    (summary,) = judged.where(f"kind <> {TICK}").agg(*batch_summary()).collect()
    counts = batch_counts(summary)
    assert counts["bad"] == 6 and counts["kept"] == 2
    minute = {c["period_s"]: c for c in summary["candles"] if c is not None}[60]
    assert (minute["open"], minute["high"], minute["close"]) == ("1.5", "2.5", "2.5")
    assert Decimal(minute["volume"]) == Decimal("100000000000000000000.999999999999999999")
    assert minute["trade_count"] == 2  # a volume no table holds: see the next test


def test_a_candle_whose_volume_no_table_holds_is_left_out_and_counted_not_the_batch() -> None:
    """Every trade fits DECIMAL(38,18), yet a candle's volume is their sum: past 20 digits a
    null reached the MERGE, which failed, and so did the job at every restart. One that a
    commit before stored is deleted from ``ohlc``, where it stayed as it was then."""
    from types import SimpleNamespace

    import pyarrow as pa

    from streaming.metrics import Laps, StreamMetrics
    from streaming.queries.ticks import CANDLES, TicksQuery

    written: list[pa.Table] = []
    deleted: list[tuple[str, int, int]] = []
    tables = SimpleNamespace(
        upsert_ohlc=lambda rows, _view, lap: written.append(rows), delete_ohlc=deleted.extend
    )
    query = TicksQuery.__new__(TicksQuery)
    query.ctx = SimpleNamespace(tables=tables, metrics=StreamMetrics())  # type: ignore[assignment]
    query.merged, query.merged_since_ms, query.unstorable = set(), None, set()

    def candle(ticker: str, volume: str) -> dict:
        prices = dict.fromkeys(("open", "high", "low", "close"), "1.5")
        return dict(ticker=ticker, period_s=60, open_ms=60_000, **prices, volume=volume,
                    trade_count=2, closed=False, first_trade_ns=1, last_trade_ns=2, revision=0)  # fmt: skip

    sums = pa.Table.from_pylist(
        [candle("A:X/Y", "3"), candle("B:X/Y", "120000000000000000000"), candle("C:X/Y", "1e30")],
        CANDLES,
    )
    query._merge_candles(sums, Laps())
    ((rows,),) = [written]
    assert rows.column("ticker").to_pylist() == ["A:X/Y"]
    assert rows.column("volume").to_pylist() == [Decimal(3)]
    assert query.ctx.metrics.unstorable._value.get() == 2
    assert query.merged == {"A:X/Y"}
    # Stored by a commit before, as it was then: out of ``ohlc`` too (it stayed, stale), and
    # once, not at each batch that changes it again.
    assert sorted(deleted) == [("B:X/Y", 60, 60_000), ("C:X/Y", 60, 60_000)]
    query._merge_candles(sums, Laps())
    assert len(deleted) == 2
