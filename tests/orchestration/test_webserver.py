"""A backfill launched through the webserver's GraphQL endpoint, as the UI launches it, run
by the daemon against the live pipeline."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from candlewire.config import Settings
from candlewire.lake import NAMESPACE, catalog
from launcher.dagster_home import ADD_PARTITION, LAUNCH, REPO, STATUS, graphql
from launcher.stack import Stack, dagster_services


@pytest.fixture
def dagster(platform_env: Settings) -> Iterator[Settings]:
    stack = Stack(platform_env, dagster_services(platform_env))
    stack.up(lambda _: None)
    yield platform_env
    stack.down(lambda _: None)


def test_backfill_launched_through_graphql_completes(dagster: Settings) -> None:
    tickers, days = ["SIM:BTC/USDT", "SIM:SOL/USDT"], ["2025-04-01", "2025-04-02"]
    for ticker in tickers:
        added = graphql(dagster, ADD_PARTITION, {"repo": REPO, "name": "tickers", "key": ticker})
        assert added["addDynamicPartition"]["__typename"] in (
            "AddDynamicPartitionSuccess",
            "DuplicateDynamicPartitionError",
        ), added
    params = {
        "assetSelection": [{"path": ["ohlc_history"]}],
        "partitionNames": [f"{d}|{t}" for d in days for t in tickers],
        "fromFailure": False,
    }
    launched = graphql(dagster, LAUNCH, {"params": params})["launchPartitionBackfill"]
    assert launched["__typename"] == "LaunchBackfillSuccess", launched
    deadline = time.monotonic() + 300
    while True:
        state = graphql(dagster, STATUS, {"id": launched["backfillId"]})["partitionBackfillOrError"]
        if state["status"] not in ("REQUESTED", "CANCELING", "FAILING"):
            break
        assert time.monotonic() < deadline, state
        time.sleep(2)
    assert state["status"] in ("COMPLETED", "COMPLETED_SUCCESS"), state
    assert state["numPartitions"] == 4
    # BackfillPolicy.multi_run: one run per ticker, covering its range of days.
    assert [r["status"] for r in state["runs"]] == ["SUCCESS"] * len(tickers)
    ohlc = catalog(dagster).load_table(f"{NAMESPACE}.ohlc")
    rows = ohlc.scan(
        row_filter="period_s = 60 and open_time >= '2025-04-01T00:00:00+00:00' "
        "and open_time < '2025-04-03T00:00:00+00:00' "
        "and ticker in ('SIM:BTC/USDT', 'SIM:SOL/USDT')"
    ).to_arrow()
    assert rows.num_rows == 4 * 1440
