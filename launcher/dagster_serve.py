"""Dagster's code server, webserver and daemon in one process.

``dagster api grpc``, ``dagster-webserver`` and ``dagster-daemon run`` are each a Python
process holding Dagster and a storage pool: about 135-140 MiB of RSS apiece, idle (#36).
Here the code server (``orchestration.definitions`` on a Unix socket; it launches the runs,
each a process of its own as before) serves from gRPC's threads, and the daemon
controller's threads (schedules, sensors, backfills, the run queue) run beside the
webserver's event loop, each with its own instance as the commands would have; the
webserver and the daemon reach the code over the socket, as they did across processes. So
what each does is unchanged. The servers and the controller are Dagster's own
(``dagster._grpc``, ``dagster._daemon``, pinned with Dagster in ``pyproject.toml``). When a
daemon thread dies or the code server stops, the process stops, as the commands would, and
``candlewire status`` shows the part down.

    python -m launcher.dagster_serve --host 127.0.0.1 --port 3000 --workspace WORKSPACE \
        --code-socket SOCKET
"""

from __future__ import annotations

import argparse
import logging
import signal
import sys
import threading
import time
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


def interrupts_raise() -> None:
    """SIGINT and SIGTERM raise KeyboardInterrupt, as Dagster's commands set them up.

    Dagster gives SIGTERM whatever SIGINT has, here and again after each load of the code.
    A process started in the background by a shell without job control inherits SIGINT
    ignored, so SIGTERM (``candlewire down``, or the code server stopping) would be ignored
    too: SIGINT gets Python's own handler first.
    """
    from dagster._utils.interrupts import setup_interrupt_handlers

    signal.signal(signal.SIGINT, signal.default_int_handler)
    setup_interrupt_handlers()


def serve_code(socket: str, stopping: threading.Event) -> threading.Event:
    """Load the definitions and serve them on ``socket`` from gRPC's threads, as ``dagster api
    grpc --socket SOCKET -m orchestration.definitions`` would. Returns the event that stops
    the server; if it stops otherwise, the process stops (SIGTERM), unless already stopping."""
    from dagster._core.types.loadable_target_origin import LoadableTargetOrigin
    from dagster._core.utils import FuturesAwareThreadPoolExecutor
    from dagster._grpc.server import DagsterApiServer, DagsterGrpcServer

    from candlewire.config import REPO_ROOT
    from launcher.dagster_home import DEFINITIONS, LOCATION

    logger = logging.getLogger("dagster.code_server")
    ended = threading.Event()
    executor = FuturesAwareThreadPoolExecutor()
    origin = LoadableTargetOrigin(
        executable_path=sys.executable, module_name=DEFINITIONS, working_directory=str(REPO_ROOT)
    )
    servicer = DagsterApiServer(
        server_termination_event=ended,
        logger=logger,
        server_threadpool_executor=executor,
        loadable_target_origin=origin,
        location_name=LOCATION,
    )
    server = DagsterGrpcServer(
        server_termination_event=ended,
        dagster_api_servicer=servicer,
        logger=logger,
        threadpool_executor=executor,
        socket=socket,
    )

    def run() -> None:
        try:
            server.serve()
        except Exception:
            log.exception("the Dagster code server failed")
        if not stopping.is_set():
            log.error("the Dagster code server stopped; stopping the process with it")
            _stop_process()

    threading.Thread(target=run, name="code-server", daemon=True).start()
    _await_socket(socket)  # the webserver and the daemon load the code from it at once
    return ended


def _await_socket(path: str, timeout_s: float = 30.0) -> None:
    from launcher.dagster_home import socket_problem

    deadline = time.monotonic() + timeout_s
    while (problem := socket_problem(path)) is not None:
        if time.monotonic() > deadline:
            raise RuntimeError(problem)
        time.sleep(0.05)


def serve(host: str, port: int, workspace: str, code_socket: str) -> None:
    from dagster import DagsterInstance
    from dagster._core.workspace.context import WorkspaceProcessContext
    from dagster._core.workspace.load_target import WorkspaceFileTarget
    from dagster._daemon.controller import daemon_controller_from_instance
    from dagster_webserver.cli import host_dagster_ui_with_workspace_process_context
    from dagster_webserver.version import __version__

    # SIGTERM raises KeyboardInterrupt, as in ``dagster-daemon run``. The webserver stops on
    # it first, then sends it again once it has stopped: it then leaves each ``with`` below,
    # so the daemon threads finish their iteration and the instances close, not killed.
    interrupts_raise()
    quicken_backfills()
    stopping = threading.Event()
    code = serve_code(code_socket, stopping)
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
            stopping.set()  # the daemon threads and the code server now stop on purpose
            code.set()


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
        _stop_process()


def _stop_process() -> None:
    """SIGTERM, as ``candlewire down`` sends it, to the main thread: sent to the process from
    another thread, the kernel may hand it to a thread other than the main one, and Python
    then runs its handler only once the main thread's blocking call returns by itself."""
    signal.pthread_kill(threading.main_thread().ident or 0, signal.SIGTERM)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", required=True)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--workspace", required=True)
    parser.add_argument("--code-socket", required=True)
    args = parser.parse_args()
    try:
        serve(args.host, args.port, args.workspace, args.code_socket)
    except KeyboardInterrupt:
        log.info("stopped")  # SIGTERM or Ctrl-C: webserver and daemons shut down in order


if __name__ == "__main__":
    main()
