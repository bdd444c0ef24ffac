"""The committing plan alone, against Spark's own read of the same records (#34).

``bench.stream`` times the whole job: its live path, the bench's producer and the broker share
the cores with the committing query, and the JIT of a job two minutes old takes a third of
them, so one run differs from the next by a fifth. This bench holds everything else still: a
private broker and catalog, a million ticks over eight tickers written once (as
``bench.stream``'s burst), then rounds of three timed batch jobs (four with ``--append``) in
one Spark session, each round in the same order:

- ``read``: Spark's plain Kafka read of the topic, counted (``bench.stream``'s denominator);
- ``judge``: the committing plan (``Commit``, judging and candles in Spark's tasks) with the
  driver's summary gathered beside it, its stored ticks to a no-op sink;
- ``commit``: the same, its stored ticks appended to the Iceberg ``ticks`` table as the job
  appends them;
- ``append`` (with ``--append``): every record decoded by the JVM's UDF and appended to
  ``ticks`` as it is, with no judging and no state (a writer open per ticker, since a Kafka
  partition interleaves them where the committing plan hands over one ticker after
  another). It is the least any route that puts the topic's ticks into ``ticks`` through
  Spark pays, committing the live path's verdicts (#34's third option) included: that route
  reads, decodes and appends as many. It is off by default, so ``make bench-quick``'s rounds
  stay the ones its baseline was measured with.

``lost`` and ``duplicated`` count the ticks a batch kept fewer or more than were written, over
all batches (each judges the topic afresh, and every tick is distinct and timely), and
``tickers_differing`` the tickers whose candles, as the last batch made them, differ from a
pandas resample of their trades in any period (:mod:`bench.oracle`): all three must be 0.

Each figure is the best of the rounds after the first two (a fresh JVM's first rounds pay for
compiling). The ratios are each rate over ``read``'s in the same round set: the share of the
machine's read rate that judging, judging with the write, and the write alone leave. The last
line is JSON.

    python -m bench.commit [--ticks N] [--rounds R] [--append]
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable, Iterator
from decimal import Decimal

from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic
from pyspark.sql import DataFrame, Observation
from pyspark.sql import functions as F

from bench.kafka import produce_all
from bench.oracle import Candles, Trade, all_same, reference
from bench.spark_read import kafka_source
from bench.stack import private_postgres, running
from bench.stream import tick, trade
from candlewire.config import PERIODS_S, Settings
from candlewire.kafka import producer_config
from candlewire.lake import TICKS_SCHEMA, ensure_tables, table_name
from candlewire.spark import build_session
from launcher.stack import kafka_service
from streaming.decode import CONTROL, CONTROL_SQL, decode_ticks_in_jvm
from streaming.queries.ticks import (
    ONE_PASS,
    batch_counts,
    batch_summary,
    judged_in_tasks,
    stored_ticks,
)
from streaming.sql import columns_from_decoded

TOPIC = "bench.commit.ticks"
TICKERS = [f"BENCH:C{k}/USDT" for k in range(8)]
WARM_ROUNDS = 2


def produce(settings: Settings, n: int) -> dict[str, list[Trade]]:
    """``n`` ticks round-robin over :data:`TICKERS`, a microsecond apart, into six partitions
    keyed by ticker (as ingestors write them); each ticker's trades."""
    admin = AdminClient({"bootstrap.servers": settings.kafka_servers()})
    admin.create_topics([NewTopic(TOPIC, num_partitions=6, replication_factor=1)])[TOPIC].result()
    producer = Producer(producer_config(settings, **{"linger.ms": 20}))
    now = time.time_ns()
    trades: dict[str, list[Trade]] = {t: [] for t in TICKERS}

    def records() -> Iterator[tuple[bytes, bytes]]:
        for i in range(n):
            ticker = TICKERS[i % len(TICKERS)]
            trades[ticker].append(trade(i, now + i * 1000))
            yield ticker.encode(), tick(ticker, i, now + i * 1000)

    produce_all(producer, TOPIC, records())
    return trades


def judged_candles(candles: list) -> dict[str, Candles]:
    """A batch's changed candles (the summary's), as :func:`bench.oracle.reference` has them."""
    got: dict[str, Candles] = {t: {p: [] for p in PERIODS_S} for t in TICKERS}
    for c in candles:
        amounts = (Decimal(c[f]) for f in ("open", "high", "low", "close", "volume"))
        got[c["ticker"]][c["period_s"]].append((c["open_ms"], *amounts, c["trade_count"]))
    return {t: {p: sorted(rows) for p, rows in by.items()} for t, by in got.items()}


def timed(job: Callable[[], object]) -> float:
    t0 = time.perf_counter()
    job()
    return time.perf_counter() - t0


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--ticks", type=int, default=1_000_000)
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument(
        "--append", action="store_true", help="also time the topic decoded and appended unjudged"
    )
    args = parser.parse_args()
    if args.rounds <= WARM_ROUNDS:
        parser.error(f"--rounds must be more than the {WARM_ROUNDS} warm-up rounds")
    with private_postgres() as settings, running(kafka_service(settings)):
        trades = produce(settings, args.ticks)
        print(f"{args.ticks:,} ticks written to {TOPIC}", flush=True)
        ensure_tables(settings)
        spark = build_session(settings, "candlewire-bench-commit")
        ticks_table = table_name(settings, "ticks")

        def records() -> DataFrame:
            return kafka_source(spark, settings, TOPIC, False).select(
                "value", "partition", "offset", F.expr(CONTROL_SQL).alias(CONTROL.name)
            )

        observed: list[Observation] = []

        def judged() -> DataFrame:
            observed.append(Observation(f"commit-{len(observed)}"))
            plan = judged_in_tasks(
                records(), settings.stream_watermark_s, settings.stream_dedup_horizon_s
            )
            return plan.observe(observed[-1], *batch_summary())

        jobs: dict[str, Callable[[], object]] = {
            "read": lambda: (
                kafka_source(spark, settings, TOPIC, False)
                .select("value", "partition", "offset")
                .count()
            ),
            "judge": lambda: stored_ticks(judged()).write.format("noop").mode("overwrite").save(),
            "commit": lambda: (
                stored_ticks(judged()).writeTo(ticks_table).options(**ONE_PASS).append()
            ),
        }
        if args.append:
            jobs["append"] = lambda: (
                decode_ticks_in_jvm(spark, records().drop(CONTROL.name))
                .where("valid AND NOT idle")
                .select(*columns_from_decoded(TICKS_SCHEMA))
                .writeTo(ticks_table)
                .options(**{**ONE_PASS, "fanout-enabled": "true"})
                .append()
            )
        seconds: dict[str, list[float]] = {k: [] for k in jobs}
        for r in range(args.rounds):
            for name, job in jobs.items():
                seconds[name].append(timed(job))
            print(
                f"round {r + 1}: " + ", ".join(f"{k} {v[-1]:.2f} s" for k, v in seconds.items()),
                flush=True,
            )
        # Each batch judges the whole topic afresh (no state between them): every tick
        # is distinct and timely, so each is kept, and each batch changes every candle.
        kept = [batch_counts(o.get)["kept"] for o in observed]
        got = judged_candles(observed[-1].get["candles"])
        spark.stop()
    want = reference(trades)
    differing = sum(not all_same("candles", {t: got[t]}, {t: want[t]}) for t in want)
    rates = {k: args.ticks / min(v[WARM_ROUNDS:]) for k, v in seconds.items()}
    print(
        json.dumps(
            {
                **{f"{k}_per_s": round(v) for k, v in rates.items()},
                "judge_ratio": round(rates["judge"] / rates["read"], 3),
                "commit_ratio": round(rates["commit"] / rates["read"], 3),
                **(
                    {"append_ratio": round(rates["append"] / rates["read"], 3)}
                    if args.append
                    else {}
                ),
                "lost": sum(max(0, args.ticks - k) for k in kept),
                "duplicated": sum(max(0, k - args.ticks) for k in kept),
                "tickers_differing": differing,
                "ticks": args.ticks,
                "rounds": args.rounds,
            }
        )
    )


if __name__ == "__main__":
    main()
