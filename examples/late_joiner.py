"""A late joiner: replay the last minutes of a ticker from the journal, then go live, with
no gap and no repeat at the seam.

    python examples/late_joiner.py [--ticker BINANCE:BTC/USDT] [--minutes 10] [--live 5]

Needs a running stack (``make up``). ``since=`` also takes a message received earlier (or its
``stream`` position), to resume right after it.
"""

from __future__ import annotations

import argparse
import sys
from datetime import UTC, datetime, timedelta

from candlewire import CandlewireError, Client


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ticker", default="BINANCE:BTC/USDT")
    parser.add_argument("--minutes", type=float, default=10.0, help="how far back to start")
    parser.add_argument("--live", type=int, default=5, help="live ticks to print, then stop")
    args = parser.parse_args(argv)

    joined = datetime.now(UTC)
    since = joined - timedelta(minutes=args.minutes)
    replayed = live = 0
    with Client() as client:
        sub = client.subscribe(args.ticker, "tick", since=since, idle_timeout=120)
        for tick in sub:
            # stream.publish_time_ms: when the stream job published it (0 for a tick so old it
            # was read back from Iceberg).
            published = tick.stream.publish_time_ms / 1000
            if published < joined.timestamp():
                replayed += 1
                continue
            live += 1
            print(f"live  {tick.time:%H:%M:%S.%f} {tick.price} x {tick.size}")
            if live >= args.live:
                break
        sub.close()
    print(f"replayed {replayed} ticks published since {since:%H:%M:%S} UTC, then {live} live")
    print(f"repairs: {sub.stats}")


if __name__ == "__main__":
    try:
        sys.exit(main())
    except CandlewireError as exc:  # the stack down, a ticker refused: one line, no traceback
        sys.exit(f"error: {exc}")
