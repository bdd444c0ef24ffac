"""Fanout throughput through the relay against direct PUB→SUB, in one run.

Publisher, subscribers and the relay are separate processes. Each case sends the same
100-byte Tick envelopes; subscribers count what they receive between the first measured
message and the end marker. The last line is JSON: direct_msgs_per_s, relay_msgs_per_s, ratio
(for 10 subscribers, the fanout case), with the 1-subscriber figures beside it.

    python -m bench.relay [--messages N]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import subprocess
import tempfile
import time

import zmq

from candlewire.testing import candlewire_command, free_settings
from candlewire.topics import market_data_topic, tick_type
from proto import market_pb2
from proto.envelope import encode_topic

TOPIC = market_data_topic("BINANCE:BTC/USDT", tick_type())
END = b"END"


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


def subscriber(endpoint: str, ready: mp.Event, out: mp.Queue) -> None:
    ctx = zmq.Context()
    sub = ctx.socket(zmq.SUB)
    sub.setsockopt(zmq.RCVHWM, 0)
    sub.subscribe(TOPIC.encode())
    sub.subscribe(END)
    sub.connect(endpoint)
    ready.set()
    count, first = 0, 0.0
    while True:
        frames = sub.recv_multipart()
        if frames[0] == END:
            if count:
                break
            continue
        if frames[1:2] == [b"warm"]:
            continue
        if count == 0:
            first = time.perf_counter()
        count += 1
    out.put((count, time.perf_counter() - first))
    sub.close(linger=0)
    ctx.term()


def publisher(endpoint: str, bind: bool, n: int, go: mp.Event) -> None:
    ctx = zmq.Context()
    pub = ctx.socket(zmq.PUB)
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
    pub.close(linger=5000)
    ctx.term()


def run_case(pub_endpoint: str, bind: bool, sub_endpoint: str, subs: int, n: int) -> float:
    ready = [mp.Event() for _ in range(subs)]
    go, out = mp.Event(), mp.Queue()
    procs = [mp.Process(target=subscriber, args=(sub_endpoint, r, out)) for r in ready]
    procs.append(mp.Process(target=publisher, args=(pub_endpoint, bind, n, go)))
    for p in procs:
        p.start()
    for r in ready:
        r.wait(30)
    go.set()
    results = [out.get(timeout=300) for _ in range(subs)]
    for p in procs:
        p.join(60)
    # Delivered messages per second, summed over subscribers.
    return sum(count / max(elapsed, 1e-9) for count, elapsed in results)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--messages", type=int, default=200_000)
    args = parser.parse_args()
    settings = free_settings(tempfile.mkdtemp())
    env = {**os.environ, **settings.to_env()}
    relay = subprocess.Popen(candlewire_command("relay"), env=env)
    time.sleep(1.5)
    results: dict[str, float] = {}
    try:
        for subs in (1, 10):
            direct_ep = f"tcp://127.0.0.1:{settings.port('stream_pub')}"
            d = run_case(direct_ep, True, direct_ep, subs, args.messages)
            r = run_case(
                settings.connect("publisher_ingress"),
                False,
                settings.connect("market_data"),
                subs,
                args.messages,
            )
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
    main()
