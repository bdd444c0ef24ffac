"""Dagster's webserver and its daemon in one process, over the stack's one code server.

``dagster-webserver`` and ``dagster-daemon run`` are each a Python process holding Dagster,
its GraphQL schema and a storage pool: about 135 MiB of RSS apiece, idle (#36). Here the
daemon controller's threads (schedules, sensors, backfills, the run queue) run beside the
webserver's event loop, each with its own instance as the two commands would have, so what
they do is unchanged. The daemon controller is Dagster's own (``dagster._daemon``, pinned
with Dagster in ``pyproject.toml``); when a daemon thread dies, the process stops, as
``dagster-daemon run`` would, and ``candlewire status`` shows the part down.

    python -m launcher.dagster_serve --host 127.0.0.1 --port 3000 --workspace WORKSPACE
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import threading
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from dagster._daemon.controller import DagsterDaemonController

log = logging.getLogger("candlewire.dagster")

# dagster-webserver's own defaults for its storage pool (``--db-statement-timeout`` …).
STATEMENT_TIMEOUT_MS = 15_000
POOL_RECYCLE_S = 3_600
POOL_MAX_OVERFLOW = 20


# Dagster's backfill daemon looks at its backfills every 30 s: a module constant of its daemon
# controller that no instance setting reaches. A backfill launched from the UI waited up to
# 30 s for its first run, and as long again after its last to show as completed (most of
# the GraphQL backfill test's minute). This process is ours, so it looks every 5 s: a query
# for the backfills in progress. The asset daemon reads the same constant as its default
# interval; ``dagster.yaml`` keeps that at 30 s (``launcher.dagster_home``).
BACKFILL_INTERVAL_S = 5


def quicken_backfills() -> None:
    """Set the backfill daemon's interval to :data:`BACKFILL_INTERVAL_S`."""
    from dagster._daemon import controller

    if not hasattr(controller, "DEFAULT_DAEMON_INTERVAL_SECONDS"):  # another Dagster
        log.warning("Dagster's backfill interval is not where it was; backfills keep theirs")
        return
    controller.DEFAULT_DAEMON_INTERVAL_SECONDS = BACKFILL_INTERVAL_S


def serve(host: str, port: int, workspace: str) -> None:
    from dagster import DagsterInstance
    from dagster._core.workspace.context import WorkspaceProcessContext
    from dagster._core.workspace.load_target import WorkspaceFileTarget
    from dagster._daemon.controller import daemon_controller_from_instance
    from dagster._utils.interrupts import setup_interrupt_handlers
    from dagster_webserver.cli import host_dagster_ui_with_workspace_process_context
    from dagster_webserver.version import __version__

    # SIGTERM raises KeyboardInterrupt, as in ``dagster-daemon run``. The webserver stops on
    # it first, then sends it again once it has stopped: it then leaves each ``with`` below,
    # so the daemon threads finish their iteration and the instances close, not killed.
    setup_interrupt_handlers()
    quicken_backfills()
    stopping = threading.Event()
    target = WorkspaceFileTarget(paths=[workspace])
    with (
        DagsterInstance.get() as daemon_instance,
        daemon_controller_from_instance(daemon_instance, workspace_load_target=target) as daemons,
        DagsterInstance.get() as instance,
    ):
        watch = threading.Thread(target=_watch, args=(daemons, stopping), name="daemon-watch")
        watch.daemon = True
        watch.start()
        instance.optimize_for_webserver(STATEMENT_TIMEOUT_MS, POOL_RECYCLE_S, POOL_MAX_OVERFLOW)
        try:
            with WorkspaceProcessContext(
                instance, version=__version__, read_only=False, workspace_load_target=target
            ) as context:
                host_dagster_ui_with_workspace_process_context(context, host, port, "", "warning")
        finally:
            stopping.set()  # the daemon threads now stop on purpose


def _watch(daemons: DagsterDaemonController, stopping: threading.Event) -> None:
    """The daemon command's own loop: it raises once a daemon thread stops heartbeating.
    The webserver then stops too (SIGTERM, as ``candlewire down`` sends it), unless the
    process is already stopping and the threads are ending because it asked them to."""
    try:
        daemons.check_daemon_loop()
    except Exception:
        if stopping.is_set():
            return
        log.exception("a Dagster daemon stopped; stopping the webserver with it")
    if not stopping.is_set():
        os.kill(os.getpid(), signal.SIGTERM)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", required=True)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--workspace", required=True)
    args = parser.parse_args()
    try:
        serve(args.host, args.port, args.workspace)
    except KeyboardInterrupt:
        log.info("stopped")  # SIGTERM or Ctrl-C: webserver and daemons shut down in order


if __name__ == "__main__":
    main()
