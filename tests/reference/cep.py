"""Test reference, not run by the platform: trigger semantics, the second, Python copy of the
rules that run in ``jvm/decoder``'s ``Triggers`` and ``FeedTriggers`` (the live path of
both engines). tests/streaming/test_cep_jvm.py holds the JVM's firings to this module's.

CEP triggers on each feed: which trades and closed candles fire them (#19).

:class:`Triggers` is fed one feed's records in Kafka order: its registrations and removals,
its trades (judged here as :mod:`tests.reference.feeds` judges them: a resend or a late trade
fires nothing) and its idle marks. :class:`FeedTriggers` holds one feed's triggers and
what they look back on. Nothing here reads a wall clock, so the same records from the same
state give the same firings, each numbered per trigger: a replay after a restart fires
(trigger_id, firing) again, never a new one.

Meanings (``proto/cep.proto`` is the contract):

- A trigger judges the trades read after its registration; its windows fill from then.
- A window is event time, ``(t - window_s, t]`` for a trade at ``t``, over the trades read
  so far (an out-of-order trade within the lateness allowance counts where its time puts it).
- A candle closes when the feed's watermark (clock minus the allowance) reaches its end, as
  :mod:`tests.reference.candles` closes it; its close is the trade with the latest time, the later
  read on a tie, as in ``ohlc``.
- Candle triggers judge the candles that close after their registration, when they close:
  before the trade that closed them is judged.
- A re-arming trigger fires again only at an event time ``cooldown_s`` or more after its last
  firing; a crossing needs a new crossing. A one-shot trigger is gone after its firing.
"""

from __future__ import annotations

import bisect
from collections import deque
from dataclasses import dataclass, field
from decimal import Decimal

from candlewire.market import plain
from candlewire.triggers import Trigger, TriggerRejected, parse_trigger, trigger_request
from proto import cep_pb2 as cep
from tests.reference.feeds import Feed, Feeds, Verdict

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
            value=plain(self.value),
            fired_time_ms=fired_time_ms,
            event_time_ms=self.event_time_ns // 1_000_000,
            firing=self.firing,
            reference=plain(self.reference),
            client_id=t.client_id,
            user_id=t.user_id,
            registered_ms=t.registered_ms,
        )


@dataclass
class _Armed:
    trigger: Trigger
    since: int  # the first trade sequence number it judges
    from_ns: int = 0  # a candle trigger judges candles opening after it: the clock at its add
    fired: int = 0
    next_ns: int = 0  # the earliest event time it may fire again


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
    # price_cross triggers by level, so a trade finds the levels it crossed by bisection
    # instead of asking every trigger: (level, trigger_id), sorted.
    ups: list[tuple[Decimal, str]] = field(default_factory=list)
    downs: list[tuple[Decimal, str]] = field(default_factory=list)
    windowed: dict[str, None] = field(default_factory=dict)  # percent_move, window_volume
    on_candles: dict[str, None] = field(default_factory=dict)  # candle_close, range_breakout
    last_price: Decimal | None = None  # of the last trade judged
    # What the triggers look back on, kept as they change rather than asked of every
    # trigger per trade: the longest window (s) and the most closed candles one needs.
    longest_s: int = 0
    most_candles: int = 0
    unused: bool = False  # a candle trigger went: its period's candles may be unused

    # -- registrations ---------------------------------------------------------------------

    def add(self, trigger: Trigger) -> None:
        """Register, or replace a trigger of the same id (which starts afresh)."""
        self.remove(trigger.trigger_id)
        self.triggers[trigger.trigger_id] = _Armed(
            trigger, since=self.seq + 1, from_ns=self.clock_ns
        )
        if trigger.kind == "price_cross":
            levels = self.ups if trigger.direction == cep.UP else self.downs
            bisect.insort(levels, (trigger.level, trigger.trigger_id))
        elif trigger.window_s:
            self.windowed[trigger.trigger_id] = None
        if trigger.on_candles:
            self.on_candles[trigger.trigger_id] = None
            self.forming.setdefault(trigger.period_s, {})
            self.closed.setdefault(trigger.period_s, deque())
        self._measure()

    def remove(self, trigger_id: str) -> bool:
        armed = self.triggers.pop(trigger_id, None)
        if armed is None:
            return False
        t = armed.trigger
        if t.kind == "price_cross":
            levels = self.ups if t.direction == cep.UP else self.downs
            levels.pop(bisect.bisect_left(levels, (t.level, t.trigger_id)))
        self.windowed.pop(trigger_id, None)
        self.on_candles.pop(trigger_id, None)
        self.unused |= t.on_candles
        self._measure()
        return True

    def _measure(self) -> None:
        armed = [self.triggers[t].trigger for t in (*self.windowed, *self.on_candles)]
        self.longest_s = max((t.window_s for t in armed), default=0)
        self.most_candles = max((t.candles for t in armed), default=0)

    def __len__(self) -> int:
        return len(self.triggers)

    # -- the recorded state (proto/cep.proto's CepFeed) ------------------------------------

    def state(self, judged: Feed | None) -> cep.CepFeed:
        self._prune()  # not recorded: the flag is not, and a restored feed would keep them
        judged = judged or Feed()
        return cep.CepFeed(
            ticker=self.ticker,
            clock_ns=self.clock_ns,
            seq=self.seq,
            last_price="" if self.last_price is None else str(self.last_price),
            armed=[
                cep.CepArmed(
                    trigger=trigger_request(a.trigger),
                    since=a.since,
                    fired=a.fired,
                    next_ns=a.next_ns,
                    from_ns=a.from_ns,
                )
                for a in self.triggers.values()
            ],
            window=[
                cep.CepTrade(time_ns=t, seq=n, price=str(p), size=str(z))
                for t, n, p, z in self.window
            ],
            periods=list(self.forming),
            forming=[_candle_state(p, c) for p, f in self.forming.items() for c in f.values()],
            closed=[_candle_state(p, c) for p, d in self.closed.items() for c in d],
            judged_clock_ns=judged.clock_ns,
            trade_ids=[i for _, i in judged.order],
            trade_times_ns=[t for t, _ in judged.order],
        )

    @classmethod
    def from_state(cls, msg: cep.CepFeed, allowance_ns: int) -> tuple[FeedTriggers, Feed]:
        """The feed as recorded, and its judged trades."""
        feed = cls(msg.ticker, allowance_ns)
        for period in msg.periods:  # first: the order candles close in across periods
            feed.forming[period], feed.closed[period] = {}, deque()
        for a in msg.armed:
            feed.seq = a.since - 1  # add() arms a trigger from the next trade on
            feed.add(parse_trigger(a.trigger))
            armed = feed.triggers[a.trigger.trigger_id]
            armed.fired, armed.next_ns, armed.from_ns = a.fired, a.next_ns, a.from_ns
        feed.clock_ns, feed.seq = msg.clock_ns, msg.seq
        feed.last_price = Decimal(msg.last_price) if msg.last_price else None
        feed.window = [(w.time_ns, w.seq, Decimal(w.price), Decimal(w.size)) for w in msg.window]
        for c in msg.forming:
            feed.forming[c.period_s][c.open_ms] = _candle(c)
        for c in msg.closed:
            feed.closed[c.period_s].append(_candle(c))
        judged = Feed(clock_ns=msg.judged_clock_ns)
        for trade_id, t_ns in zip(msg.trade_ids, msg.trade_times_ns, strict=True):
            judged.seen[trade_id] = t_ns
            judged.order.append((t_ns, trade_id))
        return feed, judged

    # -- the judged records ----------------------------------------------------------------

    def trade(self, t_ns: int, price: Decimal, size: Decimal) -> list[Firing]:
        """A timely, distinct trade."""
        self.seq += 1
        self._fold(t_ns, price)
        fired = self._advance(t_ns)
        for armed in self._crossed(price):
            fired.extend(self._fire(armed, t_ns, price, armed.trigger.level))
        if self.windowed:
            bisect.insort(self.window, (t_ns, self.seq, price, size))
        for trigger_id in list(self.windowed):
            armed = self.triggers[trigger_id]
            if armed.trigger.kind == "percent_move":
                hit = self._percent(armed, t_ns, price)
            else:
                hit = self._volume(armed, t_ns)
            if hit is not None:
                fired.extend(self._fire(armed, t_ns, *hit))
        self._forget()
        self._prune()
        return fired

    def mark(self, t_ns: int) -> list[Firing]:
        """An idle mark: the clock moves, and candles it closes are judged."""
        fired = self._advance(t_ns)
        self._prune()
        return fired

    def _prune(self) -> None:
        """Drop the candles of periods no trigger uses (no later one would judge them):
        after a record, not while its candles close (a one-shot removes itself as it fires)."""
        if not self.unused:
            return
        self.unused = False
        used = {self.triggers[t].trigger.period_s for t in self.on_candles}
        for period in [p for p in self.forming if p not in used]:
            del self.forming[period], self.closed[period]

    def revise(self, t_ns: int, price: Decimal) -> None:
        """A late trade inside the dedup horizon: into the candles still forming; no clock
        moves, nothing fires, a closed window stays as judged."""
        self._fold(t_ns, price)

    # -- trade conditions ------------------------------------------------------------------

    def _crossed(self, price: Decimal) -> list[_Armed]:
        """The price_cross triggers this trade crossed: UP levels in (last, price], DOWN
        levels in [price, last); a trigger registered since the last trade only learns
        which side the price is on."""
        last, self.last_price = self.last_price, price
        if last is None or price == last:
            return []
        if price > last:
            top = (price, "\U0010ffff")
            hits = self.ups[
                bisect.bisect_right(self.ups, (last, "\U0010ffff")) : bisect.bisect_right(
                    self.ups, top
                )
            ]
        else:
            hits = self.downs[
                bisect.bisect_left(self.downs, (price, "")) : bisect.bisect_left(
                    self.downs, (last, "")
                )
            ]
        armed = (self.triggers[trigger_id] for _, trigger_id in hits)
        return [a for a in armed if a.since < self.seq]

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
        watermark_ms = (self.clock_ns - self.allowance_ns) // 1_000_000
        for period, forming in self.forming.items():
            open_ms = t_ns // 1_000_000 // (period * 1000) * (period * 1000)
            c = forming.get(open_ms)
            if c is None:
                if open_ms + period * 1000 > watermark_ms:  # else closed: judged already
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
        for armed in [self.triggers[t] for t in self.on_candles]:
            t = armed.trigger
            if t.period_s != period or candle.open_ms * 1_000_000 <= armed.from_ns:
                continue
            hit: tuple[Decimal, Decimal] | None = None
            if t.kind == "candle_close":
                met = candle.close >= t.level if t.direction == cep.UP else candle.close <= t.level
                hit = (candle.close, t.level) if met else None
            elif t.kind == "range_breakout" and len(history) >= t.candles:
                before = list(history)[-t.candles :]
                if before[0].open_ms * 1_000_000 <= armed.from_ns:
                    continue  # a candle it would look back on holds trades from before it
                if t.direction == cep.UP:
                    top = max(c.high for c in before)
                    hit = (candle.close, top) if candle.close > top else None
                else:
                    bottom = min(c.low for c in before)
                    hit = (candle.close, bottom) if candle.close < bottom else None
            if hit is not None:
                fired.extend(self._fire(armed, end_ns, *hit))
        history.append(candle)
        while len(history) > self.most_candles:
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
            self.remove(t.trigger_id)
        return [Firing(t, armed.fired, t_ns, value, ref)]

    def _forget(self) -> None:
        """Trades no window can reach: a timely trade is at most the allowance behind the
        clock, so its window starts after clock - allowance - the longest window."""
        if not self.window:
            return
        start = self.clock_ns - self.allowance_ns - self.longest_s * NS
        cut = bisect.bisect_right(self.window, (start, float("inf")))
        if cut:
            del self.window[:cut]


def _candle_state(period: int, c: _Candle) -> cep.CepCandle:
    return cep.CepCandle(
        period_s=period,
        open_ms=c.open_ms,
        high=str(c.high),
        low=str(c.low),
        close=str(c.close),
        last_ns=c.last_ns,
    )


def _candle(c: cep.CepCandle) -> _Candle:
    return _Candle(c.open_ms, Decimal(c.high), Decimal(c.low), Decimal(c.close), c.last_ns)


# What the evaluating queries hand to :meth:`Triggers.judge`, in Kafka order: a feed's trade
# (valid, not yet judged), its idle mark, a registration or removal read from the ticks topic.
Trade = tuple[str, int, Decimal, Decimal, str]  # ticker, t_ns, price, size, trade_id
Mark = tuple[str, int]  # ticker, t_ns
Event = Trade | Mark | cep.CEPTriggerRequest


@dataclass
class Triggers:
    """Every feed's triggers (#19), as the live path's evaluator reads the ticks topic.

    Registrations and removals reach the ticks topic under their ticker (the desk writes
    them there too), so they meet the feed's trades in order. Trades are judged here
    (:class:`tests.reference.feeds.Feeds`: resends and late trades fire nothing; a late one
    inside the dedup horizon goes into the candles still forming, as into the published
    ones) from the first registration on a feed; the state (:meth:`dumps`) is the JVM's
    ``CepState``.
    """

    allowance_s: float
    horizon_s: float
    feeds: dict[str, FeedTriggers] = field(default_factory=dict)
    judged: Feeds = field(init=False)

    def __post_init__(self) -> None:
        self.judged = Feeds(self.allowance_s, self.horizon_s)

    def apply(self, req: cep.CEPTriggerRequest) -> None:
        """An ADD or REMOVE record."""
        feed = self.feeds.get(req.ticker)
        if req.action == cep.REMOVE:
            if feed is not None:
                feed.remove(req.trigger_id)
            return
        try:
            trigger = parse_trigger(req)
        except TriggerRejected:
            return  # the desk checked it; a record it would refuse changes nothing
        if feed is None:
            allowance_ns = int(self.allowance_s * NS)
            feed = self.feeds[trigger.ticker] = FeedTriggers(trigger.ticker, allowance_ns)
        feed.add(trigger)

    def tickers(self) -> set[str]:
        return set(self.feeds)

    def judge(self, events: list[Event]) -> list[Firing]:
        """Records in Kafka order. A feed whose last trigger goes is forgotten at once, its
        judged trades too, so a later trigger starts afresh wherever batches were cut."""
        fired: list[Firing] = []
        for e in events:
            if isinstance(e, cep.CEPTriggerRequest):
                self.apply(e)
                ticker = e.ticker
            else:
                ticker = e[0]
                feed = self.feeds.get(ticker)
                if feed is None:
                    continue
                if len(e) == 2:
                    self.judged.mark(ticker, e[1])
                    fired += feed.mark(e[1])
                else:
                    _, t_ns, price, size, trade_id = e  # type: ignore[misc]
                    verdict = self.judged.admit(ticker, trade_id, t_ns)
                    if verdict is Verdict.KEEP:
                        fired += feed.trade(t_ns, price, size)
                    elif verdict is Verdict.REVISE:
                        feed.revise(t_ns, price)
            feed = self.feeds.get(ticker)
            if feed is not None and not len(feed):
                del self.feeds[ticker]
                self.judged.feeds.pop(ticker, None)
        return fired

    def dumps(self, offsets: dict[int, int] | None = None) -> bytes:
        """The state as ``CepState`` (``proto/cep.proto``), which the JVM's evaluator reads
        and writes too."""
        state = cep.CepState(offsets=offsets or {})
        for ticker, feed in self.feeds.items():
            state.feeds.append(feed.state(self.judged.feeds.get(ticker)))
        return state.SerializeToString()

    @classmethod
    def loads(cls, data: bytes, allowance_s: float, horizon_s: float) -> Triggers:
        """A recorded ``CepState``; a record it cannot read raises (the caller starts from
        the registry instead)."""
        state = cep.CepState.FromString(data)
        triggers = cls(allowance_s, horizon_s)
        for msg in state.feeds:
            feed, judged = FeedTriggers.from_state(msg, int(allowance_s * NS))
            if len(feed):
                triggers.feeds[msg.ticker], triggers.judged.feeds[msg.ticker] = feed, judged
        return triggers
