"""Sequenced live streams: replay speed, loss and repeats under trouble, and their cost.

Kafka (the real broker), a relay and the journal service run as processes of their own; the
stream processor's publisher (:class:`streaming.publisher.StreamPublisher`, which stamps and
journals what it publishes) runs here and publishes ticks as the live query does.

- ``replay_msgs_per_s``: ``--replay`` ticks of one ticker are published (all within the last
  hour); a client then subscribes with ``since`` an hour ago and we time until its iterator
  has yielded them all (protobuf messages, ``raw=True``).
- ``replay_arrow_rows_per_s``: the same range again with ``batches=True``, one RecordBatch
  per chunk, until they hold every row.
- ``replay_client_cpu_us_per_msg`` and ``replay_arrow_client_cpu_us_per_row``: this
  process's CPU (the client's; the publisher is idle by then) for each, and the journal
  service's in the Arrow replay: unlike the rates, these hardly depend on what else shares
  the machine's two cores.
- ``lost`` and ``duplicated``: ticks flow at ``--rate``/s for ``--flow-seconds`` to a client
  that sleeps for two seconds in the middle, while the relay is killed (SIGKILL) and
  restarted; counted against what was published.
- ``live_overhead_p99_ms``: publish-to-receive p99 of ticks through the relay at a steady
  rate, sequenced (publisher stamps, client checks) minus the same run without sequencing (a
  plain PUB of the Kafka value, a plain SUB).

    python -m bench.replay [--replay N] [--rate R] [--flow-seconds S]

The last line is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import threading
import time

import zmq

from bench.stack import private_broker, sigterm_unwinds
from bench.stats import pct, process_cpu_s
from candlewire.client import Client
from candlewire.config import Settings
from candlewire.kafka import ensure_topics
from candlewire.testing import TickFeed, metric, spawn, wait_for
from candlewire.topics import work_prefix
from proto import market_pb2
from proto.envelope import decode_sub
from streaming.publisher import StreamPublisher


def work_subscriber(settings: Settings) -> zmq.Socket:
    """A SIM work-queue subscriber, so the relay does not answer NO_INGESTOR."""
    sock = zmq.Context.instance().socket(zmq.SUB)
    sock.subscribe(work_prefix("SIM"))
    sock.connect(settings.connect("work_queue"))
    return sock


def start_relay(settings: Settings, work: zmq.Socket):
    """A relay process, once it sees the work subscriber (which only sends its
    subscription again to a restarted relay when the socket is polled, as a receive loop
    would)."""
    proc = spawn(
        settings, ["relay"], healthy="candlewire_relay_up 1.0", metrics_endpoint="relay_metrics"
    )
    wait_for(
        lambda: (
            work.poll(0) >= 0 and metric(settings, "relay_metrics", "candlewire_relay_work_topics")
        ),
        timeout=30,
    )
    return proc


def replay(settings: Settings, pub: StreamPublisher, n: int, journal_pid: int) -> dict:
    feed = TickFeed(pub, prefix="SIM:R")
    since = int(time.time() * 1000) - 3_600_000
    started = time.perf_counter()
    for _ in range(n // 10_000):
        feed.publish(10_000)
    pub._journal.flush(120)
    print(f"published {n} ticks in {time.perf_counter() - started:.1f}s", flush=True)
    with Client(settings) as client:
        started, cpu = time.perf_counter(), time.process_time()
        sub = client.subscribe(feed.ticker, since=since, raw=True)
        count = 0
        for msg in sub:
            count += 1
            if msg.stream.source_offset == n - 1:
                break
        took, cpu = time.perf_counter() - started, time.process_time() - cpu
        sub.close()
    result = {
        "replayed": count,
        "replay_s": round(took, 2),
        "replay_msgs_per_s": round(count / took),
        "replay_client_cpu_us_per_msg": round(cpu / count * 1e6, 3),
    }
    with Client(settings) as client:  # the same range again, as Arrow
        started, cpu = time.perf_counter(), time.process_time()
        journal_cpu = process_cpu_s(journal_pid)
        sub = client.subscribe(feed.ticker, since=since, batches=True)
        rows = 0
        for batch in sub:
            rows += len(batch)
            if rows >= n:
                break
        took, cpu = time.perf_counter() - started, time.process_time() - cpu
        journal_cpu = process_cpu_s(journal_pid) - journal_cpu
        sub.close()
    result.update(
        {
            "replayed_rows": rows,
            "replay_arrow_rows_per_s": round(rows / took),
            "replay_arrow_client_cpu_us_per_row": round(cpu / rows * 1e6, 3),
            "replay_arrow_journal_cpu_us_per_row": round(journal_cpu / rows * 1e6, 3),
        }
    )
    return result


def trouble(settings: Settings, pub: StreamPublisher, relay, work, rate: int, seconds: float):
    """Ticks at ``rate`` for ``seconds``; the client sleeps, the relay dies and comes back."""
    feed = TickFeed(pub, prefix="SIM:R")
    total = int(rate * seconds)
    state = {"relay": relay}

    def kill_and_restart() -> None:
        time.sleep(seconds / 3)
        os.kill(state["relay"].pid, signal.SIGKILL)
        state["relay"].wait()
        time.sleep(1.0)
        state["relay"] = start_relay(settings, work)

    got: list[int] = []
    with Client(settings) as client:
        sub = client.subscribe(feed.ticker, idle_timeout=60, raw=True)
        threads: list[threading.Thread] = []

        def begin() -> None:
            time.sleep(1.0)  # subscribe() subscribed; the subscription reaches the feed
            threads.append(feed.flow(rate, seconds))
            threads.append(threading.Thread(target=kill_and_restart))
            threads[-1].start()

        starter = threading.Thread(target=begin, daemon=True)
        starter.start()
        for msg in sub:
            got.append(msg.stream.source_offset)
            if len(got) == rate * seconds // 2:
                time.sleep(2.0)  # slow for a while: the queues overflow
            if msg.stream.source_offset == total - 1:
                break
        stats = sub.stats
        sub.close()
    starter.join()
    for t in threads:
        t.join()
    delivered = set(got)
    start = got[0]
    return state["relay"], {
        "flow_ticks": total - start,
        "lost": len(set(range(start, total)) - delivered),
        "duplicated": len(got) - len(delivered),
        "gaps_filled": stats.gaps,
        "filled_msgs": stats.filled,
    }


def latencies(settings: Settings, pub: StreamPublisher, sequenced: bool, n: int, rate: int):
    """Publish-to-receive times (s) of ``n`` ticks at ``rate``/s through the relay."""
    feed = TickFeed(pub, prefix="SIM:R")
    out: list[float] = []
    done = threading.Event()

    def receive() -> None:
        if sequenced:
            with Client(settings) as client:
                sub = client.subscribe(feed.ticker, idle_timeout=30, raw=True)
                for msg in sub:
                    out.append((time.time_ns() - msg.ingest_time_ns) / 1e9)
                    if msg.stream.source_offset == n - 1:
                        break
                sub.close()
        else:
            sock = zmq.Context.instance().socket(zmq.SUB)
            sock.subscribe(feed.topic.encode())
            sock.connect(settings.connect("market_data"))
            while len(out) < n and sock.poll(30_000):
                _, msg = decode_sub(sock.recv_multipart())
                if isinstance(msg, market_pb2.Tick):  # not the head beacons
                    out.append((time.time_ns() - msg.ingest_time_ns) / 1e9)
            sock.close(linger=0)
        done.set()

    t = threading.Thread(target=receive)
    t.start()
    time.sleep(1.0)  # the subscription reaches the publisher
    raw = pub._sock
    for _ in range(n):
        (topic, record, part, offset) = feed.records(1)[0]
        if sequenced:
            pub.publish_ticks([(topic, record, part, offset)])
        else:
            with pub._lock:
                raw.send_multipart([topic, record[:1], record[1:]])
        time.sleep(1 / rate)
    done.wait(60)
    t.join(5)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--replay", type=int, default=1_000_000)
    parser.add_argument("--rate", type=int, default=20_000)
    parser.add_argument("--flow-seconds", type=float, default=12.0)
    parser.add_argument("--latency-ticks", type=int, default=3_000)
    args = parser.parse_args()
    procs = []
    with private_broker() as settings:
        try:
            ensure_topics(settings)
            procs.append(
                spawn(
                    settings,
                    ["journal"],
                    healthy="candlewire_journal_up 1.0",
                    metrics_endpoint="journal_metrics",
                )
            )
            work = work_subscriber(settings)
            relay = start_relay(settings, work)
            pub = StreamPublisher(settings)
            result: dict = {}
            result.update(replay(settings, pub, args.replay, procs[0].pid))
            print(json.dumps(result), flush=True)
            relay, trouble_result = trouble(
                settings, pub, relay, work, args.rate, args.flow_seconds
            )
            result.update(trouble_result)
            print(json.dumps(result), flush=True)
            plain = latencies(settings, pub, False, args.latency_ticks, 1000)
            stamped = latencies(settings, pub, True, args.latency_ticks, 1000)
            result.update(
                {
                    "live_p99_ms_plain": round(pct(plain, 0.99), 3),
                    "live_p99_ms_sequenced": round(pct(stamped, 0.99), 3),
                    "live_overhead_p99_ms": round(pct(stamped, 0.99) - pct(plain, 0.99), 3),
                }
            )
            pub.close()
            procs.append(relay)
        finally:
            for p in procs:
                p.terminate()
                p.wait(30)
    print(json.dumps(result))


if __name__ == "__main__":
    with sigterm_unwinds():  # its brokers and services stop on a kill too
        main()
