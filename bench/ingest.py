"""SIM ticks per second that one ingestor process writes to Kafka, against Kafka's own
kafka-producer-perf-test measured in the same run on the same private broker.

The ingestor streams SIM trades at a rate higher than it can write; we count the records
that reach the ticks topic over the measuring window. The perf tool runs before it (after an
untimed run that warms the broker) and again after it, and ``ratio`` is taken against the
mean of the two: with one reference run, on a cold broker, on a machine whose speed drifts
(a shared host), one build gave ratios of 0.75 to 1.05. The last
line is JSON with ``ingest_ticks_per_s``, ``kafka_perf_records_per_s`` (that mean),
``kafka_perf_before`` and ``kafka_perf_after``, and ``ratio``.

    python -m bench.ingest [--seconds S]
"""

from __future__ import annotations

import argparse
import json
import threading
import time

from confluent_kafka import Consumer, TopicPartition

from bench.kafka import perf_test_records_per_s
from bench.stack import private_broker, sigterm_unwinds
from candlewire.kafka import TICKS, consumer_config, ensure_topics
from ingest.exchanges.sim import SimExchange
from ingest.gaps import GapDetector, GapWatch
from ingest.jobs import run_stream
from ingest.sink import KafkaSink


def topic_size(settings) -> int:
    c = Consumer(consumer_config(settings, "bench-size"))
    parts = c.list_topics(TICKS.name, timeout=10).topics[TICKS.name].partitions
    total = sum(
        c.get_watermark_offsets(TopicPartition(TICKS.name, p), timeout=10)[1] for p in parts
    )
    c.close()
    return total


class Flood(SimExchange):
    """SIM's trades for the past hours, replayed as fast as the sink takes them, ten
    minutes a run (36,000 trades)."""

    def trade_runs(self, ticker, stop):
        m0 = (int(time.time() * 1000) - 86_400_000 - 1_577_836_800_000) // 60_000
        while not stop.is_set():
            yield self.trade_run(ticker, m0, m0 + 10)
            m0 += 10


def sim_ticks_per_s(settings, seconds: float) -> float:
    """SIM ticks/s one ingestor's stream writes into the ticks topic, over ``seconds``."""
    sink = KafkaSink(settings)
    stop = threading.Event()
    # As an Ingestor streams: every trade through its gap detector (#37).
    gaps = GapWatch(GapDetector("SIM:BTC/USDT", sequential=True), lambda _gap, _recent: None)
    worker = threading.Thread(
        target=run_stream,
        args=("SIM:BTC/USDT", Flood(rate=60.0), sink, stop),
        kwargs={"gaps": gaps},
    )
    before = topic_size(settings)
    worker.start()
    time.sleep(1.0)  # warm-up
    t0, n0 = time.perf_counter(), topic_size(settings)
    time.sleep(seconds)
    t1, n1 = time.perf_counter(), topic_size(settings)
    stop.set()
    worker.join()
    sink.flush()
    rate = (n1 - n0) / (t1 - t0)
    print(f"ingestor wrote {n1 - before:,} ticks; {rate:,.0f} ticks/s over {t1 - t0:.1f}s")
    return rate


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--records", type=int, default=2_000_000)
    args = parser.parse_args()
    with private_broker() as settings:
        ensure_topics(settings)
        # Untimed: a fresh broker's first run pays for its own warm-up (its JIT, its
        # log's first segments), a quarter to a third below the runs after it.
        perf_test_records_per_s(settings, args.records // 4)
        before = perf_test_records_per_s(settings, args.records)
        rate = sim_ticks_per_s(settings, args.seconds)
        after = perf_test_records_per_s(settings, args.records)
    baseline = (before + after) / 2
    print(
        json.dumps(
            {
                "ingest_ticks_per_s": round(rate),
                "kafka_perf_records_per_s": round(baseline),
                "kafka_perf_before": round(before),
                "kafka_perf_after": round(after),
                "ratio": round(rate / baseline, 3),
            }
        )
    )


if __name__ == "__main__":
    with sigterm_unwinds():  # its brokers and services stop on a kill too
        main()
