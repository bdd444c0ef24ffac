"""The live path's throwaway directories: one left by a job that died without exiting is
removed by the next job's start, one of a job still running is not."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from streaming.queries.live import SCRATCH, scratch_dir


def test_a_dead_jobs_scratch_is_removed_and_a_living_ones_kept(tmp_path: Path) -> None:
    dead = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"],
        check=True,
        capture_output=True,
        text=True,
    )
    left = tmp_path / f"{SCRATCH}checkpoint-{int(dead.stdout)}-abc"
    (left / "offsets").mkdir(parents=True)
    (left / "offsets" / "0").write_text("v1")
    living = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        kept = tmp_path / f"{SCRATCH}checkpoint-{living.pid}-def"
        kept.mkdir()
        other = tmp_path / f"{SCRATCH}state-{int(dead.stdout)}-ghi"  # another kind's
        other.mkdir()
        ours = Path(scratch_dir("checkpoint", str(tmp_path)))
        assert ours.name.startswith(f"{SCRATCH}checkpoint-{os.getpid()}-") and ours.is_dir()
        assert not left.exists() and kept.exists() and other.exists()
        scratch_dir("state", str(tmp_path))
        assert not other.exists() and ours.exists()
    finally:
        living.kill()
        living.wait()


def test_another_users_jobs_scratch_is_kept(tmp_path: Path, monkeypatch) -> None:
    """A pid we may not signal is a running process of another user: its job's scratch stays.
    (As root every signal is allowed, so the kernel's refusal is played by ``os.kill``.)"""
    theirs = tmp_path / f"{SCRATCH}checkpoint-{2**22 + 7}-abc"
    theirs.mkdir()
    real_kill = os.kill

    def kill(pid: int, sig: int) -> None:
        if pid == 2**22 + 7:
            raise PermissionError(1, "Operation not permitted")
        real_kill(pid, sig)

    monkeypatch.setattr(os, "kill", kill)
    scratch_dir("checkpoint", str(tmp_path))
    assert theirs.exists()
