"""Fanout throughput through the relay against direct PUB→SUB, in one run.

Publisher, subscribers and the relay are separate processes. Each case sends the same
100-byte Tick envelopes; subscribers count what they receive between the first measured
message and the end marker. The last line is JSON: direct_msgs_per_s, relay_msgs_per_s, ratio
(for 10 subscribers, the fanout case), with the 1-subscriber figures beside it.

    python -m bench.relay [--messages N] [--curve]

With ``--curve`` it also runs the relay with CURVE on (keys from ``candlewire keys init``,
every peer keyed) and reports ``curve_ratio``, the relay's forwarded msgs/s with CURVE ÷
without for 10 subscribers (``curve_ratio_1_subscriber`` beside it), and
``handshake_1000_s``: how long 1,000 clients take to complete their CURVE handshakes with
the relay at once. ``cpu_us_per_tick`` splits the CPU time of the 10-subscriber cases
between relay, subscribers and publisher: on a machine they share, that split is what
bounds the ratio.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import resource
import subprocess
import tempfile
import time
from dataclasses import dataclass

import zmq

from bench.stack import sigterm_unwinds
from bench.stats import process_cpu_s
from candlewire.config import Settings
from candlewire.curve import Keyring, dial
from candlewire.testing import candlewire_command, free_settings, this_tree
from candlewire.topics import market_data_topic, tick_type
from proto import market_pb2
from proto.envelope import encode_topic

TOPIC = market_data_topic("BINANCE:BTC/USDT", tick_type())
END = b"END"
IDLE_MS = 3000  # a subscriber that hears nothing this long after its first tick is done


def tick_frames() -> list[bytes]:
    tick = market_pb2.Tick(
        ticker="BINANCE:BTC/USDT",
        trade_id="1234567890",
        price="65000.12",
        size="0.00100000",
        side=market_pb2.BUY,
        exchange_time_ns=1_700_000_000_000_000_000,
        ingest_time_ns=1_700_000_000_000_500_000,
    )
    frames = encode_topic(TOPIC, tick)
    # Pad the trade id so the envelope (version + type + payload) is 100 bytes.
    pad = 100 - sum(len(f) for f in frames[1:])
    tick.trade_id += "0" * pad
    frames = encode_topic(TOPIC, tick)
    assert sum(len(f) for f in frames[1:]) == 100
    return frames


def cpu_s() -> float:
    """This process's CPU time so far, its libzmq I/O threads (where CURVE runs) included."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def subscriber(
    endpoint: str, ready: mp.Event, out: mp.Queue, settings: Settings | None = None
) -> None:
    ctx = zmq.Context()
    sub = ctx.socket(zmq.SUB)
    if settings is not None:
        dial(sub, settings, "relay", "local")
    sub.setsockopt(zmq.RCVHWM, 0)
    sub.subscribe(TOPIC.encode())
    sub.subscribe(END)
    sub.connect(endpoint)
    ready.set()
    count, first, idle_s = 0, 0.0, 0.0
    while True:
        try:
            frames = sub.recv_multipart()
        except zmq.Again:  # every END dropped at the relay's full queue: silence ends it
            idle_s = IDLE_MS / 1000
            break
        if frames[0] == END:
            if count:
                break
            continue
        if frames[1:2] == [b"warm"]:
            continue
        if count == 0:
            first = time.perf_counter()
            sub.setsockopt(zmq.RCVTIMEO, IDLE_MS)
        count += 1
    out.put((count, time.perf_counter() - first - idle_s, cpu_s()))
    sub.close(linger=0)
    ctx.term()


def publisher(
    endpoint: str,
    bind: bool,
    n: int,
    go: mp.Event,
    out: mp.Queue,
    settings: Settings | None = None,
) -> None:
    ctx = zmq.Context()
    pub = ctx.socket(zmq.PUB)
    if settings is not None:
        dial(pub, settings, "relay", "stream")
    pub.setsockopt(zmq.SNDHWM, 0)
    pub.bind(endpoint) if bind else pub.connect(endpoint)
    frames = tick_frames()
    go.wait()
    deadline = time.monotonic() + 1.0  # let subscriptions arrive (through the relay too)
    while time.monotonic() < deadline:
        pub.send_multipart([TOPIC.encode(), b"warm"])
        time.sleep(0.01)
    for _ in range(n):
        pub.send_multipart(frames)
    for _ in range(50):
        pub.send(END)
        time.sleep(0.02)
    pub.close(linger=-1)  # every message and END reach the relay, however slow it is
    ctx.term()
    out.put(cpu_s())


@dataclass
class Case:
    rate: float  # delivered msgs/s, summed over subscribers
    lost: int  # messages a subscriber never got (dropped at a full queue), summed
    subscribers_cpu_s: float
    publisher_cpu_s: float


def run_case(
    pub_endpoint: str,
    bind: bool,
    sub_endpoint: str,
    subs: int,
    n: int,
    settings: Settings | None = None,
) -> Case:
    """One publisher and ``subs`` subscribers; keyed peers when ``settings`` has CURVE."""
    ready = [mp.Event() for _ in range(subs)]
    go, out, pub_out = mp.Event(), mp.Queue(), mp.Queue()
    procs = [
        mp.Process(target=subscriber, args=(sub_endpoint, r, out, settings), daemon=True)
        for r in ready
    ]
    procs.append(
        mp.Process(
            target=publisher, args=(pub_endpoint, bind, n, go, pub_out, settings), daemon=True
        )
    )
    for p in procs:
        p.start()
    for r in ready:
        r.wait(30)
    go.set()
    results = [out.get(timeout=300) for _ in range(subs)]
    publisher_cpu = pub_out.get(timeout=120)
    for p in procs:
        p.join(60)
    return Case(
        rate=sum(count / max(elapsed, 1e-9) for count, elapsed, _ in results),
        lost=sum(n - count for count, _, _ in results),
        subscribers_cpu_s=sum(cpu for _, _, cpu in results),
        publisher_cpu_s=publisher_cpu,
    )


def through_relay(settings: Settings, subs: int, n: int) -> Case:
    """Publisher into ``publisher_ingress``, subscribers on ``market_data``, of a relay
    already running with ``settings``."""
    keyed = settings if settings.security.curve else None
    return run_case(
        settings.connect("publisher_ingress"),
        False,
        settings.connect("market_data"),
        subs,
        n,
        keyed,
    )


def handshakes(settings: Settings, clients: int = 1000) -> float:
    """Seconds until ``clients`` keyed sockets, connecting at once, are all through CURVE."""
    ctx = zmq.Context()
    ctx.set(zmq.MAX_SOCKETS, 4 * clients + 16)
    socks, monitors = [], []
    for _ in range(clients):
        sock = dial(ctx.socket(zmq.DEALER), settings, "relay", "local")
        sock.setsockopt(zmq.LINGER, 0)
        socks.append(sock)
        monitors.append(sock.get_monitor_socket(zmq.EVENT_HANDSHAKE_SUCCEEDED))
    poller = zmq.Poller()
    for mon in monitors:
        poller.register(mon, zmq.POLLIN)
    start = time.perf_counter()
    for sock in socks:
        sock.connect(settings.connect("client_requests"))
    done: set[zmq.Socket] = set()
    while len(done) < clients and time.perf_counter() - start < 120:
        for mon, _ in poller.poll(1000):
            mon.recv_multipart()
            done.add(mon)
            poller.unregister(mon)
    elapsed = time.perf_counter() - start
    if len(done) < clients:
        raise RuntimeError(f"only {len(done)} of {clients} handshakes completed")
    for sock in socks:
        sock.disable_monitor()
        sock.close()
    for mon in monitors:
        mon.close(linger=0)
    ctx.term()
    return elapsed


def start_relay(settings: Settings) -> subprocess.Popen:
    env = {**os.environ, **this_tree(), **settings.to_env()}
    relay = subprocess.Popen(candlewire_command("relay"), env=env)
    time.sleep(1.5)
    return relay


def curve_case(n: int) -> dict[str, object]:
    """The relay's rate for 10 and for 1 subscriber, without and then with CURVE."""
    cases: dict[tuple[bool, int], Case] = {}
    cpu: dict[str, dict[str, float]] = {}
    handshake_s = 0.0
    for curve in (False, True):
        mode = "curve" if curve else "plain"
        settings = free_settings(tempfile.mkdtemp(), security={"curve": curve})
        if curve:
            Keyring(settings).init()
        relay = start_relay(settings)
        try:
            before = process_cpu_s(relay.pid)
            case = cases[(curve, 10)] = through_relay(settings, 10, n)
            per_tick = 1e6 / n
            cpu[mode] = {
                "relay": round((process_cpu_s(relay.pid) - before) * per_tick, 1),
                "subscribers": round(case.subscribers_cpu_s * per_tick, 1),
                "publisher": round(case.publisher_cpu_s * per_tick, 1),
            }
            cases[(curve, 1)] = through_relay(settings, 1, n)
            if curve:
                handshake_s = handshakes(settings)
        finally:
            relay.terminate()
            relay.wait(10)
        for subs in (10, 1):
            case = cases[(curve, subs)]
            print(f"{subs:>2} subscriber(s), {mode}: {case.rate:,.0f} msg/s, {case.lost:,} lost")
    return {
        "relay_plain_msgs_per_s": round(cases[(False, 10)].rate),
        "relay_curve_msgs_per_s": round(cases[(True, 10)].rate),
        "curve_ratio": round(cases[(True, 10)].rate / cases[(False, 10)].rate, 3),
        "curve_ratio_1_subscriber": round(cases[(True, 1)].rate / cases[(False, 1)].rate, 3),
        "cpu_us_per_tick": cpu,
        "handshake_1000_s": round(handshake_s, 3),
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--messages", type=int, default=200_000)
    parser.add_argument("--curve", action="store_true", help="also measure CURVE's cost")
    args = parser.parse_args()
    if args.curve:
        print(json.dumps({**curve_case(args.messages), "cores": os.cpu_count()}))
        return
    settings = free_settings(tempfile.mkdtemp())
    relay = start_relay(settings)
    results: dict[str, float] = {}
    try:
        for subs in (1, 10):
            direct_ep = f"tcp://127.0.0.1:{settings.port('stream_pub')}"
            d = run_case(direct_ep, True, direct_ep, subs, args.messages).rate
            r = through_relay(settings, subs, args.messages).rate
            results[f"direct_{subs}"], results[f"relay_{subs}"] = d, r
            print(
                f"{subs:>2} subscriber(s): direct {d:,.0f} msg/s, relay {r:,.0f} msg/s, ratio {r / d:.3f}"
            )
    finally:
        relay.terminate()
        relay.wait(10)
    summary = {
        "direct_msgs_per_s": round(results["direct_10"]),
        "relay_msgs_per_s": round(results["relay_10"]),
        "ratio": round(results["relay_10"] / results["direct_10"], 3),
        "ratio_1_subscriber": round(results["relay_1"] / results["direct_1"], 3),
        "messages": args.messages,
        "cores": os.cpu_count(),
    }
    print(json.dumps(summary))


if __name__ == "__main__":
    with sigterm_unwinds():  # its brokers and services stop on a kill too
        main()
