"""The assets against the live local pipeline: relay, SIM ingestor, Spark job, Iceberg."""

from __future__ import annotations

import threading
import time
import urllib.request
import uuid
from datetime import UTC, datetime

import dagster as dg
from confluent_kafka import Producer

from candlewire import Client
from candlewire.kafka import GAPS, TICKS, ensure_topics, producer_config
from candlewire.lake import NAMESPACE, TABLES, catalog
from orchestration.defs.assets.history import day_is_complete, no_duplicate_candles, ohlc_history
from orchestration.defs.assets.metadata import symbol_metadata
from orchestration.defs.resources import CandlewireResource
from proto import market_pb2
from proto.envelope import to_record
from tests.support import wait_for

HISTORY_DAY = 1_740_787_200_000  # 2025-03-01
DAY_MS = 86_400_000
CHECKS = [ohlc_history, day_is_complete, no_duplicate_candles]


def materialize_history(ticker: str, day: str, **kw) -> dg.ExecuteInProcessResult:
    with dg.instance_for_test() as instance:
        instance.add_dynamic_partitions("tickers", [ticker])
        return dg.materialize(
            CHECKS,
            partition_key=dg.MultiPartitionKey({"day": day, "ticker": ticker}),
            instance=instance,
            resources={"candlewire": CandlewireResource(history_timeout_s=180)},
            **kw,
        )


def test_a_partition_materializes_end_to_end_with_its_checks(platform_env) -> None:
    result = materialize_history("SIM:ETH/USDT", "2025-03-01")
    assert result.success
    (mat,) = result.asset_materializations_for_node("ohlc_history")
    meta = {k: v.value for k, v in mat.metadata.items()}
    assert meta["rows"] == 1440
    assert meta["start"].startswith("2025-03-01T00:00") and meta["end"].startswith("2025-03-02")
    assert int(meta["iceberg_snapshot_id"]) > 0 and meta["duration_s"] > 0
    checks = {e.check_name: e.passed for e in result.get_asset_check_evaluations()}
    assert checks == {"day_is_complete": True, "no_duplicate_candles": True}


def test_an_error_notification_fails_the_partition_with_its_reason(platform_env) -> None:
    result = materialize_history("SIM:NOPE/USDT", "2025-03-01", raise_on_error=False)
    assert not result.success
    failure = next(e for e in result.all_events if e.event_type_value == "STEP_FAILURE")
    assert "does not list SIM:NOPE/USDT" in failure.step_failure_data.error.message


def test_missing_minutes_are_listed() -> None:
    from orchestration.defs.assets.history import Want, missing_minutes

    want = Want.of("2025-03-01|SIM:BTC/USDT")
    minutes = [want.start_ms + i * 60_000 for i in range(1440) if i not in (0, 61)]
    assert missing_minutes(want, minutes) == "2 of 1440 minutes missing: 00:00, 01:01"


def test_a_missing_minute_is_healed_by_the_sensor_and_the_check_then_passes(platform_env) -> None:
    from orchestration.definitions import defs as load
    from orchestration.defs.healing import heal_incomplete_days

    ticker, day = "SIM:BTC/USDT", "2025-02-14"
    start = 1_739_491_200_000  # 2025-02-14
    lost = start + 5 * 60_000  # 00:05 never fetched, as after an outage
    with Client(platform_env) as client:
        for a, b in ((start, lost), (lost + 60_000, start + DAY_MS)):
            client.request_history(ticker, 60, a, b, timeout=180)
    defs = load()
    key = dg.MultiPartitionKey({"day": day, "ticker": ticker})
    with (
        dg.instance_for_test() as instance,
        dg.partition_loading_context(dynamic_partitions_store=instance),
    ):
        instance.add_dynamic_partitions("tickers", [ticker])
        # The check alone, as the UI runs it: a partition given by tags (materialize's
        # partition_key needs a selected asset to find the partitions definition by).
        checked = dg.materialize(
            CHECKS,
            selection=dg.AssetSelection.checks(day_is_complete),
            tags={"dagster/partition": key},
            instance=instance,
            resources={"candlewire": CandlewireResource()},
        )
        (failed,) = checked.get_asset_check_evaluations()
        assert not failed.passed
        assert failed.metadata["missing_ranges"].value == {key: [[lost, lost + 60_000]]}

        tick = heal_incomplete_days.evaluate_tick(
            dg.build_sensor_context(instance=instance, definitions=defs)
        )
        (request,) = tick.run_requests
        assert request.tags["candlewire/heal_ranges"] == "00:05"
        healed = defs.resolve_job_def("heal_missing_minutes").execute_in_process(
            run_config=request.run_config,
            partition_key=request.partition_key,
            tags=request.tags,
            instance=instance,
        )
        assert healed.success
        (mat,) = healed.asset_materializations_for_node("ohlc_history")
        assert mat.metadata["healed_ranges"].value == [[lost, lost + 60_000]]
        assert mat.metadata["healed_rows"].value == 1
        checks = {e.check_name: e.passed for e in healed.get_asset_check_evaluations()}
        assert checks == {"day_is_complete": True, "no_duplicate_candles": True}
        again = heal_incomplete_days.evaluate_tick(
            dg.build_sensor_context(instance=instance, cursor=tick.cursor, definitions=defs)
        )
        assert not again.run_requests
        latest = instance.get_latest_asset_check_evaluation_record(day_is_complete.check_key)
        assert latest.partition == key and latest.status.value == "SUCCEEDED"


def gap(gap_id: str, status: int, **kw) -> market_pb2.Gap:
    return market_pb2.Gap(
        gap_id=gap_id,
        ticker="TEST:GAP/USDT",
        cause=market_pb2.GapCause.Value(gap_id.split("|")[1]),
        from_ns=1_740_787_200_000_000_123,
        to_ns=1_740_787_260_000_000_456,
        from_trade_id="10",
        to_trade_id="14",
        status=status,
        detected_ms=1_740_787_300_000,
        ingestor_id="test",
        **kw,
    )


def test_gaps_asset_writes_the_latest_state_of_each_gap(platform_env) -> None:
    from orchestration.defs.assets.gaps import gaps

    ensure_topics(platform_env)
    run = uuid.uuid4().hex[:8]
    one, two = f"TEST:GAP/USDT|TRADE_ID_JUMP|{run}1", f"TEST:GAP/USDT|RECONNECT|{run}2"
    producer = Producer(producer_config(platform_env))
    for record in (
        gap(one, market_pb2.GAP_OPEN),
        gap(two, market_pb2.GAP_OPEN),
        gap(one, market_pb2.GAP_OPEN, reason="refetching"),
        gap(one, market_pb2.GAP_REPAIRED, repaired_ms=1_740_787_400_000, refetched=3),
    ):
        producer.produce(GAPS.name, key=record.gap_id.encode(), value=to_record(record))
    assert producer.flush(30) == 0

    def run_asset() -> dict:
        with dg.instance_for_test() as instance:
            result = dg.materialize(
                [gaps], instance=instance, resources={"candlewire": CandlewireResource()}
            )
        (mat,) = result.asset_materializations_for_node("gaps")
        return {k: v.value for k, v in mat.metadata.items()}

    meta = run_asset()
    assert meta["open"] >= 1 and meta["repaired"] >= 1 and meta["dagster/row_count"] >= 2
    table = catalog(platform_env).load_table(f"{NAMESPACE}.gaps")
    mine = table.scan(row_filter=f"gap_id in ('{one}', '{two}')").to_arrow().to_pylist()
    got = {r["gap_id"]: r for r in mine}
    assert len(mine) == 2 and set(got) == {one, two}, "one row a gap"
    assert got[one]["status"] == "GAP_REPAIRED" and got[one]["refetched"] == 3
    assert got[one]["reason"] is None  # the latest record's, not the one before
    assert got[one]["from_ns"] == 1_740_787_200_000_000_123
    assert got[one]["repaired_time"] == datetime(2025, 3, 1, 0, 3, 20, tzinfo=UTC)
    assert got[two]["status"] == "GAP_OPEN" and got[two]["cause"] == "RECONNECT"
    assert got[two]["repaired_time"] is None
    assert run_asset()["changed"] is False, "an unchanged topic writes no new snapshot"


def test_symbol_metadata_refresh_reports_counts_and_feeds_ticker_partitions(platform_env) -> None:
    with dg.instance_for_test() as instance:
        result = dg.materialize(
            [symbol_metadata],
            partition_key="SIM",
            instance=instance,
            resources={"candlewire": CandlewireResource(history_timeout_s=120)},
        )
        tickers = set(instance.get_dynamic_partitions("tickers"))
    assert result.success
    (mat,) = result.asset_materializations_for_node("symbol_metadata")
    meta = {k: v.value for k, v in mat.metadata.items()}
    assert meta["symbols"] == 3 and {"added", "removed", "changed"} <= set(meta)
    assert tickers == {"SIM:BTC/USDT", "SIM:ETH/USDT", "SIM:SOL/USDT"}
    assert sorted(meta["new_ticker_partitions"]) == sorted(tickers)


def test_only_tickers_the_platform_can_name_become_ticker_partitions(platform_env) -> None:
    """A venue lists symbols no ticker names (lower case, other scripts): they stay in
    ``symbol_metadata`` as listed, but a partition of one would fail at every run."""
    from datetime import UTC, datetime

    import pyarrow as pa

    from candlewire.lake import load_table
    from orchestration.defs.assets.metadata import listed_tickers

    exchange = f"ODD{uuid.uuid4().hex[:6].upper()}"
    table = load_table(platform_env, "symbol_metadata")
    now = datetime.now(UTC)
    rows = [
        {"ticker": f"{exchange}:{base}/USDT", "exchange": exchange, "base": base,
         "quote": "USDT", "status": "TRADING", "update_time": now}
        for base in ("BTC", "USDe")
    ]  # fmt: skip
    table.append(pa.Table.from_pylist(rows, schema=table.schema().as_arrow()))
    assert listed_tickers(CandlewireResource(), exchange) == [f"{exchange}:BTC/USDT"]


def tick(ticker: str, i: int) -> bytes:
    return to_record(
        market_pb2.Tick(
            ticker=ticker,
            trade_id=str(i),
            price="100.5",
            size="0.25",
            side=market_pb2.BUY,
            exchange_time_ns=time.time_ns(),
        )
    )


def _rows(settings, table: str, row_filter: str) -> list[tuple]:
    t = catalog(settings).load_table(f"{NAMESPACE}.{table}")
    return sorted(tuple(r.values()) for r in t.scan(row_filter=row_filter).to_arrow().to_pylist())


def test_compaction_while_streaming_loses_and_duplicates_nothing(platform_env) -> None:
    settings = platform_env
    live = "TEST:CMP/USDT"
    stop = threading.Event()
    sent: list[int] = []

    def produce() -> None:  # live ticks all along: appends to ticks, MERGEs into ohlc
        producer = Producer(producer_config(settings))
        while not stop.is_set():
            producer.produce(TICKS.name, key=live.encode(), value=tick(live, len(sent)))
            producer.poll(0)
            sent.append(len(sent))
            time.sleep(0.02)
        assert producer.flush(30) == 0

    # A quiet ticker written in five separate micro-batches: five small files to compact.
    quiet = "TEST:QUIET/USDT"
    ticks_table = catalog(settings).load_table(f"{NAMESPACE}.ticks")

    def files_of(ticker: str) -> int:
        ticks_table.refresh()
        return len(list(ticks_table.scan(row_filter=f"ticker = '{ticker}'").plan_files()))

    producer = Producer(producer_config(settings))
    for burst in range(5):
        for i in range(burst * 20, burst * 20 + 20):
            producer.produce(TICKS.name, key=quiet.encode(), value=tick(quiet, i))
        assert producer.flush(30) == 0
        wait_for(lambda n=burst: files_of(quiet) > n, timeout=60, interval=0.5)
    assert files_of(quiet) >= 5

    # Rows that exist now and that nothing rewrites but compaction: ticks are append-only
    # (the job may still be catching up on older tests' ticks, which land later), and the
    # history partition of the test above is not touched by streaming.
    with Client(settings) as client:
        client.request_history("SIM:ETH/USDT", 60, HISTORY_DAY, HISTORY_DAY + DAY_MS, timeout=180)
    cut = datetime.now(UTC).isoformat()
    old_ticks = f"ingest_time <= '{cut}'"
    history = "ticker = 'SIM:ETH/USDT' and period_s = 60"  # 2025-03-01, fetched above
    ticks_before = _rows(settings, "ticks", old_ticks)
    ohlc_before = _rows(settings, "ohlc", history)
    assert len(ohlc_before) >= 1440
    worker = threading.Thread(target=produce)
    worker.start()
    try:
        time.sleep(3.0)
        from orchestration.definitions import defs

        job = defs().resolve_job_def("iceberg_maintenance")
        with dg.instance_for_test() as instance:
            result = job.execute_in_process(instance=instance)
        time.sleep(2.0)
    finally:
        stop.set()
        worker.join()
    assert result.success
    stats = {
        e.event_specific_data.asset_observation.asset_key.path[
            -1
        ]: e.event_specific_data.asset_observation.metadata
        for e in result.all_events
        if e.event_type_value == "ASSET_OBSERVATION"
    }
    assert set(stats) == set(TABLES)  # every platform table, the books' too
    assert {"files_before", "files_after", "bytes_before", "bytes_after"} <= set(stats["ticks"])
    assert files_of(quiet) == 1, "the quiet ticker's small files were not compacted"

    # Every live tick landed exactly once; the rest of both tables is unchanged.
    table = catalog(settings).load_table(f"{NAMESPACE}.ticks")

    def all_live() -> list[str]:
        table.refresh()
        ids = table.scan(row_filter=f"ticker = '{live}'").to_arrow()["trade_id"].to_pylist()
        return ids if len(ids) >= len(sent) else []

    ids = wait_for(all_live, timeout=120, interval=1.0)
    assert sorted(map(int, ids)) == sent, "live ticks lost or duplicated across the compaction"
    assert _rows(settings, "ticks", old_ticks) == ticks_before
    assert _rows(settings, "ohlc", history) == ohlc_before
    url = settings.metrics_url("stream_metrics")
    assert "candlewire_stream_up 1.0" in urllib.request.urlopen(url, timeout=5).read().decode()
