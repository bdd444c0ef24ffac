"""A private local stack on free ports for benchmarks, so they never disturb `make up`."""

from __future__ import annotations

import contextlib
import shutil
import signal
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from candlewire.config import Settings
from candlewire.testing import free_settings, stream_metric
from launcher.local.postgres import LocalPostgres
from launcher.stack import ProcessService, Stack, default_services


@contextlib.contextmanager
def private_stack(**overrides: object) -> Iterator[Settings]:
    """``overrides``: settings that differ from the defaults, e.g. the commit interval.

    The stack goes down however the bench ends, a SIGTERM (``kill``, ``timeout``) included:
    a bench killed without it once left a whole stack running for an hour beside others."""
    base = Path(tempfile.mkdtemp(prefix="candlewire-bench-"))
    base.chmod(0o755)  # PostgreSQL runs as the postgres user when we are root
    settings = free_settings(base, **overrides)
    stack = Stack(settings, default_services(settings))

    def stop() -> None:
        try:
            stack.down(lambda _: None)
        finally:
            shutil.rmtree(base, ignore_errors=True)

    with _stopped_despite_sigterm(stop):
        stack.up(lambda line: print(line, flush=True))
        yield settings


@contextlib.contextmanager
def running(service: ProcessService) -> Iterator[ProcessService]:
    """``service`` started, and stopped however the block ends, a SIGTERM during its start
    (which waits seconds for its health) included: its pid is on file from its first moment."""
    try:
        service.start()
        yield service
    finally:
        service.stop()


@contextlib.contextmanager
def private_postgres() -> Iterator[Settings]:
    """Settings on free ports, their state in a temporary folder, with a PostgreSQL of their
    own running (the Iceberg catalog, the gateway's directory) for a bench that needs no
    more of the stack; stopped and removed at the end."""
    base = Path(tempfile.mkdtemp(prefix="candlewire-bench-"))
    base.chmod(0o755)  # PostgreSQL runs as the postgres user when we are root
    settings = free_settings(base)
    pg = LocalPostgres(base / "postgres", settings.port("postgres"))

    def stop() -> None:
        try:
            pg.stop()
        finally:
            shutil.rmtree(base, ignore_errors=True)

    with _stopped_despite_sigterm(stop):
        pg.init_once()
        pg.start(base / "postgres.log")
        yield settings


@contextlib.contextmanager
def sigterm_unwinds() -> Iterator[None]:
    """Inside, a SIGTERM (``kill``, ``timeout``) raises ``SystemExit``, so every ``finally``
    stops what the bench started: Python's default ends the process at once and skips them.
    Any later SIGTERM is ignored on the way out: ``kill`` and ``timeout`` often deliver two
    (``pkill -f`` reaches ``timeout`` too, which passes its own on), and the second once ended
    a bench halfway through its stack's ``down``, leaving seven parts running."""
    previous = signal.signal(signal.SIGTERM, _exit_on_term)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def _exit_on_term(signum: int, _frame: object) -> None:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    raise SystemExit(128 + signum)


@contextlib.contextmanager
def _stopped_despite_sigterm(stop: Callable[[], None]) -> Iterator[None]:
    """Run ``stop`` however the body ends, a SIGTERM included, with SIGTERM ignored while
    it runs."""
    with sigterm_unwinds():
        try:
            yield
        finally:
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
            stop()


def ticks_batches(settings: Settings) -> float:
    """Batches the committing query has ended."""
    return stream_metric(settings, 'candlewire_stream_batches_total{query="ticks"}')


def wait_until_warm(settings: Settings, commits: int = 2, timeout: float = 300.0) -> None:
    """Until the streaming job has made its first commits: they pay for JIT, Python workers
    and connections, and the benchmarks time the job as it runs for days, not its first
    minute (a cold first commit took 30 s here, overlapping whatever was timed)."""
    deadline = time.monotonic() + timeout
    while ticks_batches(settings) < commits:
        if time.monotonic() > deadline:
            raise TimeoutError(f"the streaming job made no {commits} commits in {timeout:.0f}s")
        time.sleep(1.0)
