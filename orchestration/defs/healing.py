"""Self-healing history (#37): a failed ``day_is_complete`` refetches exactly what it found
missing, and the check judges the day again.

``heal_incomplete_days`` reads ``day_is_complete``'s evaluations from the instance's event
log (each failed one lists the partitions' missing minutes as ranges, ``missing_ranges``)
and launches one ``heal_missing_minutes`` run per failing partition. Such a run materializes
that ``ohlc_history`` partition with ``HistoryConfig.ranges``, one history request a range
through the relay's work queue, then runs the asset's checks, whose results are ordinary
evaluations of them. A range still missing after the heal fails the check again, and the
sensor tries once more; after ``MAX_ATTEMPTS`` tries of a range it gives up on it and says
so in the tick's log: the venue does not serve that range, and asking again would not help.

The cursor holds what the sensor has read (``HealCursor``) and the attempts per range, which
a later passing evaluation of the partition clears.
"""

import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import dagster as dg

from orchestration.defs.assets.history import (
    TICKERS,
    HistoryConfig,
    MinuteRange,
    day_is_complete,
    describe_ranges,
    ohlc_history,
)

# Not public in ``dagster``; for annotations only (quoted where used).
if TYPE_CHECKING:
    from dagster._core.storage.asset_check_execution_record import AssetCheckExecutionRecord

MAX_ATTEMPTS = 2  # heals of one range before the sensor gives up on it
PAGE = 100  # check executions read per query
LOOKBACK = 1000  # at most this many executions read a tick (the first tick reads no more)
CHECK_KEY = day_is_complete.check_key

Range = tuple[int, int]

heal_job = dg.define_asset_job(
    "heal_missing_minutes",
    # The asset's checks come with it: they judge the day after the repair.
    selection=dg.AssetSelection.assets(ohlc_history),
    description="Refetch the missing minutes of one ohlc_history partition, then check it.",
)


def _range_key(r: Range) -> str:
    return f"{r[0]}-{r[1]}"


@dataclass
class HealCursor:
    """What the sensor remembers between ticks.

    ``after``: every check execution with an id up to it has been read. Ids are given when
    a run plans the check, so an execution still running holds ``after`` below it, and the
    finished ones above it are listed in ``handled``. ``attempts``: heals launched per
    partition and range (``start-end``)."""

    after: int = 0
    handled: list[int] = field(default_factory=list)
    attempts: dict[str, dict[str, int]] = field(default_factory=dict)

    @classmethod
    def load(cls, raw: str | None) -> "HealCursor":
        return cls(**json.loads(raw)) if raw else cls()

    def dump(self) -> str:
        return json.dumps(
            {"after": self.after, "handled": self.handled, "attempts": self.attempts},
            sort_keys=True,
        )


@dataclass
class Plan:
    heal: dict[str, list[Range]] = field(default_factory=dict)
    """Ranges to refetch now, by partition."""
    given_up: dict[str, list[Range]] = field(default_factory=dict)
    """Ranges tried ``MAX_ATTEMPTS`` times already, by partition."""


def plan_heals(
    failing: dict[str, list[Range]],
    attempts: dict[str, dict[str, int]],
    max_attempts: int = MAX_ATTEMPTS,
) -> Plan:
    """Which of ``failing``'s ranges to heal, counting the attempt in ``attempts``, and which
    to give up on. A range that comes back smaller is a new range with its own attempts: the
    venue served part of it, so trying again makes progress."""
    plan = Plan()
    for partition, ranges in failing.items():
        tried = attempts.setdefault(partition, {})
        for r in ranges:
            n = tried.get(_range_key(r), 0)
            if n >= max_attempts:
                plan.given_up.setdefault(partition, []).append(r)
            else:
                tried[_range_key(r)] = n + 1
                plan.heal.setdefault(partition, []).append(r)
    return plan


def _new_executions(
    instance: dg.DagsterInstance, after: int, skip: Iterable[int] = ()
) -> tuple[list["AssetCheckExecutionRecord"], bool]:
    """``day_is_complete``'s executions with an id above ``after`` and not in ``skip``,
    oldest first, at most about ``LOOKBACK``; and whether they are all of them. Read newest
    first: when there are more, the oldest are left for the next tick."""
    out, skipped = [], set(skip)
    before: int | None = None
    while True:
        page = instance.event_log_storage.get_asset_check_execution_history(
            CHECK_KEY, limit=PAGE, cursor=before
        )
        out.extend(r for r in page if r.id > after and r.id not in skipped)
        if len(page) < PAGE or page[-1].id <= after:
            return out[::-1], True
        if len(out) >= LOOKBACK:
            return out[::-1], False
        before = page[-1].id


def _running(instance: dg.DagsterInstance, records: list["AssetCheckExecutionRecord"]) -> set[int]:
    """Ids of executions planned whose run is not finished: their result is still to come.
    A run over a range of partitions plans one execution per partition but records one
    result for them all, so its per-partition plans stay planned after the run; they are
    settled then."""
    finished: dict[str, bool] = {}
    for run_id in {r.run_id for r in records if r.status.value == "PLANNED"}:
        run = instance.get_run_by_id(run_id)
        finished[run_id] = run is None or run.is_finished
    return {r.id for r in records if r.status.value == "PLANNED" and not finished[r.run_id]}


def read_failing(
    records: Iterable["AssetCheckExecutionRecord"], attempts: dict[str, dict[str, int]]
) -> dict[str, tuple[int, list[Range]]]:
    """The latest failure of each partition among finished executions, as (execution id,
    missing ranges). A later pass clears the partition, and its attempts."""
    failing: dict[str, tuple[int, list[Range]]] = {}
    for record in records:
        if record.status.value == "SUCCEEDED":
            if record.partition is not None:
                failing.pop(record.partition, None)
                attempts.pop(record.partition, None)
            continue
        if record.status.value != "FAILED" or record.event is None:
            continue
        evaluation = record.event.dagster_event.asset_check_evaluation_data
        entry = evaluation.metadata.get("missing_ranges")
        for partition, ranges in (entry.value if entry else {}).items():
            failing[partition] = (record.id, [(int(s), int(e)) for s, e in ranges])
    return failing


def heal_request(partition: str, ranges: list[Range], attempt: int, run_key: str) -> dg.RunRequest:
    key = dg.MultiPartitionKey(dict(zip(("day", "ticker"), partition.split("|", 1), strict=True)))
    config = HistoryConfig(ranges=[MinuteRange(start_ms=s, end_ms=e) for s, e in ranges])
    return dg.RunRequest(
        run_key=run_key,
        partition_key=key,
        run_config=dg.RunConfig(ops={ohlc_history.op.name: config}),
        tags={
            "candlewire/heal_ticker": key.keys_by_dimension["ticker"],
            "candlewire/heal_day": key.keys_by_dimension["day"],
            "candlewire/heal_ranges": describe_ranges(ranges),
            "candlewire/heal_attempt": str(attempt),
        },
    )


@dg.sensor(job=heal_job, minimum_interval_seconds=60, default_status=dg.DefaultSensorStatus.RUNNING)
def heal_incomplete_days(context: dg.SensorEvaluationContext) -> dg.SensorResult:
    """Refetch the missing minutes of every partition whose ``day_is_complete`` failed.

    On by default: healing is what a user wants of a failed completeness check, and it is
    cheap. A tick is one indexed query of the check's executions, a heal fetches only the
    missing minutes, and a range is tried at most ``MAX_ATTEMPTS`` times.
    """
    cursor = HealCursor.load(context.cursor)
    handled = set(cursor.handled)
    records, complete = _new_executions(context.instance, cursor.after, handled)
    running = _running(context.instance, records)
    if any(r.status.value == "PLANNED" and r.id not in running for r in records):
        # A run of one partition writes its check's result into the row it planned: one that
        # finished after the read left a planned row here whose result was never read, and
        # the partition unhealed. Its run finished, its row is final now: read again.
        fresh = {r.id: r for r in _new_executions(context.instance, cursor.after, handled)[0]}
        records = [fresh.get(r.id, r) for r in records]
    finished = [r for r in records if r.id not in handled and r.id not in running]
    failing = read_failing(finished, cursor.attempts)
    tickers = set(context.instance.get_dynamic_partitions(TICKERS.name))
    for partition in [p for p in failing if p.split("|", 1)[-1] not in tickers]:
        context.log.warning(f"{partition}: the ticker is no longer a partition; not healed")
        del failing[partition]
    plan = plan_heals({p: ranges for p, (_, ranges) in failing.items()}, cursor.attempts)
    for partition, ranges in plan.given_up.items():
        context.log.warning(
            f"giving up on {partition} {describe_ranges(ranges)}: still missing after "
            f"{MAX_ATTEMPTS} heals, the venue does not serve it"
        )
    requests = [
        heal_request(
            partition,
            ranges,
            max(cursor.attempts[partition][_range_key(r)] for r in ranges),
            f"heal:{failing[partition][0]}:{partition}",
        )
        for partition, ranges in plan.heal.items()
    ]
    ids = [r.id for r in records]
    if complete:  # else older executions are still unread: ``after`` stays below them
        cursor.after = min(running) - 1 if running else max(ids, default=cursor.after)
    cursor.handled = sorted(i for i in handled | {r.id for r in finished} if i > cursor.after)
    if requests:
        return dg.SensorResult(run_requests=requests, cursor=cursor.dump())
    gave_up = "; ".join(f"{p} {describe_ranges(r)}" for p, r in plan.given_up.items())
    reason = f"gave up on {gave_up}" if gave_up else "no incomplete days to heal"
    return dg.SensorResult(skip_reason=reason, cursor=cursor.dump())


@dg.definitions
def healing() -> dg.Definitions:
    return dg.Definitions(jobs=[heal_job], sensors=[heal_incomplete_days])
