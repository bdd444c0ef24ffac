"""Forming candles across micro-batches, without Spark: partials folded batch by batch equal
one aggregation over all ticks, whatever the batch split or arrival order.

Test reference, not run by the platform: :func:`aggregate` is a second fold of trades into
candles, the oracle for ``tests.reference.candles`` (itself the reference of ``FeedState``)."""

from __future__ import annotations

import random
from decimal import Decimal

from tests.reference.candles import Candle, FormingCandles, changed, partial_candles

Tick = tuple[str, int, Decimal, Decimal]  # ticker, time ns, price, size


def aggregate(ticks: list[Tick], period_s: int) -> dict[tuple, Candle]:
    """The reference: one candle per window over the ticks in event-time order (what
    Spark's per-batch aggregation computes for one batch)."""
    out: dict[tuple, Candle] = {}
    for ticker, t, price, size in sorted(ticks, key=lambda x: x[1]):
        open_ms = t // 1_000_000 // (period_s * 1000) * period_s * 1000
        key = (ticker, period_s, open_ms)
        c = out.get(key)
        if c is None:
            out[key] = Candle(ticker, period_s, open_ms, price, price, price, price, size, 1, t, t)
        else:
            c.high, c.low = max(c.high, price), min(c.low, price)
            c.close, c.last_trade_ns = price, t
            c.volume += size
            c.trade_count += 1
    return out


def ticks(n: int, seed: int) -> list[Tick]:
    rng = random.Random(seed)
    t0 = 1_700_000_000_000_000_000
    return [
        (
            rng.choice(["X:A/B", "X:C/D"]),
            t0 + i * 3_000_000_000 + rng.randint(0, 2_999_999_999),
            Decimal(rng.randint(9_000, 11_000)) / 100,
            Decimal(rng.randint(1, 999)) / 1000,
        )
        for i in range(n)
    ]


def batches(all_ticks: list[Tick], seed: int) -> list[list[Tick]]:
    """Arrival order: mostly in order, neighbours swapped, cut into uneven batches."""
    rng = random.Random(seed)
    arrived = list(all_ticks)
    for i in range(0, len(arrived) - 1, 7):
        arrived[i], arrived[i + 1] = arrived[i + 1], arrived[i]
    out, i = [], 0
    while i < len(arrived):
        size = rng.randint(1, 40)
        out.append(arrived[i : i + size])
        i += size
    return out


def fold(state: FormingCandles, parts: list[list[Tick]], period_s: int) -> dict[tuple, Candle]:
    final: dict[tuple, Candle] = {}
    for batch in parts:
        for c in state.merge(aggregate(batch, period_s).values()):
            final[c.key] = Candle(**{f: getattr(c, f) for f in Candle.__slots__})
    return final


def test_batches_fold_to_one_aggregation_for_each_period() -> None:
    data = ticks(2000, seed=1)
    for period in (60, 300, 3600):
        got = fold(FormingCandles(), batches(data, seed=period), period)
        assert got == aggregate(data, period), period


def test_out_of_order_tick_sets_open_and_close_by_event_time() -> None:
    state = FormingCandles()
    d = Decimal
    state.merge([Candle("X:A/B", 60, 0, d(2), d(2), d(2), d(2), d(1), 1, 20, 20)])
    earlier = Candle("X:A/B", 60, 0, d(1), d(1), d(1), d(1), d(1), 1, 10, 10)
    (c,) = state.merge([earlier])
    assert (c.open, c.close, c.low, c.trade_count, c.volume) == (d(1), d(2), d(1), 2, d(2))
    later = Candle("X:A/B", 60, 0, d(3), d(3), d(3), d(3), d(1), 1, 30, 30)
    (c,) = state.merge([later])
    assert (c.open, c.close, c.high, c.trade_count) == (d(1), d(3), d(3), 3)


def test_restored_state_continues_exactly_like_the_uninterrupted_one() -> None:
    data = ticks(1500, seed=2)
    parts = batches(data, seed=3)
    cut = len(parts) // 2
    uninterrupted = fold(FormingCandles(), parts, 300)

    before = FormingCandles()
    written = fold(before, parts[:cut], 300)  # what the MERGEs left in ohlc
    restarted = FormingCandles()
    restarted.restore(written.values(), lambda ticker: 0)
    after = fold(restarted, parts[cut:], 300)
    assert {**written, **after} == uninterrupted


def test_eviction_takes_out_final_windows_per_feed_and_restore_skips_them() -> None:
    d = Decimal
    old = Candle("X:A/B", 60, 0, d(1), d(1), d(1), d(1), d(1), 1, 5, 5)
    forming = Candle(
        "X:A/B", 60, 60_000, d(1), d(1), d(1), d(1), d(1), 1, 61_000_000_000, 61_000_000_000
    )
    behind = Candle("Y:A/B", 60, 0, d(2), d(2), d(2), d(2), d(1), 1, 5, 5)
    watermarks = {"X:A/B": 60_000, "Y:A/B": 59_999}  # Y's own clock has not passed its window
    state = FormingCandles()
    state.merge([old, forming, behind])
    assert state.evict(watermarks.__getitem__) == [old] and len(state) == 2
    assert state.tickers() == {"X:A/B": 120_000, "Y:A/B": 60_000}
    restored = FormingCandles()
    restored.restore([old, forming, behind], watermarks.__getitem__)
    assert len(restored) == 2
    # The forming window stayed: a later tick folds into it.
    (c,) = state.merge(
        [
            Candle(
                "X:A/B", 60, 60_000, d(4), d(4), d(4), d(4), d(1), 1, 62_000_000_000, 62_000_000_000
            )
        ]
    )
    assert (c.trade_count, c.close, c.open) == (2, d(4), d(1))


def test_live_reduction_equals_the_reference_in_any_arrival_order() -> None:
    data = ticks(800, seed=5)
    shuffled = random.Random(6).sample(data, len(data))
    got = {c.key: c for c in partial_candles(shuffled, [60, 900])}
    assert got == {**aggregate(data, 60), **aggregate(data, 900)}


def test_a_batch_s_changes_name_each_candle_once_and_say_which_closed() -> None:
    d = Decimal
    a = Candle("X:A/B", 60, 0, d(1), d(1), d(1), d(1), d(1), 1, 5, 5)
    b = Candle("X:A/B", 60, 60_000, d(1), d(1), d(1), d(1), d(1), 1, 61, 61)
    c = Candle("X:A/B", 300, 0, d(1), d(1), d(1), d(1), d(1), 1, 5, 5)
    assert changed([a, b], [a, c]) == [(a, True), (b, False), (c, True)]
