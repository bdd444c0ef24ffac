"""A private local stack on free ports for benchmarks, so they never disturb `make up`."""

from __future__ import annotations

import contextlib
import shutil
import signal
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

from candlewire.config import Settings
from candlewire.testing import free_settings, stream_metric
from launcher.local.postgres import LocalPostgres
from launcher.stack import Stack, default_services


@contextlib.contextmanager
def private_stack(**overrides: object) -> Iterator[Settings]:
    """``overrides``: settings that differ from the defaults, e.g. the commit interval.

    The stack goes down however the bench ends, a SIGTERM (``kill``, ``timeout``) included:
    a bench killed without it once left a whole stack running for an hour beside others."""
    base = Path(tempfile.mkdtemp(prefix="candlewire-bench-"))
    base.chmod(0o755)  # PostgreSQL runs as the postgres user when we are root
    settings = free_settings(base, **overrides)
    stack = Stack(settings, default_services(settings))
    try:
        with _unwound_by_sigterm():
            stack.up(lambda line: print(line, flush=True))
            yield settings
    finally:
        stack.down(lambda _: None)
        shutil.rmtree(base, ignore_errors=True)


@contextlib.contextmanager
def private_postgres() -> Iterator[Settings]:
    """Settings on free ports, their state in a temporary folder, with a PostgreSQL of their
    own running (the Iceberg catalog, the gateway's directory) for a bench that needs no
    more of the stack; stopped and removed at the end."""
    base = Path(tempfile.mkdtemp(prefix="candlewire-bench-"))
    base.chmod(0o755)  # PostgreSQL runs as the postgres user when we are root
    settings = free_settings(base)
    pg = LocalPostgres(base / "postgres", settings.port("postgres"))
    try:
        with _unwound_by_sigterm():
            pg.init_once()
            pg.start(base / "postgres.log")
            yield settings
    finally:
        pg.stop()
        shutil.rmtree(base, ignore_errors=True)


@contextlib.contextmanager
def _unwound_by_sigterm() -> Iterator[None]:
    """A SIGTERM inside raises ``SystemExit``, so the caller's ``finally`` stops what the
    bench started: Python's default for SIGTERM ends the process at once and skips it."""
    previous = signal.signal(signal.SIGTERM, _exit_on_term)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def _exit_on_term(signum: int, _frame: object) -> None:
    raise SystemExit(128 + signum)


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
