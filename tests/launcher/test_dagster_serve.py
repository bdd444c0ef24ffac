"""The one Dagster process (webserver and daemon): it must not outlive its daemons."""

from __future__ import annotations

import signal
import subprocess
import sys

STOPPING_DAEMON = """
import threading, time
from launcher.dagster_serve import _watch

class Stopped:
    def check_daemon_loop(self):
        raise RuntimeError("SchedulerDaemon: no heartbeat for 300 s")

stopping = threading.Event()
if STOPPING:
    stopping.set()
_watch(Stopped(), stopping)
time.sleep(3)  # the webserver, serving on
"""


def test_the_process_stops_when_a_daemon_stops() -> None:
    """As ``dagster-daemon run`` exits when a daemon thread dies; otherwise the UI would stay
    up with no schedules or backfills running, and ``candlewire status`` would not say."""
    done = _run(stopping=False)
    assert done.returncode == -signal.SIGTERM
    assert "a Dagster daemon stopped" in done.stderr
    assert "SchedulerDaemon: no heartbeat" in done.stderr


def test_daemons_ending_because_the_process_stops_stop_nothing_more() -> None:
    """While the process shuts down on purpose its daemon threads end; that is no failure to
    report, nor a reason to signal the process again in the middle of its shutdown."""
    done = _run(stopping=True)
    assert done.returncode == 0, done.stderr
    assert "a Dagster daemon stopped" not in done.stderr


def _run(stopping: bool) -> subprocess.CompletedProcess[str]:
    code = f"STOPPING = {stopping}\n{STOPPING_DAEMON}"
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=20)
