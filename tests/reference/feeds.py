"""Test reference, not run by the platform: judging (resends, late trades, each feed's clock)
as the second, Python copy of the rules that run in ``jvm/decoder``'s ``FeedState``
(``TradeIds`` for the dedup horizon), which the committing query and the live path of both
engines run. Tests hold the JVM's verdicts to this module's
(tests/streaming/test_sql.py, test_live_jvm.py, test_cep_jvm.py).

Event time per feed, and one count per trade.

Each ticker is a feed with its own event clock: the largest event time of its trades read so
far, in Kafka order (a ticker's trades share one partition, keyed by ticker). A feed minutes
or hours behind the others, a venue that reconnects and catches up, or a replay with its
original timestamps therefore gets complete candles, while a maximum over all feeds would
call every one of its trades late.

Every tick is judged once, in the order Kafka holds it, by :meth:`Feeds.admit`:

- **duplicate**: its (ticker, trade_id) was seen within the dedup horizon. It changes
  nothing: it is not stored again, not counted, not published.
- **revise**: older than its own feed's clock minus the lateness allowance, but with a trade
  id and within the dedup horizon, so a resend of it is still recognised: typically a trade
  lost upstream and fetched again after a gap (docs/explanation/gaps.md). It is stored, and
  folded into its candles: a forming one as any trade, a closed one as a *revision*, which
  the live stream publishes again (closed, ``revision`` one higher) and ``ohlc`` takes.
- **late**: as late, but beyond the horizon (or without a trade id): it could be a resend
  nothing remembers, so it is stored in ``ticks`` and counted, and changes no candle.
- **keep**: everything else.

The verdict depends only on the ticks before it in Kafka, never on where micro-batches were
cut, so every path reaches the same verdicts, and the last live update of every window equals
its ``ohlc`` row. A tick without a trade_id cannot be matched and is never taken for a
duplicate; it is counted.

A quiet feed's clock does not move by itself. The job writes an idle mark (``FeedIdle``) into
the ticks topic for a feed that has been quiet for ``stream_idle_timeout_s``: read in order
like a trade, it moves that feed's clock as far as the feed would have gone (its last event
time plus the wall time it has been quiet), so its last candles close and reach ``ohlc``.

State is bounded: seen trade ids older than the horizon behind their feed's clock are
forgotten, and the horizon must exceed the lateness allowance (a resend older than the
horizon is late anyway, and changes no candle).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field
from decimal import Decimal, InvalidOperation
from enum import IntEnum


def held(text: str) -> bool:
    """Whether DECIMAL(38,18), the tables' type, holds a price or size exactly (``DecodeTick
    .held``): at most 20 digits before the point and 18 after, trailing zeros aside. A
    trade whose price or size it does not hold is bad, judged by no rule below."""
    try:
        value = Decimal(text)
    except InvalidOperation:
        return False
    if not value.is_finite():
        return False
    if not value:
        return True
    _sign, digits, exponent = value.as_tuple()
    exponent = int(exponent)
    while digits[-1] == 0:  # trailing zeros aside (not ``normalize``: 28 digits at most)
        digits, exponent = digits[:-1], exponent + 1
    return exponent >= -18 and len(digits) + exponent <= 20


class Verdict(IntEnum):
    KEEP = 0
    LATE = 1
    DUPLICATE = 2
    REVISE = 3


@dataclass
class Feed:
    clock_ns: int = 0  # the largest event time read (trades and idle marks)
    seen: dict[str, int] = field(default_factory=dict)  # trade_id → event time
    order: deque[tuple[int, str]] = field(default_factory=deque)  # (time, trade_id) as read

    def forget_before(self, horizon_start_ns: int) -> None:
        """Trade ids older than the horizon; arrival order is nearly time order, so a few
        out-of-order ids may stay a little longer, never without bound."""
        while self.order and self.order[0][0] < horizon_start_ns:
            t_ns, trade_id = self.order.popleft()
            if self.seen.get(trade_id) == t_ns:
                del self.seen[trade_id]


class Feeds:
    """Every feed's clock and recent trade ids, as one query reads the ticks topic."""

    def __init__(self, allowance_s: float, horizon_s: float) -> None:
        if horizon_s <= allowance_s:
            raise ValueError(
                f"dedup horizon {horizon_s}s must exceed the lateness allowance {allowance_s}s"
            )
        self.allowance_ns = int(allowance_s * 1e9)
        self.horizon_ns = int(horizon_s * 1e9)
        self.feeds: dict[str, Feed] = {}

    def admit(self, ticker: str, trade_id: str, t_ns: int) -> Verdict:
        feed = self._feed(ticker)
        if trade_id and trade_id in feed.seen:
            return Verdict.DUPLICATE
        late = feed.clock_ns > 0 and t_ns < feed.clock_ns - self.allowance_ns
        revisable = late and bool(trade_id) and t_ns >= feed.clock_ns - self.horizon_ns
        if trade_id:
            feed.seen[trade_id] = t_ns
            feed.order.append((t_ns, trade_id))
        self._advance(feed, t_ns)
        if not late:
            return Verdict.KEEP
        return Verdict.REVISE if revisable else Verdict.LATE

    def mark(self, ticker: str, t_ns: int) -> None:
        """An idle mark: the feed's clock moves to ``t_ns`` as if a trade happened then."""
        self._advance(self._feed(ticker), t_ns)

    def _feed(self, ticker: str) -> Feed:
        feed = self.feeds.get(ticker)
        if feed is None:
            feed = self.feeds[ticker] = Feed()
        return feed

    def _advance(self, feed: Feed, t_ns: int) -> None:
        """A clock only moves forward, and trade ids it leaves behind the horizon go."""
        if t_ns > feed.clock_ns:
            feed.clock_ns = t_ns
            feed.forget_before(t_ns - self.horizon_ns)

    def watermark_ms(self, ticker: str) -> int:
        """Windows of this feed ending at or before this are final."""
        feed = self.feeds.get(ticker)
        if feed is None or feed.clock_ns == 0:
            return 0
        return (feed.clock_ns - self.allowance_ns) // 1_000_000

    def horizon_start_ms(self, ticker: str) -> int:
        """Closed windows of this feed ending at or before this can no longer be revised."""
        feed = self.feeds.get(ticker)
        if feed is None or feed.clock_ns == 0:
            return 0
        return (feed.clock_ns - self.horizon_ns) // 1_000_000

    def clock_ns(self, ticker: str) -> int:
        feed = self.feeds.get(ticker)
        return 0 if feed is None else feed.clock_ns

    # -- what a commit records, and a restart restores --------------------------------------

    def clocks(self) -> dict[str, int]:
        return {t: f.clock_ns for t, f in self.feeds.items()}

    def horizon_start_ns(self) -> int:
        """The oldest event time any feed still remembers trade ids from (0: no feeds)."""
        starts = [f.clock_ns - self.horizon_ns for f in self.feeds.values() if f.clock_ns]
        return max(0, min(starts, default=0))

    def restore(self, clocks: dict[str, int], trades: Iterable[tuple[str, str, int]]) -> None:
        """The state as of a commit: each feed's clock, and the (ticker, trade_id, time) of
        the trades stored in ``ticks`` as of it, in the order they were stored."""
        self.feeds = {t: Feed(clock_ns=c) for t, c in clocks.items()}
        for ticker, trade_id, t_ns in trades:
            feed = self.feeds.get(ticker)
            if feed is None or not trade_id or t_ns < feed.clock_ns - self.horizon_ns:
                continue
            feed.seen[trade_id] = t_ns
            feed.order.append((t_ns, trade_id))
