"""``candlewire up | down | status``: the local stack as supervised background processes.

Each service has a pid file and a log in the state dir. ``up`` is idempotent: a running
service is left alone, a port held by something else is a one-line error naming the fix.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from candlewire.config import Settings


class StackError(RuntimeError):
    """A prerequisite is missing or a service would not start; the message says what to do."""


@dataclass
class Service:
    name: str
    argv: list[str]
    port: int
    health: Callable[[], str | None]
    """None when healthy, else a short description of what is wrong."""
    env: dict[str, str] = field(default_factory=dict)
    start_timeout: float = 30.0
    prepare: Callable[[], None] | None = None
    """One-time setup before the first start (formatting storage, creating dirs)."""
    stop_timeout: float = 20.0


def port_open(host: str, port: int, timeout: float = 0.5) -> bool:
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


def http_health(url: str, needle: str) -> Callable[[], str | None]:
    def check() -> str | None:
        try:
            with urllib.request.urlopen(url, timeout=2) as resp:
                body = resp.read().decode(errors="replace")
        except OSError as exc:
            return f"{url}: {exc}"
        return None if needle in body else f"{url}: {needle!r} not reported"

    return check


class Stack:
    def __init__(self, settings: Settings, services: list[Service]) -> None:
        self.settings = settings
        self.services = services
        self.run_dir = settings.state_dir / "run"
        self.log_dir = settings.state_dir / "logs"

    def pidfile(self, svc: Service) -> Path:
        return self.run_dir / f"{svc.name}.pid"

    def logfile(self, svc: Service) -> Path:
        return self.log_dir / f"{svc.name}.log"

    def pid(self, svc: Service) -> int | None:
        """The recorded pid if that process is still alive."""
        try:
            pid = int(self.pidfile(svc).read_text().strip())
            os.kill(pid, 0)
        except (OSError, ValueError):
            return None
        return pid

    def up(self, echo: Callable[[str], None] = print) -> None:
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.log_dir.mkdir(parents=True, exist_ok=True)
        for svc in self.services:
            if self.pid(svc) is not None:
                echo(f"{svc.name}: already running (pid {self.pid(svc)})")
                continue
            if port_open(self.settings.host, svc.port):
                raise StackError(
                    f"{svc.name}: port {svc.port} is taken by another process; stop it or set "
                    f"CANDLEWIRE_PORTS__<NAME> to another port"
                )
            if svc.prepare is not None:
                svc.prepare()
            self._spawn(svc)
            self._await_healthy(svc)
            echo(f"{svc.name}: up on port {svc.port} (log {self.logfile(svc)})")

    def _spawn(self, svc: Service) -> None:
        log = self.logfile(svc).open("ab")
        proc = subprocess.Popen(
            svc.argv,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
            env={**os.environ, **self.settings.to_env(), **svc.env},
        )
        self.pidfile(svc).write_text(str(proc.pid))

    def _await_healthy(self, svc: Service) -> None:
        deadline = time.monotonic() + svc.start_timeout
        problem: str | None = "not started"
        while time.monotonic() < deadline:
            if self.pid(svc) is None:
                tail = self.logfile(svc).read_text(errors="replace").splitlines()[-15:]
                raise StackError(f"{svc.name} exited during start; log:\n" + "\n".join(tail))
            problem = svc.health()
            if problem is None:
                return
            time.sleep(0.3)
        raise StackError(f"{svc.name} not healthy after {svc.start_timeout:.0f}s: {problem}")

    def down(self, echo: Callable[[str], None] = print) -> None:
        for svc in reversed(self.services):
            pid = self.pid(svc)
            if pid is None:
                self.pidfile(svc).unlink(missing_ok=True)
                continue
            stop_process_group(pid, svc.stop_timeout)
            self.pidfile(svc).unlink(missing_ok=True)
            echo(f"{svc.name}: stopped")

    def status(self) -> list[tuple[str, int, int | None, str]]:
        """(name, port, pid, health) for each service."""
        rows = []
        for svc in self.services:
            pid = self.pid(svc)
            health = "stopped" if pid is None else (svc.health() or "healthy")
            rows.append((svc.name, svc.port, pid, health))
        return rows


def stop_process_group(pid: int, timeout: float) -> None:
    """SIGTERM the service's process group, then SIGKILL what outlives ``timeout``."""
    try:
        os.killpg(pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            os.killpg(pid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.1)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pid, signal.SIGKILL)


def python_service(module_args: list[str]) -> list[str]:
    """Run a candlewire subcommand with this interpreter."""
    return [sys.executable, "-m", "candlewire.cli", *module_args]


def default_services(settings: Settings) -> list[Service]:
    relay_metrics = f"http://{settings.host}:{settings.port('relay_metrics')}/metrics"
    return [
        Service(
            name="relay",
            argv=python_service(["relay"]),
            port=settings.port("client_requests"),
            health=http_health(relay_metrics, "candlewire_relay_up 1.0"),
        ),
    ]
