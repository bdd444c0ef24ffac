"""A bench's private servers go down with it, a ``kill`` (SIGTERM) included, and a second
SIGTERM while they stop does not cut that short."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from candlewire.testing import wait_for

# A bench that holds a private PostgreSQL, says where its state is, and waits to be killed.
BENCH = """
import time
from bench.stack import private_postgres
with private_postgres() as settings:
    print(settings.state_dir, flush=True)
    time.sleep(120)
"""
# A bench's private PostgreSQL, which sends the bench a SIGTERM as it starts to stop: as
# ``pkill -f`` does when it reaches both the bench and the ``timeout`` that runs it, which
# passes its own on.
KILLED_AS_IT_STOPS = """
import os, signal, time
from bench.stack import private_postgres
from launcher.local.postgres import LocalPostgres
stop = LocalPostgres.stop
def stop_killed(self, *args, **kwargs):
    os.kill(os.getpid(), signal.SIGTERM)
    return stop(self, *args, **kwargs)
LocalPostgres.stop = stop_killed
"""
# BENCH, sent that second SIGTERM.
TWICE = (
    KILLED_AS_IT_STOPS
    + """
with private_postgres() as settings:
    print(settings.state_dir, flush=True)
    time.sleep(120)
"""
)
# The second SIGTERM in the bench's own cleanup (as ``bench.commit`` stops its broker), which
# must run to its end before the private server stops.
IN_ITS_CLEANUP = """
import os, signal, time
from bench.stack import private_postgres
with private_postgres() as settings:
    try:  # said inside the try: the SIGTERM comes as soon as it is read
        print(settings.state_dir, flush=True)
        time.sleep(120)
    finally:
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(0.2)
        print("its own cleanup done", flush=True)
"""


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


@contextlib.contextmanager
def bench_process(script: str, *args: str) -> Iterator[tuple[subprocess.Popen, list[int]]]:
    """``script`` run as a bench, its stdout read by the test; the pids the test appends to
    the list (servers, children) are killed afterwards if still running, so a failing test
    leaves nothing behind. A bench still running is sent SIGTERM first, to stop its own."""
    bench = subprocess.Popen(
        [sys.executable, "-c", script, *args], stdout=subprocess.PIPE, text=True, cwd=Path.cwd()
    )
    leftovers: list[int] = []
    try:
        yield bench, leftovers
    finally:
        if bench.poll() is None:
            bench.terminate()
            try:
                bench.wait(timeout=60)
            except subprocess.TimeoutExpired:
                bench.kill()
                bench.wait(timeout=10)
        for pid in leftovers:
            if _alive(pid):
                os.kill(pid, signal.SIGKILL)


@pytest.mark.parametrize(
    ("script", "own_cleanup"),
    [(BENCH, False), (TWICE, False), (IN_ITS_CLEANUP, True)],
    ids=["once", "again-while-stopping", "again-in-its-own-cleanup"],
)
def test_a_killed_bench_stops_its_private_postgres_and_removes_its_state(
    script: str, own_cleanup: bool
) -> None:
    with bench_process(script) as (bench, leftovers):
        state = Path(bench.stdout.readline().strip())  # type: ignore[union-attr]
        server = int((state / "postgres" / "postmaster.pid").read_text().split()[0])
        leftovers.append(server)
        assert _alive(server)
        bench.send_signal(signal.SIGTERM)
        assert bench.wait(timeout=60) == 128 + signal.SIGTERM
        wait_for(lambda: not _alive(server), timeout=10)
        assert not state.exists()
        said = bench.stdout.read()  # type: ignore[union-attr]
        assert ("its own cleanup done" in said) == own_cleanup


# A bench that starts its servers itself (``bench.kafka``, ``bench.replay``) and stops them in
# its own ``finally``, run as their ``__main__`` runs it.
OWN_SERVERS = """
import os, signal, time
from bench.stack import sigterm_unwinds
with sigterm_unwinds():
    try:  # said inside the try: the SIGTERM comes as soon as it is read
        print("started", flush=True)
        time.sleep(120)
    finally:
        os.kill(os.getpid(), signal.SIGTERM)  # the second, as pkill -f sends beside timeout
        time.sleep(0.2)
        print("stopped", flush=True)
"""


def test_a_killed_bench_runs_its_own_finally_to_the_end() -> None:
    with bench_process(OWN_SERVERS) as (bench, _):
        assert bench.stdout.readline().strip() == "started"  # type: ignore[union-attr]
        bench.send_signal(signal.SIGTERM)
        assert bench.wait(timeout=30) == 128 + signal.SIGTERM
        assert bench.stdout.read().strip() == "stopped"  # type: ignore[union-attr]


# A bench killed while a server it starts is still coming up (a broker waits seconds for its
# health). The server, whose health never comes, writes its pid to its log and sleeps; its
# state folder goes once it is stopped.
STARTING = """
import sys
from pathlib import Path
from bench.stack import running, sigterm_unwinds
from launcher.stack import ProcessService
base = Path(sys.argv[1])
sleeper = "import os, time; print(os.getpid(), flush=True); time.sleep(120)"
server = ProcessService(
    name="server",
    argv=lambda: [sys.executable, "-c", sleeper],
    port=None,
    check=lambda: "not yet",
    run_dir=base,
    log=base / "server.log",
)
(base / "state").mkdir()
with sigterm_unwinds(), running(server, base / "state"):
    pass
"""


def test_a_bench_killed_while_its_server_starts_stops_that_server(tmp_path: Path) -> None:
    log = tmp_path / "server.log"
    with bench_process(STARTING, str(tmp_path)) as (bench, leftovers):
        # Its pid on file too: the bench writes it just after the spawn returns.
        wait_for(lambda: (tmp_path / "server.pid").is_file() and log.is_file(), timeout=30)
        wait_for(lambda: log.read_text().strip() != "", timeout=30)
        server = int(log.read_text().split()[0])
        leftovers.append(server)
        assert _alive(server)
        bench.send_signal(signal.SIGTERM)
        assert bench.wait(timeout=60) == 128 + signal.SIGTERM
        wait_for(lambda: not _alive(server), timeout=10)
        assert not (tmp_path / "server.pid").exists()  # stopped by its own stop
        assert not (tmp_path / "state").exists()


# Blocks within blocks: the bench's own cleanup, outside an inner block that has ended, is
# not cut short by a second SIGTERM either. A child it started and never recorded (a call
# the kill interrupted) is stopped on the way out.
NESTED = """
import os, signal, subprocess, sys, time
from bench.stack import sigterm_unwinds
with sigterm_unwinds():
    try:
        with sigterm_unwinds():
            sleeper = [sys.executable, "-c", "import time; time.sleep(120)"]
            child = subprocess.Popen(sleeper, stdout=subprocess.DEVNULL)
            print(child.pid, flush=True)
            time.sleep(120)
    finally:
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(0.2)
        print("outer cleanup done", flush=True)
"""


def test_a_killed_bench_finishes_every_cleanup_and_stops_its_leftover_children() -> None:
    with bench_process(NESTED) as (bench, leftovers):
        child = int(bench.stdout.readline())  # type: ignore[union-attr]
        leftovers.append(child)
        assert _alive(child)
        bench.send_signal(signal.SIGTERM)
        assert bench.wait(timeout=30) == 128 + signal.SIGTERM
        assert bench.stdout.read().strip() == "outer cleanup done"  # type: ignore[union-attr]
        wait_for(lambda: not _alive(child), timeout=10)


# A SIGTERM that comes while a bench that has finished stops its server: the stop runs to
# its end, and then the bench exits as killed instead of carrying on.
DURING_TEARDOWN = (
    KILLED_AS_IT_STOPS
    + """
with private_postgres() as settings:
    print(settings.state_dir, flush=True)
    pid = (settings.state_dir / "postgres" / "postmaster.pid").read_text().split()[0]
    print(pid, flush=True)
print("carried on", flush=True)
"""
)


def test_a_sigterm_during_a_finished_benchs_teardown_waits_for_it_then_ends_the_bench() -> None:
    with bench_process(DURING_TEARDOWN) as (bench, leftovers):
        lines = bench.stdout  # type: ignore[union-attr]
        state = Path(lines.readline().strip())
        server = int(lines.readline())
        leftovers.append(server)
        assert bench.wait(timeout=60) == 128 + signal.SIGTERM
        assert "carried on" not in lines.read()
        # The stop ran to its end, not just the folder's removal after it.
        wait_for(lambda: not _alive(server), timeout=10)
        assert not state.exists()
