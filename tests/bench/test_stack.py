"""A bench's private servers go down with it, a ``kill`` (SIGTERM) included."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

from candlewire.testing import wait_for

# A bench that holds a private PostgreSQL, says where its state is, and waits to be killed.
BENCH = """
import time
from bench.stack import private_postgres
with private_postgres() as settings:
    print(settings.state_dir, flush=True)
    time.sleep(120)
"""


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_a_killed_bench_stops_its_private_postgres_and_removes_its_state() -> None:
    bench = subprocess.Popen(
        [sys.executable, "-c", BENCH], stdout=subprocess.PIPE, text=True, cwd=Path.cwd()
    )
    try:
        state = Path(bench.stdout.readline().strip())  # type: ignore[union-attr]
        server = int((state / "postgres" / "postmaster.pid").read_text().split()[0])
        assert _alive(server)
        bench.send_signal(signal.SIGTERM)
        assert bench.wait(timeout=60) == 128 + signal.SIGTERM
        wait_for(lambda: not _alive(server), timeout=10)
        assert not state.exists()
    finally:  # a failure before the SIGTERM still lets the bench stop its server
        if bench.poll() is None:
            bench.terminate()
            bench.wait(timeout=60)
