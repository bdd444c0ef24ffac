"""Wall time of a 30-day x 5-ticker backfill of 1-minute SIM candles, launched through the
webserver's GraphQL endpoint as the UI launches it, and the share spent in the pipeline
versus in Dagster (run launch, code loading, step orchestration, daemon polling).

Pipeline time is the union over runs of the intervals in which a run waited for its
HistoryReady notifications: from the materialization time back by the run's longest
request duration. Everything else in the wall time is Dagster overhead.

The last line is JSON. ``python -m bench.backfill [--days 30]``
"""

from __future__ import annotations

import argparse
import json
import os
import time
from collections import defaultdict
from datetime import date, timedelta

from bench.stack import private_stack
from launcher.dagster_home import ADD_PARTITION, LAUNCH, REPO, STATUS, dagster_home, graphql

TICKERS = ["SIM:BTC/USDT", "SIM:ETH/USDT", "SIM:SOL/USDT", "BINANCE:BTC/USDT", "BINANCE:ETH/USDT"]
FIRST_DAY = date(2025, 5, 1)


def union(intervals: list[tuple[float, float]]) -> float:
    total, end = 0.0, float("-inf")
    for a, b in sorted(intervals):
        if b > end:
            total += b - max(a, end)
            end = b
    return total


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--days", type=int, default=30)
    args = parser.parse_args()
    days = [(FIRST_DAY + timedelta(days=i)).isoformat() for i in range(args.days)]
    with private_stack() as settings:
        for ticker in TICKERS:
            graphql(settings, ADD_PARTITION, {"repo": REPO, "name": "tickers", "key": ticker})
        params = {
            "assetSelection": [{"path": ["ohlc_history"]}],
            "partitionNames": [f"{d}|{t}" for d in days for t in TICKERS],
            "fromFailure": False,
        }
        t0 = time.time()
        launched = graphql(settings, LAUNCH, {"params": params})["launchPartitionBackfill"]
        backfill_id = launched["backfillId"]
        while True:
            state = graphql(settings, STATUS, {"id": backfill_id})["partitionBackfillOrError"]
            if state["status"] not in ("REQUESTED", "CANCELING", "FAILING"):
                break
            time.sleep(1)
        wall = time.time() - t0
        print(f"backfill {state['status']} after {wall:.1f}s in {len(state['runs'])} runs")

        os.environ["DAGSTER_HOME"] = str(dagster_home(settings))
        import dagster as dg

        with dg.DagsterInstance.get() as instance:
            records = instance.fetch_materializations(
                dg.AssetKey("ohlc_history"), limit=len(params["partitionNames"]) * 2
            ).records
        per_run: dict[str, list[tuple[float, float]]] = defaultdict(list)
        for r in records:
            meta = r.asset_materialization.metadata
            per_run[r.run_id].append((r.timestamp, float(meta["duration_s"].value)))
        intervals = [
            (max(t for t, _ in mats) - max(d for _, d in mats), max(t for t, _ in mats))
            for mats in per_run.values()
        ]
        pipeline = union(intervals)
    rows = sum(len(m) for m in per_run.values()) * 1440
    print(
        f"{len(records)} partitions ({rows:,} candles): pipeline {pipeline:.1f}s "
        f"({pipeline / wall:.0%}), Dagster overhead {wall - pipeline:.1f}s ({1 - pipeline / wall:.0%})"
    )
    print(
        json.dumps(
            {
                "partitions": len(records),
                "runs": len(state["runs"]),
                "wall_s": round(wall, 1),
                "pipeline_s": round(pipeline, 1),
                "dagster_overhead_share": round(1 - pipeline / wall, 3),
            }
        )
    )


if __name__ == "__main__":
    main()
