"""An alert with a CEP trigger: register it, wait for it to fire, print the firing.

    python examples/alert.py [--ticker BINANCE:BTC/USDT] [--percent 0.5] [--window 300]
                             [--user alice] [--timeout 600]

Fires when a trade moves ``--percent`` away from the window's low or high, in either
direction. With ``--user`` the firing is also that user's alert on the gateway's page.
Needs a running stack (``make up``), whose ``up`` loads the symbol metadata that triggers are
checked against; ``--refresh`` loads it for the ticker's exchange first.
"""

from __future__ import annotations

import argparse
import sys
from datetime import UTC, datetime

from candlewire import CandlewireError, Client, condition


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ticker", default="BINANCE:BTC/USDT")
    parser.add_argument("--percent", default="0.5", help="the move, in percent")
    parser.add_argument("--window", type=int, default=300, help="seconds")
    parser.add_argument("--user", default="", help="whose alert it is (optional)")
    parser.add_argument("--timeout", type=float, default=600.0)
    parser.add_argument("--refresh", action="store_true", help="refresh symbol metadata first")
    args = parser.parse_args(argv)

    with Client() as client:
        if args.refresh:
            client.refresh_metadata(args.ticker.split(":")[0], timeout=120)
        move = condition(
            "percent_move", percent=args.percent, window_s=args.window, direction="either"
        )
        ack = client.add_trigger(args.ticker, move, user_id=args.user)  # one-shot
        print(f"trigger {ack.trigger_id}: {args.ticker} moves {args.percent} %")
        firing = client.next_firing(timeout=args.timeout)
        if firing is None:
            client.remove_trigger(ack.trigger_id)
            print(f"no firing within {args.timeout:.0f} s", file=sys.stderr)
            return 1
    at = datetime.fromtimestamp(firing.event_time_ms / 1000, UTC)
    print(f"fired at {at:%H:%M:%S} UTC: {firing.value} % against {firing.reference}")
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except CandlewireError as exc:  # the stack down, a ticker refused: one line, no traceback
        sys.exit(f"error: {exc}")
