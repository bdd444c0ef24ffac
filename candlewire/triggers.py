"""A CEP trigger request checked once, into the one shape everything else uses (#19).

The relay refuses what is wrong with a request on its face, the stream processor what needs
state (symbol metadata, the owner's count), and the client the same before it sends: all
three call :func:`parse_trigger`, so a request means the same thing everywhere. Decimals
stay :class:`~decimal.Decimal` (prices are compared exactly, as candles are built).
"""

from __future__ import annotations

from dataclasses import dataclass
from decimal import Decimal, InvalidOperation

from candlewire.amounts import plain
from candlewire.config import PERIODS_S
from candlewire.errors import CandlewireError
from candlewire.topics import TopicError, check_id, parse_ticker
from proto import cep_pb2 as cep

KINDS = ("price_cross", "percent_move", "window_volume", "candle_close", "range_breakout")
Condition = (
    cep.PriceCross | cep.PercentMove | cep.WindowVolume | cep.CandleClose | cep.RangeBreakout
)
_FIELD = {
    cep.PriceCross: "price_cross",
    cep.PercentMove: "percent_move",
    cep.WindowVolume: "window_volume",
    cep.CandleClose: "candle_close",
    cep.RangeBreakout: "range_breakout",
}
DIRECTIONS = {"up": cep.UP, "down": cep.DOWN, "either": cep.EITHER}
MAX_WINDOW_S = 7 * 86_400
MAX_COOLDOWN_S = 30 * 86_400
MAX_CANDLES = 1_000
MAX_PERCENT = Decimal(1_000)


class TriggerRejected(CandlewireError, ValueError):
    """Why a trigger request is refused; ``reason`` is a ``TriggerRejectReason``."""

    def __init__(self, reason: int, message: str) -> None:
        super().__init__(message)
        self.reason = reason
        self.message = message


@dataclass(frozen=True)
class Trigger:
    """One registered condition on one feed, and what to do when it is met."""

    trigger_id: str
    client_id: str
    user_id: str
    ticker: str
    kind: str  # one of KINDS
    direction: int  # cep.Direction; UP for window_volume
    level: Decimal = Decimal(0)  # price_cross, candle_close: the level; percent_move: percent;
    # window_volume: the volume
    window_s: int = 0  # percent_move, window_volume
    period_s: int = 0  # candle_close, range_breakout
    candles: int = 0  # range_breakout
    once: bool = True
    cooldown_s: int = 0
    critical: bool = False
    notification_topic: str = ""
    registered_ms: int = 0  # the desk's, at the ADD it accepted: names this registration

    @property
    def on_candles(self) -> bool:
        return self.kind in ("candle_close", "range_breakout")


def _bad(message: str) -> TriggerRejected:
    return TriggerRejected(cep.BAD_TRIGGER, message)


def _decimal(text: str, what: str, *, positive: bool = True) -> Decimal:
    try:
        value = Decimal(text)
    except (InvalidOperation, TypeError):
        raise _bad(f"{what} {text!r} is not a decimal") from None
    if not value.is_finite() or (positive and value <= 0):
        raise _bad(f"{what} {text!r} must be a finite number above 0")
    if value.adjusted() > 20 or value.as_tuple().exponent < -18:  # DECIMAL(38, 18)
        raise _bad(f"{what} {text!r} is out of range (at most 20 digits, 18 decimals)")
    return value


def _window(window_s: int) -> int:
    if not 1 <= window_s <= MAX_WINDOW_S:
        raise _bad(f"window_s {window_s} must be 1..{MAX_WINDOW_S}")
    return window_s


def _period(period_s: int) -> int:
    if period_s not in PERIODS_S:
        raise _bad(f"period_s {period_s} not in {list(PERIODS_S)}")
    return period_s


def _direction(direction: int, *, either: bool = False) -> int:
    allowed = (cep.UP, cep.DOWN, cep.EITHER) if either else (cep.UP, cep.DOWN)
    if direction not in allowed:
        names = ", ".join(cep.Direction.Name(d) for d in allowed)
        raise _bad(f"direction must be one of {names}")
    return direction


def check_owner(req: cep.CEPTriggerRequest) -> None:
    """What every action needs: a well-formed owner and, but for LIST, trigger id."""
    try:
        check_id(req.client_id, "client_id")
        if req.user_id:
            check_id(req.user_id, "user_id")
        if req.action != cep.LIST:
            check_id(req.trigger_id, "trigger_id")
        if req.request_id:
            check_id(req.request_id, "request_id")
    except TopicError as exc:
        raise _bad(str(exc)) from None
    if req.action not in (cep.ADD, cep.REMOVE, cep.LIST):
        raise _bad(f"unknown action {req.action}")


def parse_trigger(req: cep.CEPTriggerRequest) -> Trigger:
    """An ADD request as a :class:`Trigger`, or :class:`TriggerRejected` saying why not."""
    check_owner(req)
    if req.action != cep.ADD:
        raise _bad("only an ADD request describes a trigger")
    try:
        parse_ticker(req.ticker)
    except TopicError as exc:
        raise _bad(str(exc)) from None
    if req.cooldown_s > MAX_COOLDOWN_S:
        raise _bad(f"cooldown_s {req.cooldown_s} is above {MAX_COOLDOWN_S}")
    if req.once and req.cooldown_s:
        raise _bad("a one-shot trigger has no cooldown_s")
    kind = req.WhichOneof("condition")
    common = {
        "trigger_id": req.trigger_id,
        "client_id": req.client_id,
        "user_id": req.user_id,
        "ticker": req.ticker,
        "kind": kind,
        "once": req.once,
        "cooldown_s": req.cooldown_s,
        "critical": req.critical,
        "notification_topic": req.notification_topic,
        "registered_ms": req.registered_ms,
    }
    if kind == "price_cross":
        c = req.price_cross
        return Trigger(
            **common, direction=_direction(c.direction), level=_decimal(c.level, "level")
        )
    if kind == "percent_move":
        c = req.percent_move
        percent = _decimal(c.percent, "percent")
        if percent > MAX_PERCENT:
            raise _bad(f"percent {c.percent} is above {MAX_PERCENT}")
        return Trigger(
            **common,
            direction=_direction(c.direction, either=True),
            level=percent,
            window_s=_window(c.window_s),
        )
    if kind == "window_volume":
        c = req.window_volume
        return Trigger(
            **common,
            direction=cep.UP,
            level=_decimal(c.volume, "volume"),
            window_s=_window(c.window_s),
        )
    if kind == "candle_close":
        c = req.candle_close
        return Trigger(
            **common,
            direction=_direction(c.direction),
            level=_decimal(c.level, "level"),
            period_s=_period(c.period_s),
        )
    if kind == "range_breakout":
        c = req.range_breakout
        if not 1 <= c.candles <= MAX_CANDLES:
            raise _bad(f"candles {c.candles} must be 1..{MAX_CANDLES}")
        return Trigger(
            **common,
            direction=_direction(c.direction),
            period_s=_period(c.period_s),
            candles=c.candles,
        )
    raise _bad("no condition: set one of " + ", ".join(KINDS))


def condition(kind: str, **params: object) -> Condition:
    """A condition by name, e.g. ``condition("price_cross", level="70000", direction="up")``
    (what the CLI builds); ``direction`` may be a name or a ``Direction`` value."""
    by_name = {v: k for k, v in _FIELD.items()}
    if kind not in by_name:
        raise TriggerRejected(cep.BAD_TRIGGER, f"unknown kind {kind!r}: one of {', '.join(KINDS)}")
    direction = params.get("direction")
    if isinstance(direction, str):
        if direction not in DIRECTIONS:
            raise TriggerRejected(cep.BAD_TRIGGER, f"direction {direction!r}: up, down or either")
        params["direction"] = DIRECTIONS[direction]
    given = {k: v for k, v in params.items() if v is not None}
    # Each kind's every parameter is needed (a direction too, but for window_volume's, which
    # has none): one message naming them all, not the first value found empty.
    missing = [f.name for f in by_name[kind].DESCRIPTOR.fields if f.name not in given]
    if missing:
        raise TriggerRejected(cep.BAD_TRIGGER, f"{kind} needs {', '.join(missing)}")
    try:
        return by_name[kind](**given)
    except (ValueError, TypeError) as exc:
        raise TriggerRejected(cep.BAD_TRIGGER, f"{kind}: {exc}") from None


def add_request(
    client_id: str,
    trigger_id: str,
    ticker: str,
    cond: Condition,
    *,
    user_id: str = "",
    once: bool = True,
    cooldown_s: int = 0,
    critical: bool = False,
    request_id: str = "",
) -> cep.CEPTriggerRequest:
    """The ADD request for ``cond`` on ``ticker``, as :meth:`Client.add_trigger` sends it."""
    req = cep.CEPTriggerRequest(
        trigger_id=trigger_id,
        client_id=client_id,
        user_id=user_id,
        ticker=ticker,
        action=cep.ADD,
        once=once,
        cooldown_s=cooldown_s,
        critical=critical,
        request_id=request_id,
    )
    getattr(req, _FIELD[type(cond)]).CopyFrom(cond)
    return req


def trigger_request(t: Trigger) -> cep.CEPTriggerRequest:
    """The ADD request :func:`parse_trigger` makes ``t`` of (a recorded state keeps triggers
    so, as the contract spells them)."""
    level = str(t.level)
    cond: Condition
    if t.kind == "price_cross":
        cond = cep.PriceCross(level=level, direction=t.direction)
    elif t.kind == "percent_move":
        cond = cep.PercentMove(percent=level, window_s=t.window_s, direction=t.direction)
    elif t.kind == "window_volume":
        cond = cep.WindowVolume(volume=level, window_s=t.window_s)
    elif t.kind == "candle_close":
        cond = cep.CandleClose(period_s=t.period_s, level=level, direction=t.direction)
    else:
        cond = cep.RangeBreakout(period_s=t.period_s, candles=t.candles, direction=t.direction)
    req = add_request(
        t.client_id,
        t.trigger_id,
        t.ticker,
        cond,
        user_id=t.user_id,
        once=t.once,
        cooldown_s=t.cooldown_s,
        critical=t.critical,
    )
    req.notification_topic = t.notification_topic
    req.registered_ms = t.registered_ms
    return req


def describe(t: Trigger) -> str:
    """What ``t`` waits for, in words (``trigger ls``): the same fields the evaluator reads,
    e.g. ``crosses 70000 upward`` or ``a 60 s candle closes above the high of the 20 before``."""
    up = t.direction == cep.UP
    level = plain(t.level)
    if t.kind == "price_cross":
        return f"crosses {level} {'upward' if up else 'downward'}"
    if t.kind == "percent_move":
        move = "moves" if t.direction == cep.EITHER else "rises" if up else "falls"
        return f"{move} {level} % within {t.window_s} s"
    if t.kind == "window_volume":
        return f"volume reaches {level} within {t.window_s} s"
    if t.kind == "candle_close":
        return f"a {t.period_s} s candle closes at or {'above' if up else 'below'} {level}"
    side = "above the high" if up else "below the low"
    return f"a {t.period_s} s candle closes {side} of the {t.candles} before"


FiringKey = tuple[str, int, int, int]


def firing_key(event: cep.CEPTriggerEvent) -> FiringKey:
    """What names one firing, so that one sent again is known and no other is taken for it:
    the registration (a trigger added again numbers afresh) and the evaluator's line of
    states (a restart with no record to go on from numbers afresh too)."""
    return (event.trigger_id, event.registered_ms, event.evaluator_started_ms, event.firing)
