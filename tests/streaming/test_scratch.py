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
