"""Your own Binance Vision download, as history: request a range of a REPLAY ticker and
print its candles.

First run an ingestor that serves the download beside the stack:

    candlewire ingest --exchange REPLAY --replay-root ~/binance-vision

(without ``--replay-root``: the sample in ``ingest/samples/binance-vision``, BTCUSDT and
ETHUSDT on 2025-01-01), then

    python examples/replay_zips.py [--ticker REPLAY:BTC/USDT] [--period 3600]
                                   [--start 2025-01-01] [--end 2025-01-02]

The candles keep their recorded times and exact prices; ``candlewire watch REPLAY:BTC/USDT``
streams the recorded trades the same way.
"""

from __future__ import annotations

import argparse
import sys

from candlewire import CandlewireError, Client


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ticker", default="REPLAY:BTC/USDT")
    parser.add_argument("--period", type=int, default=3600, help="seconds")
    parser.add_argument("--start", default="2025-01-01")
    parser.add_argument("--end", default="2025-01-02")
    args = parser.parse_args(argv)

    with Client() as client:
        candles = client.request_history(
            args.ticker, args.period, args.start, args.end, read=True, timeout=300
        )
    columns = ["open_time", "open", "high", "low", "close", "volume", "trade_count"]
    print(candles.select(columns).to_pandas().to_string(index=False))


if __name__ == "__main__":
    try:
        sys.exit(main())
    except CandlewireError as exc:  # the stack down, a ticker refused: one line, no traceback
        sys.exit(f"error: {exc}")
