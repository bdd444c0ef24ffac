"""What an ingestor lets into the ticks topic: positive prices, non-negative sizes, times
within the window of now (recordings exempt from its past bound)."""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Iterator

import pytest

from candlewire.kafka import TICKS
from ingest.exchanges.base import ExchangeError, TradeRun, one_by_one
from ingest.exchanges.sim import GENESIS_MS, MINUTE_MS, SimExchange
from ingest.gaps import GapDetector, GapWatch
from ingest.jobs import run_stream, tick_problem
from proto import market_pb2
from tests.support import RecordingSink

NOW = time.time_ns()
S = 1_000_000_000


def tick(price: str = "1.5", size: str = "2", at: int = NOW) -> market_pb2.Tick:
    return market_pb2.Tick(ticker="SIM:BTC/USDT", price=price, size=size, exchange_time_ns=at)


@pytest.mark.parametrize(
    ("t", "problem"),
    [
        (tick(), None),
        (tick(size="0"), None),
        (tick(price="0"), "price"),
        (tick(price="-1"), "price"),
        (tick(price="NaN"), "price"),
        (tick(price="Infinity"), "price"),
        (tick(price="abc"), "not_decimal"),
        (tick(size="-0.1"), "size"),
        (tick(size="nan"), "size"),
        # Judged exactly, not as a float would be: DECIMAL(38,18), the tables' type, holds
        # 20 digits before the point and 18 after; the stream counts anything else bad.
        (tick(price="1e-400"), "range"),
        (tick(price="1e400", size="1e999"), "range"),
        (tick(price="100000000000000000000"), "range"),
        (tick(price="1.0000000000000000025"), "range"),
        (tick(size="0.0000000000000000005"), "range"),
        (tick(price="99999999999999999999.999999999999999999"), None),
        (tick(price="1.50000000000000000000", size="2e19"), None),
        (tick(price="1E+2", size=".5"), None),
        (tick(size="-1e-400"), "size"),
        (tick(size="-0"), None),
        (tick(price="0x10"), "not_decimal"),
        (tick(price="1_000"), "not_decimal"),  # Decimal reads it, the wire's grammar not
        (tick(size=" 1"), "not_decimal"),
        (tick(price="-inf"), "price"),
        (tick(at=NOW + 59 * S), None),
        (tick(at=NOW + 61 * S), "ahead"),
        (tick(at=NOW - 3599 * S), None),
        (tick(at=NOW - 3601 * S), "behind"),
        # The bounds themselves are in the window, a nanosecond past them is not.
        (tick(at=NOW + 60 * S), None),
        (tick(at=NOW + 60 * S + 1), "ahead"),
        (tick(at=NOW - 3600 * S), None),
        (tick(at=NOW - 3600 * S - 1), "behind"),
    ],
)
def test_tick_problem(t: market_pb2.Tick, problem: str | None) -> None:
    assert tick_problem(t, NOW, 60, 3600) == problem


def test_a_trade_without_a_time_is_refused_even_where_any_age_is_let_in() -> None:
    # A venue's trade whose time could not be read arrives as 0 (ccxt's None): a replay's
    # window lets any age in, and a trade of 1970 would have gone through.
    assert tick_problem(tick(at=0), NOW, 60, None) == "time"
    assert tick_problem(tick(at=-1), NOW, 60, None) == "time"
    assert tick_problem(tick(at=1), NOW, 60, None) is None
    assert tick_problem(tick(at=0), NOW, 60, 3600) == "time"  # named so, not "behind"


class Watched:
    """The stream's gap watch, as far as what it is shown."""

    def __init__(self) -> None:
        self.seen: list[str] = []

    def observe(self, t: market_pb2.Tick) -> None:
        self.seen.append(t.trade_id)

    def observe_run(self, run: TradeRun) -> bool:
        self.seen.extend(run.trade_ids)
        return True

    def reconnected(self) -> None:
        self.seen.append("reconnect")


def test_a_trade_without_a_time_is_not_shown_to_the_gap_watch() -> None:
    # As the stream's last trade it placed the next reconnect's gap at 1970, and the repair
    # walked the venue's history minute by minute from there.
    first, timeless, last = tick(at=NOW), tick(at=0), tick(at=NOW + 1)
    first.trade_id, timeless.trade_id, last.trade_id = "a", "b", "c"

    class Venue(SimExchange):
        def trade_runs(self, ticker: str, stop: threading.Event) -> Iterator[market_pb2.Tick]:
            yield from (first, timeless, last)

    watch, dropped = Watched(), []
    ticker = first.ticker
    sink = RecordingSink()
    run_stream(
        ticker, Venue(), sink, threading.Event(), (60, None), dropped.append, watch, lambda: NOW
    )  # type: ignore[arg-type]
    assert watch.seen == ["a", "c"] and dropped == ["time"]
    assert [t.trade_id for t in sink.sent(TICKS.name)] == ["a", "c"]


def test_an_unbounded_window_lets_any_time_in() -> None:
    far = [tick(at=NOW + 10**18), tick(at=NOW - 10**18)]
    assert [tick_problem(t, NOW, float("inf"), float("inf")) for t in far] == [None, None]
    assert [tick_problem(t, NOW, 60, None) for t in far] == ["ahead", None]


class Listing:
    name = "SIM"

    def __init__(self, ticks: list[market_pb2.Tick], recorded: bool = False) -> None:
        self.ticks, self.recorded = ticks, recorded

    def trades(self, ticker: str, stop: threading.Event):
        yield from self.ticks

    def trade_runs(self, ticker: str, stop: threading.Event):
        return self.trades(ticker, stop)


@pytest.mark.parametrize("recorded", [False, True])
def test_bad_trades_are_dropped_and_counted_good_ones_sent(recorded: bool) -> None:
    now = time.time_ns()
    good, old = tick(at=now), tick(at=now - 7 * 86_400 * S)
    ticks = [good, tick(price="-5", at=now), tick(at=now + 3600 * S), old, tick(size="-1")]
    sink, dropped = RecordingSink(), []
    sent = run_stream(
        "SIM:BTC/USDT", Listing(ticks, recorded), sink, threading.Event(), (60, 86_400),
        dropped.append,
    )  # fmt: skip
    kept = [good, old] if recorded else [good]
    assert sink.sent(TICKS.name) == kept and sent == len(kept)
    assert sorted(dropped) == sorted(["price", "ahead", "size", *([] if recorded else ["behind"])])


# -- trades in runs: the same verdicts, records and gaps as one at a time ----------------------


class Runs:
    """A sequential venue yielding the given items: Ticks, TradeRuns, or an error to raise."""

    name, recorded, sequential_ids = "SIM", False, True

    def __init__(self, items: list) -> None:
        self.items = list(items)

    def trades(self, ticker: str, stop: threading.Event):
        return one_by_one(self.trade_runs(ticker, stop), stop)

    def trade_runs(self, ticker: str, stop: threading.Event):
        while self.items:
            item = self.items.pop(0)
            if isinstance(item, Exception):
                raise item
            yield item


BAD = {
    "prices": [
        "nan",
        "-1",
        "0",
        "abc",
        "inf",
        "1e400",
        "1e-400",
        "-inf",
        "1_000",
        " 5 ",
        "100000000000000000000",
        "1.0000000000000000025",
        "1E+2",
        ".5",
    ],
    "sizes": [
        "nan",
        "-0.1",
        "0",
        "-0",
        "x",
        "Infinity",
        "1e999",
        "-1e-400",
        "0.0000000000000000005",
        "2e20",
        "12345678901234567890",
    ],
    "trade_ids": ["77", "x", "", "05", "1_2", "-3"],  # an id repeated, jumped, not a number
    "times_ns": [NOW + 61 * S, NOW - 3601 * S, NOW + 60 * S, NOW - 3600 * S, 0],
}


def spoiled(seed: int) -> list:
    """SIM's trades with faults cut in, split at random into runs and single Ticks, with a
    reconnect (an ExchangeError) here and there between them."""
    rng = random.Random(seed)
    sim = SimExchange(symbols={"BTC/USDT": 30_000.0}, rate=20.0)
    m0 = (NOW // 1_000_000 - GENESIS_MS) // MINUTE_MS - 1
    run = sim.trade_run("SIM:BTC/USDT", m0, m0 + 1)
    cols = {c: list(getattr(run, c)) for c in ("trade_ids", "prices", "sizes", "times_ns")}
    cols["times_ns"] = [NOW - 30 * S + i * 1000 for i in range(len(run))]  # in the window
    for column, values in BAD.items():  # each bad value in some seed, all within 16 seeds
        cols[column][rng.randrange(len(run))] = values[seed % len(values)]
    for _ in range(rng.randrange(0, 4)):
        column = rng.choice(list(BAD))
        cols[column][rng.randrange(len(run))] = rng.choice(BAD[column])
    if rng.random() < 0.3:  # ids jump: trades lost upstream
        k = rng.randrange(1, len(run))
        cols["trade_ids"][k:] = [
            str(int(i) + 5) if i.isdigit() else i for i in cols["trade_ids"][k:]
        ]
    whole = TradeRun(run.ticker, cols["trade_ids"], cols["prices"], cols["sizes"],
                     list(run.sides), cols["times_ns"], NOW)  # fmt: skip
    cuts = sorted(rng.sample(range(1, len(whole)), rng.randrange(1, 12)))
    items: list = []
    for a, b in zip([0, *cuts], [*cuts, len(whole)], strict=True):
        part = whole.slice(a, b, NOW)
        items.extend(part.ticks() if rng.random() < 0.1 else [part])
        if rng.random() < 0.1:
            items.append(ExchangeError("a reconnect"))
    return items


def one_at_a_time(items: list) -> list:
    """The same stream as a venue yielding Ticks would give it, reconnects kept."""
    return [x for i in items for x in (i.ticks() if isinstance(i, TradeRun) else [i])]


def streamed(
    items: list, sequential: bool = True
) -> tuple[list, list[str], list[tuple], int, tuple]:
    """What ``run_stream`` does with ``items`` at ``NOW``: the records sent, the reasons for
    what was dropped, the gaps found, the count sent and the detector's tail."""
    sink, dropped, gaps = RecordingSink(), [], []
    detector = GapDetector("SIM:BTC/USDT", sequential=sequential)
    watch = GapWatch(detector, lambda gap, _recent: gaps.append(gap))
    stop = threading.Event()
    real_wait = stop.wait
    stop.wait = lambda t=None: real_wait(0)  # type: ignore[method-assign]  # no reconnect pause
    sent = run_stream(
        "SIM:BTC/USDT", Runs(items), sink, stop, (60, 3600), dropped.append, watch, lambda: NOW
    )
    found = [(g.cause, g.from_trade_id, g.to_trade_id, g.from_ns, g.to_ns) for g in gaps]
    tail = detector.tail
    recent = sorted(watch.recent._ids.items()) if watch.recent is not None else None
    return sink.records, dropped, found, sent, (tail.trade_id, tail.time_ns) if tail else (), recent


def good_run(n: int = 50, first: int = 1000) -> TradeRun:
    return TradeRun("SIM:BTC/USDT", [str(first + i) for i in range(n)], ["1.5"] * n, ["2"] * n,
                    [market_pb2.BUY] * n, [NOW - 30 * S + i for i in range(n)], NOW)  # fmt: skip


@pytest.mark.parametrize("sequential", [True, False])
@pytest.mark.parametrize(  # ids by position: a time's value depends on when NOW was read
    ("column", "k"), [(c, k) for c, values in BAD.items() for k in range(len(values))]
)
def test_one_bad_value_sends_its_run_trade_by_trade(column: str, k: int, sequential: bool) -> None:
    bad = BAD[column][k]
    before, run = good_run(), good_run(first=1050)
    getattr(run, column)[20] = bad
    items = [before, run, good_run(first=1100)]
    singles = one_at_a_time(items)
    got = streamed(items, sequential)
    assert got == streamed(singles, sequential)
    fit = tick_problem(run.tick(20), NOW, 60, 3600) is None
    assert got[3] == 150 - (not fit)


def test_a_run_after_a_reconnect_goes_trade_by_trade_and_a_later_jump_is_a_jump() -> None:
    items = [good_run(), ExchangeError("a reconnect"), good_run(first=1050), good_run(first=1200)]
    got = streamed(list(items))
    assert got == streamed(one_at_a_time(items))
    assert [g[:3] for g in got[2]] == [(market_pb2.TRADE_ID_JUMP, "1099", "1200")]


@pytest.mark.parametrize("seed", range(16))
def test_trades_in_runs_are_judged_sent_and_watched_as_one_at_a_time(seed: int) -> None:
    items = spoiled(seed)
    singles = one_at_a_time(items)  # before the stream takes the items
    runs = streamed(items)
    assert runs == streamed(singles)
    assert runs[0], "nothing was sent"


def test_a_run_that_fits_and_continues_goes_whole_and_one_that_does_not_goes_trade_by_trade() -> (
    None
):
    sim = SimExchange(symbols={"BTC/USDT": 30_000.0}, rate=20.0)
    m0 = (NOW // 1_000_000 - GENESIS_MS) // MINUTE_MS - 1
    run = sim.trade_run("SIM:BTC/USDT", m0, m0 + 1)
    fine = TradeRun(run.ticker, run.trade_ids, run.prices, run.sizes, run.sides,
                    [NOW - 30 * S] * len(run), NOW)  # fmt: skip
    bad = fine.slice(0, len(fine), NOW)
    bad.prices[7] = "-1"  # type: ignore[index]
    sink = RecordingSink()
    calls: list[int] = []
    sink.send_trades = lambda topic, key, r: calls.append(len(r))  # type: ignore[method-assign]
    first, rest = fine.slice(0, 1, NOW), fine.slice(1, len(fine), NOW)
    watch = GapWatch(GapDetector("SIM:BTC/USDT", sequential=True), lambda _gap, _recent: None)
    run_stream("SIM:BTC/USDT", Runs([first, rest]), sink, threading.Event(), (60, 3600), gaps=watch)
    assert watch.detector.tail.trade_id == fine.trade_ids[-1]
    # The first trade has nothing before it to continue; the rest go as one run.
    assert calls == [len(fine) - 1] and len(sink.records) == 1
    calls.clear()
    dropped: list[str] = []
    run_stream("SIM:BTC/USDT", Runs([bad]), sink, threading.Event(), (60, 3600), dropped.append)
    assert calls == [] and dropped == ["price"] and len(sink.records) == 1 + len(bad) - 1
