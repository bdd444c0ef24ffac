"""The one Dagster process (webserver and daemon): it must not outlive its daemons."""

from __future__ import annotations

import signal
import subprocess
import sys

STOPPING_DAEMON = """
import time
from launcher.dagster_serve import _watch

class Stopped:
    def check_daemon_loop(self):
        raise RuntimeError("SchedulerDaemon: no heartbeat for 300 s")

_watch(Stopped())
time.sleep(30)  # the webserver, serving on
"""


def test_the_process_stops_when_a_daemon_stops() -> None:
    """As ``dagster-daemon run`` exits when a daemon thread dies; otherwise the UI would stay
    up with no schedules or backfills running, and ``candlewire status`` would not say."""
    done = subprocess.run(
        [sys.executable, "-c", STOPPING_DAEMON], capture_output=True, text=True, timeout=20
    )
    assert done.returncode == -signal.SIGTERM
    assert "a Dagster daemon stopped" in done.stderr
    assert "SchedulerDaemon: no heartbeat" in done.stderr
