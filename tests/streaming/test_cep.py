"""The CEP evaluator against crafted near-misses and against brute force and pandas.

Test reference, not run by the platform: the brute-force crossings and the pandas resamples
here are oracles for the evaluator, not copies of it that run."""

from __future__ import annotations

import random
from decimal import Decimal

import pandas as pd
import pytest

from candlewire.triggers import Trigger
from proto import cep_pb2 as cep
from tests.reference.cep import FeedTriggers, Firing, Triggers

S = 1_000_000_000
T0 = 1_700_006_400 * S  # on an hour boundary
ALLOWANCE = 10 * S
TICKER = "SIM:BTC/USDT"


def trigger(kind: str, **kw) -> Trigger:
    base = {"trigger_id": kw.pop("trigger_id", "t1"), "client_id": "c", "user_id": "u"}
    return Trigger(**base, ticker=TICKER, kind=kind, **kw)


def run(
    feed: FeedTriggers, trades: list[tuple[int, str, str]], end_ns: int | None = None
) -> list[Firing]:
    out: list[Firing] = []
    for t_ns, price, size in trades:
        out += feed.trade(t_ns, Decimal(price), Decimal(size))
    if end_ns is not None:
        out += feed.mark(end_ns)
    return out


def feed_with(*triggers: Trigger) -> FeedTriggers:
    feed = FeedTriggers(TICKER, ALLOWANCE)
    for t in triggers:
        feed.add(t)
    return feed


# -- crafted sequences: each kind fires, and a near-miss does not ---------------------------


@pytest.mark.parametrize(
    ("direction", "prices", "fires"),
    [
        (cep.UP, ["99", "99.99", "100"], True),
        (cep.UP, ["99", "99.99", "99.99"], False),  # one tick short
        (cep.UP, ["100", "101"], False),  # never below: no crossing
        (cep.DOWN, ["101", "100.01", "100"], True),
        (cep.DOWN, ["101", "100.01"], False),
    ],
)
def test_price_cross(direction: int, prices: list[str], fires: bool) -> None:
    feed = feed_with(trigger("price_cross", direction=direction, level=Decimal(100)))
    got = run(feed, [(T0 + i * S, p, "1") for i, p in enumerate(prices)])
    assert [f.value for f in got] == ([Decimal(prices[-1])] if fires else [])
    if fires:
        assert got[0].event_time_ns == T0 + (len(prices) - 1) * S
        assert got[0].reference == Decimal(100) and got[0].firing == 1


@pytest.mark.parametrize(("gap_s", "fires"), [(299, True), (300, False)])
def test_percent_move_inside_and_one_second_outside_the_window(gap_s: int, fires: bool) -> None:
    """+3 % in 5 minutes: the low 299 s before counts, 300 s before is outside (t - W, t]."""
    feed = feed_with(
        trigger("percent_move", direction=cep.UP, level=Decimal(3), window_s=300, once=True)
    )
    got = run(feed, [(T0, "100", "1"), (T0 + gap_s * S, "103", "1")])
    assert [(f.value, f.reference) for f in got] == ([(Decimal(3), Decimal(100))] if fires else [])


def test_percent_move_down_and_either() -> None:
    down = trigger(
        "percent_move", trigger_id="d", direction=cep.DOWN, level=Decimal(2), window_s=60
    )
    either = trigger(
        "percent_move", trigger_id="e", direction=cep.EITHER, level=Decimal(2), window_s=60
    )
    feed = feed_with(down, either)
    got = run(feed, [(T0, "100", "1"), (T0 + S, "98.01", "1"), (T0 + 2 * S, "98", "1")])
    assert [(f.trigger.trigger_id, f.value) for f in got] == [
        ("d", Decimal(-2)),
        ("e", Decimal(-2)),
    ]


@pytest.mark.parametrize(
    ("sizes", "gap_s", "fires"),
    [
        (["4", "6"], 59, True),
        (["4", "5.999"], 59, False),  # one lot short
        (["4", "6"], 60, False),  # the first trade is one second outside the window
    ],
)
def test_window_volume(sizes: list[str], gap_s: int, fires: bool) -> None:
    feed = feed_with(trigger("window_volume", direction=cep.UP, level=Decimal(10), window_s=60))
    got = run(feed, [(T0, "1", sizes[0]), (T0 + gap_s * S, "1", sizes[1])])
    assert [f.value for f in got] == ([Decimal(10)] if fires else [])


@pytest.mark.parametrize(("close", "fires"), [("100", True), ("99.99", False)])
def test_candle_close_fires_when_the_candle_closes(close: str, fires: bool) -> None:
    feed = feed_with(
        trigger("candle_close", direction=cep.UP, level=Decimal(100), period_s=60, once=False)
    )
    trades = [(T0 + S, "105", "1"), (T0 + 50 * S, close, "1")]
    assert run(feed, trades) == []  # still forming: nothing yet, even at 105
    # The watermark (clock - 10 s allowance) reaches the minute's end 70 s in.
    assert run(feed, [], end_ns=T0 + 69 * S) == []
    got = run(feed, [], end_ns=T0 + 70 * S)
    assert [(f.value, f.event_time_ns) for f in got] == (
        [(Decimal(close), T0 + 60 * S)] if fires else []
    )


def test_range_breakout_over_the_last_n_candles() -> None:
    feed = feed_with(
        trigger("range_breakout", direction=cep.UP, period_s=60, candles=2, once=False)
    )
    minute = 60 * S
    trades = [
        (T0, "100", "1"),  # candle 0: high 101
        (T0 + 1 * S, "101", "1"),
        (T0 + minute, "99", "1"),  # candle 1: high 100.5
        (T0 + minute + S, "100.5", "1"),
        (T0 + 2 * minute, "101", "1"),  # candle 2 closes at 101: not above 101
        (T0 + 3 * minute, "101.01", "1"),  # candle 3 closes at 101.01 > max(100.5, 101)
        (T0 + 5 * minute, "1", "1"),  # closes candle 3
    ]
    got = run(feed, trades)
    assert [(f.value, f.reference, f.event_time_ns) for f in got] == [
        (Decimal("101.01"), Decimal(101), T0 + 4 * minute)
    ]


# -- once, cooldown, removal, ticks before registration -------------------------------------


def zigzag(n: int) -> list[tuple[int, str, str]]:
    """Crossing 100 upwards every other trade, 10 s apart."""
    return [(T0 + i * 10 * S, "99" if i % 2 == 0 else "101", "1") for i in range(n)]


def test_one_shot_fires_once_and_is_gone() -> None:
    feed = feed_with(trigger("price_cross", direction=cep.UP, level=Decimal(100), once=True))
    got = run(feed, zigzag(10))
    assert [(f.firing, f.event_time_ns) for f in got] == [(1, T0 + 10 * S)]
    assert len(feed) == 0


def test_rearming_trigger_respects_its_cooldown() -> None:
    """Crossings every 20 s, cooldown 45 s: it fires at 10, then 70 (50 and 30 were within
    45 s of a firing), then 130."""
    feed = feed_with(
        trigger("price_cross", direction=cep.UP, level=Decimal(100), once=False, cooldown_s=45)
    )
    got = run(feed, zigzag(14))
    assert [(f.firing, (f.event_time_ns - T0) // S) for f in got] == [(1, 10), (2, 70), (3, 130)]


def test_removal_stops_it_and_a_trigger_judges_only_later_trades() -> None:
    feed = feed_with()
    run(feed, [(T0, "99", "1")])
    feed.add(trigger("price_cross", direction=cep.UP, level=Decimal(100), once=False))
    # The 99 read before registration does not make the next 101 a crossing.
    assert run(feed, [(T0 + S, "101", "1")]) == []
    assert len(run(feed, [(T0 + 2 * S, "99", "1"), (T0 + 3 * S, "101", "1")])) == 1
    assert feed.remove("t1") and not feed.remove("t1")
    assert run(feed, [(T0 + 4 * S, "99", "1"), (T0 + 5 * S, "101", "1")]) == []


# -- random sequences against independent oracles -------------------------------------------


def random_trades(seed: int, n: int = 400) -> list[tuple[int, str, str]]:
    """Prices walking around 100, 0.5-20 s apart, now and then two swapped within the
    allowance (out of order, still timely)."""
    rng = random.Random(seed)
    t, price, out = T0, 10_000, []
    for _ in range(n):
        t += rng.randint(500, 20_000) * 1_000_000
        price = max(9_000, min(11_000, price + rng.randint(-150, 150)))
        out.append([t, f"{price / 100:.2f}", f"{rng.randint(1, 300) / 100:.2f}"])
    for i in range(5, n - 1, 17):
        if out[i + 1][0] - out[i][0] < 5 * S:
            out[i][0], out[i + 1][0] = out[i + 1][0], out[i][0]
    return [tuple(x) for x in out]


def cooled(candidates: list[tuple[int, Decimal]], cooldown_s: int) -> list[tuple[int, Decimal]]:
    out, next_ns = [], 0
    for t, v in candidates:
        if t >= next_ns:
            out.append((t, v))
            next_ns = t + cooldown_s * S
    return out


def in_window(trades, i: int, window_s: int) -> list[tuple[int, str, str]]:
    t_i = trades[i][0]
    return [tr for tr in trades[: i + 1] if t_i - window_s * S < tr[0] <= t_i]


@pytest.mark.parametrize("seed", range(4))
def test_trade_kinds_equal_brute_force(seed: int) -> None:
    trades = random_trades(seed)
    level, cooldown = Decimal("100.5"), 120
    kinds = {
        "cross": trigger(
            "price_cross",
            trigger_id="cross",
            direction=cep.UP,
            level=level,
            once=False,
            cooldown_s=cooldown,
        ),
        "pct": trigger(
            "percent_move",
            trigger_id="pct",
            direction=cep.EITHER,
            level=Decimal("0.8"),
            window_s=90,
            once=False,
            cooldown_s=cooldown,
        ),
        "vol": trigger(
            "window_volume",
            trigger_id="vol",
            direction=cep.UP,
            level=Decimal(12),
            window_s=120,
            once=False,
            cooldown_s=cooldown,
        ),
    }
    got = run(feed_with(*kinds.values()), trades)
    want: dict[str, list] = {k: [] for k in kinds}
    prices = [Decimal(p) for _, p, _ in trades]
    for i, (t, p, _) in enumerate(trades):
        price = Decimal(p)
        if i and prices[i - 1] < level <= price:
            want["cross"].append((t, price))
        window = in_window(trades, i, 90)
        low, high = min(Decimal(w[1]) for w in window), max(Decimal(w[1]) for w in window)
        if price >= low * Decimal("1.008"):
            want["pct"].append((t, (price / low - 1) * 100))
        elif price <= high * Decimal("0.992"):
            want["pct"].append((t, (price / high - 1) * 100))
        volume = sum(Decimal(w[2]) for w in in_window(trades, i, 120))
        if volume >= 12:
            want["vol"].append((t, volume))
    for k in kinds:
        fired = [(f.event_time_ns, f.value) for f in got if f.trigger.trigger_id == k]
        assert fired == cooled(want[k], cooldown), k
        assert [f.firing for f in got if f.trigger.trigger_id == k] == list(
            range(1, len(fired) + 1)
        )
    assert sum(len(v) for v in want.values()) > 10  # the sequence exercises every kind


@pytest.mark.parametrize("seed", range(3))
def test_candle_kinds_equal_pandas_resample(seed: int) -> None:
    trades = random_trades(seed, 600)
    end_ns = max(t for t, _, _ in trades) + 3600 * S
    feed = feed_with(
        trigger(
            "candle_close",
            trigger_id="close",
            direction=cep.DOWN,
            level=Decimal(100),
            period_s=300,
            once=False,
        ),
        trigger(
            "range_breakout",
            trigger_id="break",
            direction=cep.UP,
            period_s=60,
            candles=3,
            once=False,
        ),
    )
    got = run(feed, trades, end_ns=end_ns)

    def candles(period_s: int) -> pd.DataFrame:
        df = pd.DataFrame(
            {
                "time": pd.to_datetime([t for t, _, _ in trades], unit="ns", utc=True),
                "price": [float(p) for _, p, _ in trades],
                "order": range(len(trades)),
            }
        ).sort_values(["time", "order"])
        r = df.set_index("time")["price"].resample(f"{period_s}s")
        out = pd.DataFrame({"high": r.max(), "low": r.min(), "close": r.last()}).dropna()
        out["end_ns"] = [int(i.value) + period_s * S for i in out.index]
        return out

    c5 = candles(300)
    want_close = [
        (e, Decimal(str(c))) for e, c in zip(c5["end_ns"], c5["close"], strict=True) if c <= 100
    ]
    assert [(f.event_time_ns, f.value) for f in got if f.trigger.trigger_id == "close"] == [
        (e, Decimal(f"{v:.2f}")) for e, v in want_close
    ]
    c1 = candles(60).reset_index(drop=True)
    want_break = [
        (int(c1.end_ns[k]), round(c1.close[k], 2))
        for k in range(3, len(c1))
        if c1.close[k] > c1.high[k - 3 : k].max()
    ]
    assert [(f.event_time_ns, float(f.value)) for f in got if f.trigger.trigger_id == "break"] == [
        (e, v) for e, v in want_break
    ]
    assert want_close and want_break


def test_a_candle_closes_on_the_later_read_of_two_trades_at_the_same_time() -> None:
    """As in ``ohlc``: on equal exchange times the trade read later is the close."""
    feed = feed_with(trigger("candle_close", direction=cep.DOWN, level=Decimal(95), period_s=60))
    got = run(feed, [(T0 + 50 * S, "100", "1"), (T0 + 50 * S, "90", "1")], end_ns=T0 + 70 * S)
    assert [f.value for f in got] == [Decimal(90)]


# -- Triggers: registrations in order with the trades, resends, late trades, restarts --------


def registration(trigger_id: str, level: str, action: int = cep.ADD) -> cep.CEPTriggerRequest:
    return cep.CEPTriggerRequest(
        trigger_id=trigger_id,
        client_id="c",
        ticker=TICKER,
        action=action,
        once=False,
        price_cross=cep.PriceCross(level=level, direction=cep.UP),
    )


def trade(t_s: int, price: str, trade_id: str) -> tuple:
    return (TICKER, T0 + t_s * S, Decimal(price), Decimal(1), trade_id)


def test_triggers_judge_registrations_resends_and_late_trades_in_order() -> None:
    triggers = Triggers(allowance_s=10.0, horizon_s=600.0)
    events = [
        trade(0, "99", "a"),  # before any registration: nobody looks
        registration("x", "100"),
        trade(1, "101", "b"),  # first trade judged: only tells the side
        trade(2, "99", "c"),
        trade(3, "101", "d"),  # crossing 1
        trade(4, "99", "e"),
        trade(5, "101", "d"),  # a resend of d: nothing
        trade(60, "99", "f"),
        trade(61, "101", "g"),  # crossing 2; the clock is at 61 s
        trade(20, "99", "h"),  # late (older than 61 - 10): nothing
        trade(62, "101", "i"),  # no crossing: h did not count
        registration("x", "100", cep.REMOVE),
        trade(63, "99", "j"),
        trade(64, "101", "k"),  # removed: nothing
    ]
    fired = triggers.judge(events)
    assert [((f.event_time_ns - T0) // S, f.firing) for f in fired] == [(3, 1), (61, 2)]
    assert triggers.tickers() == set()


def test_triggers_restored_from_their_record_fire_as_if_never_stopped() -> None:
    rng = random.Random(9)
    events: list = [registration("x", "100"), registration("y", "100.5")]
    for i in range(300):
        events.append(trade(i * 3, f"{rng.randint(9_900, 10_100) / 100:.2f}", str(i)))
        if rng.random() < 0.1:
            events.append(trade(i * 3, events[-1][2].to_eng_string(), str(i)))  # a resend

    def firings(fired: list[Firing]) -> list[tuple]:
        return [(f.trigger.trigger_id, f.firing, f.event_time_ns) for f in fired]

    whole = firings(Triggers(10.0, 600.0).judge(events))
    first = Triggers(10.0, 600.0)
    before = first.judge(events[:150])
    after = Triggers.loads(first.dumps(), 10.0, 600.0).judge(events[150:])
    assert firings(before + after) == whole and len(whole) > 10
