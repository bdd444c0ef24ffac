"""``ohlc_history``: one day of one ticker's 1-minute candles per partition, fetched the way a
user would, through the relay, and checked in Iceberg afterwards.

Partitions are day by ticker. Tickers are a dynamic set that ``symbol_metadata`` fills from
the exchanges' markets. Dagster advises keeping an asset under about 100,000 partitions:
days since ``CANDLEWIRE_HISTORY_START`` times tickers stays far below that for a few hundred
tickers over a few years. Backfills run as a few runs: Dagster cuts a multi-partitioned
backfill into one range of days per ticker, each run covering up to ``PARTITIONS_PER_RUN``
days. Every run submits its requests together (up to ``max_in_flight`` at once) and the
pipeline fetches them in parallel.

A run can also fetch only some minute ranges of one partition (``HistoryConfig.ranges``):
``heal_missing_minutes`` runs (``orchestration/defs/healing.py``) do, to refetch what
``day_is_complete`` found missing, and the checks then judge the repaired day.

The client and pyarrow are imported where they are used: the code server only lists
definitions; a run imports them when it runs (#36).
"""

import os
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, date, datetime
from typing import TYPE_CHECKING

import dagster as dg

from candlewire.errors import CandlewireError
from orchestration.defs.assets.lineage import iceberg_key
from orchestration.defs.resources import CandlewireResource
from proto import requests_pb2 as rq
from proto.envelope import Names

# For annotations only, quoted where used. Not ``from __future__ import annotations``: Dagster
# checks an asset's or op's ``context`` annotation as a class, and a string fails that check.
if TYPE_CHECKING:
    from candlewire.client import Client

HISTORY_STATUSES = Names.of(rq.HistoryStatus)
PERIOD_S = 60
DAY_MS = 86_400_000
PARTITIONS_PER_RUN = 100
HISTORY_START = os.environ.get("CANDLEWIRE_HISTORY_START", "2025-01-01")

TICKERS = dg.DynamicPartitionsDefinition(name="tickers")
DAYS = dg.DailyPartitionsDefinition(start_date=HISTORY_START, timezone="UTC")
PARTITIONS = dg.MultiPartitionsDefinition({"day": DAYS, "ticker": TICKERS})


@dataclass(frozen=True)
class Want:
    """One partition as a history request: a ticker's 1-minute candles for one UTC day."""

    key: str
    ticker: str
    start_ms: int
    end_ms: int

    @classmethod
    def of(cls, key: str) -> "Want":
        dims = PARTITIONS.get_partition_key_from_str(key).keys_by_dimension
        day = datetime.combine(date.fromisoformat(dims["day"]), datetime.min.time(), UTC)
        start = int(day.timestamp() * 1000)
        return cls(key, dims["ticker"], start, start + DAY_MS)


class MinuteRange(dg.Config):
    """``[start_ms, end_ms)`` in epoch milliseconds, whole minutes."""

    start_ms: int
    end_ms: int


class HistoryConfig(dg.Config):
    ranges: list[MinuteRange] = []
    """Fetch only these ranges of the run's one partition instead of its whole day: a heal
    (one history request a range). Empty, the default: whole days."""


def range_wants(wants: list[Want], ranges: list[MinuteRange]) -> list[Want]:
    """One request a range, each inside the run's single partition: a heal run repairs one
    day of one ticker, so ranges are meaningless across partitions."""
    if len(wants) != 1:
        raise dg.Failure(f"ranges given for {len(wants)} partitions; a heal run has one")
    (day,) = wants
    out = []
    for r in ranges:
        if not day.start_ms <= r.start_ms < r.end_ms <= day.end_ms:
            raise dg.Failure(f"range {r.start_ms}-{r.end_ms} is not inside {day.key}")
        out.append(Want(day.key, day.ticker, r.start_ms, r.end_ms))
    return out


def hhmm(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, UTC).strftime("%H:%M")


def describe_ranges(ranges: list[tuple[int, int]]) -> str:
    """``00:05-00:06, 13:00``: each range's first and last minute, for people to read."""
    step = PERIOD_S * 1000
    return ", ".join(hhmm(s) if e - s == step else f"{hhmm(s)}-{hhmm(e - step)}" for s, e in ranges)


@dataclass
class Outcome:
    ok: list[tuple[Want, rq.HistoryReadyNotification, float]] = field(default_factory=list)
    failed: list[tuple[Want, str]] = field(default_factory=list)


def fetch(
    client: "Client",
    wants: list[Want],
    max_in_flight: int,
    timeout: float,
    progress: Callable[[str], object],
) -> Outcome:
    """Submit every partition's request, keeping at most ``max_in_flight`` unanswered."""
    out = Outcome()
    flight: deque[tuple[Want, str, float]] = deque()
    todo = deque(wants)
    deadline = time.monotonic() + timeout
    while todo or flight:
        while todo and len(flight) < max_in_flight:
            want = todo.popleft()
            try:
                ack = client.submit(want.ticker, PERIOD_S, want.start_ms, want.end_ms)
                flight.append((want, ack.request_id, time.monotonic()))
            except CandlewireError as exc:
                out.failed.append((want, str(exc)))
        if not flight:
            continue
        want, request_id, t0 = flight.popleft()
        try:
            note = client.wait_ready(request_id, max(1.0, deadline - time.monotonic()))
        except CandlewireError as exc:
            out.failed.append((want, str(exc)))
            continue
        if note.status == rq.HISTORY_OK:
            out.ok.append((want, note, time.monotonic() - t0))
        else:
            out.failed.append((want, note.error_message or HISTORY_STATUSES[note.status]))
        done = len(out.ok) + len(out.failed)
        progress(f"{done}/{len(wants)} partitions answered ({len(out.failed)} failed)")
    return out


@dg.asset(
    partitions_def=PARTITIONS,
    backfill_policy=dg.BackfillPolicy.multi_run(max_partitions_per_run=PARTITIONS_PER_RUN),
    deps=[
        iceberg_key("ohlc"),
        # Tickers come from every exchange's refresh, not from one matching partition.
        dg.AssetDep("symbol_metadata", partition_mapping=dg.AllPartitionMapping()),
    ],
    kinds={"iceberg"},
    group_name="history",
)
def ohlc_history(
    context: dg.AssetExecutionContext, config: HistoryConfig, candlewire: CandlewireResource
) -> None:
    """1-minute candles of one ticker for one UTC day, requested through the relay.

    An ERROR HistoryReady (unknown symbol, a range the exchange does not hold, exchange
    failures) fails the run with each partition's reason. A heal (``config.ranges``) fetches
    only those ranges and fails nothing: it materializes whatever it got, and the checks,
    which run next, say what is still missing (which the healing sensor counts as a failed
    attempt, so a range the venue cannot serve is given up rather than retried forever).
    """
    wants = [Want.of(k) for k in context.partition_keys]
    healing = bool(config.ranges)
    if healing:
        wants = range_wants(wants, config.ranges)
    context.log.info(f"requesting {len(wants)} {'ranges' if healing else 'partitions'}")
    with candlewire.client() as client:
        out = fetch(
            client, wants, candlewire.max_in_flight, candlewire.history_timeout_s, context.log.info
        )
    if healing:
        _heal_metadata(context, out)
        return
    for want, note, seconds in out.ok:
        context.add_asset_metadata(
            {
                "rows": int(note.row_count),
                "start": datetime.fromtimestamp(note.start_ms / 1000, UTC).isoformat(),
                "end": datetime.fromtimestamp(note.end_ms / 1000, UTC).isoformat(),
                "duration_s": round(seconds, 3),
                "iceberg_snapshot_id": str(note.snapshot_id),
                "request_id": note.request_id,
            },
            partition_key=want.key,
        )
    if out.failed:
        reasons = {w.key: reason for w, reason in out.failed}
        raise dg.Failure(
            description=f"{len(reasons)} of {len(wants)} partitions failed: "
            + "; ".join(f"{k}: {r}" for k, r in list(reasons.items())[:10]),
            metadata={"failed_partitions": dg.MetadataValue.json(reasons)},
        )


def _heal_metadata(context: dg.AssetExecutionContext, out: Outcome) -> None:
    ok = sorted((w.start_ms, w.end_ms) for w, _, _ in out.ok)
    failed = {describe_ranges([(w.start_ms, w.end_ms)]): reason for w, reason in out.failed}
    for where, reason in failed.items():
        context.log.warning(f"{context.partition_key} {where} not refetched: {reason}")
    context.add_asset_metadata(
        {
            "healed_ranges": dg.MetadataValue.json([list(r) for r in ok]),
            "healed": describe_ranges(ok),
            "healed_rows": sum(int(note.row_count) for _, note, _ in out.ok),
            "unserved": dg.MetadataValue.json(failed),
            "duration_s": round(max((s for _, _, s in out.ok), default=0.0), 3),
            "request_ids": dg.MetadataValue.json([note.request_id for _, note, _ in out.ok]),
            **({"iceberg_snapshot_id": str(out.ok[-1][1].snapshot_id)} if out.ok else {}),
        }
    )


def _minutes(candlewire: CandlewireResource, want: Want) -> list[int]:
    # Imported when a check runs, not at load: the code server only lists definitions.
    import pyarrow.compute as pc

    with candlewire.client() as client:
        table = client.history(want.ticker, PERIOD_S, want.start_ms, want.end_ms)
    times = pc.cast(table["open_time"], "int64").to_pylist()  # µs since the epoch
    return [t // 1000 for t in times]


Judge = Callable[[Want, list[int]], object]


def _check(
    context: dg.AssetCheckExecutionContext, judge: Judge, **details: Judge
) -> dg.AssetCheckResult:
    """``judge`` says what is wrong with a partition ("" if nothing); each of ``details``
    adds machine-readable metadata about the failing partitions under its name."""
    bad: dict[str, object] = {}
    extra: dict[str, dict[str, object]] = {name: {} for name in details}
    resource: CandlewireResource = context.resources.candlewire
    for key in context.partition_keys:
        want = Want.of(key)
        minutes = _minutes(resource, want)
        problem = judge(want, minutes)
        if problem:
            bad[key] = problem
            for name, detail in details.items():
                extra[name][key] = detail(want, minutes)
    return dg.AssetCheckResult(
        passed=not bad,
        metadata={
            "partitions_checked": len(context.partition_keys),
            "failing": dg.MetadataValue.json(bad),
            **{name: dg.MetadataValue.json(v) for name, v in extra.items()},
        },
    )


def _missing(want: Want, minutes: list[int]) -> list[int]:
    expected = set(range(want.start_ms, want.end_ms, PERIOD_S * 1000))
    return sorted(expected - set(minutes))


def missing_minutes(want: Want, minutes: list[int]) -> str:
    """A 24/7 market has a candle for every minute of a day; list the ones it lacks."""
    missing = _missing(want, minutes)
    if not missing:
        return ""
    shown = ", ".join(hhmm(m) for m in missing[:20])
    return f"{len(missing)} of 1440 minutes missing: {shown}{' …' if len(missing) > 20 else ''}"


def merge_minutes(missing: list[int]) -> list[tuple[int, int]]:
    """Sorted minute starts (ms) as ``[start, end)`` ranges of consecutive minutes: one
    history request a range heals them, instead of one a minute."""
    ranges: list[tuple[int, int]] = []
    step = PERIOD_S * 1000
    for m in missing:
        if ranges and ranges[-1][1] == m:
            ranges[-1] = (ranges[-1][0], m + step)
        else:
            ranges.append((m, m + step))
    return ranges


def missing_ranges(want: Want, minutes: list[int]) -> list[list[int]]:
    """What ``heal_incomplete_days`` reads from a failed ``day_is_complete``: the missing
    minutes as ``[start_ms, end_ms)`` ranges (JSON lists)."""
    return [list(r) for r in merge_minutes(_missing(want, minutes))]


def duplicate_keys(want: Want, minutes: list[int]) -> str:
    dupes = len(minutes) - len(set(minutes))
    return f"{dupes} duplicated (ticker, period, open_time) keys" if dupes else ""


@dg.asset_check(
    asset=ohlc_history, partitions_def=PARTITIONS, required_resource_keys={"candlewire"}
)
def day_is_complete(context: dg.AssetCheckExecutionContext) -> dg.AssetCheckResult:
    """Every minute of the day has its candle (SIM and crypto markets trade 24/7). A failure
    records the missing ranges by partition (``missing_ranges``), which the healing sensor
    refetches."""
    return _check(context, missing_minutes, missing_ranges=missing_ranges)


@dg.asset_check(
    asset=ohlc_history, partitions_def=PARTITIONS, required_resource_keys={"candlewire"}
)
def no_duplicate_candles(context: dg.AssetCheckExecutionContext) -> dg.AssetCheckResult:
    """Upserts keep one row per (ticker, period, open_time)."""
    return _check(context, duplicate_keys)


@dg.definitions
def history() -> dg.Definitions:
    return dg.Definitions(
        assets=[ohlc_history], asset_checks=[day_is_complete, no_duplicate_candles]
    )
