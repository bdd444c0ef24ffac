"""Live candles into a pandas DataFrame: one row per candle, updated while it forms.

    python examples/live_candles_pandas.py [--ticker BINANCE:BTC/USDT] [--period 60] [--updates 20]

Needs a running stack (``make up``) and pandas. Prices stay ``Decimal``: exact, as published.
"""

from __future__ import annotations

import argparse
import sys

import pandas as pd

from candlewire import CandlewireError, Client


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ticker", default="BINANCE:BTC/USDT")
    parser.add_argument("--period", type=int, default=60, help="seconds")
    parser.add_argument("--updates", type=int, default=20, help="stop after this many")
    args = parser.parse_args(argv)

    rows: dict = {}
    with Client() as client:
        sub = client.subscribe(args.ticker, f"ohlc:{args.period}", idle_timeout=120)
        for n, candle in enumerate(sub, 1):
            # A forming candle comes again with every trade: the last update wins.
            rows[candle.open_time] = {
                "open": candle.open,
                "high": candle.high,
                "low": candle.low,
                "close": candle.close,
                "volume": candle.volume,
                "trades": candle.trade_count,
                "closed": candle.closed,
            }
            if n >= args.updates:
                break
        sub.close()
    frame = pd.DataFrame.from_dict(rows, orient="index").sort_index()
    frame.index.name = "open_time"
    print(frame.to_string())


if __name__ == "__main__":
    try:
        sys.exit(main())
    except CandlewireError as exc:  # the stack down, a ticker refused: one line, no traceback
        sys.exit(f"error: {exc}")
