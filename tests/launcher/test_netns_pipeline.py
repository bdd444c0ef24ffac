"""The whole path on hosts of their own (network namespaces): three Kafka brokers, S3Proxy
(the Iceberg warehouse), a Spark standalone master and two workers, two relays, the real
stream job (its driver on a host of its own, its executors on the workers; found by the
relays under the name ``publishers.cw``), a SIM ingestor and a client given both relays;
the catalog's PostgreSQL on this host, served on the bridge. History requests and a live
subscription work end to end, and go on losing nothing across ``kill -9`` of a relay, then
of a broker, then of a Spark worker. ``make scale`` runs it (root; minutes)."""

from __future__ import annotations

import os
import signal
import sys
import time
import uuid

import pytest

from bench.scale import (
    MASTER_PORT,
    env_for,
    kafka_bootstrap,
    parse_client,
    relay_addresses,
    serving,
    spawn_client,
    start_kafka,
    start_relays,
    start_s3,
    start_spark,
)
from candlewire.config import Settings
from candlewire.lake import ensure_tables
from candlewire.testing import free_port, wait_for
from launcher.local.postgres import LocalPostgres
from launcher.netns import Lab

pytestmark = [
    pytest.mark.scale,
    pytest.mark.skipif(Lab.available() is not None, reason=str(Lab.available())),
]
SUBNET = "10.80.0"
SECRET = "netns-" + uuid.uuid4().hex
HISTORY = 4
TICKER = "SIM:ETH/USDT"


def test_history_and_live_data_through_every_host(tmp_path) -> None:
    os.environ["CANDLEWIRE_SECRET_S3_SECRET_KEY"] = SECRET
    pg = None
    try:
        with Lab(prefix="cwp", subnet=SUBNET) as lab:
            hosts = ("kafka-1", "kafka-2", "kafka-3", "s3", "relay-a", "relay-b", "stream")
            spark = ("spark-master", "spark-1", "spark-2")
            for name in (*hosts, *spark, "ingest", "client"):
                lab.add(name)
            lab.name("publishers.cw", "stream")
            procs = start_kafka(lab, tmp_path)
            procs |= start_spark(lab, tmp_path)
            endpoint = start_s3(lab, tmp_path, SECRET)
            password = uuid.uuid4().hex
            pg = LocalPostgres(tmp_path / "pg", free_port(), password, listen=(lab.gateway,))
            pg.init_once()
            pg.allow(f"{SUBNET}.0/24")
            pg.start(tmp_path / "pg.log")
            platform = {
                "catalog_url": f"postgresql://candlewire:{password}@{lab.gateway}:{pg.port}/candlewire",
                "warehouse": "s3://lake/warehouse",
                "s3": {"endpoint": endpoint},
            }
            ensure_tables(Settings(kafka_bootstrap=kafka_bootstrap(lab), **platform))
            procs |= start_relays(lab, tmp_path)
            master = f"spark://{lab.hosts['spark-master'].address}:{MASTER_PORT}"
            stream_env = env_for(
                lab,
                tmp_path,
                "stream",
                spark_master=master,  # executors on the workers' hosts
                stream_live_engine="microbatch",  # the real-time engine runs in the driver
                checkpoint_dir=str(tmp_path / "checkpoints"),  # one filesystem for all hosts
                **platform,
            ) | {"CANDLEWIRE_STREAM_TICKS_TRIGGER_S": "1"}
            lab.spawn(
                "stream",
                [sys.executable, "-m", "launcher.cli", "stream"],
                stream_env,
                tmp_path / "stream.log",
            )
            stream = lab.hosts["stream"].address
            wait_for(
                lambda: serving(stream, "stream_metrics", "candlewire_stream_up 1.0"),
                timeout=300,
                interval=1,
            )
            relays = relay_addresses(lab)
            lab.spawn(
                "ingest",
                [sys.executable, "-m", "launcher.cli", "ingest", "--exchange", "SIM"],
                env_for(lab, tmp_path, "ingest", relay_hosts=relays),
                tmp_path / "ingest.log",
            )
            wait_for(
                lambda: serving(relays[1], "relay_metrics", "candlewire_relay_work_topics 1.0"),
                timeout=60,
            )

            client, out = spawn_client(
                lab,
                tmp_path,
                [TICKER],
                HISTORY,
                *("--history-ticker", "SIM:BTC/USDT", "--history-timeout", "240"),
                *("--history-gap", "8"),
            )

            def ticks() -> int:
                return out.read_text().count("tick ") if out.exists() else 0

            wait_for(lambda: ticks() > 20, timeout=180, interval=1)
            first_kill = time.time_ns()
            os.killpg(procs["relay-a"].pid, signal.SIGKILL)
            time.sleep(8)
            os.killpg(procs["kafka-2"].pid, signal.SIGKILL)
            seen = ticks()
            wait_for(lambda: ticks() > seen + 20, timeout=120, interval=1)
            os.killpg(procs["spark-1"].pid, signal.SIGKILL)  # a worker and its executor
            seen = ticks()
            wait_for(lambda: ticks() > seen + 20, timeout=180, interval=1)
            wait_for(lambda: out.read_text().count("history ") == HISTORY, timeout=600, interval=2)
            client.send_signal(signal.SIGTERM)
            client.wait(30)
            got = parse_client(out, first_kill)
            assert set(got["histories"].values()) == {"HISTORY_OK"}, got["histories"]
            assert got["missing"] == 0 and got["repeated"] == 0, got
            assert got["failover_s"] is not None and got["failover_s"] < 2.0, got
            assert any(stream in pair for pair in lab.connections("relay-b")), "not dialled"
            for host in ("relay-b", "stream", "ingest", "client"):
                assert lab.stray(host) == [], host
    finally:
        del os.environ["CANDLEWIRE_SECRET_S3_SECRET_KEY"]
        if pg is not None:
            pg.remove()
