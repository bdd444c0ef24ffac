"""Which stopped queries the stream job starts again, and how often."""

from __future__ import annotations

import pytest

import streaming.job as job
from streaming.job import StreamingJob, transient

# How each fault reads in the StreamingQueryException that stopped the query (abridged from
# the job's log).
SPARK_55271 = (
    'java.lang.NullPointerException: Cannot invoke "scala.collection.IterableOps.map('
    'scala.Function1)" because the return value of "scala.Option.get()" is null'
)
CATALOG_LOST = (
    "[FOREACH_BATCH_USER_FUNCTION_ERROR] An error occurred in the user provided function in "
    "foreach batch sink. ... py4j.protocol.Py4JJavaError: An error occurred while calling "
    "o82.sql.\n: org.apache.iceberg.jdbc.UncheckedSQLException: Failed to get table "
    "market.ohlc from catalog candlewire\n...\nCaused by: org.postgresql.util.PSQLException: "
    "FATAL: terminating connection due to administrator command"
)
BUG = "[FOREACH_BATCH_USER_FUNCTION_ERROR] ... KeyError: 'open_time_ms'"


def test_passing_faults_are_told_from_the_rest() -> None:
    assert transient(SPARK_55271) is not None
    assert transient(CATALOG_LOST) == "a lost connection to the catalog's PostgreSQL"
    assert transient(BUG) is None
    assert transient(None) is None


class _Query:
    name = "ticks"


def test_restarts_are_bounded_in_a_window_with_longer_pauses(monkeypatch) -> None:
    slept: list[float] = []
    clock = [1000.0]
    monkeypatch.setattr(job.time, "sleep", slept.append)
    monkeypatch.setattr(job.time, "monotonic", lambda: clock[0])
    stream = StreamingJob.__new__(StreamingJob)  # the restart rule needs no Spark
    stream._restarts = {"ticks": []}
    q = _Query()
    assert not stream._may_restart(q, BUG)
    assert [stream._may_restart(q, CATALOG_LOST) for _ in range(4)] == [True] * 3 + [False]
    assert slept == pytest.approx([1.0, 2.0, 4.0])
    clock[0] += job.RESTART_WINDOW_S  # the window has passed: the budget is back
    assert stream._may_restart(q, SPARK_55271)
