"""The plain install: a user who only wants the client gets no Spark, Dagster or ccxt.

The project is installed without extras into a fresh venv (pip reuses its wheel cache and
skips byte-compiling what it installs: the test runs each module once), and
that venv's client and CLI subscribe through a real relay. A service verb there names the
install it needs instead of failing with a traceback.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from tests.candlewire.test_client import feed

ROOT = Path(__file__).resolve().parents[1]
PLATFORM_ONLY = ("pyspark", "dagster", "ccxt", "confluent_kafka", "prometheus_client")
SUBSCRIBE = """
import sys
from candlewire import Client
with Client() as client:
    for tick in client.subscribe(sys.argv[1], idle_timeout=20):
        print(tick.ticker, tick.trade_id)
        break
"""


@pytest.fixture(scope="module")
def plain_venv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    venv = tmp_path_factory.mktemp("plain") / "venv"
    # No pip of its own: this checkout's newer pip installs into it, in half the time.
    subprocess.run(
        [sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120
    )
    python = str(venv / "bin" / "python")
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "--python",
            python,
            "install",
            "-q",
            "--no-compile",
            str(ROOT),
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    return venv


def run_in(venv: Path, settings, *args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    return subprocess.run(
        list(args),
        env=env | settings.to_env(),
        cwd=venv,  # not the checkout: only what was installed is importable
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_the_plain_install_has_no_platform_packages(plain_venv: Path, settings) -> None:
    probe = "import importlib.util as u, sys; print([m for m in sys.argv[1:] if u.find_spec(m)])"
    out = run_in(plain_venv, settings, str(plain_venv / "bin/python"), "-c", probe, *PLATFORM_ONLY)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


def test_the_plain_install_subscribes_and_watches(
    plain_venv: Path, settings, relay, publisher, served
) -> None:
    stop = threading.Event()
    feeder = feed(publisher, "BINANCE:SOL/USDT|tick", stop)
    try:
        py = run_in(
            plain_venv,
            settings,
            str(plain_venv / "bin/python"),
            "-c",
            SUBSCRIBE,
            "BINANCE:SOL/USDT",
        )
        cli = run_in(
            plain_venv,
            settings,
            str(plain_venv / "bin/candlewire"),
            "watch",
            "BINANCE:SOL/USDT",
            "--count",
            "1",
        )
    finally:
        stop.set()
        feeder.join()
    assert py.returncode == 0, py.stderr
    assert py.stdout.startswith("BINANCE:SOL/USDT ")
    assert cli.returncode == 0, cli.stderr
    assert "  BINANCE:SOL/USDT  " in cli.stdout and " @ " in cli.stdout  # one line, a tick


def test_a_service_verb_names_the_install_it_needs(plain_venv: Path, settings) -> None:
    out = run_in(plain_venv, settings, str(plain_venv / "bin/candlewire"), "stream")
    assert out.returncode == 1
    assert "pip install '.[platform]'" in out.stderr
    assert "Traceback" not in out.stderr
