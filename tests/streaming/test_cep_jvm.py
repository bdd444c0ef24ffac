"""The CEP evaluator (jvm/decoder's Triggers) against its reference, tests/reference/cep.py: the
same ticks-topic records give the same firings, numbered alike, and either one goes on from
a state the other recorded, as a job switching engines between runs does.

The records mix every kind of trigger (one-shot and re-arming, with cool-downs), removals and
re-registrations, trades at the same time, trades out of order within the allowance, late
trades, resends, trades without an id, idle marks and undecodable records, over two feeds.
"""

from __future__ import annotations

import random
from decimal import Decimal

import pytest

from candlewire.triggers import add_request
from proto import cep_pb2 as cep
from proto import market_pb2
from proto.envelope import to_record
from tests.reference.cep import Firing, Triggers
from tests.streaming.test_sql import trade as buy_of_one

S = 1_000_000_000
T0 = 1_789_999_200 * S  # a whole hour
ALLOWANCE_S, HORIZON_S = 10.0, 600.0
TICKERS = ("SIM:AAA/USDT", "SIM:BBB/USDT")


@pytest.fixture(scope="module")
def jvm(spark):
    return spark._jvm.io.candlewire.spark.Triggers


def condition(rng: random.Random) -> object:
    kind = rng.choice(["price_cross", "percent_move", "window_volume", "candle", "breakout"])
    level = f"{rng.randint(9_800, 10_200) / 100:.2f}"
    if kind == "price_cross":
        return cep.PriceCross(level=level, direction=rng.choice([cep.UP, cep.DOWN]))
    if kind == "percent_move":
        return cep.PercentMove(
            percent=rng.choice(["0.5", "1", "1.25"]),
            window_s=rng.choice([30, 90, 300]),
            direction=rng.choice([cep.UP, cep.DOWN, cep.EITHER]),
        )
    if kind == "window_volume":
        return cep.WindowVolume(
            volume=rng.choice(["5", "12.5", "30"]), window_s=rng.choice([60, 200])
        )
    if kind == "candle":
        return cep.CandleClose(
            period_s=rng.choice([60, 300]), level=level, direction=rng.choice([cep.UP, cep.DOWN])
        )
    return cep.RangeBreakout(
        period_s=rng.choice([60, 300]),
        candles=rng.randint(1, 4),
        direction=rng.choice([cep.UP, cep.DOWN]),
    )


def records(seed: int, n: int = 3_000) -> list[tuple[bytes, object]]:
    """(Kafka record, what tests.reference.cep.Triggers.judge takes for it, or None)."""
    rng = random.Random(seed)
    out: list[tuple[bytes, object]] = []
    clock = {t: T0 for t in TICKERS}
    price = dict.fromkeys(TICKERS, 10_000)
    sent: dict[str, list[tuple[str, int]]] = {t: [] for t in TICKERS}
    ids = 0
    for i in range(n):
        ticker = rng.choice(TICKERS)
        roll = rng.random()
        if roll < 0.03:
            ids += 1
            once = rng.random() < 0.3
            req = add_request(
                "c",
                f"t{rng.randint(0, 40)}",  # now and then an id again: it starts afresh
                ticker,
                condition(rng),  # type: ignore[arg-type]
                user_id="u",
                once=once,
                cooldown_s=0 if once else rng.choice([0, 0, 30, 120]),
            )
            req.notification_topic = "RESPONSE:c"
            req.registered_ms = 1_000 + i  # the desk's: a firing names its registration
            out.append((to_record(req), req))
        elif roll < 0.04:
            req = cep.CEPTriggerRequest(
                trigger_id=f"t{rng.randint(0, 40)}", client_id="c", ticker=ticker, action=cep.REMOVE
            )
            out.append((to_record(req), req))
        elif roll < 0.05:
            clock[ticker] += rng.randint(1, 400) * S
            mark = market_pb2.FeedIdle(ticker=ticker, event_time_ns=clock[ticker])
            out.append((to_record(mark), (ticker, clock[ticker])))
        elif roll < 0.055:
            out.append((bytes([1, 2]) + rng.randbytes(rng.randint(0, 20)), None))
        else:
            if roll < 0.08 and sent[ticker]:
                trade_id, t_ns = rng.choice(sent[ticker][-50:])  # a resend
            else:
                if rng.random() > 0.05:  # else at the same time as the last: a tie
                    clock[ticker] += rng.randint(200, 8_000) * 1_000_000
                t_ns = clock[ticker]
                if roll < 0.1:
                    t_ns -= rng.choice([3, 8, 30]) * S  # out of order, or late
                trade_id = "" if roll < 0.11 else f"{i}"
            price[ticker] = max(9_000, min(11_000, price[ticker] + rng.randint(-40, 40)))
            tick = market_pb2.Tick(
                ticker=ticker,
                trade_id=trade_id,
                price=f"{price[ticker] / 100:.2f}",
                size=f"{rng.randint(1, 400) / 100:.2f}",
                side=market_pb2.BUY,
                exchange_time_ns=t_ns,
            )
            if trade_id:
                sent[ticker].append((trade_id, t_ns))
            event = (ticker, t_ns, Decimal(tick.price), Decimal(tick.size), trade_id)
            out.append((to_record(tick), event))
    return out


def named(e: cep.CEPTriggerEvent) -> tuple:
    return (
        e.trigger_id,
        e.firing,
        e.event_time_ms,
        e.value,
        e.reference,
        e.ticker,
        e.user_id,
        e.registered_ms,
    )


def python_firings(fired: list[Firing]) -> list[tuple]:
    return [named(f.event(0)) for f in fired]


def jvm_firings(data: bytes) -> list[tuple]:
    return [named(f.event) for f in cep.CepFirings.FromString(data).firings]


def run_python(triggers: Triggers, recs: list[tuple[bytes, object]]) -> list[tuple]:
    return python_firings(triggers.judge([e for _, e in recs if e is not None]))


def run_jvm(evaluator, recs: list[tuple[bytes, object]], first_offset: int) -> list[tuple]:
    out: list[tuple] = []
    for i, (value, _) in enumerate(recs):
        out += jvm_firings(bytes(evaluator.judge(value, 0, first_offset + i)))
    return out


def test_a_revising_trade_goes_into_the_forming_candle_on_both_engines(jvm) -> None:
    """A late trade inside the dedup horizon (``FeedState``'s REVISE) goes into the candle
    still forming, as into the published one, which a candle trigger then judges; it fires
    nothing itself, and goes into no window already judged. The reference and the JVM alike:
    the random records above seldom make it visible in a firing."""
    ticker = TICKERS[0]
    close_above = cep.CandleClose(period_s=300, level="110", direction=cep.UP)
    req = add_request("c", "x", ticker, close_above, once=False)

    def trade(t_s: int, price: str, trade_id: str) -> tuple[bytes, object]:
        record = buy_of_one(ticker, trade_id, price, T0 + t_s * S)
        return record, (ticker, T0 + t_s * S, Decimal(price), Decimal(1), trade_id)

    def mark(t_s: int) -> tuple[bytes, object]:
        idle = market_pb2.FeedIdle(ticker=ticker, event_time_ns=T0 + t_s * S)
        return to_record(idle), (ticker, T0 + t_s * S)

    recs = [
        (to_record(req), req),
        trade(10, "100", "a"),
        mark(100),  # the watermark at 90 s
        trade(50, "120", "b"),  # late, revising: the forming 5-minute candle closes at 120
        trade(75, "130", "b"),  # a resend of b: nothing
        mark(310),  # the watermark at 300 s: the 5-minute window closes
        trade(200, "150", "e"),  # revising, into the window closed just now: nothing
        trade(305, "90", "c"),
        mark(900),
        trade(400, "150", "d"),  # inside the horizon, its window judged already: nothing
        mark(1_000),
    ]
    want = run_python(Triggers(ALLOWANCE_S, HORIZON_S), recs)
    assert run_jvm(jvm.open(b"", ALLOWANCE_S, HORIZON_S), recs, 0) == want
    assert [(f[2], f[3]) for f in want] == [((T0 + 300 * S) // 1_000_000, "120")]


@pytest.mark.parametrize("seed", range(3))
def test_the_jvm_evaluator_fires_what_the_python_one_does(jvm, seed: int) -> None:
    recs = records(seed)
    want = run_python(Triggers(ALLOWANCE_S, HORIZON_S), recs)
    got = run_jvm(jvm.open(b"", ALLOWANCE_S, HORIZON_S), recs, 0)
    assert got == want
    kinds = {r.WhichOneof("condition") for _, r in recs if isinstance(r, cep.CEPTriggerRequest)}
    assert len(want) > 30 and len(kinds) == 6  # five kinds, and removals (None)
    fired_ids = {f[0] for f in want}
    assert len(fired_ids) > 10


@pytest.mark.parametrize("seed", range(3, 6))
def test_each_engine_goes_on_from_the_state_the_other_recorded(jvm, seed: int) -> None:
    recs = records(seed)
    cut = random.Random(seed).randint(len(recs) // 4, 3 * len(recs) // 4)
    whole = run_python(Triggers(ALLOWANCE_S, HORIZON_S), recs)

    # Python first, then the JVM from Python's record: the records before it are skipped.
    first = Triggers(ALLOWANCE_S, HORIZON_S)
    before = run_python(first, recs[:cut])
    evaluator = jvm.open(first.dumps({0: cut}), ALLOWANCE_S, HORIZON_S)
    assert run_jvm(evaluator, recs, 0) == whole[len(before) :]
    assert before == whole[: len(before)]

    # The JVM first, then Python from the JVM's record, which has the offsets it reached.
    evaluator = jvm.open(b"", ALLOWANCE_S, HORIZON_S)
    before = run_jvm(evaluator, recs[:cut], 0)
    state = bytes(evaluator.state(False))
    assert dict(cep.CepState.FromString(state).offsets) == {0: cut}
    after = run_python(Triggers.loads(state, ALLOWANCE_S, HORIZON_S), recs[cut:])
    assert before + after == whole
    assert evaluator.state(True) is None  # nothing read since: nothing new to record


@pytest.mark.parametrize(
    "other",
    [
        None,
        cep.PriceCross(level="500", direction=cep.UP),
        cep.CandleClose(period_s=60, level="500", direction=cep.UP),
        cep.RangeBreakout(period_s=60, candles=3, direction=cep.UP),
        cep.RangeBreakout(period_s=300, candles=1, direction=cep.DOWN),
    ],
)
def test_a_candle_trigger_judges_the_same_candles_whatever_else_the_feed_has(
    jvm, other: object
) -> None:
    """Candle triggers registered mid-candle judge only candles that open after the feed's
    clock at their registration, whole as subscribers see them. Their firings depend on no
    other trigger: before, a period's candles were shared from its first trigger on (a later
    one judged trades from before its registration), trimmed to the most any trigger needed,
    and kept after its last trigger went."""
    ticker = TICKERS[0]

    def trade(t_s: int, price: str) -> tuple[bytes, object]:
        record = buy_of_one(ticker, f"{t_s}", price, T0 + t_s * S)
        return record, (ticker, T0 + t_s * S, Decimal(price), Decimal(1), f"{t_s}")

    def add(trigger_id: str, condition: object) -> tuple[bytes, object]:
        req = add_request("c", trigger_id, ticker, condition, once=False)  # type: ignore[arg-type]
        return to_record(req), req

    feed = [add("first", cep.PriceCross(level="1", direction=cep.DOWN)), trade(1, "100")]
    if other is not None:
        feed.append(add("other", other))
    feed += [trade(5, "150"), trade(30, "100")]  # the minute [0, 60) holds trades before them
    feed += [
        add("close", cep.CandleClose(period_s=60, level="100", direction=cep.UP)),
        add("break", cep.RangeBreakout(period_s=60, candles=2, direction=cep.UP)),
        trade(40, "120"),  # [0, 60) closes at 120 above the high of nothing they judged
        trade(70, "101"),
        trade(130, "102"),
        trade(190, "103"),  # [180, 240) closes at 103 > max(101, 102): a breakout
        trade(250, "99"),
        trade(400, "99"),
    ]
    want = [
        (trigger_id, (T0 + end_s * S) // 1_000_000, value)
        for trigger_id, end_s, value in [
            ("close", 120, "101"),
            ("close", 180, "102"),
            ("close", 240, "103"),
            ("break", 240, "103"),
        ]
    ]
    python = run_python(Triggers(ALLOWANCE_S, HORIZON_S), feed)
    assert run_jvm(jvm.open(b"", ALLOWANCE_S, HORIZON_S), feed, 0) == python
    assert [(f[0], f[2], f[3]) for f in python if f[0] in ("close", "break")] == want


def test_a_period_no_trigger_uses_is_not_recorded(jvm) -> None:
    """A candle trigger removed, then the state recorded before the next trade: its period
    went into the record, and a feed restored from it folded that period's candles for ever
    (the flag that prunes it is not recorded). Both engines prune before recording."""
    ticker = TICKERS[0]
    cross = add_request("c", "cross", ticker, cep.PriceCross(level="1", direction=cep.DOWN))
    close = add_request(
        "c", "close", ticker, cep.CandleClose(period_s=60, level="1", direction=cep.UP)
    )
    remove = cep.CEPTriggerRequest(
        trigger_id="close", client_id="c", ticker=ticker, action=cep.REMOVE
    )
    recs = [
        (to_record(cross), cross),
        (to_record(close), close),
        (buy_of_one(ticker, "a", "100", T0), (ticker, T0, Decimal(100), Decimal(1), "a")),
        (to_record(remove), remove),
    ]
    python = Triggers(ALLOWANCE_S, HORIZON_S)
    run_python(python, recs)
    evaluator = jvm.open(b"", ALLOWANCE_S, HORIZON_S)
    run_jvm(evaluator, recs, 0)
    for state in (python.dumps({0: len(recs)}), bytes(evaluator.state(False))):
        (feed,) = cep.CepState.FromString(state).feeds
        assert list(feed.periods) == [] and list(feed.forming) == []


def test_a_state_keeps_its_line_and_its_firings_carry_it(jvm) -> None:
    """A state begun afresh (no record to go on from) is a line of its own: recorded at once,
    before any record is read, kept by every record after, and on every firing, so a client
    and the gateways tell its firing 1 from the line before's."""
    ticker = TICKERS[0]
    cross = add_request("c", "x", ticker, cep.PriceCross(level="100", direction=cep.UP))
    cross.registered_ms = 1_000
    recs = [
        (to_record(cross), cross),
        (buy_of_one(ticker, "a", "99", T0), None),
        (buy_of_one(ticker, "b", "101", T0 + S), None),
    ]
    begun = cep.CepState(offsets={0: 0}, started_ms=1_234).SerializeToString()
    evaluator = jvm.open(begun, ALLOWANCE_S, HORIZON_S)
    first = evaluator.state(True)
    assert first is not None and cep.CepState.FromString(bytes(first)).started_ms == 1_234
    fired = [
        f.event
        for i, (value, _) in enumerate(recs)
        for f in cep.CepFirings.FromString(bytes(evaluator.judge(value, 0, i))).firings
    ]
    assert [(e.firing, e.evaluator_started_ms) for e in fired] == [(1, 1_234)]
    again = jvm.open(bytes(evaluator.state(False)), ALLOWANCE_S, HORIZON_S)
    assert cep.CepState.FromString(bytes(again.state(False))).started_ms == 1_234
