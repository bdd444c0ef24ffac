"""Dagster's instance for the local stack: DAGSTER_HOME inside the state dir, storage in the
platform's PostgreSQL, telemetry off, and the processes ``make up`` runs."""

from __future__ import annotations

import json
import sys
import urllib.request
from pathlib import Path

from candlewire.config import REPO_ROOT, Settings

WORKSPACE = REPO_ROOT / "workspace.yaml"
MAX_CONCURRENT_RUNS = 2  # two cores: more runs only queue inside Spark and the relay


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
                    "config": {"max_concurrent_runs": MAX_CONCURRENT_RUNS},
                },
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


def webserver_argv(settings: Settings) -> list[str]:
    return [
        str(Path(sys.executable).with_name("dagster-webserver")),
        "-h",
        settings.bind_host,
        "-p",
        str(settings.port("dagster")),
        "-w",
        str(WORKSPACE),
    ]


def daemon_argv(settings: Settings) -> list[str]:
    return [str(Path(sys.executable).with_name("dagster-daemon")), "run", "-w", str(WORKSPACE)]


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
REPO = {"repositoryLocationName": "candlewire", "repositoryName": "__repository__"}
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
    try:
        statuses = graphql(settings, DAEMON_HEALTH)["instance"]["daemonHealth"]
    except (OSError, RuntimeError, ValueError, KeyError) as exc:
        return f"dagster daemon (asked through the webserver): {exc}"
    sick = [
        s["daemonType"] for s in statuses["allDaemonStatuses"] if s["required"] and not s["healthy"]
    ]
    return f"daemons not healthy yet: {', '.join(sick)}" if sick else None
