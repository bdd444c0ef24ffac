"""The stack under steady load for a long time (#34): what must not grow as it runs for days.

Steady trades at ``--rate`` ticks/s over ``--tickers`` tickers are written into the ticks
topic exactly as an ingestor writes them, for ``--minutes``. Each minute one line: ticks
produced and committed so far, how far Iceberg is behind Kafka (the job's
``candlewire_stream_iceberg_behind_seconds``), each commit phase's mean over the ticks
batches that ended in that minute (from the job's log), and each part's PSS (its whole
process tree) in MiB. Then:

- ``lag_s``: from the last trade produced until Iceberg's ``ticks`` holds every one of them
  (the commit time of the first snapshot that does);
- ``candles_equal``: for 3 sampled tickers, every candle of every period in ``ohlc`` equals
  a pandas resample of exactly the trades produced for it;
- ``commit_growth``: mean batch time (its phases summed) of the last 5 ticks batches that
  committed ticks over the first 5; ``rss_growth`` and ``pss_growth``: the stack's summed RSS
  and PSS at the last minute over minute 2 (the first minute pays for JIT and warm caches).
  Both stay near 1 in a stack that can run for days; ``committing_batches`` says how many
  batches the first and last 5 are of. ``pss_mib`` and ``rss_mib``: the stack at minute 2
  and at its largest (PSS counts each shared page once: the memory the stack holds).

"Committed" counts the ``ticks`` rows metric, which also counts the local ingestor's own SIM
trades (a few per second). The last line is JSON.

    python -m bench.soak [--minutes 30] [--rate 5000] [--tickers 50]
"""

from __future__ import annotations

import argparse
import json
import math
import random
import re
import statistics
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from bench.oracle import iceberg_candles_equal, reference
from bench.stack import private_stack, stream_metric, wait_until_warm
from candlewire.config import Settings
from candlewire.kafka import TICKS
from candlewire.lake import load_table
from ingest.sink import KafkaSink
from launcher.stack import Memory, default_services, gauge, stack_memory
from proto import market_pb2
from streaming.metrics import ICEBERG_BEHIND

SLICE_S = 0.1  # production is paced per slice
MAX_BACKLOG_S = 1.0  # a producer that fell behind catches up at most this much, never bursts
DRAIN_TIMEOUT_S = 600.0
SAMPLED = 3  # tickers whose candles are checked against pandas
BATCH_LINE = re.compile(r"ticks batch (\d+): (\d+) ticks[^;]*; (.*)$")
PHASE = re.compile(r"([A-Za-z_][\w-]*) (\d+(?:\.\d+)?)s\b")


# The job's log --------------------------------------------------------------------------


@dataclass
class Batch:
    batch_id: int
    ticks: int
    phases: dict[str, float]

    @property
    def total_s(self) -> float:
        return sum(self.phases.values())


class BatchLog:
    """The committing query's batches as its log lines appear, from where the soak began:
    the names after the ``;`` are taken as they come, so renamed or new phases still show."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.offset = path.stat().st_size if path.exists() else 0
        self.batches: list[Batch] = []

    def read(self) -> list[Batch]:
        """The batches logged since the last call."""
        if not self.path.exists():
            return []
        with self.path.open("rb") as f:
            f.seek(self.offset)
            data = f.read()
        complete = data.rfind(b"\n") + 1  # a line being written is read next time
        self.offset += complete
        new = []
        for line in data[:complete].decode(errors="replace").splitlines():
            m = BATCH_LINE.search(line)
            if m:
                phases = {k: float(v) for k, v in PHASE.findall(m.group(3))}
                new.append(Batch(int(m.group(1)), int(m.group(2)), phases))
        self.batches += new
        return new


def phase_means(batches: list[Batch]) -> str:
    if not batches:
        return "no batch"
    names = list(dict.fromkeys(k for b in batches for k in b.phases))
    means = (
        f"{k} {statistics.mean(b.phases[k] for b in batches if k in b.phases):.2f}s" for k in names
    )
    n = len(batches)
    return f"{n} batch{'es' if n > 1 else ''}: " + ", ".join(means)


def commit_growth(batches: list[Batch], n: int = 5) -> float | None:
    """Mean total time of the last ``n`` batches that committed ticks over the first ``n``."""
    committing = [b.total_s for b in batches if b.ticks > 0]
    if not committing:
        return None
    k = min(n, len(committing))
    first = statistics.mean(committing[:k])
    return statistics.mean(committing[-k:]) / first if first else None


# Producing trades ----------------------------------------------------------------------


@dataclass
class Feed:
    """One ticker's trades: strictly increasing event times, trade ids and a price walk
    in whole cents, so every decimal string is exact."""

    ticker: str
    cents: int
    last_ns: int = 0
    seq: int = 0
    kept: list[tuple[int, str, str]] | None = None  # (time ns, price, size) when sampled

    def trade(self, rng: random.Random, now_ns: int) -> market_pb2.Tick:
        self.seq += 1
        self.last_ns = max(now_ns, self.last_ns + 1)  # in order, no ties: close is defined
        self.cents = max(1, self.cents + rng.randint(-5, 5))
        lots = rng.randint(1, 50_000)  # 0.0001 .. 5.0000
        price = f"{self.cents // 100}.{self.cents % 100:02d}"
        size = f"{lots // 10_000}.{lots % 10_000:04d}"
        if self.kept is not None:
            self.kept.append((self.last_ns, price, size))
        return market_pb2.Tick(
            ticker=self.ticker,
            trade_id=str(self.seq),
            price=price,
            size=size,
            side=rng.choice((market_pb2.BUY, market_pb2.SELL)),
            exchange_time_ns=self.last_ns,
            ingest_time_ns=time.time_ns(),
        )


@dataclass
class Production:
    """Steady trades at ``rate`` ticks/s for ``seconds``, in a thread of its own so the
    minute lines never disturb the pace."""

    settings: Settings
    feeds: list[Feed]
    rate: float
    seconds: float
    rng: random.Random = field(default_factory=lambda: random.Random(34))
    produced: int = 0
    last_ns: int = 0  # the last trade's event time (the wall clock when produced)
    stop: threading.Event = field(default_factory=threading.Event)
    error: BaseException | None = None  # raised again by the main thread

    def run(self) -> None:
        try:
            self._produce()
        except BaseException as exc:
            self.error = exc

    def _produce(self) -> None:
        sink = KafkaSink(self.settings)  # the ingestor's own: idempotent, acks=all, bounded
        t0 = time.monotonic()
        due = 0.0
        while not self.stop.is_set():
            elapsed = time.monotonic() - t0
            if elapsed >= self.seconds:
                break
            # A slice's share, plus what earlier slices missed up to MAX_BACKLOG_S: a stall
            # (a GC, a busy core) never turns into a burst the job would see as a spike.
            due = min(due + self.rate * SLICE_S, self.rate * MAX_BACKLOG_S)
            n = int(due)
            due -= n
            for _ in range(n):
                feed = self.feeds[self.rng.randrange(len(self.feeds))]
                tick = feed.trade(self.rng, time.time_ns())
                sink.send(TICKS.name, feed.ticker, tick)  # keyed by ticker
                self.last_ns = feed.last_ns
                self.produced += 1
            sink.poll()
            next_slice = t0 + (int(elapsed / SLICE_S) + 1) * SLICE_S
            time.sleep(max(0.0, next_slice - time.monotonic()))
        sink.flush(120)


# Iceberg -----------------------------------------------------------------------------


def committed_rows(settings: Settings) -> float:
    return stream_metric(settings, 'candlewire_stream_rows_total{table="ticks"}')


def ticker_filter(tickers: list[str]) -> str:
    return "ticker in (" + ", ".join(f"'{t}'" for t in tickers) + ")"


def wait_for_ticks(settings: Settings, prod: Production, base: float) -> float | None:
    """Seconds from the last trade produced until ``ticks`` first held all of them: the
    commit time of the first snapshot whose count of our tickers is complete. The rows
    metric says when to start looking (it also counts SIM trades, so it is not the proof)."""
    want, last_s = prod.produced, prod.last_ns / 1e9
    where = ticker_filter([f.ticker for f in prod.feeds])
    table = load_table(settings, "ticks")
    checked: set[int] = set()
    deadline = time.monotonic() + DRAIN_TIMEOUT_S
    while time.monotonic() < deadline:
        if committed_rows(settings) - base < want:
            time.sleep(0.5)
            continue
        table.refresh()
        for snap in sorted(table.snapshots(), key=lambda s: s.timestamp_ms):
            if snap.snapshot_id in checked or snap.timestamp_ms / 1000 < last_s:
                continue
            checked.add(snap.snapshot_id)
            held = table.scan(row_filter=where, snapshot_id=snap.snapshot_id).count()
            if held > want:
                print(f"ticks holds {held - want:,} more of our trades than were produced")
            if held >= want:
                return snap.timestamp_ms / 1000 - last_s
        time.sleep(1.0)
    print(f"ticks did not hold all {want:,} trades within {DRAIN_TIMEOUT_S:.0f}s")
    return None


# The run ---------------------------------------------------------------------------------


def _seconds(s: float | None) -> str:
    """``12s``, or ``-`` when the job did not say (not answering, or no commit yet)."""
    return "-" if s is None or math.isnan(s) else f"{s:.0f}s"


def minute_line(
    minute: int,
    prod: Production,
    committed: float,
    behind_s: float | None,
    batches: list[Batch],
    mem: dict[str, Memory],
) -> str:
    parts = " ".join(f"{k} {v.pss:.0f}" for k, v in mem.items())
    total = sum(mem.values(), Memory())
    return (
        f"minute {minute}: {prod.produced:,} produced, {committed:,.0f} committed, "
        f"Iceberg {_seconds(behind_s)} behind Kafka; "
        f"{phase_means(batches)}; PSS MiB {parts}, total {total.pss:.0f} (RSS {total.rss:.0f})"
    )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--minutes", type=int, default=30)
    parser.add_argument("--rate", type=float, default=5000.0, help="ticks/s")
    parser.add_argument("--tickers", type=int, default=50)
    args = parser.parse_args()
    if args.minutes < 3:
        parser.error("--minutes must be at least 3: RSS growth is measured from minute 2")
    rng = random.Random(7)
    feeds = [
        Feed(f"SOAK:S{i:03d}/USDT", cents=rng.randint(1_000, 500_000)) for i in range(args.tickers)
    ]
    sampled = rng.sample(feeds, min(SAMPLED, len(feeds)))
    for feed in sampled:
        feed.kept = []
    with private_stack() as settings:
        wait_until_warm(settings)
        services = default_services(settings)
        log = BatchLog(settings.state_dir / "logs" / "stream.log")
        base = committed_rows(settings)
        prod = Production(settings, feeds, args.rate, args.minutes * 60.0)
        worker = threading.Thread(target=prod.run, daemon=True)
        t0 = time.monotonic()
        worker.start()
        totals: list[Memory] = []
        try:
            for minute in range(1, args.minutes + 1):
                time.sleep(max(0.0, t0 + minute * 60.0 - time.monotonic()))
                mem = stack_memory(services)
                totals.append(sum(mem.values(), Memory()))
                committed = committed_rows(settings) - base
                behind = gauge(settings, "stream_metrics", ICEBERG_BEHIND)
                line = minute_line(minute, prod, committed, behind, log.read(), mem)
                print(line, flush=True)
            worker.join()
        finally:
            prod.stop.set()
        if prod.error is not None:
            raise prod.error
        print(f"{prod.produced:,} trades produced; waiting for Iceberg to hold them", flush=True)
        lag = wait_for_ticks(settings, prod, base)
        held = "not all held" if lag is None else f"all held {lag:.1f}s after the last"
        print(f"after production: {phase_means(log.read())}; {held}", flush=True)
        equal = iceberg_candles_equal(
            settings, reference({f.ticker: f.kept or [] for f in sampled})
        )
        log.read()
        growth = commit_growth(log.batches)
    print(
        json.dumps(
            {
                "commit_growth": None if growth is None else round(growth, 2),
                "rss_growth": round(totals[-1].rss / totals[1].rss, 2),
                "pss_growth": round(totals[-1].pss / totals[1].pss, 2),
                "pss_mib": [round(totals[1].pss), round(max(t.pss for t in totals))],
                "rss_mib": [round(totals[1].rss), round(max(t.rss for t in totals))],
                "lag_s": None if lag is None else round(lag, 1),
                "candles_equal": equal,
                "minutes": args.minutes,
                "rate": args.rate,
                "tickers": args.tickers,
                "ticks": prod.produced,
                "committing_batches": sum(1 for b in log.batches if b.ticks > 0),
                "ticks_trigger_s": settings.stream_ticks_trigger_s,
            }
        )
    )


if __name__ == "__main__":
    main()
