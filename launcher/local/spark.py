"""A Spark standalone cluster from pyspark's own jars: one master and N workers
(``spark-class org.apache.spark.deploy.master.Master`` / ``...worker.Worker``), what
``[spark] workers`` asks ``candlewire up`` to run instead of ``local[*]``."""

from __future__ import annotations

import json
import os
import sys
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import pyspark

SPARK_HOME = Path(pyspark.__file__).parent


def master_workers(status_url: str) -> list[dict]:
    """The workers a master lists (each with its ``state``); OSError or ValueError when it
    does not answer yet."""
    with urllib.request.urlopen(status_url, timeout=2) as r:
        return json.loads(r.read()).get("workers", [])


def count_alive(workers: list[dict]) -> int:
    return sum(w["state"] == "ALIVE" for w in workers)


@dataclass(frozen=True)
class StandaloneCluster:
    """``host``: the address of the process at hand (master or worker); the master's is
    ``master_host``, by default the same (all on one host)."""

    host: str
    port: int
    ui_port: int
    work_dir: Path
    worker_cores: int = 1
    worker_memory: str = "1g"
    master_host: str | None = None
    java_options: str = ""  # the master's and workers' JVM options
    # Put first on their class path, as on the driver's and executors' (``spark_conf``'s
    # extraClassPath): a JVM maps the driver's class archive only under the class path it
    # was dumped with.
    class_path: str = ""

    @property
    def master_url(self) -> str:
        return f"spark://{self.master_host or self.host}:{self.port}"

    @property
    def status_url(self) -> str:
        """The master's status as JSON (its UI's ``/json/``)."""
        return f"http://{self.master_host or self.host}:{self.ui_port}/json/"

    def env(self) -> dict[str, str]:
        """Executors run this interpreter (with candlewire), on the master's own address."""
        return {
            "SPARK_HOME": str(SPARK_HOME),
            "SPARK_LOCAL_IP": self.host,
            "PYSPARK_PYTHON": sys.executable,
            "SPARK_NO_DAEMONIZE": "1",
            "SPARK_DAEMON_JAVA_OPTS": self.java_options,
            "SPARK_DAEMON_CLASSPATH": self.class_path,
            "PATH": os.environ.get("PATH", ""),
        }

    def master_argv(self) -> list[str]:
        return [
            str(SPARK_HOME / "bin" / "spark-class"),
            "org.apache.spark.deploy.master.Master",
            "--host",
            self.host,
            "--port",
            str(self.port),
            "--webui-port",
            str(self.ui_port),
        ]

    def worker_argv(self, n: int) -> list[str]:
        work = self.work_dir / f"worker-{n}"
        work.mkdir(parents=True, exist_ok=True)
        return [
            str(SPARK_HOME / "bin" / "spark-class"),
            "org.apache.spark.deploy.worker.Worker",
            "--host",
            self.host,
            "--cores",
            str(self.worker_cores),
            "--memory",
            self.worker_memory,
            "--work-dir",
            str(work),
            "--webui-port",
            "0",
            self.master_url,
        ]
