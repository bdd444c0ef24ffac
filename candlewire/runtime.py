"""What every long-running candlewire service shares: its ports, a metrics endpoint and
signal handling.

A port that is taken is :class:`~candlewire.config.PortTaken` (one line naming its setting),
except a metrics port left at its default: that one gives way to any free port, logged, so a
second ingestor, relay or gateway starts beside ``make up`` as it is.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import signal
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from socketserver import StreamRequestHandler
from types import FrameType

import zmq
from prometheus_client import CollectorRegistry, start_http_server

from candlewire.config import PortTaken, Settings, port_setting

# Every JVM the stack runs keeps its heap near its live set (#36). The serial collector grows
# the old generation only to keep 10 % free after a full collection and gives back what
# passes 30 %; young collections stop the world on one thread, short at these heap sizes.
# The Spark driver, the one JVM whose pauses stop a busy pipeline, collects in parallel
# within the same ratios (candlewire.spark.DRIVER_COLLECTOR).
# G1 (tried with these ratios and a periodic collection) grew the stream job's heap from a
# live set of 160 MiB to 640-780 MiB idle and to its cap under load: its heuristics expand
# whenever a burst of pauses passes its time goal, and its own structures cost more besides.
HEAP_NEAR_LIVE_SET = (
    "-XX:NewRatio=3",  # old generation three times the young: room for a full horizon of ids
    "-XX:MinHeapFreeRatio=10",
    "-XX:MaxHeapFreeRatio=30",
    # glibc keeps what native code freed (Kafka's and Parquet's buffers, RocksDB, the JIT);
    # trimmed every 5 s it goes back (77 MiB at once in the stream job under bench.soak).
    "-XX:+UnlockExperimentalVMOptions",
    "-XX:TrimNativeHeapInterval=5000",
)
JVM_SMALL_HEAP = ("-XX:+UseSerialGC", *HEAP_NEAR_LIVE_SET)

# A JVM's class archive (application class-data sharing): the classes a run of the program
# loaded, parsed and verified, which later starts map from the file instead of loading again
# (a Spark session started in half the time, a Kafka broker in two thirds). ``make archives``
# dumps one per program. The JVM checks an archive against the class path's jars and ignores
# a stale one; its messages about the archive are silenced, since a start without it is only
# slower.
QUIET_ARCHIVE = "-Xlog:cds*=off"


def pid_alive(pid: int, *, ours: bool = True) -> bool:
    """Whether process ``pid`` runs. Another user's process counts as gone when ``ours``
    (the stack's parts are its own, so such a pid was reused) and as running otherwise (a
    job whose scratch directory we would otherwise remove may be another user's)."""
    try:
        os.kill(pid, 0)
    except PermissionError:
        return not ours
    except OSError:
        return False
    return True


def archive_options(archive: Path) -> tuple[str, ...]:
    """The JVM options that map classes from ``archive``; none while it does not exist."""
    return (QUIET_ARCHIVE, f"-XX:SharedArchiveFile={archive}") if archive.is_file() else ()


# A dumping run's compiled code dies with it, and the archive holds classes, not code: with
# C1 only the Spark driver's dump took 70 s instead of 83 and 30 CPU seconds fewer, and JVMs
# with C2 map it as before (2026-12-07).
DUMP_COMPILER = "-XX:TieredStopAtLevel=1"


def dump_options(archive: Path) -> tuple[str, ...]:
    """The JVM options that dump the classes it loaded, as it exits, to ``archive``'s
    ``.part`` file (:func:`publish_archive` renames it once the JVM has exited)."""
    part = archive.with_suffix(".part")
    return (QUIET_ARCHIVE, DUMP_COMPILER, f"-XX:ArchiveClassesAtExit={part}")


def publish_archive(archive: Path) -> Path:
    """Rename the dumped ``.part`` file to ``archive``: a JVM never maps half of one."""
    part = archive.with_suffix(".part")
    if not part.is_file():
        raise RuntimeError(f"the JVM wrote no class archive to {part}")
    part.replace(archive)
    print(f"class archive: {archive} ({archive.stat().st_size // 2**20} MiB)")
    return archive


log = logging.getLogger("candlewire")


@contextmanager
def binding(settings: Settings, name: str) -> Iterator[None]:
    """Whatever binds endpoint ``name`` in this block (a server, a ZMQ socket): a taken port
    is :class:`PortTaken`."""
    try:
        yield
    except (OSError, zmq.ZMQError) as exc:
        if isinstance(exc, PortTaken) or exc.errno != errno.EADDRINUSE:
            raise
        raise PortTaken(name, settings.port(name), settings.bind_host) from None


def bind(sock: zmq.Socket, settings: Settings, name: str) -> zmq.Socket:
    """Bind ``sock`` to endpoint ``name``; a taken port is :class:`PortTaken`."""
    with binding(settings, name):
        sock.bind(settings.bind(name))
    return sock


METRICS_IDLE_S = 10.0


class MetricsServer:
    """Prometheus exposition of one registry on endpoint ``name``; close() frees the port for
    a restart. ``port`` is where it serves: the default's place may have been taken."""

    def __init__(self, registry: CollectorRegistry, settings: Settings, name: str) -> None:
        host, port = settings.bind_host, settings.port(name)
        try:
            self._server, _ = start_http_server(port, addr=host, registry=registry)
        except OSError as exc:
            if exc.errno != errno.EADDRINUSE:
                raise
            if settings.port_set(name):
                raise PortTaken(name, port, host, floats=True) from None
            self._server, _ = start_http_server(0, addr=host, registry=registry)
            log.warning(
                "metrics on http://%s:%d/metrics: %s's port %d is taken (%s chooses one)",
                host,
                self._server.server_address[1],
                name,
                port,
                port_setting(name),
            )
        self.port: int = self._server.server_address[1]
        # A connection that sends nothing is closed after METRICS_IDLE_S: each holds a
        # thread of prometheus_client's server until it ends, and a scraper's never idles.
        self._server.RequestHandlerClass = _idle_closing(self._server.RequestHandlerClass)

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()


def _idle_closing(handler: type[StreamRequestHandler]) -> type[StreamRequestHandler]:
    """``handler`` with a timeout on its connection's reads, and the timeout closing it
    quietly (socketserver printed a traceback for each)."""

    class Idle(handler):  # type: ignore[valid-type, misc]
        timeout = METRICS_IDLE_S

        def handle(self) -> None:
            with contextlib.suppress(TimeoutError):
                super().handle()

    return Idle


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
