"""A private PostgreSQL instance: initdb into the state dir, its own port, pg_ctl.

PostgreSQL refuses to run as root, so as root the server runs as the ``postgres`` user that
Debian's package creates. Authentication is ``trust`` for the ``candlewire`` role, and the
server listens on 127.0.0.1 and a socket in its data dir only.
"""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import subprocess
from pathlib import Path

USER = "candlewire"
DATABASES = ("candlewire", "dagster")


class PostgresSetupError(RuntimeError):
    pass


def bindir() -> Path:
    """Debian keeps the server binaries out of PATH, in /usr/lib/postgresql/<major>/bin."""
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"), reverse=True)
    if found:
        return Path(found[0]).parent
    if (initdb := shutil.which("initdb")) is not None:
        return Path(initdb).resolve().parent
    raise PostgresSetupError(
        "PostgreSQL server not installed: run `make install` (apt-get install postgresql)"
    )


class LocalPostgres:
    def __init__(self, data: Path, port: int) -> None:
        self.data = data.resolve()
        self.port = port
        self.bin = bindir()

    def _as_owner(self, argv: list[str]) -> list[str]:
        if os.geteuid() != 0:
            return argv
        try:
            pwd.getpwnam("postgres")
        except KeyError:
            raise PostgresSetupError(
                "running as root needs the `postgres` user: apt-get install postgresql"
            ) from None
        return ["runuser", "-u", "postgres", "--", *argv]

    def _run(self, argv: list[str]) -> str:
        out = subprocess.run(self._as_owner(argv), capture_output=True, text=True)
        if out.returncode != 0:
            raise PostgresSetupError(f"{' '.join(argv[:2])} failed: {out.stdout}{out.stderr}")
        return out.stdout

    def init_once(self) -> None:
        if (self.data / "PG_VERSION").exists():
            return
        self.data.mkdir(parents=True, exist_ok=True)
        if os.geteuid() == 0:
            shutil.chown(self.data, "postgres", "postgres")
            self._check_traversable()
        self.data.chmod(0o700)
        self._run(
            [
                str(self.bin / "initdb"),
                "-D",
                str(self.data),
                "-U",
                USER,
                "--auth=trust",
                "-E",
                "UTF8",
            ]
        )

    def _check_traversable(self) -> None:
        for parent in self.data.parents:
            if not parent.stat().st_mode & 0o001:
                raise PostgresSetupError(
                    f"the postgres user cannot reach {self.data}: {parent} is not world-"
                    f"searchable (chmod o+x {parent}, or set CANDLEWIRE_STATE_DIR elsewhere)"
                )

    def start(self, log: Path) -> None:
        log.parent.mkdir(parents=True, exist_ok=True)
        log.touch()
        if os.geteuid() == 0:
            shutil.chown(log, "postgres")
        opts = f"-p {self.port} -c listen_addresses=127.0.0.1 -k {self.data} -c max_connections=200"
        self._run(
            [
                str(self.bin / "pg_ctl"),
                "-D",
                str(self.data),
                "-l",
                str(log),
                "-o",
                opts,
                "-w",
                "-t",
                "60",
                "start",
            ]
        )
        for db in DATABASES:
            self.create_database(db)

    def create_database(self, name: str) -> None:
        exists = self.psql(f"SELECT 1 FROM pg_database WHERE datname = '{name}'", "postgres")
        if exists.strip() != "1":
            self.psql(f'CREATE DATABASE "{name}"', "postgres")

    def psql(self, sql: str, db: str = "candlewire") -> str:
        argv = [str(self.bin / "psql"), "-h", "127.0.0.1", "-p", str(self.port), "-U", USER]
        out = subprocess.run([*argv, "-d", db, "-tAc", sql], capture_output=True, text=True)
        if out.returncode != 0:
            raise PostgresSetupError(f"psql: {out.stderr.strip()}")
        return out.stdout

    def stop(self) -> None:
        if self.pid() is None:
            return
        self._run([str(self.bin / "pg_ctl"), "-D", str(self.data), "-m", "fast", "-w", "stop"])

    def pid(self) -> int | None:
        try:
            pid = int((self.data / "postmaster.pid").read_text().split()[0])
            os.kill(pid, 0)
        except (OSError, ValueError, IndexError):
            return None
        return pid

    def url(self, db: str = "candlewire") -> str:
        return f"postgresql://{USER}@127.0.0.1:{self.port}/{db}"
