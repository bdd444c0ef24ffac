"""A private local stack on free ports for benchmarks, so they never disturb `make up`."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from candlewire.config import Settings
from candlewire.testing import free_settings, stream_metric
from launcher.local.postgres import LocalPostgres
from launcher.stack import ProcessService, Stack, default_services, kafka_service


@contextlib.contextmanager
def private_stack(**overrides: object) -> Iterator[Settings]:
    """``overrides``: settings that differ from the defaults, e.g. the commit interval.

    The stack goes down however the bench ends, a SIGTERM (``kill``, ``timeout``) included:
    a bench killed without it once left a whole stack running for an hour beside others."""
    base = _private_folder()
    settings = free_settings(base, **overrides)
    stack = Stack(settings, default_services(settings))
    with _stopped_despite_sigterm(lambda: stack.down(lambda _: None), base):
        stack.up(lambda line: print(line, flush=True))
        yield settings


@contextlib.contextmanager
def private_postgres() -> Iterator[Settings]:
    """Settings on free ports, their state in a temporary folder, with a PostgreSQL of their
    own running (the Iceberg catalog, the gateway's directory) for a bench that needs no
    more of the stack; stopped and removed at the end."""
    base = _private_folder()
    settings = free_settings(base)
    pg = LocalPostgres(base / "postgres", settings.port("postgres"))
    with _stopped_despite_sigterm(pg.stop, base):
        pg.init_once()
        pg.start(base / "postgres.log")
        yield settings


@contextlib.contextmanager
def private_broker() -> Iterator[Settings]:
    """Settings on free ports, their state in a temporary folder, with a Kafka broker of
    their own running, for a bench that needs no more of the stack; stopped and removed at
    the end."""
    base = _private_folder()
    settings = free_settings(base)
    with running(kafka_service(settings), base):
        yield settings


@contextlib.contextmanager
def running(service: ProcessService, folder: Path | None = None) -> Iterator[ProcessService]:
    """``service`` started, and stopped (then ``folder`` removed) however the block ends, a
    SIGTERM during its start (which waits seconds for its health) included: its pid is on
    file once it is spawned."""
    with _stopped_despite_sigterm(service.stop, folder):
        service.start()
        yield service


def _private_folder() -> Path:
    base = Path(tempfile.mkdtemp(prefix="candlewire-bench-"))
    base.chmod(0o755)  # PostgreSQL runs as the postgres user when we are root
    return base


# Once a SIGTERM has come, every later one is ignored until the bench is out.
_killed = False
_depth = 0  # sigterm_unwinds blocks open


@contextlib.contextmanager
def sigterm_unwinds() -> Iterator[None]:
    """Inside, a SIGTERM (``kill``, ``timeout``) raises ``SystemExit``, so every ``finally``
    stops what the bench started: Python's default ends the process at once and skips them.
    Any later SIGTERM is ignored on the way out, through every enclosing block: ``kill`` and
    ``timeout`` often deliver two (``pkill -f`` reaches ``timeout`` too, which passes its own
    on), and the second once ended a bench halfway through its stack's ``down``, leaving seven
    parts running. The outermost block then stops the child processes still running as it
    ends (one started by a call the kill interrupted, before its caller could record it);
    one a thread starts after that is not seen."""
    global _depth
    previous = signal.signal(signal.SIGTERM, _exit_on_term)
    _depth += 1
    try:
        yield
    finally:
        _depth -= 1
        if _killed:
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
            if _depth == 0:
                _stop_children()
        else:
            signal.signal(signal.SIGTERM, previous)


def _held_term(_signum: int, _frame: object) -> None:
    global _killed
    _killed = True
    signal.signal(signal.SIGTERM, signal.SIG_IGN)


def _exit_on_term(signum: int, frame: object) -> None:
    _held_term(signum, frame)
    raise SystemExit(128 + signum)


@contextlib.contextmanager
def _stopped_despite_sigterm(
    stop: Callable[[], None], folder: Path | None = None
) -> Iterator[None]:
    """Run ``stop`` (then remove ``folder``) however the body ends, to its end: a SIGTERM
    while it runs is held, and the bench exits as killed once it is done."""

    def stopped() -> None:
        try:
            stop()
        finally:
            if folder is not None:
                shutil.rmtree(folder, ignore_errors=True)

    with sigterm_unwinds():
        try:
            yield
        except BaseException:  # a SIGTERM's own SystemExit, or the bench's error
            _hold_sigterm()
            stopped()
            raise
        _hold_sigterm()
        stopped()
        if _killed:
            raise SystemExit(128 + signal.SIGTERM)


def _hold_sigterm() -> None:
    """From here a SIGTERM only marks the bench killed: the cleanup under way finishes."""
    signal.signal(signal.SIGTERM, signal.SIG_IGN if _killed else _held_term)


def _stop_children(grace_s: float = 10.0) -> None:
    """SIGTERM to each child process running now, SIGKILL to any left after ``grace_s``; a
    child that leads its own process group (a server in its own session) with its group."""
    left = _children()
    for pid in left:
        _signal(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while left and time.monotonic() < deadline:
        time.sleep(0.1)
        left = [pid for pid in left if pid in _children()]
    for pid in left:
        _signal(pid, signal.SIGKILL)


def _signal(pid: int, sig: int) -> None:
    with contextlib.suppress(OSError):  # gone, or not ours to signal: nothing more to do
        if os.getpgid(pid) == pid:
            os.killpg(pid, sig)
        else:
            os.kill(pid, sig)


def _children() -> list[int]:
    """This process's children that have not exited (zombies left out), from ``/proc``."""
    me, found = os.getpid(), []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError, IndexError, ValueError):
            state, ppid = stat.read_text().rsplit(")", 1)[1].split()[:2]
            if int(ppid) == me and state != "Z":
                found.append(int(stat.parent.name))
    return found


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
