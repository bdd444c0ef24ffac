"""CEP triggers at scale: 10,000 registered triggers over 100 tickers (#19).

Reference, not run by the platform: :func:`expected` computes every price crossing itself,
the oracle the JVM's firings are held to (the rule that runs is ``jvm/decoder``'s
``FeedTriggers``).

On a private stack (``bench.stack``), the bench lists 100 tickers in symbol metadata and
registers 100 price-cross triggers on each through the relay (levels spread over the
ticker's price range, up and down, re-arming with no cooldown: every crossing fires).

- **Throughput**, in the same run: a burst of N ticks on 100 tickers without triggers, then
  a burst of N on the 100 with them; each timed from the first produce to the last tick
  committed (``ticks_per_s_without``, ``ticks_per_s_with_triggers``; target ratio 0.8).
- **Fire latency**: ticks at a low rate on the triggered tickers, each stamped when produced;
  a firing's latency is its receive time minus the produce time of the trade that fired it
  (``fire_p99_ms``; target 1,000 ms).
- **Correctness**: the bench computes every crossing itself (the trade before a level on the
  near side, this one at or beyond it) over all the ticks it sent, and holds them against
  the firings received, each (trigger_id, firing) once: ``missed`` and ``extra`` must be 0.

    python -m bench.cep [--burst N] [--latency-seconds S] [--engine realtime|microbatch]

Either engine evaluates the triggers in the JVM's live path: as each record is read (the
real-time engine, the default), or as each micro-batch reaches the driver
(``--engine microbatch``).

The stack commits every 5 s (``CANDLEWIRE_STREAM_TICKS_TRIGGER_S``; 30 s by default), so a
burst's rate is the job's rather than one commit trigger's wait; the live path sends firings
ahead of the commits either way.
"""

from __future__ import annotations

import argparse
import json
import random
import threading
import time
from collections import Counter, defaultdict
from decimal import Decimal

import zmq
from confluent_kafka import Producer

from bench.kafka import produce_all
from bench.stack import private_stack, ticks_batches, wait_until_warm
from bench.stats import pct
from bench.stream import busy_seconds, committed_ticks
from candlewire import Client, TriggerRefused, condition
from candlewire.kafka import TICKS, producer_config
from candlewire.testing import list_symbols
from proto import cep_pb2 as cep
from proto import market_pb2
from proto.envelope import EnvelopeError, decode_sub, to_record

TICKERS = 100
COMMIT_S = 5.0
PER_TICKER = 100
S = 1_000_000_000


class Feed:
    """One ticker's random walk between 90 and 110 (a cent or two a trade: a trade crosses
    one of the ticker's levels, 20 cents apart, about once in twenty), and every trade sent."""

    def __init__(self, ticker: str, seed: int) -> None:
        self.ticker, self.rng = ticker, random.Random(seed)
        self.cents, self.sent = 10_000, []  # (trade_id, t_ns, price)

    def next(self, t_ns: int) -> bytes:
        self.cents = max(9_000, min(11_000, self.cents + self.rng.randint(-2, 2)))
        price = f"{self.cents // 100}.{self.cents % 100:02d}"
        trade_id = str(len(self.sent))
        self.sent.append((trade_id, t_ns, Decimal(price)))
        tick = market_pb2.Tick(
            ticker=self.ticker,
            trade_id=trade_id,
            price=price,
            size="0.01",
            side=market_pb2.BUY,
            exchange_time_ns=t_ns,
        )
        return to_record(tick)


def register(settings, tickers: list[str]) -> dict[str, tuple[str, Decimal, int]]:
    """100 triggers per ticker, one client per ticker; trigger_id → (ticker, level, dir)."""
    triggers: dict[str, tuple[str, Decimal, int]] = {}
    started = time.perf_counter()
    for n, ticker in enumerate(tickers):
        with Client(settings, client_id=f"bench-cep-{n}") as client:
            for k in range(PER_TICKER):
                level = Decimal(9_005 + k * 20) / 100  # 90.05 .. 109.85, off the cent grid
                direction = cep.UP if k % 2 == 0 else cep.DOWN
                trigger_id = f"b{n}-{k}"
                cond = condition(
                    "price_cross", level=str(level), direction="up" if k % 2 == 0 else "down"
                )
                while True:
                    try:
                        client.add_trigger(ticker, cond, trigger_id=trigger_id, once=False)
                        break
                    except TriggerRefused as exc:  # the desk reloads metadata every 5 s
                        if exc.reason != "UNKNOWN_TICKER":
                            raise
                        time.sleep(1.0)
                triggers[trigger_id] = (ticker, level, direction)
        if n % 10 == 9:
            print(f"  {len(triggers):,} triggers registered, {time.perf_counter() - started:.0f}s")
    return triggers


def expected(
    feeds: dict[str, Feed], triggers: dict[str, tuple[str, Decimal, int]]
) -> dict[str, list[int]]:
    """Every crossing, computed here: trigger_id → the event times it fires at."""
    by_ticker: dict[str, list[tuple[str, Decimal, int]]] = defaultdict(list)
    for trigger_id, (ticker, level, direction) in triggers.items():
        by_ticker[ticker].append((trigger_id, level, direction))
    out: dict[str, list[int]] = defaultdict(list)
    for ticker, feed in feeds.items():
        for (_, _, before), (_, t_ns, price) in zip(feed.sent, feed.sent[1:], strict=False):
            for trigger_id, level, direction in by_ticker[ticker]:
                up = direction == cep.UP and before < level <= price
                if up or (direction == cep.DOWN and before > level >= price):
                    out[trigger_id].append(t_ns)
    return out


class Firings(threading.Thread):
    """Every client's notification topic on one SUB; each (trigger_id, firing) once."""

    def __init__(self, settings) -> None:
        super().__init__(daemon=True)
        self.settings = settings
        self.got: dict[tuple[str, int], tuple[cep.CEPTriggerEvent, float]] = {}
        self.ready, self._halt = threading.Event(), threading.Event()

    def run(self) -> None:
        with zmq.Context() as ctx, ctx.socket(zmq.SUB) as sub:
            sub.setsockopt(zmq.RCVHWM, 0)
            sub.subscribe("RESPONSE:bench-cep-")
            sub.connect(self.settings.connect("market_data"))
            self.ready.set()
            while not self._halt.is_set():
                if not sub.poll(100):
                    continue
                frames, now = sub.recv_multipart(), time.time()
                try:
                    _topic, msg = decode_sub(frames)
                except EnvelopeError:
                    continue
                if isinstance(msg, cep.CEPTriggerEvent):
                    self.got.setdefault((msg.trigger_id, msg.firing), (msg, now))

    def stop(self) -> None:
        self._halt.set()
        self.join(5)


def burst(settings, feeds: list[Feed], n: int, t0_ns: int) -> tuple[float, float]:
    """N ticks round-robin over the feeds, event times 1 ms apart: ticks/s from the first
    produce until the batch that committed the last of them has ended (its candles MERGEd
    too, so none of its work spills into the next burst's time), and the seconds the
    committing query spent in its batches meanwhile."""
    producer = Producer(producer_config(settings, **{"linger.ms": 20}))
    values = [
        (f.ticker, f.next(t0_ns + i * 1_000_000)) for i, f in enumerate(feeds * (n // len(feeds)))
    ]
    base, started = committed_ticks(settings), time.perf_counter()
    busy_ticks = busy_seconds(settings, "ticks")
    produce_all(producer, TICKS.name, ((ticker.encode(), value) for ticker, value in values))
    while committed_ticks(settings) - base < len(values):
        time.sleep(0.2)
    batches = ticks_batches(settings)
    while ticks_batches(settings) == batches:  # the batch ends after its candles' MERGE
        time.sleep(0.2)
    rate = len(values) / (time.perf_counter() - started)
    return rate, busy_seconds(settings, "ticks") - busy_ticks


def trickle(settings, feeds: list[Feed], seconds: float, rate: float, t0_ns: int) -> dict:
    """Ticks at ``rate`` per second over the feeds; (ticker, event time) → produce time."""
    producer = Producer(producer_config(settings, **{"linger.ms": 0}))
    produced: dict[tuple[str, int], float] = {}
    deadline, i = time.time() + seconds, 0
    while time.time() < deadline:
        feed = feeds[i % len(feeds)]
        t_ns = t0_ns + i * S
        value = feed.next(t_ns)
        produced[(feed.ticker, t_ns)] = time.time()
        producer.produce(TICKS.name, key=feed.ticker.encode(), value=value)
        producer.poll(0)
        i += 1
        time.sleep(1 / rate)
    producer.flush(30)
    return produced


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--burst", type=int, default=300_000)
    parser.add_argument("--latency-seconds", type=float, default=90.0)
    parser.add_argument("--engine", choices=("realtime", "microbatch"), default="realtime")
    args = parser.parse_args()
    triggered = [f"BENCHCEP:T{i:03d}/USDT" for i in range(TICKERS)]
    plain = [f"BENCHCEP:P{i:03d}/USDT" for i in range(TICKERS)]
    # Commits every 5 s, not 30: a burst's rate is then the job's, not one trigger's wait.
    with private_stack(stream_ticks_trigger_s=COMMIT_S, stream_live_engine=args.engine) as settings:
        wait_until_warm(settings)
        list_symbols(settings, triggered)
        triggers = register(settings, triggered)
        firings = Firings(settings)
        firings.start()
        firings.ready.wait()
        feeds = {t: Feed(t, seed=i) for i, t in enumerate(triggered)}
        others = [Feed(t, seed=1_000 + i) for i, t in enumerate(plain)]
        t0 = (time.time_ns() - 3 * 3600 * S) // S * S  # the past: event time, not wall time
        # A first burst on other feeds pays for the job's first large batch (JIT, buffers),
        # so the two timed bursts meet the same job.
        warm = [Feed(f"BENCHCEP:W{i:03d}/USDT", seed=2_000 + i) for i in range(TICKERS)]
        print(f"warm-up: {burst(settings, warm, args.burst, t0)[0]:,.0f} ticks/s committed")
        without, busy_without = burst(settings, others, args.burst, t0)
        print(f"without triggers: {without:,.0f} ticks/s committed ({busy_without:.1f}s busy)")
        with_triggers, busy_with = burst(settings, list(feeds.values()), args.burst, t0)
        print(
            f"with {len(triggers):,} triggers: {with_triggers:,.0f} ticks/s committed "
            f"({busy_with:.1f}s busy committing)"
        )
        produced = trickle(
            settings, list(feeds.values()), args.latency_seconds, 20.0, t0 + 3600 * S
        )
        want = expected(feeds, triggers)
        deadline = time.time() + 120
        total = sum(len(v) for v in want.values())
        while len(firings.got) < total and time.time() < deadline:
            time.sleep(1.0)
        time.sleep(5.0)  # anything extra would have come by now
        firings.stop()
    got: dict[str, list[int]] = defaultdict(list)
    for (trigger_id, _), (event, _) in sorted(firings.got.items()):
        got[trigger_id].append(event.event_time_ms * 1_000_000)
    # A firing at another time than the crossing computed counts as one missed, one extra.
    missed = sum((Counter(want[t]) - Counter(got[t])).total() for t in triggers)
    extra = sum((Counter(got[t]) - Counter(want[t])).total() for t in triggers)
    lat = [
        received - produced[(event.ticker, event.event_time_ms * 1_000_000)]
        for event, received in firings.got.values()
        if (event.ticker, event.event_time_ms * 1_000_000) in produced
    ]
    print(f"{total:,} crossings computed, {len(firings.got):,} firings received")
    print(
        json.dumps(
            {
                "engine": args.engine,
                "triggers": len(triggers),
                "ticks_per_s_without": round(without),
                "ticks_per_s_with_triggers": round(with_triggers),
                "with_ratio": round(with_triggers / without, 2),
                "commit_busy_s_without": round(busy_without, 1),
                "commit_busy_s_with": round(busy_with, 1),
                "fire_p50_ms": round(pct(lat, 0.5)) if lat else None,
                "fire_p99_ms": round(pct(lat, 0.99)) if lat else None,
                "fire_samples": len(lat),
                "crossings": total,
                "missed": missed,
                "extra": extra,
            }
        )
    )


if __name__ == "__main__":
    main()
