"""Feeds: one verdict per tick from the ticks before it, whatever the batches."""

from __future__ import annotations

import random

import pytest

from tests.reference.feeds import Feeds, Verdict

S = 1_000_000_000  # ns per second


def stream(seed: int, n: int = 3000) -> list[tuple[str, str, int]]:
    """Three feeds, one five minutes behind, out of order within the allowance, with
    resends (the same trade id again) now and then."""
    rng = random.Random(seed)
    lag = {"A": 0, "B": 300 * S, "C": 0}
    out: list[tuple[str, str, int]] = []
    sent: dict[str, list[tuple[str, str, int]]] = {k: [] for k in lag}
    for i in range(n):
        feed = rng.choice("AB" if i > n // 2 else "ABC")  # C goes quiet halfway
        t = 1_000 * S + i * S // 2 - lag[feed] + rng.randint(-3 * S, 3 * S)
        tick = (feed, f"{feed}{i}", t)
        sent[feed].append(tick)
        out.append(tick)
        if rng.random() < 0.05:
            out.append(rng.choice(sent[feed][-50:]))  # a resend
    return out


def verdicts(feeds: Feeds, ticks: list[tuple[str, str, int]]) -> list[Verdict]:
    return [feeds.admit(*t) for t in ticks]


def test_a_resend_counts_once_and_a_lagging_feed_is_never_late() -> None:
    ticks = stream(1)
    got = verdicts(Feeds(allowance_s=10, horizon_s=600), ticks)
    first = {}
    for tick, v in zip(ticks, got, strict=True):
        key = (tick[0], tick[1])
        assert v == (Verdict.DUPLICATE if key in first else Verdict.KEEP), tick
        first.setdefault(key, tick)
    assert got.count(Verdict.DUPLICATE) == len(ticks) - len(first) > 0


def test_one_global_clock_would_have_dropped_the_lagging_feed() -> None:
    """The oracle the per-feed clock is checked against: a single clock over all feeds
    calls the feed five minutes behind late, trade after trade."""
    ticks = stream(2)
    shared = Feeds(allowance_s=10, horizon_s=600)
    behind = (Verdict.LATE, Verdict.REVISE)
    late = [t for t in ticks if shared.admit("ALL", f"{t[0]}{t[1]}", t[2]) in behind]
    assert sum(t[0] == "B" for t in late) > 1000
    assert not set(behind) & set(verdicts(Feeds(allowance_s=10, horizon_s=600), ticks))


def test_late_is_relative_to_the_feed_s_own_clock() -> None:
    feeds = Feeds(allowance_s=10, horizon_s=600)
    assert feeds.admit("A", "1", 100 * S) == Verdict.KEEP
    assert feeds.admit("A", "2", 91 * S) == Verdict.KEEP  # within the allowance
    assert feeds.admit("A", "3", 89 * S) == Verdict.REVISE, "late, within the horizon"
    assert feeds.admit("A", "3", 89 * S) == Verdict.DUPLICATE, "a late trade is still seen"
    assert feeds.admit("B", "1", 5 * S) == Verdict.KEEP, "another feed, another clock"
    assert feeds.admit("A", "", 50 * S) == Verdict.LATE, "no trade id: a resend could double"
    assert feeds.admit("A", "", 100 * S) == Verdict.KEEP
    assert feeds.admit("A", "", 100 * S) == Verdict.KEEP, "no trade id: never a duplicate"
    feeds.admit("A", "4", 700 * S)
    assert feeds.admit("A", "5", 99 * S) == Verdict.LATE, "beyond the horizon"
    assert feeds.admit("A", "6", 100 * S) == Verdict.REVISE, "at the horizon's start"
    assert feeds.watermark_ms("A") == 690_000 and feeds.watermark_ms("C") == 0
    assert feeds.horizon_start_ms("A") == 100_000


def test_restoring_a_commit_continues_exactly_like_the_uninterrupted_run() -> None:
    ticks = stream(3)
    whole = verdicts(Feeds(allowance_s=10, horizon_s=600), ticks)
    for cut in (1, 700, 1500, len(ticks) - 1):
        before = Feeds(allowance_s=10, horizon_s=600)
        head = verdicts(before, ticks[:cut])
        stored = sorted(
            (t for t, v in zip(ticks[:cut], head, strict=True) if v != Verdict.DUPLICATE),
            key=lambda t: t[2],
        )
        after = Feeds(allowance_s=10, horizon_s=600)
        after.restore(before.clocks(), stored)
        assert head + verdicts(after, ticks[cut:]) == whole, cut


def test_idle_mark_moves_only_its_feed_s_clock() -> None:
    feeds = Feeds(allowance_s=10, horizon_s=600)
    feeds.admit("A", "1", 100 * S)
    feeds.admit("B", "1", 100 * S)
    feeds.mark("A", 200 * S)
    assert feeds.watermark_ms("A") == 190_000 and feeds.watermark_ms("B") == 90_000
    feeds.mark("A", 150 * S)
    assert feeds.clock_ns("A") == 200 * S, "a mark never moves a clock back"


def test_remembered_trade_ids_stay_within_the_horizon() -> None:
    feeds = Feeds(allowance_s=10, horizon_s=60)
    for i in range(10_000):
        feeds.admit("A", str(i), i * S)
    assert len(feeds.feeds["A"].seen) <= 62
    assert feeds.admit("A", "9990", 9_990 * S) == Verdict.DUPLICATE


def test_the_horizon_must_exceed_the_allowance() -> None:
    with pytest.raises(ValueError, match="must exceed"):
        Feeds(allowance_s=600, horizon_s=600)
