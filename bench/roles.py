"""The processes of the multi-host setup, one role per host (``python -m bench.roles ROLE``),
configured like every candlewire process by ``CANDLEWIRE_*`` variables.

- ``publisher``: a stream publisher (the stream job's own ``StreamPublisher``, so sequenced
  and journalled) streaming one ticker's ticks at ``--rate``; with ``--history-from`` it also
  plays ingestor and stream job for history requests: it takes work from every relay and
  publishes each HistoryReady (``--history-from`` each relay host).
- ``client``: ``candlewire.Client`` through every relay: subscribes to ``--ticker``s and
  sends ``--history`` requests one after another; writes what it got to ``--out``, one line
  per event (``tick TICKER SEQ WALL_NS``, ``history REQUEST_ID STATUS WALL_NS``).
- ``counter``: a bare SUB on one relay counting one ticker's messages (throughput, no
  per-message Python beyond the count); prints the count when terminated.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
import time
from pathlib import Path
from typing import TextIO

import zmq

from candlewire.client import Client
from candlewire.config import Settings
from candlewire.curve import dial
from candlewire.testing import TickFeed, history_ready
from candlewire.topics import market_data_topic, tick_type, work_prefix
from proto import requests_pb2 as rq
from proto.envelope import decode_sub

STOP = threading.Event()
signal.signal(signal.SIGTERM, lambda *_: STOP.set())


def publisher(args: argparse.Namespace, settings: Settings) -> None:
    from streaming.publisher import StreamPublisher

    pub = StreamPublisher(settings)
    feed = TickFeed(pub)
    feed.ticker, feed.topic = args.ticker, market_data_topic(args.ticker, tick_type())
    work = None
    if args.history_from:
        work = dial(zmq.Context.instance().socket(zmq.SUB), settings, "relay", "ingest")
        work.subscribe(work_prefix("SIM"))
        for relay in args.history_from:  # every relay's work queue, as an ingestor takes it
            work.connect(f"tcp://{relay}:{settings.port('work_queue')}")
    start, sent = time.monotonic(), 0
    while not STOP.is_set():
        due = int((time.monotonic() - start) * args.rate) - sent
        if due > 0:
            feed.publish(min(due, 5000))
            sent += min(due, 5000)
        if work is not None and work.poll(0):
            _, req = decode_sub(work.recv_multipart())
            pub.notify(req.notification_topic, history_ready(req))  # and again, as the job does
        time.sleep(0.002)
    pub.close()


def client(args: argparse.Namespace, settings: Settings) -> None:
    # Every line is written as it comes (line buffering): a stop need not wait for a history
    # request or a subscription to return.
    signal.signal(signal.SIGTERM, lambda *_: os._exit(0))
    with Path(args.out).open("a", buffering=1) as out:  # lines: read while it runs
        _client(args, settings, out)


def _client(args: argparse.Namespace, settings: Settings, out: TextIO) -> None:
    lock = threading.Lock()

    def write(line: str) -> None:
        with lock:
            out.write(line + "\n")

    def follow(ticker: str) -> None:
        with Client(settings) as c:
            for tick in c.subscribe(ticker, idle_timeout=None):
                write(f"tick {ticker} {tick.stream.seq} {time.time_ns()}")
                if STOP.is_set():
                    return

    threads = [threading.Thread(target=follow, args=(t,), daemon=True) for t in args.ticker]
    for t in threads:
        t.start()
    with Client(settings, attempt_timeout=1.0) as c:
        for i in range(args.history):
            if STOP.is_set():
                break
            note = c.request_history(
                args.history_ticker,
                60,
                1_700_000_000_000 + i * 60_000,
                1_700_000_000_000 + (i + 60) * 60_000,
                timeout=args.history_timeout,
            )
            write(
                f"history {note.request_id} {rq.HistoryStatus.Name(note.status)} {time.time_ns()}"
            )
            time.sleep(args.history_gap)
    STOP.wait()
    with lock:
        out.flush()


def counter(args: argparse.Namespace, settings: Settings) -> None:
    sub = dial(zmq.Context.instance().socket(zmq.SUB), settings, "relay")
    sub.setsockopt(zmq.RCVHWM, 0)
    sub.subscribe(market_data_topic(args.ticker[0], tick_type()))
    sub.connect(settings.connect("market_data"))
    while not sub.poll(100):  # the first message: connected and subscribed
        pass
    n, counting_from = 0, time.monotonic() + args.after
    while time.monotonic() < counting_from:
        if sub.poll(100):
            sub.recv_multipart()
    until = counting_from + args.seconds
    while time.monotonic() < until and not STOP.is_set():
        if sub.poll(100):
            for _ in range(10_000):  # then look at STOP again
                try:
                    sub.recv_multipart(zmq.NOBLOCK, copy=False)
                except zmq.Again:
                    break
                n += 1
    print(n, time.monotonic() - counting_from, flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.roles")
    parser.add_argument("role", choices=["publisher", "client", "counter"])
    parser.add_argument("--ticker", action="append", default=[])
    parser.add_argument("--rate", type=int, default=1000)
    parser.add_argument("--history", type=int, default=0)
    parser.add_argument("--history-gap", type=float, default=0.2)
    parser.add_argument("--history-ticker", default="SIM:HIST/USDT")
    parser.add_argument("--history-timeout", type=float, default=60.0)
    parser.add_argument("--history-from", action="append", default=[], help="relay hosts")
    parser.add_argument("--out", default="client.log")
    parser.add_argument("--after", type=float, default=0.0, help="counter: start counting")
    parser.add_argument("--seconds", type=float, default=10.0, help="counter: count so long")
    args = parser.parse_args(argv)
    settings = Settings()
    role = {"publisher": publisher, "client": client, "counter": counter}[args.role]
    if args.role == "publisher":
        args.ticker = args.ticker[0]
    role(args, settings)
    return 0


if __name__ == "__main__":
    sys.exit(main())
