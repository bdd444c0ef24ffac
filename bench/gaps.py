"""Trades lost upstream, found, fetched again and corrected into every candle (#37).

A private stack; an ingestor streams ``GAPSIM:BTC/USDT`` from a SIM that drops ``--drop-s``
seconds of its live stream ``--at-s`` seconds after it starts (its trade ids jump). Then:

- ``detect_s``: from the gap's end (the first trade after it) until the ingestor recorded it;
- ``repair_s``: from detection until every dropped trade is in ``ticks`` and every candle
  whose window overlaps the gap, of every period, equals pandas over SIM's trades up to that
  candle's last trade (so a forming candle counts as revised too);
- ``candles_exact``: after the stream stops, every candle of every period in ``ohlc`` equals a
  pandas resample of every trade SIM made over the span, the dropped ones included;
- ``doubled``: trade ids stored in ``ticks`` more than once.

The last line is JSON.

    python -m bench.gaps [--drop-s 20] [--at-s 30] [--rate 20] [--tail-s 20] [--ticks-trigger-s S]

``repair_s`` includes the committing query's next batch, which the live path brings forward
when it revises a closed candle (``streaming.pacing``), and the bench's own polling of
Iceberg (about a second); the live stream publishes the revisions at once.
"""

from __future__ import annotations

import argparse
import json
import time
from collections import Counter

import pandas as pd

from bench.oracle import candle_rows, expected_candles
from bench.stack import private_stack, wait_until_warm
from candlewire.config import PERIODS_S, Settings
from candlewire.gaps import read_gaps
from candlewire.lake import load_table
from ingest.exchanges.sim import SimExchange
from ingest.service import Ingestor
from proto import market_pb2

TICKER = "GAPSIM:BTC/USDT"


def sim_trades(sim: SimExchange, from_ns: int, to_ns: int) -> list[tuple[int, str, str]]:
    """(time, price, size) of every trade SIM made in [from_ns, to_ns]: the oracle's input."""
    return [
        (t.exchange_time_ns, t.price, t.size) for t in sim.trades_between(TICKER, from_ns, to_ns)
    ]


def wait_for_gap(settings: Settings, timeout: float) -> market_pb2.Gap:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        done = [
            g
            for g in read_gaps(settings).listed()
            if g.ticker == TICKER and g.status != market_pb2.GAP_OPEN
        ]
        if done:
            return done[0]
        time.sleep(0.5)
    raise TimeoutError(f"no repaired gap of {TICKER} within {timeout:.0f}s")


def ohlc_rows(settings: Settings) -> pd.DataFrame:
    table = load_table(settings, "ohlc")
    return table.scan(row_filter=f"ticker = '{TICKER}'").to_pandas()


def stored_ticks(settings: Settings) -> pd.DataFrame:
    table = load_table(settings, "ticks")
    return table.scan(
        row_filter=f"ticker = '{TICKER}'", selected_fields=("trade_id", "exchange_time_ns")
    ).to_pandas()


def gap_repaired(settings: Settings, sim: SimExchange, gap: market_pb2.Gap) -> bool:
    """Every dropped trade is stored, and every candle overlapping the gap equals pandas over
    SIM's trades up to its own last trade."""
    missing = {
        t.trade_id
        for t in sim.trades_between(TICKER, gap.from_ns + 1, gap.to_ns - 1)  # both received
    }
    ticks = stored_ticks(settings)
    if not missing <= set(ticks["trade_id"]):
        return False
    first_ns = int(ticks["exchange_time_ns"].min())  # SIM traded before the stream began
    rows = ohlc_rows(settings)
    for r in rows.itertuples():
        open_ns = pd.Timestamp(r.open_time).value
        end_ns = open_ns + int(r.period_s) * 1_000_000_000
        if end_ns <= gap.from_ns or open_ns >= gap.to_ns:
            continue
        want = candle_rows(
            expected_candles(
                sim_trades(sim, max(open_ns, first_ns), int(r.last_trade_ns)), int(r.period_s)
            )
        )
        mine = candle_rows(pd.DataFrame([r._asdict()]).set_index("open_time"))
        if mine != want:
            return False
    return True


def candles_exact(settings: Settings, sim: SimExchange, timeout: float = 120.0) -> bool:
    """Every candle of every period equals pandas over every trade SIM made in the span."""
    deadline = time.monotonic() + timeout
    while True:
        ticks = stored_ticks(settings)
        trades = sim_trades(
            sim, int(ticks["exchange_time_ns"].min()), int(ticks["exchange_time_ns"].max())
        )
        rows = ohlc_rows(settings)
        equal = all(
            candle_rows(rows[rows["period_s"] == p].set_index("open_time"))
            == candle_rows(expected_candles(trades, p))
            for p in PERIODS_S
        )
        if equal or time.monotonic() > deadline:
            return equal
        time.sleep(2.0)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--drop-s", type=float, default=20.0)
    parser.add_argument("--at-s", type=float, default=30.0)
    parser.add_argument("--rate", type=float, default=20.0, help="SIM's trades per second")
    parser.add_argument("--tail-s", type=float, default=20.0, help="streamed after the repair")
    parser.add_argument(
        "--ticks-trigger-s", type=float, help="the committing query's interval (default: 30 s)"
    )
    args = parser.parse_args()
    overrides = (
        {} if args.ticks_trigger_s is None else {"stream_ticks_trigger_s": args.ticks_trigger_s}
    )
    with private_stack(**overrides) as settings:
        wait_until_warm(settings)
        sim = SimExchange(
            name="GAPSIM", symbols={"BTC/USDT": 30_000.0}, rate=args.rate,
            faults=f"drop:{args.drop_s:g}s@{args.at_s:g}s",
        )  # fmt: skip
        ingestor = Ingestor(
            settings, [sim], always_on=[TICKER], metrics=False, heartbeat_s=0.5
        ).start()
        try:
            gap = wait_for_gap(settings, args.at_s + args.drop_s + 120)
            detect_s = gap.detected_ms / 1000 - gap.to_ns / 1e9
            print(
                f"gap {market_pb2.GapCause.Name(gap.cause)} of {gap.to_ns - gap.from_ns:,} ns "
                f"detected after {detect_s:.3f}s; {gap.refetched} trades fetched again; "
                f"{market_pb2.GapStatus.Name(gap.status)} {gap.reason}",
                flush=True,
            )
            repair_s = None
            deadline = time.monotonic() + 120
            while time.monotonic() < deadline:
                if gap_repaired(settings, sim, gap):
                    repair_s = time.time() - gap.detected_ms / 1000
                    break
                time.sleep(0.25)
            print(f"repaired in ticks and every overlapping candle after {repair_s}s", flush=True)
            time.sleep(args.tail_s)
        finally:
            ingestor.stop()
        exact = candles_exact(settings, sim)
        doubled = sum(n - 1 for n in Counter(stored_ticks(settings)["trade_id"]).values() if n > 1)
    result = {
        "drop_s": args.drop_s,
        "detect_s": round(max(detect_s, 0.0), 3),
        "repair_s": None if repair_s is None else round(repair_s, 3),
        "refetched": int(gap.refetched),
        "candles_exact": exact,
        "doubled": doubled,
    }
    print(json.dumps(result))


if __name__ == "__main__":
    main()
