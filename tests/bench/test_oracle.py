"""bench.oracle's reference candles on trades worked out by hand: the benches' correctness
figures (``candles_equal``, ``live_candles_equal``) are only as good as it is."""

from __future__ import annotations

from decimal import Decimal as D

from bench.oracle import all_same, reference

MINUTE_NS = 60 * 10**9
T0 = 1_700_000_040 * 10**9  # a minute's open (1,700,000,040 is a multiple of 60)


def test_trades_fold_into_each_period_s_candles_by_event_time_not_arrival() -> None:
    trades = [  # arrival order; the second trade happened first
        (T0 + 30 * 10**9, "10.5", "1"),
        (T0 + 10 * 10**9, "11", "0.25"),
        (T0 + MINUTE_NS + 1, "9", "2"),
        (T0 + 59 * 10**9, "12", "0.5"),
    ]
    ref = reference({"X": trades})["X"]
    open_ms = T0 // 10**6
    assert ref[60] == [
        (open_ms, D("11"), D("12"), D("10.5"), D("12"), D("1.75"), 3),
        (open_ms + 60_000, D("9"), D("9"), D("9"), D("9"), D("2"), 1),
    ]
    hour_ms = T0 // 3_600_000_000_000 * 3_600_000  # all four fall in this hour
    assert ref[3600] == [(hour_ms, D("11"), D("12"), D("9"), D("9"), D("3.75"), 4)]


def test_a_single_differing_candle_fails_the_comparison(capsys) -> None:
    want = reference({"X": [(T0, "1", "1"), (T0 + MINUTE_NS, "2", "1")]})
    same = {"X": {p: list(rows) for p, rows in want["X"].items()}}
    assert all_same("ohlc", same, want)
    changed = {"X": {**same["X"], 60: [same["X"][60][0], (*same["X"][60][1][:-1], 2)]}}
    assert not all_same("ohlc", changed, want)
    assert "ohlc X 60s" in capsys.readouterr().out


def test_a_volume_is_summed_exactly_past_28_digits() -> None:
    # Python's default context rounds to 28 digits: 12345678901234.5 + 1e-18 lost its last
    # digit, and the benches called the platform's exact sum wrong.
    ref = reference({"X": [(T0, "1", "12345678901234.5"), (T0 + 1, "1", "0.000000000000000001")]})
    assert ref["X"][60][0][5] == D("12345678901234.500000000000000001")
