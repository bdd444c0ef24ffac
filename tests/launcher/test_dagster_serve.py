"""The one Dagster process (webserver and daemon): it must not outlive its daemons."""

from __future__ import annotations

import signal
import subprocess
import sys

from candlewire.testing import free_settings

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


def test_backfills_are_looked_at_every_few_seconds_and_automation_keeps_its_pace(
    tmp_path,
) -> None:
    """The backfill daemon reads its interval from the constant ``quicken_backfills`` sets;
    the asset daemon, which defaults to it too, is held at its own by ``dagster.yaml``."""
    import inspect

    from dagster import QueuedRunCoordinator
    from dagster._core.instance.config import dagster_instance_config
    from dagster._daemon import backfill, controller

    from launcher.dagster_home import AUTOMATION_INTERVAL_S, DEQUEUE_INTERVAL_S, dagster_home
    from launcher.dagster_serve import BACKFILL_INTERVAL_S, quicken_backfills

    loop = inspect.getsource(backfill.execute_backfill_iteration_loop)
    assert "DEFAULT_DAEMON_INTERVAL_SECONDS - loop_duration" in loop
    before = controller.DEFAULT_DAEMON_INTERVAL_SECONDS
    try:
        quicken_backfills()
        assert controller.DEFAULT_DAEMON_INTERVAL_SECONDS == BACKFILL_INTERVAL_S
    finally:
        controller.DEFAULT_DAEMON_INTERVAL_SECONDS = before
    config, _ = dagster_instance_config(str(dagster_home(free_settings(tmp_path))))
    assert config["auto_materialize"]["minimum_interval_seconds"] == AUTOMATION_INTERVAL_S
    queue = QueuedRunCoordinator.from_config_value(None, config["run_coordinator"]["config"])
    assert queue.dequeue_interval_seconds == DEQUEUE_INTERVAL_S


STOPPING_CODE_SERVER = """
import signal, threading, time
from launcher.dagster_serve import interrupts_raise, serve_code

signal.signal(signal.SIGINT, signal.SIG_IGN)  # as a shell's background job inherits it
interrupts_raise()  # as serve() does first
stopping = threading.Event()
ended = serve_code(SOCKET, stopping)  # returns once the definitions serve on the socket
print("serving", flush=True)
if STOPPING:
    stopping.set()
ended.set()  # the gRPC server ends
time.sleep(LINGER)  # the webserver, serving on
"""


def test_the_process_serves_the_definitions_and_stops_when_its_code_server_stops(
    tmp_path,
) -> None:
    """The code server shares the process with the webserver and the daemon: if it ends,
    they have no code to load or runs to launch, so the process stops and ``candlewire
    status`` shows the part down, as when ``dagster api grpc`` exited."""
    done = _serve_code(tmp_path / "code.sock", stopping=False)
    assert done.stdout.startswith("serving"), done.stderr
    assert "the Dagster code server stopped" in done.stderr
    # SIGTERM, which Dagster's handlers (set as it loads) raise as KeyboardInterrupt in the
    # main thread: the webserver's shutdown there; here the sleep ends, as interrupted.
    assert done.returncode == -signal.SIGINT, done.stderr
    assert "KeyboardInterrupt" in done.stderr


def test_a_code_server_ending_because_the_process_stops_stops_nothing_more(tmp_path) -> None:
    done = _serve_code(tmp_path / "code.sock", stopping=True)
    assert done.stdout.startswith("serving"), done.stderr
    assert done.returncode == 0, done.stderr
    assert "the Dagster code server stopped" not in done.stderr


def _serve_code(socket, stopping: bool) -> subprocess.CompletedProcess[str]:
    # Stopping on its own, the signal must end the main thread's sleep: a signal the kernel
    # handed to another thread did so only once the sleep was over (one run in six). Stopping
    # on purpose, 15 s is long enough to see that nothing signals it.
    linger = 15 if stopping else 150
    code = f"SOCKET = {str(socket)!r}\nSTOPPING = {stopping}\nLINGER = {linger}\n"
    code += STOPPING_CODE_SERVER
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=linger + 60
    )
