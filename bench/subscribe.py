"""Cold-ticker subscribe latency: ``subscribe()`` to the first tick, over 20 tickers.

The path is the whole platform: the subscription travels client → relay → ingestor (XPUB),
the owning ingestor starts the exchange stream, trades go to Kafka, the Spark job publishes
them, and the relay forwards them. The ingestor is warm; each ticker is cold (nobody
streamed it before). SIM trades 10 times a second per ticker, so waiting for the exchange's
first trade adds up to 0.1 s.

The last line is JSON. ``python -m bench.subscribe [--tickers 20]``
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

from bench.stack import private_stack, wait_until_warm
from candlewire import Client
from ingest.exchanges.sim import SimExchange
from ingest.service import Ingestor

EXCHANGE = "BENCHSUB"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--tickers", type=int, default=20)
    args = parser.parse_args()
    pairs = {f"C{i}/USDT": 100.0 + i for i in range(args.tickers)}
    with private_stack() as settings:
        ingestor = Ingestor(
            settings, [SimExchange(name=EXCHANGE, symbols=pairs, rate=10.0)], metrics=False
        ).start()
        wait_until_warm(settings)
        samples = []
        try:
            with Client(settings) as client:
                for pair in pairs:
                    ticker = f"{EXCHANGE}:{pair}"
                    t0 = time.perf_counter()
                    updates = client.subscribe(ticker, "tick", idle_timeout=120)
                    tick = next(updates)
                    samples.append(time.perf_counter() - t0)
                    updates.close()
                    assert tick.ticker == ticker
                    print(f"{ticker}: first tick after {samples[-1]:.3f}s", flush=True)
        finally:
            ingestor.stop()
    samples.sort()
    p99 = samples[min(len(samples) - 1, round(0.99 * (len(samples) - 1)))]
    median = statistics.median(samples)
    print(
        f"cold subscribe → first tick over {len(samples)} tickers: p50 {median:.3f}s, p99 {p99:.3f}s"
    )
    print(json.dumps({"tickers": len(samples), "p50_s": round(median, 3), "p99_s": round(p99, 3)}))


if __name__ == "__main__":
    main()
