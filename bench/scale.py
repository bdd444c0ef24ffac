"""Many relays and many publishers on network namespaces (``make scale-bench``; root).

Hosts, each a namespace on one bridge (:mod:`launcher.netns`): two relays (``candlewire
relay``, finding the publishers by the DNS name ``publishers.cw``), two stream publishers
(:mod:`bench.roles`, each streaming one ticker and journalling it to a Kafka broker on a
host of its own), and a client host.

- ``relays_2_over_1``: messages per second the subscribers receive with every subscriber on
  one relay, and then with them split over two, the same offered load; the second over
  the first. The load is a fan-out: each relay sends each message once per subscriber.
- ``failover_s``: a client subscribed to both tickers through both relays (and sending
  history requests); relay A is killed (``kill -9``); the time from the kill to the client's
  next delivered tick.
- ``lost``: ticks missing from what the client delivered (offsets not consecutive), plus
  history requests that did not complete. Must be 0.

The last line is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from functools import partial
from pathlib import Path

from candlewire.config import Settings
from candlewire.testing import http_get, wait_for
from launcher.netns import Lab

WARMUP_S = 2.0  # a counter counts only after this: connected and subscribed by then
KAFKA_PORT = Settings().port("kafka")
MASTER_PORT, MASTER_UI = Settings().port("spark_master"), Settings().port("spark_master_ui")
TICKERS = {"pub-a": "SIM:SCALEA/USDT", "pub-b": "SIM:SCALEB/USDT"}


def env_for(lab: Lab, state: Path, host: str, **settings: object) -> dict[str, str]:
    address = lab.hosts[host].address
    s = Settings(
        host=address,
        bind_host=address,
        state_dir=state / host,
        kafka_bootstrap=kafka_bootstrap(lab),  # the publishers' journal
        security={"curve": False},
        **settings,
    )
    return os.environ | s.to_env() | {"PYTHONUNBUFFERED": "1"}


def kafka_hosts(lab: Lab) -> list[str]:
    return [h for h in lab.hosts if h.startswith("kafka-")]


def kafka_bootstrap(lab: Lab) -> str:
    return ",".join(f"{lab.hosts[h].address}:{KAFKA_PORT}" for h in kafka_hosts(lab))


def start_kafka(lab: Lab, state: Path) -> dict[str, subprocess.Popen]:
    """The brokers (hosts ``kafka-N``), one KRaft quorum; the stream publishers journal what
    they publish there. Topics replicated to every broker, at most 3."""
    from candlewire.kafka import ensure_topics, kafka_health
    from launcher.local.kafka import KafkaBroker

    s = Settings()
    hosts = kafka_hosts(lab)
    quorum = tuple(lab.hosts[h].address for h in hosts)
    procs = {}
    for node, host in enumerate(hosts, 1):
        broker = KafkaBroker(
            state / host,
            s.jvm_dir / "kafka",
            KAFKA_PORT,
            s.port("kafka_controller"),
            heap="384m",
            node_id=node,
            quorum=quorum,
            cluster_id=state / "kafka-cluster-id",
        )
        broker.format_once()
        procs[host] = lab.spawn(host, broker.argv(), dict(os.environ), state / f"{host}.log")
    client = Settings(kafka_bootstrap=kafka_bootstrap(lab))
    wait_for(lambda: kafka_health(client, brokers=len(hosts)) is None, timeout=120, interval=0.5)
    ensure_topics(client)
    return procs


def serving(address: str, endpoint: str, line: str, settings: Settings | None = None) -> bool:
    """Whether the metrics endpoint on ``address`` shows ``line`` (a service's health)."""
    url = (settings or Settings()).metrics_url(endpoint, address)
    return line.encode() in http_get(url)


def count_for(lab: Lab, state: Path, relays_of: list[str], seconds: float) -> float:
    """Counters on the client host, the i-th on ``relays_of[i]``; their total msgs/s."""
    procs = []
    for i, relay in enumerate(relays_of):
        ticker = list(TICKERS.values())[i % 2]
        env = env_for(lab, state, "client") | {"CANDLEWIRE_HOST": lab.hosts[relay].address}
        procs.append(
            subprocess.Popen(
                [
                    "ip",
                    "netns",
                    "exec",
                    lab.hosts["client"].ns,
                    sys.executable,
                    "-m",
                    "bench.roles",
                    "counter",
                    "--ticker",
                    ticker,
                    "--after",
                    str(WARMUP_S),
                    "--seconds",
                    str(seconds),
                ],
                env=env,
                stdout=subprocess.PIPE,
                text=True,
            )
        )
    rates = []  # each counts for ``seconds`` once its own first message came, then exits
    for p in procs:
        count, window = p.communicate(timeout=120)[0].split()[-2:]
        rates.append(int(count) / float(window))
    return sum(rates)


def parse_client(path: Path, killed_ns: int) -> dict[str, object]:
    offsets: dict[str, list[int]] = {}
    after: list[int] = []
    histories: dict[str, str] = {}
    for line in path.read_text().splitlines():
        kind, key, value, wall = line.split()
        if kind == "tick":
            offsets.setdefault(key, []).append(int(value))
            if int(wall) > killed_ns:
                after.append(int(wall))
        else:
            histories[key] = value
    missing = sum(o[-1] - o[0] + 1 - len(set(o)) for o in offsets.values())
    repeated = sum(len(o) - len(set(o)) for o in offsets.values())
    return {
        "ticks": sum(map(len, offsets.values())),
        "missing": missing,
        "repeated": repeated,
        "failover_s": (min(after) - killed_ns) / 1e9 if after else None,
        "histories": histories,
    }


def start_hosts(lab: Lab, state: Path, rate: int, brokers: int = 1) -> dict[str, subprocess.Popen]:
    """Kafka, two relays that find the two publishers by DNS, the publishers (pub-a also
    answering history work from both relays); the brokers' and relays' processes by host."""
    kafkas = [f"kafka-{n}" for n in range(1, brokers + 1)]
    for name in (*kafkas, "relay-a", "relay-b", "pub-a", "pub-b", "client"):
        lab.add(name)
    lab.name("publishers.cw", "pub-a", "pub-b")
    procs = start_kafka(lab, state)
    procs |= start_relays(lab, state)
    relays = relay_addresses(lab)
    for pub, ticker in TICKERS.items():
        history = [arg for r in relays for arg in ("--history-from", r)] if pub == "pub-a" else []
        argv = ["publisher", "--ticker", ticker, "--rate", str(rate), *history]
        lab.spawn(
            pub,
            [sys.executable, "-m", "bench.roles", *argv],
            env_for(lab, state, pub),
            state / f"{pub}.log",
        )
    time.sleep(3.0)  # the relays' next lookup dials both publishers
    return procs


def start_relays(lab: Lab, state: Path, **settings: object) -> dict[str, subprocess.Popen]:
    """``candlewire relay`` on hosts relay-a and relay-b, finding the stream publishers by
    the name ``publishers.cw``; up when their metrics say so."""
    relays = relay_addresses(lab)
    procs = {}
    for r in ("relay-a", "relay-b"):
        env = env_for(
            lab,
            state,
            r,
            relay_hosts=relays,
            publisher_names=["publishers.cw"],
            discovery_interval_s=1.0,
            **settings,
        )
        procs[r] = lab.spawn(
            r, [sys.executable, "-m", "launcher.cli", "relay"], env, state / f"{r}.log"
        )
    settings = Settings()
    for address in relays:
        up = partial(serving, address, "relay_metrics", "candlewire_relay_up 1.0", settings)
        wait_for(up, timeout=60)
    return procs


def start_s3(lab: Lab, state: Path, secret: str) -> str:
    """S3Proxy on host ``s3`` with bucket ``lake``; its endpoint."""
    from launcher.local.s3proxy import S3Proxy

    address, port = lab.hosts["s3"].address, Settings().port("s3")
    proxy = S3Proxy(
        state / "s3proxy", Settings().jvm_dir / "s3proxy", address, port, "candlewire", secret
    )
    proxy.prepare()
    proxy.make_bucket("lake")
    lab.spawn("s3", proxy.argv(), dict(os.environ) | {"LOG_LEVEL": "info"}, state / "s3.log")
    return f"http://{address}:{port}"


def start_spark(lab: Lab, state: Path) -> dict[str, subprocess.Popen]:
    """A Spark standalone master on host ``spark-master`` and workers on ``spark-1`` and
    ``spark-2``; up when the master lists both alive."""
    from launcher.local.spark import StandaloneCluster, count_alive, master_workers

    master = lab.hosts["spark-master"].address

    def cluster(host: str) -> StandaloneCluster:
        return StandaloneCluster(
            lab.hosts[host].address, MASTER_PORT, MASTER_UI, state / "spark", master_host=master
        )

    head = cluster("spark-master")
    procs = {
        "spark-master": lab.spawn(
            "spark-master", head.master_argv(), os.environ | head.env(), state / "spark-master.log"
        )
    }
    for n, host in enumerate(("spark-1", "spark-2"), 1):
        c = cluster(host)
        procs[host] = lab.spawn(host, c.worker_argv(n), os.environ | c.env(), state / f"{host}.log")

    def both() -> bool:
        try:
            return count_alive(master_workers(head.status_url)) == 2
        except (OSError, ValueError):
            return False  # the master is not answering yet

    wait_for(both, timeout=120, interval=0.5)
    return procs


def relay_addresses(lab: Lab) -> list[str]:
    return [lab.hosts[r].address for r in ("relay-a", "relay-b")]


def spawn_client(
    lab: Lab, state: Path, tickers: list[str], history: int, *options: str
) -> tuple[subprocess.Popen, Path]:
    """The ``client`` role on host ``client``, given both relays; it and the file it writes."""
    out = state / "client.out"
    argv = [
        *(arg for t in tickers for arg in ("--ticker", t)),
        *("--history", str(history), *options, "--out", str(out)),
    ]
    client = lab.spawn(
        "client",
        [sys.executable, "-m", "bench.roles", "client", *argv],
        env_for(lab, state, "client", relay_hosts=relay_addresses(lab)),
        state / "client.log",
    )
    return client, out


def failover(
    lab: Lab,
    state: Path,
    procs: dict[str, subprocess.Popen],
    history: int,
    kills: tuple[str, ...] = ("relay-a",),
) -> dict[str, object]:
    """A client through both relays (both tickers, ``history`` requests); ``kill -9`` of
    each of ``kills`` in turn under it, a few seconds apart; what the client delivered
    (``failover_s`` after the first kill)."""
    client, out = spawn_client(lab, state, list(TICKERS.values()), history)
    time.sleep(4.0)
    first_kill = time.time_ns()
    for host in kills:
        os.killpg(procs[host].pid, signal.SIGKILL)
        time.sleep(4.0)
    deadline = time.monotonic() + 120 + history  # every history request answered, or given up
    while out.read_text().count("history ") < history and time.monotonic() < deadline:
        time.sleep(0.5)
    time.sleep(2.0)  # ticks after the last kill
    client.send_signal(signal.SIGTERM)
    client.wait(30)
    got = parse_client(out, first_kill)
    got["histories_done"] = sum(v == "HISTORY_OK" for v in got["histories"].values())  # type: ignore[union-attr]
    return got


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.scale")
    parser.add_argument("--rate", type=int, default=40000, help="ticks/s of each publisher")
    parser.add_argument("--subscribers", type=int, default=12)
    parser.add_argument("--seconds", type=float, default=8.0)
    parser.add_argument("--history", type=int, default=20)
    parser.add_argument("--brokers", type=int, default=1)
    args = parser.parse_args(argv)
    problem = Lab.available()
    if problem:
        print(json.dumps({"error": problem}))
        return 2
    state = Path(tempfile.mkdtemp(prefix="candlewire-scale-"))
    with Lab() as lab:
        procs = start_hosts(lab, state, args.rate, args.brokers)
        one = count_for(lab, state, ["relay-a"] * args.subscribers, args.seconds)
        two = count_for(lab, state, ["relay-a", "relay-b"] * (args.subscribers // 2), args.seconds)
        print(f"forwarded msgs/s: one relay {one:,.0f}, two relays {two:,.0f}", flush=True)
        got = failover(lab, state, procs, args.history)
    result = {
        "relays_2_over_1": round(two / one, 3) if one else None,
        "one_relay_msgs_s": round(one),
        "two_relays_msgs_s": round(two),
        "failover_s": None if got["failover_s"] is None else round(got["failover_s"], 6),
        "lost": got["missing"] + (args.history - got["histories_done"]),
        "client_ticks": got["ticks"],
        "client_repeated": got["repeated"],
        "histories_done": got["histories_done"],
        "cores": os.cpu_count(),
    }
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
