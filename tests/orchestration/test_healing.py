"""Self-healing history without the platform: the ranges a failed check yields, and the
sensor's decisions on ``day_is_complete`` evaluations recorded in a test instance (the
end-to-end heal is in test_assets.py)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import dagster as dg

from orchestration.defs.assets.history import Want, describe_ranges, merge_minutes, missing_ranges
from orchestration.defs.healing import HealCursor, heal_incomplete_days, plan_heals

MIN = 60_000
KEY = "2025-03-01|SIM:BTC/USDT"


def test_missing_minutes_merge_into_ranges() -> None:
    assert merge_minutes([]) == []
    assert merge_minutes([0, MIN, 2 * MIN, 5 * MIN, 7 * MIN, 8 * MIN]) == [
        (0, 3 * MIN),
        (5 * MIN, 6 * MIN),
        (7 * MIN, 9 * MIN),
    ]
    want = Want.of(KEY)
    have = [want.start_ms + i * MIN for i in range(1440) if i not in (0, 1, 61, 1439)]
    day = want.start_ms
    assert missing_ranges(want, have) == [
        [day, day + 2 * MIN],
        [day + 61 * MIN, day + 62 * MIN],
        [day + 1439 * MIN, want.end_ms],
    ]


def test_plan_heals_counts_attempts_per_range_and_gives_up() -> None:
    attempts: dict[str, dict[str, int]] = {}
    r1, r2 = (0, MIN), (5 * MIN, 7 * MIN)
    first = plan_heals({KEY: [r1, r2]}, attempts)
    assert first.heal == {KEY: [r1, r2]} and not first.given_up
    second = plan_heals({KEY: [r1]}, attempts)  # r2 healed; r1 still missing
    assert second.heal == {KEY: [r1]}
    third = plan_heals({KEY: [r1, (6 * MIN, 7 * MIN)]}, attempts)
    # r1 was tried twice; what is left of r2 is a new, smaller range: progress, so try it.
    assert third.given_up == {KEY: [r1]} and third.heal == {KEY: [(6 * MIN, 7 * MIN)]}
    assert attempts[KEY] == {f"0-{MIN}": 2, f"{5 * MIN}-{7 * MIN}": 1, f"{6 * MIN}-{7 * MIN}": 1}


def evaluation(passed: bool, ranges: dict[str, list[list[int]]] | None = None, partition=KEY):
    metadata = {"missing_ranges": dg.MetadataValue.json(ranges)} if ranges is not None else {}
    return dg.AssetCheckEvaluation(
        asset_key=dg.AssetKey("ohlc_history"),
        check_name="day_is_complete",
        passed=passed,
        metadata=metadata,
        partition=partition,
    )


def record(instance: dg.DagsterInstance, result: dg.AssetCheckEvaluation) -> None:
    """An evaluation recorded by a finished run, as a run of the check records it."""

    @dg.op
    def evaluate(context) -> None:  # not annotated: a string (__future__) fails the check
        context.log_event(result)

    @dg.job
    def check_run() -> None:
        evaluate()

    assert check_run.execute_in_process(instance=instance).success


@contextmanager
def instance_with(*tickers: str) -> Iterator[dg.DagsterInstance]:
    """A test instance listing ``tickers``, inside the context the daemon evaluates sensors
    in (a dynamic partition key is checked against the instance that stores it)."""
    with (
        dg.instance_for_test() as instance,
        dg.partition_loading_context(dynamic_partitions_store=instance),
    ):
        instance.add_dynamic_partitions("tickers", list(tickers))
        yield instance


def tick(instance: dg.DagsterInstance, cursor: str | None) -> dg.SensorResult:
    from orchestration.definitions import defs

    ctx = dg.build_sensor_context(instance=instance, cursor=cursor, definitions=defs())
    return heal_incomplete_days.evaluate_tick(ctx)


def test_sensor_heals_each_failed_range_twice_then_gives_up_and_says_so() -> None:
    day = Want.of(KEY).start_ms
    gone = [[day + 5 * MIN, day + 7 * MIN]]
    with instance_with("SIM:BTC/USDT") as instance:
        idle = tick(instance, None)
        assert not idle.run_requests and "no incomplete days" in idle.skip_message

        record(instance, evaluation(False, {KEY: gone}))
        first = tick(instance, idle.cursor)
        (req,) = first.run_requests
        assert req.partition_key == KEY
        assert req.run_config["ops"]["ohlc_history"]["config"]["ranges"] == [
            {"start_ms": gone[0][0], "end_ms": gone[0][1]}
        ]
        assert req.tags["candlewire/heal_ticker"] == "SIM:BTC/USDT"
        assert req.tags["candlewire/heal_ranges"] == "00:05-00:06"
        assert req.tags["candlewire/heal_attempt"] == "1"
        assert not tick(instance, first.cursor).run_requests, "one failure, one heal"

        # The heal did not help: its check fails on the same range. One more try, then none.
        record(instance, evaluation(False, {KEY: gone}))
        second = tick(instance, first.cursor)
        assert [r.tags["candlewire/heal_attempt"] for r in second.run_requests] == ["2"]
        record(instance, evaluation(False, {KEY: gone}))
        third = tick(instance, second.cursor)
        assert not third.run_requests
        assert third.skip_message == f"gave up on {KEY} 00:05-00:06"

        # A later pass forgets the attempts: a new loss of the same minutes heals again.
        record(instance, evaluation(True))
        cleared = tick(instance, third.cursor)
        assert HealCursor.load(cleared.cursor).attempts == {}
        record(instance, evaluation(False, {KEY: gone}))
        assert len(tick(instance, cleared.cursor).run_requests) == 1


def test_sensor_heals_every_failing_partition_of_a_range_run() -> None:
    """A backfill run checks many partitions and records one evaluation, with no partition."""
    other = "2025-03-02|SIM:ETH/USDT"
    with instance_with("SIM:BTC/USDT", "SIM:ETH/USDT") as instance:
        ranges = {KEY: [[1, 2]], other: [[3, 4], [5, 6]], "2025-03-01|SIM:GONE/USDT": [[1, 2]]}
        record(instance, evaluation(False, ranges, partition=None))
        result = tick(instance, None)
        assert sorted(r.partition_key for r in result.run_requests) == sorted([KEY, other])
        assert len({r.run_key for r in result.run_requests}) == 2


def test_a_result_written_after_the_read_into_a_planned_row_is_read(monkeypatch) -> None:
    """A run of one partition writes its check's result into the row it planned. Read as
    planned, then its run seen finished: the row was taken as settled, the cursor moved past
    it, and its failure was never healed. The executions and the run stand in for Dagster's."""
    from types import SimpleNamespace

    import orchestration.defs.healing as healing

    day = Want.of(KEY).start_ms
    gone = [[day + 5 * MIN, day + 7 * MIN]]
    evaluation_data = SimpleNamespace(
        metadata={"missing_ranges": dg.MetadataValue.json({KEY: gone})}
    )
    failed = SimpleNamespace(
        id=7, run_id="r", partition=KEY, status=SimpleNamespace(value="FAILED"),
        event=SimpleNamespace(dagster_event=SimpleNamespace(asset_check_evaluation_data=evaluation_data)),
    )  # fmt: skip
    planned = SimpleNamespace(
        id=7, run_id="r", partition=KEY, status=SimpleNamespace(value="PLANNED"), event=None
    )
    reads = iter([[planned], [failed]])  # the run finishes between the first read and its status
    monkeypatch.setattr(
        healing, "_new_executions", lambda instance, after, skip: (next(reads), True)
    )
    with instance_with("SIM:BTC/USDT") as instance:
        monkeypatch.setattr(
            instance, "get_run_by_id", lambda run_id: SimpleNamespace(is_finished=True)
        )
        from orchestration.definitions import defs

        # The sensor of the module patched (another test may have imported it anew).
        ctx = dg.build_sensor_context(instance=instance, cursor=None, definitions=defs())
        result = healing.heal_incomplete_days.evaluate_tick(ctx)
    assert [r.tags["candlewire/heal_ranges"] for r in result.run_requests] == [
        describe_ranges([tuple(r) for r in gone])
    ]


def test_executions_past_what_a_tick_reads_are_read_by_the_next(monkeypatch) -> None:
    """A backfill plans more check executions at once than a tick reads (1,000): the tick
    read the newest, moved past them all, and the oldest failures were never healed."""
    import orchestration.defs.healing as healing

    monkeypatch.setattr(healing, "PAGE", 2)
    monkeypatch.setattr(healing, "LOOKBACK", 3)
    day = Want.of(KEY).start_ms
    gone = [[day + 5 * MIN, day + 7 * MIN]]
    with instance_with("SIM:BTC/USDT") as instance:
        from orchestration.definitions import defs

        def tick_of(cursor: str | None) -> dg.SensorResult:
            ctx = dg.build_sensor_context(instance=instance, cursor=cursor, definitions=defs())
            return healing.heal_incomplete_days.evaluate_tick(ctx)

        start = tick_of(None)
        record(instance, evaluation(False, {KEY: gone}))  # the oldest of the burst
        others = [f"2025-03-0{d}|SIM:BTC/USDT" for d in range(2, 8)]
        for partition in others:
            record(instance, evaluation(True, partition=partition))
        first = tick_of(start.cursor)
        assert not first.run_requests  # the newest read; the failure not yet
        second = tick_of(first.cursor)
        assert [r.partition_key for r in second.run_requests] == [KEY]
        assert not tick_of(second.cursor).run_requests
