"""Test reference, not run by the platform: folding trades into candles, the second, Python
copy of the rules that run in ``jvm/decoder``'s ``FeedState`` (the committing query and the
live path of both engines). Tests hold the JVM's candles to this module's
(tests/streaming/test_sql.py, test_live_jvm.py).

Forming candles: a batch of ticks is reduced to one partial candle per (ticker, period,
window) (:func:`partial_candles`), and the state folds partials into the candles still
forming and answers with the absolute values.

Event time is per feed (:mod:`tests.reference.feeds`): a feed's watermark is its own clock minus the
lateness allowance. A window whose end is at or behind its feed's watermark is closed and
leaves the forming state; it is kept, closed, until the dedup horizon passes its end, so a
late trade within the horizon (:attr:`tests.reference.feeds.Verdict.REVISE`) revises it
(:meth:`FormingCandles.revise`). A late tick beyond the horizon changes no candle.
A candle exists only for a window with a trade: nothing is invented for quiet intervals.

Each candle carries its first and last trade's event time, stored in ``ohlc`` too, so a tick
that arrives out of order sets open or close correctly, and so the state after a restart
(:meth:`FormingCandles.restore`) merges exactly as the uninterrupted one would have.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from decimal import Decimal

Key = tuple[str, int, int]  # (ticker, period_s, open_ms)


@dataclass(slots=True)
class Candle:
    ticker: str
    period_s: int
    open_ms: int
    open: Decimal
    high: Decimal
    low: Decimal
    close: Decimal
    volume: Decimal
    trade_count: int
    first_trade_ns: int
    last_trade_ns: int
    closed: bool = False
    revision: int = 0  # 0 as first closed; one more each batch that revises it

    @property
    def key(self) -> Key:
        return self.ticker, self.period_s, self.open_ms

    @property
    def end_ms(self) -> int:
        return self.open_ms + self.period_s * 1000

    def is_final(self, watermark_ms: int) -> bool:
        """The watermark has passed the window's end: no tick may change it any more."""
        return self.end_ms <= watermark_ms

    def absorb(self, other: Candle) -> None:
        """Fold in a partial of the same window; on equal times the earlier batch keeps open
        and the later one sets close, as arrival order would."""
        if other.first_trade_ns < self.first_trade_ns:
            self.open, self.first_trade_ns = other.open, other.first_trade_ns
        if other.last_trade_ns >= self.last_trade_ns:
            self.close, self.last_trade_ns = other.close, other.last_trade_ns
        self.high = max(self.high, other.high)
        self.low = min(self.low, other.low)
        self.volume += other.volume
        self.trade_count += other.trade_count


def candle_from_row(row: dict) -> Candle:
    """A row of the batch's partial aggregation, or of ``ohlc`` (open_time as epoch ms)."""
    return Candle(
        ticker=row["ticker"],
        period_s=int(row["period_s"]),
        open_ms=int(row["open_ms"]),
        open=row["open"],
        high=row["high"],
        low=row["low"],
        close=row["close"],
        volume=row["volume"],
        trade_count=int(row["trade_count"]),
        first_trade_ns=int(row["first_trade_ns"]),
        last_trade_ns=int(row["last_trade_ns"]),
        closed=bool(row.get("closed") or False),
        revision=int(row.get("revision") or 0),
    )


class FormingCandles:
    """Candles whose window is still open, keyed by (ticker, period_s, open_ms)."""

    def __init__(self) -> None:
        self._open: dict[Key, Candle] = {}
        self._closed: dict[Key, Candle] = {}  # within the dedup horizon: revisable

    def __len__(self) -> int:
        return len(self._open)

    def merge(self, partials: Iterable[Candle]) -> list[Candle]:
        """Fold a batch's partials in; returns the touched candles with their new values."""
        touched: dict[Key, Candle] = {}
        for p in partials:
            current = self._open.get(p.key)
            if current is None:
                self._open[p.key] = current = p
            else:
                current.absorb(p)
            touched[p.key] = current
        return list(touched.values())

    def revise(
        self, partials: Iterable[Candle], watermark_of: Callable[[str], int]
    ) -> tuple[list[Candle], list[Candle]]:
        """Fold in a batch's partials of revising ticks: into a forming window as
        :meth:`merge` does, into a closed one as a revision (its revision one higher; a
        closed window that had no trade starts at 1). Returns (forming touched, revised)."""
        forming: list[Candle] = []
        revised: dict[Key, Candle] = {}
        for p in partials:
            if p.key in self._open or not p.is_final(watermark_of(p.ticker)):
                forming.append(p)
                continue
            current = self._closed.get(p.key)
            if current is None:
                p.closed = True
                self._closed[p.key] = current = p
            else:
                current.absorb(p)
            revised[p.key] = current
        for c in revised.values():
            c.revision += 1
        return self.merge(forming), list(revised.values())

    def evict(
        self, watermark_of: Callable[[str], int], horizon_of: Callable[[str], int] | None = None
    ) -> list[Candle]:
        """Take out the windows their feed's watermark has passed and return them: their last
        update is the one that says closed. They stay revisable until their feed's horizon
        (``horizon_of``) passes their end."""
        final = [c for c in self._open.values() if c.is_final(watermark_of(c.ticker))]
        for c in final:
            del self._open[c.key]
            c.closed = True
            self._closed[c.key] = c
        if horizon_of is not None:
            gone = [k for k, c in self._closed.items() if c.end_ms <= horizon_of(c.ticker)]
            for k in gone:
                del self._closed[k]
        return final

    def restore(
        self,
        candles: Iterable[Candle],
        watermark_of: Callable[[str], int],
        horizon_of: Callable[[str], int] = lambda _ticker: 0,
    ) -> None:
        """The state as of a committed batch: its live ``ohlc`` rows still forming, and the
        closed ones the horizon may still revise."""
        self._open, self._closed = {}, {}
        for c in candles:
            if not c.closed and not c.is_final(watermark_of(c.ticker)):
                self._open[c.key] = c
            elif c.end_ms > horizon_of(c.ticker):
                c.closed = True
                self._closed[c.key] = c

    def tickers(self) -> dict[str, int]:
        """Each ticker with a forming candle, and the earliest end among its windows."""
        out: dict[str, int] = {}
        for c in self._open.values():
            out[c.ticker] = min(out.get(c.ticker, c.end_ms), c.end_ms)
        return out


def changed(updated: list[Candle], closed: list[Candle]) -> list[tuple[Candle, bool]]:
    """What a batch changed, each candle once, with whether it is now closed: the rows both
    the live updates and the ``ohlc`` MERGE carry."""
    final = {c.key for c in closed}
    return [(c, c.key in final) for c in {c.key: c for c in [*updated, *closed]}.values()]


def partial_candles(
    ticks: Iterable[tuple[str, int, Decimal, Decimal]], periods: Iterable[int]
) -> list[Candle]:
    """One candle per (ticker, period, window) of ``(ticker, time_ns, price, size)`` ticks:
    the live query's reduction of a batch, the same one Spark computes for the commits.
    Ticks fold into minutes first (a few comparisons each), then minutes into each period,
    which is why every period must be a whole number of minutes."""
    periods = tuple(periods)
    if any(p % 60 for p in periods):
        raise ValueError(f"periods must be whole minutes: {periods}")
    minutes: dict[tuple[str, int], list] = {}
    for ticker, t_ns, price, size in ticks:
        m = minutes.get((ticker, t_ns // 60_000_000_000))
        if m is None:
            minutes[(ticker, t_ns // 60_000_000_000)] = [
                price,
                price,
                price,
                price,
                size,
                1,
                t_ns,
                t_ns,
            ]
            continue
        if t_ns < m[6]:
            m[0], m[6] = price, t_ns
        if t_ns >= m[7]:
            m[3], m[7] = price, t_ns
        if price > m[1]:
            m[1] = price
        if price < m[2]:
            m[2] = price
        m[4] += size
        m[5] += 1
    out: dict[Key, Candle] = {}
    for (ticker, minute), m in minutes.items():
        for period_s in periods:
            candle = Candle(
                ticker, period_s, minute * 60_000 // (period_s * 1000) * period_s * 1000, *m
            )
            current = out.get(candle.key)
            if current is None:
                out[candle.key] = candle
            else:
                current.absorb(candle)
    return list(out.values())
