"""The private PostgreSQL works even when the state dir is private to root (e.g. /root)."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

from launcher.local.postgres import RELOCATED, LocalPostgres, PostgresSetupError
from tests.support import free_port

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0, reason="only root must hand the cluster to the postgres user"
)


def test_private_state_dir_relocates_and_keeps_data(monkeypatch) -> None:
    private = Path(tempfile.mkdtemp())  # 0700: the postgres user cannot enter it
    assert private.stat().st_mode & 0o777 == 0o700
    clone = private / "clone"  # a readable clone inside a private directory
    clone.mkdir(mode=0o755)
    monkeypatch.chdir(clone)  # the stack passes paths relative to the clone, as here
    data, log, port = Path("state/postgres"), Path("state/logs/postgres.log"), free_port()
    pg = LocalPostgres(data, port)
    try:
        pg.init_once()
        pg.start(log)
        home = data.resolve().parent
        pg.psql("CREATE TABLE kept (v int); INSERT INTO kept VALUES (42)")
        pg.stop()
        assert data.is_symlink() and log.is_symlink()
        again = LocalPostgres(data, port)  # a later `up`
        assert again.pid() is None
        again.init_once()
        again.start(log)
        assert again.psql("SELECT v FROM kept").strip() == "42"
        assert "database system is ready" in log.read_text()
    finally:
        LocalPostgres(data, port).remove()
        shutil.rmtree(private, ignore_errors=True)
    assert not home.exists()  # nothing left under /var/lib/candlewire


def test_a_deleted_state_dir_s_relocated_cluster_is_set_aside_not_in_the_way(capfd) -> None:
    """The state dir went (rm -rf, or `make clean` of an older release) but its relocated
    cluster stayed: the next `up` at the same path makes a new one and keeps the old one.
    initdb refused the non-empty directory before, and CI, whose tmp paths repeat, failed."""
    private = Path(tempfile.mkdtemp())
    data, port = private / "state" / "postgres", free_port()
    old = new = LocalPostgres(data, port)
    home = RELOCATED / "none yet"
    try:
        old.init_once()
        old.start(private / "state" / "postgres.log")
        home = data.resolve().parent
        assert home.parent == RELOCATED
        shutil.rmtree(private / "state")  # the link, not the cluster behind it
        new = LocalPostgres(data, port)
        with pytest.raises(PostgresSetupError, match="still runs"):
            new.init_once()  # moving a running cluster's directory would pull it from under it
        old.stop()
        # A pid file left by a server killed, or written in another pid namespace, may name
        # a live process that is no server: that is no reason to refuse.
        (home / "postgres" / "postmaster.pid").write_text(f"{os.getpid()}\n")
        new = LocalPostgres(data, port)
        new.init_once()
        new.start(private / "state" / "postgres.log")
        assert new.psql("SELECT 1").strip() == "1"
        aside = [p for p in home.iterdir() if p.name.startswith("postgres.orphaned-")]
        assert len(aside) == 1 and (aside[0] / "PG_VERSION").exists()
        assert str(aside[0]) in capfd.readouterr().err
    finally:  # each step whatever the one before did: nothing left in /var/lib/candlewire
        with contextlib.suppress(PostgresSetupError):
            new.remove()
        with contextlib.suppress(PostgresSetupError):
            old.stop()
        shutil.rmtree(home, ignore_errors=True)
        shutil.rmtree(private, ignore_errors=True)


def connects(url: str) -> bool:
    import psycopg2

    try:
        psycopg2.connect(url, connect_timeout=5).close()
    except psycopg2.OperationalError:
        return False
    return True


def test_the_stack_s_cluster_asks_for_its_generated_password(tmp_path) -> None:
    from candlewire.config import POSTGRES_PASSWORD
    from candlewire.secrets import ensure_secret
    from candlewire.testing import free_settings

    tmp_path.chmod(0o755)
    settings = free_settings(tmp_path)
    password = ensure_secret(settings, POSTGRES_PASSWORD)
    secret = settings.state_dir / "secrets" / POSTGRES_PASSWORD
    assert secret.stat().st_mode & 0o777 == 0o600
    assert ensure_secret(settings, POSTGRES_PASSWORD) == password  # made once
    port = settings.port("postgres")
    pg = LocalPostgres(settings.state_dir / "postgres", port, password)
    try:
        pg.init_once()
        pg.start(tmp_path / "postgres.log")
        base = f"postgresql://candlewire@127.0.0.1:{port}/candlewire"
        assert not connects(base)  # no password
        assert not connects(base.replace("candlewire@", "candlewire:wrong@"))
        assert connects(settings.catalog_db())  # the URL every component builds
        assert password in settings.catalog_db() and password in settings.dagster_storage()
        hba = (settings.state_dir / "postgres" / "pg_hba.conf").read_text()
        rules = [line for line in hba.splitlines() if line.strip() and not line.startswith("#")]
        assert rules and all(line.split()[-1] == "scram-sha-256" for line in rules)
        assert password not in (tmp_path / "postgres.log").read_text()
    finally:
        pg.remove()


def test_a_trusting_cluster_of_an_older_release_is_moved_to_the_password(tmp_path) -> None:
    tmp_path.chmod(0o755)
    data, port = tmp_path / "postgres", free_port()
    old = LocalPostgres(data, port)  # as an older release made it: trust
    old.init_once()
    old.start(tmp_path / "postgres.log")
    url = f"postgresql://candlewire@127.0.0.1:{port}/candlewire"
    try:
        assert connects(url)
        old.stop()
        new = LocalPostgres(data, port, "s3cr3t")
        new.init_once()
        new.start(tmp_path / "postgres.log")
        assert not connects(url)
        assert connects(url.replace("candlewire@", "candlewire:s3cr3t@"))
        assert new.psql("SELECT 1").strip() == "1"
    finally:
        LocalPostgres(data, port).remove()


def test_the_catalog_s_idle_sessions_end_and_nothing_replicates(tmp_path) -> None:
    """Idle backends of the catalog's database end (each held ~20 MiB RSS), Dagster's
    database keeps its sessions, and no logical replication launcher runs (#36)."""
    from launcher.local.postgres import IDLE_SESSION

    tmp_path.chmod(0o755)
    port = free_port()
    pg = LocalPostgres(tmp_path / "postgres", port)
    try:
        pg.init_once()
        pg.start(tmp_path / "postgres.log")
        assert pg.psql("SHOW idle_session_timeout").strip() == IDLE_SESSION
        assert pg.psql("SHOW idle_session_timeout", "dagster").strip() == "0"
        children = subprocess.run(
            ["pgrep", "-a", "-P", str(pg.pid())], capture_output=True, text=True
        ).stdout
        assert "checkpointer" in children and "logical replication" not in children
    finally:
        pg.remove()


def test_removing_a_cluster_behind_a_link_of_the_user_s_keeps_what_it_points_to(tmp_path) -> None:
    """``remove()`` (``make clean``) deletes a cluster it relocated; a link the user made
    to elsewhere is taken away, and the directory it points to kept, as ``rm -rf`` did."""
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "PG_VERSION").write_text("15\n")
    link = tmp_path / "state" / "postgres"
    link.parent.mkdir()
    link.symlink_to(elsewhere)
    LocalPostgres(link, free_port()).remove()
    assert not link.is_symlink() and (elsewhere / "PG_VERSION").exists()
