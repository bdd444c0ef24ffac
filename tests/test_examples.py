"""The examples run against the test stack, so they never rot.

All five run at once, each as its own process, against the session's live pipeline (a relay,
a SIM ingestor, the journal and the real Spark job, which tests/streaming share), plus a
REPLAY ingestor of the bundled sample for replay_zips.py. They find it through ``CANDLEWIRE_*``
variables, as they find ``make up``'s stack through the defaults, and run on SIM tickers
with small counts so the whole test takes seconds once the pipeline is up.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import zmq

from candlewire.config import Settings
from ingest.exchanges.replay import ReplayExchange
from launcher.cli import main
from relay import Relay
from tests.ingest.test_service import start_ingestor
from tests.support import FakePublisher, secured_settings, serve_pipeline

REPO = Path(__file__).resolve().parents[1]
TICKER = "SIM:BTC/USDT"


def runs(settings: Settings) -> dict[str, list[str]]:
    """Each example with the arguments that point it at the test stack."""
    return {
        "live_candles_pandas.py": ["--ticker", TICKER, "--updates", "3"],
        "late_joiner.py": ["--ticker", TICKER, "--minutes", "5", "--live", "2"],
        "alert.py": [
            *("--ticker", TICKER, "--percent", "0.0001", "--window", "60"),
            *("--refresh", "--timeout", "120"),
        ],
        "replay_zips.py": ["--ticker", "REPLAY:BTC/USDT", "--period", "3600"],
        "plain_client.py": [
            *("--ticker", TICKER, "--ticks", "2"),
            *("--requests-port", str(settings.port("client_requests"))),
            *("--market-port", str(settings.port("market_data"))),
        ],
    }


def test_every_example_is_tested() -> None:
    on_disk = {p.name for p in (REPO / "examples").glob("*.py")}
    assert on_disk == set(runs(Settings()))


def test_examples_run_against_the_stack(live_pipeline: Settings) -> None:
    env = {**os.environ, **live_pipeline.to_env(), "PYTHONUNBUFFERED": "1"}
    replay = start_ingestor(live_pipeline, ReplayExchange(name="REPLAY"))
    started = time.monotonic()
    try:
        procs = {
            name: subprocess.Popen(
                [sys.executable, str(REPO / "examples" / name), *args],
                cwd=REPO,
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
            )
            for name, args in runs(live_pipeline).items()
        }
        outputs = {}
        for name, proc in procs.items():
            try:
                out, _ = proc.communicate(timeout=max(1.0, 240 - (time.monotonic() - started)))
            except subprocess.TimeoutExpired:
                proc.kill()
                out, _ = proc.communicate()
            outputs[name] = (proc.returncode, out)
    finally:
        replay.stop()
    failed = {n: o for n, (rc, o) in outputs.items() if rc != 0}
    assert not failed, "\n\n".join(f"== {n}\n{o}" for n, o in failed.items())
    assert "open_time" in outputs["live_candles_pandas.py"][1]
    assert "then 2 live" in outputs["late_joiner.py"][1]
    assert "fired at" in outputs["alert.py"][1]
    assert "2025-01-01" in outputs["replay_zips.py"][1]
    assert "HISTORY_OK" in outputs["plain_client.py"][1]
    assert outputs["plain_client.py"][1].count("tick ") == 2


def test_the_plain_client_dials_a_curve_stack_from_the_exported_key_alone(
    tmp_path, ctx: zmq.Context, monkeypatch
) -> None:
    """``make up``'s stack runs with CURVE on: the client written from ``proto/`` gets its
    pair, the server keys, the addresses and its id's prefix from ``keys export``'s file."""
    settings = secured_settings(tmp_path)
    for name, value in settings.to_env().items():  # where the CLI makes and finds the keys
        monkeypatch.setenv(name, value)
    assert main(["keys", "add-client", "alice", "--role", "client"]) == 0
    key = tmp_path / "alice.json"
    assert main(["keys", "export", "alice", "--output", str(key)]) == 0
    relay = Relay(settings, metrics=False).start()
    publisher = FakePublisher(ctx, settings.bind("stream_pub"), settings=settings)
    stop = threading.Event()
    answering = threading.Thread(target=serve_pipeline, args=(ctx, settings, publisher, stop))
    answering.start()
    env = {k: v for k, v in os.environ.items() if not k.startswith("CANDLEWIRE_")}
    args = ["--key", str(key), "--ticker", "BINANCE:BTC/USDT", "--ticks", "0"]
    try:
        run = subprocess.run(
            [sys.executable, str(REPO / "examples" / "plain_client.py"), *args],
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
    finally:
        stop.set()
        answering.join()
        publisher.close()
        relay.stop()
    assert run.returncode == 0, run.stdout + run.stderr
    assert "accepted; notification on RESPONSE:alice.plain-" in run.stdout
    assert "HISTORY_OK" in run.stdout
