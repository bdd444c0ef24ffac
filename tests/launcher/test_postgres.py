"""The private PostgreSQL works even when the state dir is private to root (e.g. /root)."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import pytest

from launcher.local.postgres import LocalPostgres
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
        LocalPostgres(data, port).stop()
        shutil.rmtree(data.resolve().parent, ignore_errors=True)
        shutil.rmtree(private, ignore_errors=True)
