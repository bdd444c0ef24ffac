"""User events through a real gateway process, and the raw ZMQ path beside them.

1. critical: a container DEALER sends CRITICAL events, ``--window`` in flight, to a user
   with a signed-in WebSocket session (channel ACTIVE_SESSION); each is timed from send to
   its DELIVERED ack: dedup lookup, directory lookup, delivery, ack row in PostgreSQL. (The
   stdlib Telegram stand-in serves ~300 requests/s by itself, so it would measure itself.)
2. informational: an EventPublisher publishes INFORMATIONAL events to a user with a signed-in
   WebSocket client; each is timed from publish to the client's receipt;
3. raw: the same UserEvent envelopes XPUB → SUB with nothing in between.

The last line is JSON, including informational_vs_raw. ``python -m bench.events``
"""

from __future__ import annotations

import argparse
import contextlib
import json
import shutil
import tempfile
import threading
import time
from pathlib import Path

import zmq

from bench.stats import pct
from candlewire.config import Settings
from candlewire.events import EventPublisher
from candlewire.testing import (
    TelegramStandIn,
    free_settings,
    new_user,
    open_session,
    spawn_gateway,
    user_event,
)
from gateway.auth import issue_token
from launcher.local.postgres import LocalPostgres
from proto import events_pb2 as ev
from proto.envelope import decode, encode, encode_topic

SECRET = "bench-secret-0123456789"
BOT_TOKEN = "123456:BENCH-token"


def sign_in(settings: Settings, user: str):
    return open_session(settings, user, issue_token(SECRET, user))


def drain(ws) -> threading.Thread:
    """Read a session until it closes, as a browser would."""

    def run() -> None:
        with contextlib.suppress(Exception):
            while True:
                ws.recv()

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t


def critical(settings: Settings, n: int, window: int) -> dict:
    user = new_user()
    ws = sign_in(settings, user)
    drain(ws)
    ctx = zmq.Context()
    dealer = ctx.socket(zmq.DEALER)
    dealer.connect(settings.connect("critical_events"))
    events = [user_event(user, ev.CRITICAL, [(ev.ACTIVE_SESSION, True)]) for _ in range(n)]
    sent_at: dict[str, float] = {}
    latencies: list[float] = []
    t0, next_i = time.perf_counter(), 0
    while len(latencies) < n:
        while next_i < n and next_i - len(latencies) < window:
            sent_at[events[next_i].event_id] = time.perf_counter()
            dealer.send_multipart([b"", *encode(events[next_i])])
            next_i += 1
        if dealer.poll(10_000):
            ack = decode(dealer.recv_multipart()[1:])
            assert ack.status == ev.DELIVERED, ack
            latencies.append(time.perf_counter() - sent_at[ack.event_id])
        else:
            raise TimeoutError("no ack in 10 s")
    elapsed = time.perf_counter() - t0
    dealer.close()
    ctx.term()
    ws.close()
    return {
        "events_per_s": n / elapsed,
        "p50_ms": pct(latencies, 0.5),
        "p99_ms": pct(latencies, 0.99),
    }


def informational(settings: Settings, n: int, journal: Path) -> dict:
    user = new_user()
    ws = sign_in(settings, user)
    with EventPublisher(settings, journal=journal) as pub:
        deadline = time.monotonic() + 10
        while not pub.watched(user):
            assert time.monotonic() < deadline, "the gateway never subscribed"
            time.sleep(0.01)
        latencies: list[float] = []
        done = threading.Event()

        def read() -> None:
            while len(latencies) < n:
                msg = json.loads(ws.recv(timeout=30))
                if msg["type"] == "event":
                    latencies.append(time.time() - msg["data"]["sent"])
            done.set()

        reader = threading.Thread(target=read)
        reader.start()
        t0 = time.perf_counter()
        for _ in range(n):
            pub.publish(user_event(user, ev.INFORMATIONAL, payload={"sent": time.time()}))
        done.wait(120)
        elapsed = time.perf_counter() - t0
        reader.join()
    ws.close()
    return {
        "events_per_s": n / elapsed,
        "p50_ms": pct(latencies, 0.5),
        "p99_ms": pct(latencies, 0.99),
    }


def raw(n: int, quiet_s: float = 2.0) -> tuple[float, int]:
    """XPUB → SUB with nothing in between: (events/s received, events lost). PUB/SUB drops
    at a full high-water mark, so the reader stops once nothing has arrived for ``quiet_s``
    and reports the loss instead of waiting forever."""
    ctx = zmq.Context()
    pub, sub = ctx.socket(zmq.XPUB), ctx.socket(zmq.SUB)
    port = pub.bind_to_random_port("tcp://127.0.0.1")
    sub.subscribe(b"USER:bench")
    sub.connect(f"tcp://127.0.0.1:{port}")
    pub.recv()  # the subscription arrived
    frames = encode_topic("USER:bench", user_event("bench", ev.INFORMATIONAL, payload={"sent": 0}))
    got, last = 0, time.perf_counter()

    def read() -> None:
        nonlocal got, last
        while got < n and sub.poll(int(quiet_s * 1000)):
            sub.recv_multipart()
            got += 1
            last = time.perf_counter()

    reader = threading.Thread(target=read)
    reader.start()
    t0 = time.perf_counter()
    for _ in range(n):
        pub.send_multipart(frames)
    reader.join()
    ctx.destroy(linger=0)
    return got / max(last - t0, 1e-9), n - got


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--critical", type=int, default=3000)
    parser.add_argument("--window", type=int, default=64)
    parser.add_argument("--informational", type=int, default=20000)
    args = parser.parse_args()
    base = Path(tempfile.mkdtemp(prefix="candlewire-bench-"))
    base.chmod(0o755)
    settings = free_settings(base)
    pg = LocalPostgres(base / "postgres", settings.port("postgres"))
    pg.init_once()
    pg.start(base / "postgres.log")
    telegram = TelegramStandIn(BOT_TOKEN)
    # A session outbox large enough to measure throughput, not the slow-client cut-off.
    gateway = spawn_gateway(
        settings,
        SECRET,
        BOT_TOKEN,
        telegram.url,
        {"CANDLEWIRE_GATEWAY_SESSION_QUEUE": str(args.informational)},
    )
    try:
        crit = critical(settings, args.critical, args.window)
        print(f"critical: {crit}", flush=True)
        info = informational(settings, args.informational, base / "pending.db")
        print(f"informational: {info}", flush=True)
        raw_rate, raw_lost = raw(args.informational)
        print(f"raw XPUB->SUB: {raw_rate:.0f} events/s, {raw_lost} lost", flush=True)
    finally:
        gateway.terminate()
        gateway.wait(30)
        telegram.close()
        pg.stop()
        shutil.rmtree(base, ignore_errors=True)
    result = {
        "critical_events_per_s": round(crit["events_per_s"]),
        "critical_p50_ms": round(crit["p50_ms"], 2),
        "critical_p99_ms": round(crit["p99_ms"], 2),
        "informational_events_per_s": round(info["events_per_s"]),
        "informational_p50_ms": round(info["p50_ms"], 2),
        "informational_p99_ms": round(info["p99_ms"], 2),
        "raw_xpub_sub_events_per_s": round(raw_rate),
        "raw_xpub_sub_lost": raw_lost,
        "informational_vs_raw": round(info["events_per_s"] / raw_rate, 3),
    }
    print(json.dumps(result))


if __name__ == "__main__":
    main()
