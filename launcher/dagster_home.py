"""Dagster's instance for the local stack: DAGSTER_HOME inside the state dir, storage in the
platform's PostgreSQL, telemetry off, and the processes ``make up`` runs."""

from __future__ import annotations

import hashlib
import json
import socket
import sys
import tempfile
import urllib.request
from pathlib import Path

from candlewire.config import Settings

SOCKET_PATH_MAX = 100  # sun_path holds 108 bytes on Linux, with its NUL
MAX_CONCURRENT_RUNS = 2  # two cores: more runs only queue inside Spark and the relay
DEQUEUE_INTERVAL_S = 2  # a queued run starts within this (Dagster's default: 5 s)
AUTOMATION_INTERVAL_S = 30


def sqlalchemy_url(settings: Settings) -> str:
    """dagster-postgres goes through SQLAlchemy; name the driver we install (psycopg2)."""
    url = settings.dagster_storage()
    return url.replace("postgresql://", "postgresql+psycopg2://", 1)


def dagster_home(settings: Settings) -> Path:
    home = (settings.state_dir / "dagster").resolve()
    home.mkdir(parents=True, exist_ok=True)
    instance = home / "dagster.yaml"  # it holds the storage URL's password: owner only
    instance.touch(mode=0o600)
    instance.chmod(0o600)
    instance.write_text(
        json.dumps(  # JSON is YAML; no templating of quotes
            {
                "telemetry": {"enabled": False},
                "storage": {"postgres": {"postgres_url": sqlalchemy_url(settings)}},
                "run_coordinator": {
                    "module": "dagster.core.run_coordinator",
                    "class": "QueuedRunCoordinator",
                    "config": {
                        "max_concurrent_runs": MAX_CONCURRENT_RUNS,
                        "dequeue_interval_seconds": DEQUEUE_INTERVAL_S,
                    },
                },
                # Dagster's default, which launcher.dagster_serve's shorter backfill interval
                # would otherwise become too (the two share one constant).
                "auto_materialize": {"minimum_interval_seconds": AUTOMATION_INTERVAL_S},
            },
            indent=2,
        )
    )
    return home


def env(settings: Settings) -> dict[str, str]:
    """What Dagster's processes need: the platform settings and their own home."""
    return {
        **settings.to_env(),
        "DAGSTER_HOME": str(dagster_home(settings)),
        "DAGSTER_DISABLE_TELEMETRY": "1",
    }


LOCATION = "candlewire"  # the code location's name, as workspace.yaml gives it


def code_socket(settings: Settings) -> Path:
    """Where the code server listens: a Unix socket in the state dir, so no port to declare;
    in the temp dir, named after the state dir, when that path is too long for a socket."""
    path = (settings.state_dir / "run" / "dagster-code.sock").resolve()
    if len(str(path)) <= SOCKET_PATH_MAX:
        return path
    digest = hashlib.sha256(str(path).encode()).hexdigest()[:16]
    return Path(tempfile.gettempdir()) / f"candlewire-dagster-{digest}.sock"


DEFINITIONS = "orchestration.definitions"  # workspace.yaml's module


def served_workspace(settings: Settings) -> Path:
    """``workspace.yaml``'s code location, served by the code server on :func:`code_socket`:
    what the stack's webserver and daemon load. ``workspace.yaml`` itself stays for
    ``dagster dev``."""
    path = dagster_home(settings) / "workspace.yaml"
    server = {"socket": str(code_socket(settings)), "location_name": LOCATION}
    path.write_text(json.dumps({"load_from": [{"grpc_server": server}]}, indent=2))
    return path


def code_server_health(settings: Settings) -> str | None:
    """The code server accepts connections on its socket once the definitions loaded."""
    return socket_problem(code_socket(settings))


def socket_problem(path: Path | str) -> str | None:
    """Why a connection to the code server's socket at ``path`` fails (None: it accepts)."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        try:
            s.connect(str(path))
        except OSError as exc:
            return f"dagster code server on {path}: {exc}"
    return None


def dagster_argv(settings: Settings) -> list[str]:
    """The code server, the webserver and the daemon, one process
    (:mod:`launcher.dagster_serve`)."""
    return [
        sys.executable,
        "-m",
        "launcher.dagster_serve",
        "--host",
        settings.bind_host,
        "--port",
        str(settings.port("dagster")),
        "--workspace",
        str(served_workspace(settings)),
        "--code-socket",
        str(code_socket(settings)),
    ]


def graphql(settings: Settings, query: str, variables: dict | None = None) -> dict:
    """One request to the webserver's GraphQL endpoint, as the UI makes it."""
    body = json.dumps({"query": query, "variables": variables or {}}).encode()
    req = urllib.request.Request(
        f"http://{settings.host}:{settings.port('dagster')}/graphql",
        data=body,
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(req, timeout=30) as resp:
        out = json.loads(resp.read())
    if out.get("errors"):
        raise RuntimeError(f"GraphQL errors: {out['errors']}")
    return out["data"]


# The GraphQL documents the UI sends to add a ticker partition, launch a partition backfill
# and follow it; the tests and bench.backfill drive Dagster through them as a user would.
REPO = {"repositoryLocationName": LOCATION, "repositoryName": "__repository__"}
ADD_PARTITION = """
mutation($repo: RepositorySelector!, $name: String!, $key: String!) {
  addDynamicPartition(repositorySelector: $repo, partitionsDefName: $name, partitionKey: $key) {
    __typename ... on PythonError { message }
  }
}"""
LAUNCH = """
mutation($params: LaunchBackfillParams!) {
  launchPartitionBackfill(backfillParams: $params) {
    __typename
    ... on LaunchBackfillSuccess { backfillId }
    ... on PythonError { message }
  }
}"""
STATUS = """
query($id: String!) {
  partitionBackfillOrError(backfillId: $id) {
    ... on PartitionBackfill { status numPartitions runs(limit: 10) { runId status } }
    ... on PythonError { message }
  }
}"""

DAEMON_HEALTH = (
    "{ instance { daemonHealth { allDaemonStatuses { daemonType required healthy } } } }"
)


def webserver_health(settings: Settings) -> str | None:
    try:
        graphql(settings, "{ version }")
    except (OSError, RuntimeError, ValueError) as exc:
        return f"dagster webserver: {exc}"
    return None


def daemon_health(settings: Settings) -> str | None:
    """The code server's socket, then the daemons' heartbeats, asked through the webserver
    (which answers first)."""
    if (problem := code_server_health(settings) or webserver_health(settings)) is not None:
        return problem
    try:
        statuses = graphql(settings, DAEMON_HEALTH)["instance"]["daemonHealth"]
    except (OSError, RuntimeError, ValueError, KeyError) as exc:
        return f"dagster daemon (asked through the webserver): {exc}"
    sick = [
        s["daemonType"] for s in statuses["allDaemonStatuses"] if s["required"] and not s["healthy"]
    ]
    return f"daemons not healthy yet: {', '.join(sick)}" if sick else None
