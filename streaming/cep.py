"""CEP triggers on one feed: which trades and closed candles fire them (#19).

The evaluator is fed what :mod:`streaming.feeds` judged, in the feed's Kafka order: each
timely, distinct trade (:meth:`FeedTriggers.trade`) and each idle mark
(:meth:`FeedTriggers.mark`), and the registrations and removals read with them. Nothing in it
reads a wall clock, so the same records from the same state give the same firings, each
numbered per trigger: a replay after a restart fires (trigger_id, firing) again, never a
new one.

Meanings (``proto/cep.proto`` is the contract):

- A trigger judges the trades read after its registration; its windows fill from then.
- A window is event time, ``(t - window_s, t]`` for a trade at ``t``, over the trades read
  so far (an out-of-order trade within the lateness allowance counts where its time puts it).
- A candle closes when the feed's watermark (clock minus the allowance) reaches its end, as
  :mod:`streaming.candles` closes it; its close is the trade with the latest time, the later
  read on a tie, as in ``ohlc``.
- Candle triggers judge the candles that close after their registration, when they close:
  before the trade that closed them is judged.
- A re-arming trigger fires again only at an event time ``cooldown_s`` or more after its last
  firing; a crossing needs a new crossing. A one-shot trigger is gone after its firing.
"""

from __future__ import annotations

import bisect
import pickle
from collections import deque
from dataclasses import dataclass, field
from decimal import Decimal

from candlewire.triggers import Trigger
from proto import cep_pb2 as cep

NS = 1_000_000_000
HUNDRED = Decimal(100)


@dataclass(frozen=True)
class Firing:
    trigger: Trigger
    firing: int  # 1 for the trigger's first firing
    event_time_ns: int
    value: Decimal  # what met the condition
    reference: Decimal  # what it was measured against

    def event(self, fired_time_ms: int) -> cep.CEPTriggerEvent:
        t = self.trigger
        return cep.CEPTriggerEvent(
            trigger_id=t.trigger_id,
            ticker=t.ticker,
            value=_text(self.value),
            fired_time_ms=fired_time_ms,
            event_time_ms=self.event_time_ns // 1_000_000,
            firing=self.firing,
            reference=_text(self.reference),
            client_id=t.client_id,
            user_id=t.user_id,
        )


def _text(d: Decimal) -> str:
    """A decimal as users write it: no exponent, no trailing zeros."""
    return format(d.normalize(), "f") if d else "0"


@dataclass
class _Armed:
    trigger: Trigger
    since: int  # the first trade sequence number it judges
    fired: int = 0
    next_ns: int = 0  # the earliest event time it may fire again
    before: bool = False  # price_cross: the last trade judged was short of the level


@dataclass(slots=True)
class _Candle:
    open_ms: int
    high: Decimal
    low: Decimal
    close: Decimal
    last_ns: int


@dataclass
class FeedTriggers:
    """One feed's triggers and the trades and candles they look back on."""

    ticker: str
    allowance_ns: int
    clock_ns: int = 0
    triggers: dict[str, _Armed] = field(default_factory=dict)
    seq: int = 0  # trades read
    # (t_ns, seq, price, size), sorted by time; as far back as the longest window needs.
    window: list[tuple[int, int, Decimal, Decimal]] = field(default_factory=list)
    forming: dict[int, dict[int, _Candle]] = field(default_factory=dict)  # period -> open_ms
    closed: dict[int, deque[_Candle]] = field(default_factory=dict)  # period -> last closed

    # -- registrations ---------------------------------------------------------------------

    def add(self, trigger: Trigger) -> None:
        """Register, or replace a trigger of the same id (which starts afresh)."""
        self.triggers[trigger.trigger_id] = _Armed(trigger, since=self.seq + 1)
        if trigger.on_candles:
            self.forming.setdefault(trigger.period_s, {})
            self.closed.setdefault(trigger.period_s, deque())

    def remove(self, trigger_id: str) -> bool:
        return self.triggers.pop(trigger_id, None) is not None

    def __len__(self) -> int:
        return len(self.triggers)

    # -- the judged records ----------------------------------------------------------------

    def trade(self, t_ns: int, price: Decimal, size: Decimal) -> list[Firing]:
        """A timely, distinct trade."""
        self.seq += 1
        self._fold(t_ns, price)
        fired = self._advance(t_ns)
        if any(a.trigger.window_s for a in self.triggers.values()):
            bisect.insort(self.window, (t_ns, self.seq, price, size))
        for armed in list(self.triggers.values()):
            kind = armed.trigger.kind
            if kind == "price_cross":
                hit = self._cross(armed, price)
            elif kind == "percent_move":
                hit = self._percent(armed, t_ns, price)
            elif kind == "window_volume":
                hit = self._volume(armed, t_ns)
            else:
                continue
            if hit is not None:
                fired.extend(self._fire(armed, t_ns, *hit))
        self._forget()
        return fired

    def mark(self, t_ns: int) -> list[Firing]:
        """An idle mark: the clock moves, and candles it closes are judged."""
        return self._advance(t_ns)

    # -- trade conditions ------------------------------------------------------------------

    def _cross(self, armed: _Armed, price: Decimal) -> tuple[Decimal, Decimal] | None:
        t = armed.trigger
        up = t.direction == cep.UP
        beyond = price >= t.level if up else price <= t.level
        was_before, armed.before = armed.before, (price < t.level if up else price > t.level)
        return (price, t.level) if beyond and was_before else None

    def _in_window(self, armed: _Armed, t_ns: int) -> list[tuple[int, int, Decimal, Decimal]]:
        start = t_ns - armed.trigger.window_s * NS
        lo = bisect.bisect_right(self.window, (start, float("inf")))
        hi = bisect.bisect_right(self.window, (t_ns, float("inf")))
        return [e for e in self.window[lo:hi] if e[1] >= armed.since]

    def _percent(self, armed: _Armed, t_ns: int, price: Decimal) -> tuple[Decimal, Decimal] | None:
        t = armed.trigger
        prices = [e[2] for e in self._in_window(armed, t_ns)]
        if not prices:
            return None
        if t.direction in (cep.UP, cep.EITHER):
            low = min(prices)
            if price >= low * (1 + t.level / HUNDRED):
                return (price / low - 1) * HUNDRED, low
        if t.direction in (cep.DOWN, cep.EITHER):
            high = max(prices)
            if price <= high * (1 - t.level / HUNDRED):
                return (price / high - 1) * HUNDRED, high
        return None

    def _volume(self, armed: _Armed, t_ns: int) -> tuple[Decimal, Decimal] | None:
        volume = sum((e[3] for e in self._in_window(armed, t_ns)), Decimal(0))
        return (volume, armed.trigger.level) if volume >= armed.trigger.level else None

    # -- candles ---------------------------------------------------------------------------

    def _fold(self, t_ns: int, price: Decimal) -> None:
        for period, forming in self.forming.items():
            open_ms = t_ns // 1_000_000 // (period * 1000) * (period * 1000)
            c = forming.get(open_ms)
            if c is None:
                forming[open_ms] = _Candle(open_ms, price, price, price, t_ns)
                continue
            c.high, c.low = max(c.high, price), min(c.low, price)
            if t_ns >= c.last_ns:  # the later read wins a tie, as in ``ohlc``
                c.close, c.last_ns = price, t_ns

    def _advance(self, t_ns: int) -> list[Firing]:
        """The clock moves forward; candles behind the new watermark close, oldest first."""
        if t_ns <= self.clock_ns:
            return []
        self.clock_ns = t_ns
        watermark_ms = (t_ns - self.allowance_ns) // 1_000_000
        fired: list[Firing] = []
        for period, forming in self.forming.items():
            done = sorted(o for o in forming if o + period * 1000 <= watermark_ms)
            for open_ms in done:
                fired.extend(self._closed(period, forming.pop(open_ms)))
        return fired

    def _closed(self, period: int, candle: _Candle) -> list[Firing]:
        history = self.closed[period]
        end_ns = (candle.open_ms + period * 1000) * 1_000_000
        fired: list[Firing] = []
        for armed in list(self.triggers.values()):
            t = armed.trigger
            if t.period_s != period:
                continue
            hit: tuple[Decimal, Decimal] | None = None
            if t.kind == "candle_close":
                met = candle.close >= t.level if t.direction == cep.UP else candle.close <= t.level
                hit = (candle.close, t.level) if met else None
            elif t.kind == "range_breakout" and len(history) >= t.candles:
                before = list(history)[-t.candles :]
                if t.direction == cep.UP:
                    top = max(c.high for c in before)
                    hit = (candle.close, top) if candle.close > top else None
                else:
                    bottom = min(c.low for c in before)
                    hit = (candle.close, bottom) if candle.close < bottom else None
            if hit is not None:
                fired.extend(self._fire(armed, end_ns, *hit))
        history.append(candle)
        keep = max((a.trigger.candles for a in self.triggers.values()), default=0)
        while len(history) > keep:
            history.popleft()
        return fired

    # -- firing ----------------------------------------------------------------------------

    def _fire(self, armed: _Armed, t_ns: int, value: Decimal, ref: Decimal) -> list[Firing]:
        if t_ns < armed.next_ns:
            return []
        t = armed.trigger
        armed.fired += 1
        armed.next_ns = t_ns + t.cooldown_s * NS
        if t.once:
            del self.triggers[t.trigger_id]
        return [Firing(t, armed.fired, t_ns, value, ref)]

    def _forget(self) -> None:
        """Trades no window can reach: a timely trade is at most the allowance behind the
        clock, so its window starts after clock - allowance - the longest window."""
        longest = max((a.trigger.window_s for a in self.triggers.values()), default=0)
        start = self.clock_ns - self.allowance_ns - longest * NS
        cut = bisect.bisect_right(self.window, (start, float("inf")))
        if cut:
            del self.window[:cut]


@dataclass
class Triggers:
    """Every feed's triggers, as the committing query evaluates them (#19).

    Registrations come from the ``candlewire.triggers`` topic, read up to its end at the start
    of each batch (``registry_offset`` is where the next read starts); they take effect
    before that batch's trades. The whole state is recorded with each commit
    (:meth:`dumps`), with the firings the batch made, so a batch replayed after a crash
    starts from the state before it and makes the same firings, and firings recorded but
    not yet sent are sent on restart.
    """

    allowance_ns: int
    feeds: dict[str, FeedTriggers] = field(default_factory=dict)
    registry_offset: int = 0

    def apply(self, req: cep.CEPTriggerRequest) -> None:
        """An ADD or REMOVE record of the registry topic."""
        from candlewire.triggers import TriggerRejected, parse_trigger

        if req.action == cep.REMOVE:
            feed = self.feeds.get(req.ticker)
            if feed is not None:
                feed.remove(req.trigger_id)
            return
        for other in self.feeds.values():  # an id moves if it is registered again elsewhere
            other.remove(req.trigger_id)
        try:
            trigger = parse_trigger(req)
        except TriggerRejected:
            return  # the desk checked it; a record it would refuse changes nothing
        feed = self.feeds.get(trigger.ticker)
        if feed is None:
            feed = self.feeds[trigger.ticker] = FeedTriggers(trigger.ticker, self.allowance_ns)
        feed.add(trigger)

    def tickers(self) -> list[str]:
        return sorted(t for t, f in self.feeds.items() if len(f))

    def judge(
        self, rows: list[tuple[str, bool, int, Decimal | None, Decimal | None]]
    ) -> list[Firing]:
        """Rows (ticker, idle, t_ns, price, size) of timely distinct trades and idle marks,
        in Kafka order."""
        fired: list[Firing] = []
        for ticker, idle, t_ns, price, size in rows:
            feed = self.feeds.get(ticker)
            if feed is None:
                continue
            if idle:
                fired += feed.mark(t_ns)
            else:
                assert price is not None and size is not None
                fired += feed.trade(t_ns, price, size)
        for ticker in [t for t, f in self.feeds.items() if not len(f)]:
            del self.feeds[ticker]
        return fired

    def dumps(self) -> bytes:
        return pickle.dumps(self, protocol=pickle.HIGHEST_PROTOCOL)

    @staticmethod
    def loads(data: bytes) -> Triggers:
        return pickle.loads(data)
