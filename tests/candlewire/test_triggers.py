"""Trigger requests: what each kind means, and a specific reason for each refusal."""

from __future__ import annotations

from decimal import Decimal

import pytest

from candlewire.triggers import (
    TriggerRejected,
    condition,
    describe,
    parse_trigger,
    trigger_request,
)
from proto import cep_pb2 as cep


def request(**kw) -> cep.CEPTriggerRequest:
    base = {
        "trigger_id": "t-1",
        "client_id": "client-1",
        "user_id": "alice",
        "ticker": "BINANCE:BTC/USDT",
        "action": cep.ADD,
        "once": True,
    }
    return cep.CEPTriggerRequest(**{**base, **kw})


def test_each_kind_parses_to_its_parameters() -> None:
    t = parse_trigger(request(price_cross=cep.PriceCross(level="65000.5", direction=cep.UP)))
    assert (t.kind, t.level, t.direction, t.once) == (
        "price_cross",
        Decimal("65000.5"),
        cep.UP,
        True,
    )
    t = parse_trigger(
        request(
            once=False,
            cooldown_s=600,
            percent_move=cep.PercentMove(percent="3", window_s=300, direction=cep.EITHER),
        )
    )
    assert (t.kind, t.level, t.window_s, t.cooldown_s) == ("percent_move", 3, 300, 600)
    t = parse_trigger(request(window_volume=cep.WindowVolume(volume="12.5", window_s=60)))
    assert (t.kind, t.level, t.window_s) == ("window_volume", Decimal("12.5"), 60)
    t = parse_trigger(
        request(candle_close=cep.CandleClose(period_s=3600, level="1", direction=cep.DOWN))
    )
    assert (t.kind, t.period_s, t.on_candles) == ("candle_close", 3600, True)
    t = parse_trigger(
        request(range_breakout=cep.RangeBreakout(period_s=300, candles=20, direction=cep.UP))
    )
    assert (t.kind, t.period_s, t.candles) == ("range_breakout", 300, 20)


@pytest.mark.parametrize(
    "condition",
    [
        {"price_cross": cep.PriceCross(level="65000.50", direction=cep.DOWN)},
        {"percent_move": cep.PercentMove(percent="1E+1", window_s=300, direction=cep.EITHER)},
        {"window_volume": cep.WindowVolume(volume="12.5", window_s=60)},
        {"candle_close": cep.CandleClose(period_s=3600, level="1", direction=cep.UP)},
        {"range_breakout": cep.RangeBreakout(period_s=300, candles=20, direction=cep.DOWN)},
    ],
)
def test_a_trigger_is_recorded_as_the_request_it_was_made_of(condition: dict) -> None:
    """A recorded state keeps triggers as requests (proto/cep.proto's CepArmed)."""
    req = request(
        once=False,
        cooldown_s=60,
        critical=True,
        notification_topic="RESPONSE:client-1",
        **condition,
    )
    back = trigger_request(parse_trigger(req))
    assert back == req
    assert parse_trigger(back) == parse_trigger(req)


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"trigger_id": "a b"}, "trigger_id"),
        ({"client_id": ""}, "client_id"),
        ({"ticker": "btc"}, "EXCHANGE:BASE/QUOTE"),
        ({}, "no condition"),
        ({"price_cross": cep.PriceCross(level="abc", direction=cep.UP)}, "not a decimal"),
        ({"price_cross": cep.PriceCross(level="-1", direction=cep.UP)}, "above 0"),
        ({"price_cross": cep.PriceCross(level="NaN", direction=cep.UP)}, "finite"),
        ({"price_cross": cep.PriceCross(level="1e30", direction=cep.UP)}, "out of range"),
        ({"price_cross": cep.PriceCross(level="1", direction=cep.EITHER)}, "direction"),
        ({"percent_move": cep.PercentMove(percent="3", window_s=0, direction=cep.UP)}, "window_s"),
        ({"percent_move": cep.PercentMove(percent="5000", window_s=5, direction=cep.UP)}, "above"),
        ({"candle_close": cep.CandleClose(period_s=61, level="1", direction=cep.UP)}, "period_s"),
        (
            {"range_breakout": cep.RangeBreakout(period_s=60, candles=0, direction=cep.UP)},
            "candles",
        ),
        (
            {"cooldown_s": 60, "price_cross": cep.PriceCross(level="1", direction=cep.UP)},
            "one-shot",
        ),
        ({"action": 9, "price_cross": cep.PriceCross(level="1", direction=cep.UP)}, "action"),
    ],
)
def test_bad_requests_are_refused_with_the_reason(fields: dict, message: str) -> None:
    with pytest.raises(TriggerRejected, match=message) as err:
        parse_trigger(request(**fields))
    assert err.value.reason == cep.BAD_TRIGGER


@pytest.mark.parametrize(
    ("condition", "said"),
    [
        (
            {"price_cross": cep.PriceCross(level="7E+4", direction=cep.UP)},
            "crosses 70000 upward",
        ),
        (
            {"price_cross": cep.PriceCross(level="0.50", direction=cep.DOWN)},
            "crosses 0.5 downward",
        ),
        (
            {"percent_move": cep.PercentMove(percent="3", window_s=300, direction=cep.DOWN)},
            "falls 3 % within 300 s",
        ),
        (
            {"percent_move": cep.PercentMove(percent="2.5", window_s=60, direction=cep.EITHER)},
            "moves 2.5 % within 60 s",
        ),
        (
            {"window_volume": cep.WindowVolume(volume="1000.000", window_s=60)},
            "volume reaches 1000 within 60 s",
        ),
        (
            {"candle_close": cep.CandleClose(period_s=3600, level="65000", direction=cep.DOWN)},
            "a 3600 s candle closes at or below 65000",
        ),
        (
            {"range_breakout": cep.RangeBreakout(period_s=60, candles=20, direction=cep.UP)},
            "a 60 s candle closes above the high of the 20 before",
        ),
    ],
)
def test_each_kind_is_described_by_the_parameters_it_is_judged_on(condition, said) -> None:
    assert describe(parse_trigger(request(**condition))) == said


@pytest.mark.parametrize(
    ("kind", "given", "says"),
    [
        ("percent_move", {}, "percent_move needs percent, window_s, direction"),
        ("percent_move", {"percent": "1", "direction": "up"}, "percent_move needs window_s"),
        ("window_volume", {"window_s": 60}, "window_volume needs volume"),
        ("range_breakout", {"period_s": 60, "direction": "up"}, "range_breakout needs candles"),
    ],
)
def test_a_condition_missing_parameters_names_them_all(kind: str, given: dict, says: str) -> None:
    """What ``candlewire trigger add`` says when flags are left out, instead of the first
    empty value judged as a malformed one."""
    with pytest.raises(TriggerRejected) as raised:
        condition(kind, level=None, **given)
    assert str(raised.value) == says and raised.value.reason == cep.BAD_TRIGGER


def test_a_firing_is_kept_once_per_registration_not_once_per_trigger_id() -> None:
    """A one-shot removed as it fires and added again under its id fires as firing 1 again:
    the inbox kept the first and took the second for a repeat, and the gateways' event id
    said the same (both by (trigger_id, firing))."""
    from candlewire._protocol import NotificationInbox
    from proto.envelope import encode_topic

    inbox = NotificationInbox()

    def firing(registered_ms: int, line: int = 0) -> cep.CEPTriggerEvent:
        return cep.CEPTriggerEvent(
            trigger_id="t", firing=1, registered_ms=registered_ms, evaluator_started_ms=line
        )

    # (2_000, 7): the stream job restarted with no record of its triggers' state, which
    # numbers the same registration's firings from 1 again, in a line of its own.
    sent = [firing(1_000), firing(1_000), firing(2_000), firing(2_000), firing(2_000, 7)]
    for event in [*sent, firing(2_000, 7)]:
        inbox.offer(encode_topic("RESPONSE:c", event))
    taken = [inbox.take_firing() for _ in range(4)]
    assert [(e.registered_ms, e.evaluator_started_ms) if e else None for e in taken] == [
        (1_000, 0),
        (2_000, 0),
        (2_000, 7),
        None,
    ]
