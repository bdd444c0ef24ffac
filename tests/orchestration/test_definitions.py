"""The code location loads cleanly; schedules and the sensor ask for the right runs."""

from __future__ import annotations

import importlib
import subprocess
import sys
import warnings
from datetime import UTC, datetime, timedelta
from pathlib import Path

import dagster as dg

from candlewire.config import REPO_ROOT, Settings


def load() -> dg.Definitions:
    import orchestration.definitions

    return importlib.reload(orchestration.definitions).defs()


def test_definitions_load_with_deprecations_as_errors() -> None:
    modules = [m for m in list(sys.modules) if m.startswith("orchestration")]
    for m in modules:
        del sys.modules[m]
    with warnings.catch_warnings():
        warnings.simplefilter("error", DeprecationWarning)
        defs = load()
    keys = {s.key.to_user_string() for s in defs.resolve_all_asset_specs()}
    assert {"ohlc_history", "symbol_metadata", "gaps", "kafka/gaps", "iceberg/ohlc"} <= keys
    checks = {k.name for k in defs.resolve_asset_graph().asset_check_keys}
    assert checks == {"day_is_complete", "no_duplicate_candles"}
    assert {j.name for j in defs.resolve_all_job_defs()} >= {
        "iceberg_maintenance",
        "ohlc_history_backfill",
        "heal_missing_minutes",
        "symbol_metadata_refresh",
    }


def test_lineage_runs_ingest_kafka_streaming_iceberg_to_history() -> None:
    graph = load().resolve_asset_graph()

    def parents(key: str) -> set[str]:
        return {
            p.to_user_string() for p in graph.get(dg.AssetKey.from_user_string(key)).parent_keys
        }

    assert parents("kafka/ohlc_batches") == {"exchanges"}
    assert parents("iceberg/ohlc") == {"kafka/ticks", "kafka/ohlc_batches"}
    assert parents("ohlc_history") == {"iceberg/ohlc", "symbol_metadata"}
    assert parents("symbol_metadata") == {"iceberg/symbol_metadata"}
    assert parents("gaps") == {"kafka/gaps"} and parents("kafka/gaps") == {"exchanges"}
    assert graph.get(dg.AssetKey("gaps")).kinds == {"iceberg"}
    spec = graph.get(dg.AssetKey(["kafka", "ticks"]))
    assert "kafka" in spec.kinds


def test_dg_check_defs_passes() -> None:
    dg_bin = Path(sys.executable).with_name("dg")
    out = subprocess.run(
        [str(dg_bin), "check", "defs"], cwd=REPO_ROOT, capture_output=True, text=True, timeout=300
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert "All definitions loaded successfully" in out.stdout + out.stderr


def test_metadata_refreshes_daily_and_gaps_every_5_minutes_by_automation_condition() -> None:
    defs = load()
    metadata, gaps = dg.AssetKey("symbol_metadata"), dg.AssetKey("gaps")
    with dg.instance_for_test() as instance:
        before = dg.evaluate_automation_conditions(
            defs, instance, evaluation_time=datetime(2026, 3, 1, 0, 59, tzinfo=UTC)
        )
        assert before.total_requested == 0
        tick = dg.evaluate_automation_conditions(
            defs,
            instance,
            evaluation_time=datetime(2026, 3, 1, 1, 1, tzinfo=UTC),
            cursor=before.cursor,
        )
        assert tick.get_requested_partitions(metadata) == {"SIM", "BINANCE"}
        assert tick.get_num_requested(gaps) == 1 and tick.total_requested == 3
        later = dg.evaluate_automation_conditions(
            defs,
            instance,
            evaluation_time=datetime(2026, 3, 1, 1, 3, tzinfo=UTC),
            cursor=tick.cursor,
        )
        assert later.total_requested == 0, "once per cron tick"
        next_tick = dg.evaluate_automation_conditions(
            defs,
            instance,
            evaluation_time=datetime(2026, 3, 1, 1, 6, tzinfo=UTC),
            cursor=later.cursor,
        )
        assert next_tick.get_num_requested(gaps) == 1 and next_tick.total_requested == 1
    assert defs.resolve_schedule_def("daily_maintenance").cron_schedule == "30 2 * * *"


def test_healing_sensor_is_on_by_default_and_targets_the_heal_job() -> None:
    sensor = load().resolve_sensor_def("heal_incomplete_days")
    assert sensor.default_status == dg.DefaultSensorStatus.RUNNING
    assert sensor.job_name == "heal_missing_minutes"


def test_new_ticker_sensor_backfills_only_new_tickers_and_is_off_by_default() -> None:
    defs = load()
    sensor = defs.resolve_sensor_def("new_ticker_history")
    assert sensor.default_status == dg.DefaultSensorStatus.STOPPED
    with (
        dg.instance_for_test() as instance,
        # The daemon evaluates sensors inside such a context; validating a dynamic partition
        # key needs the instance that stores the partitions.
        dg.partition_loading_context(dynamic_partitions_store=instance),
    ):
        instance.add_dynamic_partitions("tickers", ["SIM:BTC/USDT"])
        ctx = dg.build_sensor_context(instance=instance, definitions=defs)
        first = sensor.evaluate_tick(ctx)
        assert not first.run_requests and first.cursor
        instance.add_dynamic_partitions("tickers", ["SIM:NEW/USDT"])
        second = sensor.evaluate_tick(
            dg.build_sensor_context(instance=instance, cursor=first.cursor, definitions=defs)
        )
        keys = [r.partition_key for r in second.run_requests]
        yesterday = (datetime.now(UTC).date() - timedelta(days=1)).isoformat()
        assert len(keys) == 7 and all(k.keys_by_dimension["ticker"] == "SIM:NEW/USDT" for k in keys)
        assert yesterday in {k.keys_by_dimension["day"] for k in keys}
        third = sensor.evaluate_tick(
            dg.build_sensor_context(instance=instance, cursor=second.cursor, definitions=defs)
        )
        assert not third.run_requests


def test_new_ticker_sensor_on_before_the_first_refresh_backfills_no_exchange_whole() -> None:
    """Turned on in a fresh stack, it remembered no tickers; the first refresh then listed
    the exchange, and every ticker counted as new: seven runs each, thousands."""
    defs = load()
    sensor = defs.resolve_sensor_def("new_ticker_history")
    with (
        dg.instance_for_test() as instance,
        dg.partition_loading_context(dynamic_partitions_store=instance),
    ):
        empty = sensor.evaluate_tick(dg.build_sensor_context(instance=instance, definitions=defs))
        instance.add_dynamic_partitions("tickers", [f"SIM:T{i}/USDT" for i in range(50)])
        listed = sensor.evaluate_tick(
            dg.build_sensor_context(instance=instance, cursor=empty.cursor, definitions=defs)
        )
        assert not listed.run_requests
        instance.add_dynamic_partitions("tickers", ["SIM:NEW/USDT"])
        new = sensor.evaluate_tick(
            dg.build_sensor_context(instance=instance, cursor=listed.cursor, definitions=defs)
        )
        assert {r.partition_key.keys_by_dimension["ticker"] for r in new.run_requests} == {
            "SIM:NEW/USDT"
        }


def test_nightly_maintenance_runs_without_being_turned_on() -> None:
    """Off by default, as Dagster makes a schedule, compaction and expiry never ran: the
    tables' small files and snapshots grew until someone found the switch."""
    from orchestration.definitions import defs

    schedule = defs().resolve_schedule_def("daily_maintenance")
    assert schedule.default_status == dg.DefaultScheduleStatus.RUNNING


def test_every_maintenance_step_runs_and_every_failure_is_told(monkeypatch) -> None:
    """A compaction that fails kept expiry and orphan removal from running, every night; and
    of two tables that failed, only the first was told. Spark's calls stood in for."""
    import candlewire.spark
    from orchestration.defs.assets.maintenance import maintain_all

    class Row:
        files, bytes, records = 3, 300, 30

    class Spark:
        def sql(self, query: str):
            return type("Result", (), {"collect": lambda _self: [Row()]})()

    called: list[tuple[str, str]] = []

    def commit_sql(spark, sql: str) -> None:
        table = sql.split("table => '")[1].split("'")[0].rsplit(".", 1)[-1]
        step = sql.split(".system.")[1].split("(")[0]
        called.append((table, step))
        if step == "rewrite_data_files" and table in ("ticks", "ohlc"):
            raise RuntimeError(f"{table} lost its files")

    monkeypatch.setattr(candlewire.spark, "commit_sql", commit_sql)
    reported: list[str] = []
    failures = maintain_all(
        Spark(), Settings(), ["ticks", "ohlc", "symbol_metadata"], lambda t, _: reported.append(t)
    )
    steps = ["rewrite_data_files", "rewrite_manifests", "expire_snapshots", "remove_orphan_files"]
    for table in ("ticks", "ohlc", "symbol_metadata"):
        assert [s for t, s in called if t == table] == steps
    assert sorted(reported) == ["ohlc", "symbol_metadata", "ticks"]
    assert sorted(failures) == [
        "ohlc rewrite_data_files: RuntimeError: ohlc lost its files",
        "ticks rewrite_data_files: RuntimeError: ticks lost its files",
    ]
