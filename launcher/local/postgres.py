"""A private PostgreSQL instance: initdb into the state dir, its own port, pg_ctl.

PostgreSQL refuses to run as root, so as root the server runs as the ``postgres`` user that
Debian's package creates. Authentication is ``trust`` for the ``candlewire`` role, and the
server listens on 127.0.0.1 and a socket in its data dir only.
"""

from __future__ import annotations

import glob
import hashlib
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


RELOCATED = Path("/var/lib/candlewire")


def reachable(path: Path) -> bool:
    """Whether another user (postgres) can traverse every directory down to ``path``."""
    path = path.absolute()
    return all(p.stat().st_mode & 0o001 for p in (path, *path.parents) if p.exists())


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
        out = subprocess.run(self._as_owner(argv), capture_output=True, text=True, cwd="/")
        if out.returncode != 0:
            raise PostgresSetupError(f"{' '.join(argv[:2])} failed: {out.stdout}{out.stderr}")
        return out.stdout

    def init_once(self) -> None:
        if (self.data / "PG_VERSION").exists():
            return
        if os.geteuid() == 0 and not reachable(self.data.parent):
            self._relocate()
        self.data.mkdir(parents=True, exist_ok=True)
        if os.geteuid() == 0:
            shutil.chown(self.data, "postgres", "postgres")
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

    def _relocate(self) -> None:
        """The state dir is private (e.g. under /root): the postgres user cannot enter it.

        Keep the cluster under /var/lib/candlewire/<id of the state dir> instead, with a
        link from the state dir, so `up` works wherever the project was cloned.
        """
        home = RELOCATED / hashlib.sha256(str(self.data).encode()).hexdigest()[:16]
        home.mkdir(parents=True, exist_ok=True)
        for d in (RELOCATED, home):
            d.chmod(0o755)
        self.data.parent.mkdir(parents=True, exist_ok=True)
        self.data.symlink_to(home / "postgres")
        self.data = home / "postgres"

    def start(self, log: Path) -> None:
        log = log.absolute()  # pg_ctl runs as another user, from another directory
        log.parent.mkdir(parents=True, exist_ok=True)
        if os.geteuid() == 0 and not reachable(log.parent):
            # pg_ctl opens the log as the postgres user: keep it beside the data, linked.
            beside = self.data.parent / "postgres.log"
            if not log.is_symlink():
                log.unlink(missing_ok=True)
                log.symlink_to(beside)
            log = beside
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
