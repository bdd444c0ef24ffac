"""A private PostgreSQL instance: initdb into the state dir, its own port, pg_ctl.

PostgreSQL refuses to run as root, so as root the server runs as the ``postgres`` user that
Debian's package creates. The server listens on 127.0.0.1 and a socket in its data dir only.
Given a password (the stack's generated one, :mod:`candlewire.secrets`), the ``candlewire``
role logs in with it, by scram-sha-256, on both; a cluster an older release made with
``trust`` is moved to it on its next start. Without one it is ``trust`` (throwaway clusters).
"""

from __future__ import annotations

import contextlib
import glob
import hashlib
import os
import pwd
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

USER = "candlewire"
DATABASES = ("candlewire", "dagster")
# The catalog database's idle backends end after this: longer than the committing query's
# interval (30 s), whose catalog connection would otherwise end between every two commits,
# and short, since each run of that query (one a hurried commit) leaves one idle.
IDLE_SESSION = "1min"


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


def _method(line: str) -> str | None:
    """A pg_hba.conf rule's authentication method (its last word); None for comments."""
    words = line.split("#", 1)[0].split()
    return words[-1] if len(words) >= 4 else None


def _running(data: Path) -> int | None:
    """The pid of the server running on ``data``, if one is: a postmaster.pid left by a
    server killed (or by another pid namespace) may name a process that is not one, or
    another cluster's server. A postmaster works in its data directory."""
    try:
        pid = int((data / "postmaster.pid").read_text().split()[0])
        if Path(f"/proc/{pid}/cwd").resolve() != data.resolve():
            return None
    except (OSError, ValueError, IndexError):
        return None
    return pid


def _relocated(path: Path) -> bool:
    """Whether ``path`` is a cluster kept under :data:`RELOCATED` (a private state dir's)."""
    return path.parent.parent == RELOCATED


class LocalPostgres:
    """``listen``: the addresses it serves beyond 127.0.0.1 (another host's clients need
    one); their subnets must be allowed (:meth:`allow`), always with the password."""

    def __init__(
        self,
        data: Path,
        port: int,
        password: str | None = None,
        listen: tuple[str, ...] = (),
    ) -> None:
        self.path = data.absolute()  # the state dir's entry: a link once relocated
        self.data = data.resolve()
        self.port = port
        self.password = password
        self.listen = ("127.0.0.1", *listen)
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
        argv = [str(self.bin / "initdb"), "-D", str(self.data), "-U", USER, "-E", "UTF8"]
        if self.password is None:
            self._run([*argv, "--auth=trust"])
            return
        # initdb reads the password from a file the server's user can read; gone right after.
        with tempfile.NamedTemporaryFile("w", prefix="pw-", dir=self.data.parent) as pw:
            pw.write(self.password + "\n")
            pw.flush()
            if os.geteuid() == 0:
                shutil.chown(pw.name, "postgres")
            self._run([*argv, "--auth=scram-sha-256", f"--pwfile={pw.name}"])

    def _relocate(self) -> None:
        """The state dir is private (e.g. under /root): the postgres user cannot enter it.

        Keep the cluster under /var/lib/candlewire/<id of the state dir> instead, with a
        link from the state dir, so `up` works wherever the project was cloned. A cluster
        already there belonged to a state dir at this path that was deleted (its link went
        with it): initdb refuses a directory that is not empty, so it is moved aside, kept.
        """
        home = RELOCATED / hashlib.sha256(str(self.data).encode()).hexdigest()[:16]
        home.mkdir(parents=True, exist_ok=True)
        for d in (RELOCATED, home):
            d.chmod(0o755)
        target = home / "postgres"
        if target.exists() and any(target.iterdir()):
            self._set_aside(target)
        self.data.parent.mkdir(parents=True, exist_ok=True)
        self.data.symlink_to(target)
        self.data = target

    def _set_aside(self, orphan: Path) -> None:
        if (pid := _running(orphan)) is not None:
            raise PostgresSetupError(
                f"{orphan} holds the cluster of a deleted state dir at {self.data}, and it "
                f"still runs (pid {pid}): stop it (pg_ctl -D {orphan} stop, as postgres) "
                "and start again"
            )
        stamp = time.strftime("%Y%m%dT%H%M%S")
        aside = Path(tempfile.mkdtemp(prefix=f"postgres.orphaned-{stamp}-", dir=orphan.parent))
        orphan.rename(aside)  # onto the empty directory: a unique name, atomically
        print(
            f"postgres: {orphan} held the cluster of a deleted state dir at {self.data}; "
            f"kept as {aside} (delete it if you do not need it)",
            file=sys.stderr,
        )

    def remove(self) -> None:
        """Stop the cluster and delete it, with the directory it was relocated to: a
        relocated cluster outlives its state dir otherwise (``make clean``, tests). A link
        to anywhere else (the user's own) is taken away, and what it points to kept."""
        self.stop()
        target = self.path.resolve()  # relocated since this object was made, perhaps
        if not self.path.is_symlink() or _relocated(target):
            shutil.rmtree(target, ignore_errors=True)
        if self.path.is_symlink():
            self.path.unlink()
        if _relocated(target):
            (target.parent / "postgres.log").unlink(missing_ok=True)
            with contextlib.suppress(OSError):  # a cluster set aside there stays
                target.parent.rmdir()

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
        addresses = ",".join(self.listen)
        # The catalog and Dagster's storage are small: 32 MB of shared buffers hold them, and
        # every backend's RSS counts the buffers it touched (the default 128 MB, #36). Nothing
        # replicates logically: no launcher process for it (8 MiB RSS).
        opts = (
            f"-p {self.port} -c listen_addresses={addresses} -k {self.data}"
            " -c max_connections=200 -c shared_buffers=32MB"
            " -c max_logical_replication_workers=0"
        )
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
        self._require_password()
        for db in DATABASES:
            self.create_database(db)
        # Spark starts each run of the committing query (one a hurried commit) on a clone of
        # its session, and each clone's Iceberg catalog opens a connection of its own that
        # stays until the JVM collects the clone: a dozen idle backends, about 20 MiB RSS
        # each (#36). Idle ones end here; the catalogs retry on a new connection
        # (candlewire.lake.RETRYABLE_SQLSTATES). Dagster's database keeps its LISTEN connection.
        self.psql(f"ALTER DATABASE \"{DATABASES[0]}\" SET idle_session_timeout = '{IDLE_SESSION}'")

    def _require_password(self) -> None:
        """A cluster made with ``trust`` (an older release): set the password, then ask
        for it from every connection."""
        hba = self.data / "pg_hba.conf"
        lines = hba.read_text().splitlines()
        trusting = [i for i, line in enumerate(lines) if _method(line) == "trust"]
        if self.password is None or not trusting:
            return
        self.psql(f"ALTER ROLE {USER} PASSWORD '{self.password}'", "postgres", password=False)
        for i in trusting:
            lines[i] = lines[i].rstrip().removesuffix("trust") + "scram-sha-256"
        hba.write_text("\n".join(lines) + "\n")
        self._run([str(self.bin / "pg_ctl"), "-D", str(self.data), "reload"])

    def allow(self, cidr: str) -> None:
        """Let clients from ``cidr`` log in, with the password (before :meth:`start`)."""
        if self.password is None:
            raise PostgresSetupError("only a cluster with a password is opened to other hosts")
        hba = self.data / "pg_hba.conf"
        rule = f"host all all {cidr} scram-sha-256"
        lines = hba.read_text().splitlines()
        if rule not in lines:
            hba.write_text("\n".join([*lines, rule]) + "\n")

    def create_database(self, name: str) -> None:
        exists = self.psql(f"SELECT 1 FROM pg_database WHERE datname = '{name}'", "postgres")
        if exists.strip() != "1":
            self.psql(f'CREATE DATABASE "{name}"', "postgres")

    def psql(self, sql: str, db: str = "candlewire", password: bool = True) -> str:
        argv = [str(self.bin / "psql"), "-h", "127.0.0.1", "-p", str(self.port), "-U", USER]
        env = {k: v for k, v in os.environ.items() if k != "PGPASSWORD"}
        if password and self.password is not None:
            env["PGPASSWORD"] = self.password  # never on the command line (ps shows it)
        out = subprocess.run(
            [*argv, "-w", "-d", db, "-tAc", sql], capture_output=True, text=True, env=env
        )
        if out.returncode != 0:
            raise PostgresSetupError(f"psql: {out.stderr.strip()}")
        return out.stdout

    def stop(self) -> None:
        if self.pid() is None:
            return
        self._run([str(self.bin / "pg_ctl"), "-D", str(self.data), "-m", "fast", "-w", "stop"])

    def pid(self) -> int | None:
        return _running(self.data)

    def url(self, db: str = "candlewire") -> str:
        auth = USER if self.password is None else f"{USER}:{self.password}"
        return f"postgresql://{auth}@127.0.0.1:{self.port}/{db}"


if __name__ == "__main__":
    # `make clean`: a cluster relocated out of the state dir goes with it (the rest of the
    # state dir is the Makefile's `rm -rf`).
    for arg in map(Path, sys.argv[1:]):
        if arg.is_symlink() and _relocated(arg.resolve()):
            try:
                LocalPostgres(arg, 0).remove()
            except PostgresSetupError as e:
                print(f"postgres: {e}", file=sys.stderr)
