"""Adapters on their own: SIM's consistency, REPLAY's file layouts.

Test reference, not run by the platform: :func:`aggregate` folds trades into candles on its
own, to hold SIM's klines (``SimExchange.ohlc_page``) to them."""

from __future__ import annotations

import itertools
import threading
import time
import tracemalloc
from decimal import Decimal

import numpy as np
import pytest

from ingest.exchanges.base import (
    Page,
    RangeUnavailable,
    TradeRun,
    UnknownSymbol,
    fmt_fixed,
    pages,
)
from ingest.exchanges.replay import ReplayExchange
from ingest.exchanges.sim import GENESIS_MS, MINUTE_MS, SimExchange, fmt_fixed_column

T0 = 1_700_006_400_000  # a day boundary, so every period aligns


def aggregate(ticks, period_s: int) -> list[tuple]:
    """Candles from trades, independently of SimExchange.ohlc_page."""
    out: dict[int, list] = {}
    for t in ticks:
        ms = t.exchange_time_ns // 1_000_000
        out.setdefault(ms - ms % (period_s * 1000), []).append(t)
    return [
        (
            open_ms,
            Decimal(ts[0].price),
            max(Decimal(t.price) for t in ts),
            min(Decimal(t.price) for t in ts),
            Decimal(ts[-1].price),
            sum(Decimal(t.size) for t in ts),
            len(ts),
        )
        for open_ms, ts in sorted(out.items())
    ]


@pytest.mark.parametrize("period_s", [60, 300, 900])
def test_sim_history_equals_what_it_streams(period_s: int) -> None:
    sim = SimExchange(rate=2.0)
    m0 = (T0 - GENESIS_MS) // MINUTE_MS
    ticks = sim.trade_batch("SIM:ETH/USDT", m0, m0 + 60)
    want = [
        c for c in aggregate(ticks, period_s) if c[0] >= T0 - T0 % (period_s * 1000) and c[0] >= T0
    ]
    got = sim.ohlc_page("SIM:ETH/USDT", period_s, Page(0, T0, T0 + 3_600_000))
    assert [
        (
            c.open_time_ms,
            Decimal(c.open),
            Decimal(c.high),
            Decimal(c.low),
            Decimal(c.close),
            Decimal(c.volume),
            c.trade_count,
        )
        for c in got
    ] == want


def test_sim_is_deterministic_and_ids_are_contiguous() -> None:
    a, b = SimExchange(seed=7), SimExchange(seed=7)
    m0 = (T0 - GENESIS_MS) // MINUTE_MS
    ta, tb = a.trade_batch("SIM:BTC/USDT", m0, m0 + 3), b.trade_batch("SIM:BTC/USDT", m0, m0 + 3)
    assert ta == tb
    ids = [int(t.trade_id) for t in ta]
    assert ids == list(range(ids[0], ids[0] + len(ids)))
    assert SimExchange(seed=8).trade_batch("SIM:BTC/USDT", m0, m0 + 1) != ta[:60]


def test_sim_streams_today_without_holding_its_walk_since_2020() -> None:
    """Today's minute lies 3.6 million minutes into the walk: a streamed symbol keeps a few
    blocks of it (a few MiB), not the whole walk (29 MiB a symbol), and a minute read again
    after its block was let go comes back the same."""
    sim = SimExchange(seed=7)
    now = (int(time.time() * 1000) - GENESIS_MS) // MINUTE_MS
    tracemalloc.start()
    try:
        first = sim.trade_batch("SIM:BTC/USDT", now, now + 1)
        held, _ = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert held < 4 * 2**20, f"{held / 2**20:.1f} MiB held after streaming a minute"
    for m in range(0, now, 200_000):  # every block read since, the first let go
        sim.trade_batch("SIM:BTC/USDT", m, m + 1)
    assert sim.trade_batch("SIM:BTC/USDT", now, now + 1) == first
    assert SimExchange(seed=7).trade_batch("SIM:BTC/USDT", now, now + 1) == first


def test_sim_errors() -> None:
    sim = SimExchange()
    with pytest.raises(UnknownSymbol):
        sim.ohlc_page("SIM:NOPE/USDT", 60, Page(0, T0, T0 + 60_000))
    with pytest.raises(RangeUnavailable):
        sim.ohlc_page("SIM:BTC/USDT", 60, Page(0, GENESIS_MS - 86_400_000, GENESIS_MS))


@pytest.mark.parametrize("decimals", [0, 2, 4])
def test_column_formatting_equals_the_scalar_one(decimals: int) -> None:
    values = [0, 1, 9, 10, 99, 100, 12345, -1, -100, -12345, 10**15 + 7]
    assert fmt_fixed_column(np.array(values), decimals) == [fmt_fixed(v, decimals) for v in values]


def test_a_sim_ingestor_runs_without_pandas() -> None:
    """SIM's trades and candles are made without pyarrow, which loads pandas: 40 MiB of
    every SIM ingestor's memory (#36)."""
    import subprocess
    import sys

    script = (
        "import sys\n"
        "from ingest.exchanges.base import Page\n"
        "from ingest.exchanges.sim import SimExchange\n"
        "sim = SimExchange(rate=50.0)\n"
        "assert sim.trade_batch('SIM:BTC/USDT', 1000, 1010)\n"
        f"assert sim.ohlc_page('SIM:BTC/USDT', 60, Page(0, {T0}, {T0 + 3_600_000}))\n"
        "print(sorted(m for m in ('pandas', 'pyarrow') if m in sys.modules))\n"
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


def test_pages_are_fixed_windows() -> None:
    ps = pages(T0 + 1, T0 + 10 * 60_000, 60, 4)
    assert [(p.index, p.start_ms, p.end_ms) for p in ps] == [
        (0, T0 + 1, T0 + 240_000),
        (1, T0 + 240_000, T0 + 480_000),
        (2, T0 + 480_000, T0 + 600_000),
    ]


def test_replay_sample_layouts() -> None:
    replay = ReplayExchange(speed=1000.0)
    assert sorted(m.ticker for m in replay.markets()) == ["REPLAY:BTC/USDT", "REPLAY:ETH/USDT"]
    start, end = replay.recorded_range("REPLAY:BTC/USDT", 60)
    assert end - start == 86_400_000
    candles = replay.ohlc_page("REPLAY:BTC/USDT", 60, Page(0, start, start + 3_600_000))
    assert len(candles) == 60 and all(c.closed for c in candles)
    hourly = replay.ohlc_page("REPLAY:BTC/USDT", 3600, Page(0, start, end))
    assert len(hourly) == 24
    assert hourly[0].open == candles[0].open and hourly[0].close == candles[-1].close
    stop = threading.Event()
    got = []
    for tick in replay.trades("REPLAY:ETH/USDT", stop):
        got.append(tick)
        if len(got) == 50:
            stop.set()
    assert len(got) == 50 and got[0].trade_id < got[-1].trade_id
    with pytest.raises(RangeUnavailable):
        replay.ohlc_page("REPLAY:BTC/USDT", 300, Page(0, start, end))


def test_sims_live_runs_hold_every_trade_due_when_cut_and_none_before_it_is_due() -> None:
    sim = SimExchange(symbols={"BTC/USDT": 30_000.0}, rate=2_000.0)
    stop, runs = threading.Event(), []
    for item in sim.trade_runs("SIM:BTC/USDT", stop):
        assert isinstance(item, TradeRun)
        runs.append(item)
        if len(runs) == 4:
            break
        time.sleep(0.05)  # a slow reader: about 100 trades fall due meanwhile
    stop.set()
    for run in runs:
        assert run.ticker == "SIM:BTC/USDT" and len(run) >= 1
        assert max(run.times_ns) <= run.ingest_time_ns  # none handed out before it was due

    def minute(t_ns: int) -> int:
        return (t_ns // 1_000_000 - GENESIS_MS) // MINUTE_MS

    for before, after in itertools.pairwise(runs):
        assert len(after) > 1
        if minute(after.times_ns[0]) == minute(before.times_ns[-1]):  # a run ends a minute
            assert after.times_ns[0] > before.ingest_time_ns  # all due at a cut were in it
    ticks = [t for run in runs for t in run.ticks()]
    ids = [int(t.trade_id) for t in ticks]
    assert ids == list(range(ids[0], ids[0] + len(ids)))  # in order, none skipped
    m = (ticks[0].exchange_time_ns // 1_000_000 - GENESIS_MS) // MINUTE_MS
    made = {t.trade_id: t for t in sim.trade_batch("SIM:BTC/USDT", m, m + 2)}
    for t in ticks:
        want = made[t.trade_id]
        want.ingest_time_ns = t.ingest_time_ns
        assert t == want
