"""When things run besides the assets' own automation conditions (``symbol_metadata``
refreshes every exchange daily): nightly table maintenance, and an opt-in sensor that
backfills history for tickers an exchange newly lists."""

import json
from datetime import UTC, datetime, timedelta

import dagster as dg

from orchestration.defs.assets.history import DAYS, TICKERS, ohlc_history
from orchestration.defs.assets.maintenance import iceberg_maintenance
from orchestration.defs.assets.metadata import symbol_metadata

NEW_TICKER_DAYS = 7  # how much history the sensor fetches for a newly listed ticker

metadata_job = dg.define_asset_job("symbol_metadata_refresh", selection=[symbol_metadata])
history_job = dg.define_asset_job("ohlc_history_backfill", selection=[ohlc_history])


daily_maintenance = dg.ScheduleDefinition(
    name="daily_maintenance",
    job=iceberg_maintenance,
    cron_schedule="30 2 * * *",
    execution_timezone="UTC",
    # On from the start, as the docs say: off, compaction and expiry never ran, and the
    # tables' small files and snapshots grew without end.
    default_status=dg.DefaultScheduleStatus.RUNNING,
)


@dg.sensor(
    job=history_job, minimum_interval_seconds=60, default_status=dg.DefaultSensorStatus.STOPPED
)
def new_ticker_history(
    context: dg.SensorEvaluationContext,
) -> dg.SkipReason | list[dg.RunRequest]:
    """Backfill the last days of every ticker that joined the partition set since last time."""
    seen = set(json.loads(context.cursor)) if context.cursor else None
    tickers = set(context.instance.get_dynamic_partitions(TICKERS.name))
    # First evaluation, or none listed yet when it came (a fresh stack, the sensor on
    # before the first refresh): remember, do not backfill every ticker the refresh lists.
    if not seen:
        context.update_cursor(json.dumps(sorted(tickers)))
        return dg.SkipReason(f"tracking {len(tickers)} known tickers")
    new = sorted(tickers - seen)
    context.update_cursor(json.dumps(sorted(tickers)))
    if not new:
        return dg.SkipReason("no new tickers")
    today = datetime.now(UTC).date()
    days = [
        d
        for d in ((today - timedelta(days=i)).isoformat() for i in range(1, NEW_TICKER_DAYS + 1))
        if d in set(DAYS.get_partition_keys())
    ]
    return [
        dg.RunRequest(
            run_key=f"new-ticker:{ticker}:{day}",
            partition_key=dg.MultiPartitionKey({"day": day, "ticker": ticker}),
        )
        for ticker in new
        for day in days
    ]


@dg.definitions
def automation() -> dg.Definitions:
    return dg.Definitions(
        jobs=[metadata_job, history_job],
        schedules=[daily_maintenance],
        sensors=[new_ticker_history],
    )
