"""Ports from the command line: a taken port is one line naming its setting (exit code 2),
never a traceback; a metrics port left at its default gives way to a free one, so a second
ingestor, relay or gateway starts beside ``make up`` as it is."""

from __future__ import annotations

import logging
import os
import re
import signal
import socket
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace

import pytest
from prometheus_client import CollectorRegistry, Gauge

from candlewire import runtime
from candlewire.config import PortTaken, Settings, port_setting
from candlewire.endpoints import ENDPOINTS
from candlewire.runtime import MetricsServer
from candlewire.testing import candlewire_command, http_get
from tests.support import free_port, wait_for


@contextmanager
def taken(port: int) -> Iterator[None]:
    """``port`` in use on 127.0.0.1 for the block: listened on here, unless someone else
    holds it already (a local stack's service), which is as good."""
    holder = socket.socket()
    holder.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        holder.bind(("127.0.0.1", port))
        holder.listen()
    except OSError:
        pass
    try:
        yield
    finally:
        holder.close()


def registry() -> CollectorRegistry:
    reg = CollectorRegistry()
    Gauge("candlewire_test_up", "1", registry=reg).set(1)
    return reg


def test_a_taken_data_port_is_one_line_naming_its_setting(settings: Settings) -> None:
    with taken(settings.port("client_requests")):
        out = subprocess.run(
            candlewire_command("relay"),
            env=os.environ | settings.to_env(),
            capture_output=True,
            text=True,
            timeout=60,
        )
    assert out.returncode == 2, out.stderr
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: relay cannot bind client_requests")
    assert port_setting("client_requests") == "CANDLEWIRE_PORTS__CLIENT_REQUESTS"
    assert port_setting("client_requests") in lines[0]
    assert f":{settings.port('client_requests')}" in lines[0]


def test_a_metrics_port_floats_unless_it_was_set(tmp_path, monkeypatch, caplog) -> None:
    held = free_port()
    pinned = Settings(ports={"ingest_metrics": held}, state_dir=tmp_path)
    with taken(held):
        with pytest.raises(PortTaken) as info:
            MetricsServer(registry(), pinned, "ingest_metrics")
        assert port_setting("ingest_metrics") in str(info.value)
        assert "leave it unset" in str(info.value) and "\n" not in str(info.value)
        # The same port as the default instead: it gives way.
        monkeypatch.setitem(
            ENDPOINTS, "ingest_metrics", replace(ENDPOINTS["ingest_metrics"], port=held)
        )
        default = Settings(state_dir=tmp_path)
        with caplog.at_level(logging.WARNING, "candlewire"):
            server = MetricsServer(registry(), default, "ingest_metrics")
    try:
        assert server.port != held
        assert f"http://127.0.0.1:{server.port}/metrics" in caplog.text
        assert b"candlewire_test_up 1.0" in http_get(f"http://127.0.0.1:{server.port}/metrics")
    finally:
        server.close()


def test_a_metrics_connection_that_sends_nothing_is_closed_and_scrapes_go_on(
    settings: Settings, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]
) -> None:
    """Each open connection holds a server thread: half a request line must not hold one
    for ever (300 such connections held 300 threads), nor print a traceback as it goes."""
    monkeypatch.setattr(runtime, "METRICS_IDLE_S", 0.5)
    server = MetricsServer(registry(), settings, "ingest_metrics")
    try:
        idle = socket.create_connection(("127.0.0.1", server.port), timeout=10)
        idle.sendall(b"GET /metr")
        assert idle.recv(1024) == b"", "closed by the server, not by this test's timeout"
        idle.close()
        assert b"candlewire_test_up 1.0" in http_get(f"http://127.0.0.1:{server.port}/metrics")
    finally:
        server.close()
    assert "Traceback" not in capfd.readouterr().err


def test_a_second_ingestor_beside_the_stack_takes_a_free_metrics_port(
    settings: Settings, relay, tmp_path
) -> None:
    """``candlewire ingest --exchange REPLAY`` with the stack's ingestor on the default
    metrics port: it starts, says where its metrics are, and takes REPLAY work."""
    variable = port_setting("ingest_metrics")
    env = {k: v for k, v in (os.environ | settings.to_env()).items() if k != variable}
    log = tmp_path / "second-ingest.log"
    with taken(ENDPOINTS["ingest_metrics"].port), log.open("wb") as out:
        proc = subprocess.Popen(
            candlewire_command("ingest", "--exchange", "REPLAY", "--id", "second"),
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
        try:

            def metrics_url() -> str | None:
                assert proc.poll() is None, log.read_text(errors="replace")[-3000:]
                found = re.search(
                    r"metrics on (http://\S+/metrics)", log.read_text(errors="replace")
                )
                return found.group(1) if found else None

            url = wait_for(metrics_url, timeout=60, interval=0.2)
            assert f":{ENDPOINTS['ingest_metrics'].port}/" not in url
            assert b"candlewire_ingest_state" in http_get(url)
            wait_for(lambda: relay.has_ingestor("REPLAY"), timeout=60)
        finally:
            proc.send_signal(signal.SIGINT)
            proc.wait(30)
    assert "Traceback" not in log.read_text(errors="replace")
