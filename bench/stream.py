"""The streaming job on this machine: sustained ticks/s, and tick → live candle latency.

Throughput: a burst of N ticks (encoded beforehand) is written to Kafka as fast as possible;
we time until the live query has published all of them and the job has committed all of them
to the ``ticks`` table (latency is measured only after that). Latency: ticks at a low rate,
each stamped when produced; a client subscribed through the relay to ``{ticker}|ohlc:60``
receives candle updates. An update counting k trades of its minute shows that minute's first
k ticks, so each tick's latency is the receive time of the first update that shows it minus its produce time
(every tick counts, not just the newest of each update). The last line is JSON.

    python -m bench.stream [--burst N] [--latency-seconds S]
"""

from __future__ import annotations

import argparse
import json
import statistics
import threading
import time

import zmq
from confluent_kafka import Producer

from bench.stack import private_stack, stream_metric, wait_until_warm
from bench.stats import pct
from candlewire.kafka import TICKS, producer_config
from candlewire.topics import market_data_topic
from proto import market_pb2
from proto.envelope import decode_sub, to_record


def committed_ticks(settings) -> float:
    return stream_metric(settings, 'candlewire_stream_rows_total{table="ticks"}')


def published_ticks(settings) -> float:
    return stream_metric(settings, 'candlewire_stream_published_total{kind="tick"}')


def tick(ticker: str, i: int, t_ns: int) -> bytes:
    return to_record(
        market_pb2.Tick(
            ticker=ticker,
            trade_id=str(i),
            price=f"{100 + i % 50}.25",
            size="0.010",
            side=market_pb2.BUY,
            exchange_time_ns=t_ns,
        )
    )


def throughput(settings, n: int) -> dict[str, float]:
    """Ticks/s over the wall clock, from the first produce to the last tick published live,
    and to the last committed (which includes up to one commit trigger's wait)."""
    producer = Producer(producer_config(settings, **{"linger.ms": 20}))
    now = time.time_ns()
    values = [tick(f"BENCH:T{i % 8}/USDT", i, now + i * 1000) for i in range(n)]
    base, base_live = committed_ticks(settings), published_ticks(settings)
    t0 = time.perf_counter()
    for i, value in enumerate(values):
        while True:
            try:
                producer.produce(TICKS.name, key=f"BENCH:T{i % 8}/USDT".encode(), value=value)
                break
            except BufferError:
                producer.poll(0.05)
    producer.flush(120)
    produced = time.perf_counter() - t0
    while published_ticks(settings) - base_live < n:
        time.sleep(0.2)
    live = time.perf_counter() - t0
    while committed_ticks(settings) - base < n:
        time.sleep(0.2)
    elapsed = time.perf_counter() - t0
    rates = {"live": n / live, "committed": n / elapsed}
    print(
        f"{n:,} ticks produced in {produced:.1f}s; published live after {live:.1f}s "
        f"({rates['live']:,.0f} ticks/s), committed after {elapsed:.1f}s ({rates['committed']:,.0f} ticks/s)"
    )
    return rates


def latency(settings, seconds: float, rate: float = 20.0) -> list[float]:
    ticker = "BENCH:LAT/USDT"
    sent: dict[int, list[float]] = {}  # minute open → produce times, in order
    samples: list[float] = []
    stop = threading.Event()

    def produce() -> None:
        producer = Producer(producer_config(settings, **{"linger.ms": 0}))
        i = 0
        while not stop.is_set():
            now_ns = time.time_ns()
            minute = now_ns // 60_000_000_000 * 60_000
            sent.setdefault(minute, []).append(time.time())
            producer.produce(TICKS.name, key=ticker.encode(), value=tick(ticker, i, now_ns))
            producer.poll(0)
            i += 1
            time.sleep(1 / rate)
        producer.flush(10)

    # A raw SUB: the bench plays the ingestor itself, so the Client would rightly report that
    # no ingestor serves BENCH.
    with zmq.Context() as ctx, ctx.socket(zmq.SUB) as sub:
        sub.setsockopt(zmq.LINGER, 0)
        sub.subscribe(market_data_topic(ticker, "ohlc:60"))
        sub.connect(settings.connect("market_data"))
        updates = (decode_sub(sub.recv_multipart())[1] for _ in iter(int, 1))
        time.sleep(1.0)
        worker = threading.Thread(target=produce)
        worker.start()
        deadline = time.time() + seconds
        seen: dict[int, int] = {}  # minute open → trades already shown by an earlier update
        try:
            for candle in updates:
                got = time.time()
                times = sent.get(candle.open_time_ms, [])
                k = min(candle.trade_count, len(times))
                # Every tick this update shows for the first time has waited until now.
                samples.extend(got - t for t in times[seen.get(candle.open_time_ms, 0) : k])
                seen[candle.open_time_ms] = max(seen.get(candle.open_time_ms, 0), k)
                if got > deadline:
                    break
        finally:
            stop.set()
            worker.join()
    return samples


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--burst", type=int, default=1_000_000)
    parser.add_argument("--latency-seconds", type=float, default=60.0)
    args = parser.parse_args()
    with private_stack() as settings:
        wait_until_warm(settings)
        rates = throughput(settings, args.burst)
        lat = sorted(latency(settings, args.latency_seconds))
    p50, p99 = statistics.median(lat) * 1000, pct(lat, 0.99)
    print(
        f"tick → candle update via relay: p50 {p50:.0f} ms, p99 {p99:.0f} ms over {len(lat)} ticks"
    )
    print(
        json.dumps(
            {
                **{f"ticks_per_s_{k}": round(v) for k, v in rates.items()},
                "latency_p50_ms": round(p50),
                "latency_p99_ms": round(p99),
                "ticks": len(lat),
            }
        )
    )


if __name__ == "__main__":
    main()
