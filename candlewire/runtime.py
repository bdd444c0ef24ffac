"""What every long-running candlewire service shares: a metrics endpoint and signal handling."""

from __future__ import annotations

import logging
import signal
import threading
from collections.abc import Callable
from types import FrameType

from prometheus_client import CollectorRegistry, start_http_server

log = logging.getLogger("candlewire")


class MetricsServer:
    """Prometheus exposition of one registry; close() frees the port for a restart."""

    def __init__(self, registry: CollectorRegistry, host: str, port: int) -> None:
        self._server, _ = start_http_server(port, addr=host, registry=registry)

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()


def run_until_signal(
    start: Callable[[], object],
    stop: Callable[[], None],
    healthy: Callable[[], bool] = lambda: True,
) -> None:
    """Start, serve until SIGINT/SIGTERM (or until ``healthy`` turns false), then stop."""
    stopping = threading.Event()

    def _on_signal(signum: int, _frame: FrameType | None) -> None:
        log.info("stopping on signal %d", signum)
        stopping.set()

    signal.signal(signal.SIGINT, _on_signal)
    signal.signal(signal.SIGTERM, _on_signal)
    start()
    while not stopping.wait(0.5) and healthy():
        pass
    stop()
