"""The shared testing module's process helpers: a spawned service runs this tree's code."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from candlewire import testing


def test_a_spawned_process_imports_the_tree_that_spawned_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A worktree's bench must measure the worktree's services, not the checkout the editable
    install points at: ``this_tree`` puts the spawning tree first on the path."""
    tree = tmp_path / "tree"
    (tree / "gateway").mkdir(parents=True)
    (tree / "gateway" / "__init__.py").write_text("WHICH = 'the spawning tree'\n")
    monkeypatch.setattr(testing, "REPO_ROOT", tree)
    monkeypatch.setenv("PYTHONPATH", "/elsewhere")
    env = os.environ | testing.this_tree()
    assert env["PYTHONPATH"].split(os.pathsep) == [str(tree), "/elsewhere"]
    out = subprocess.run(
        [sys.executable, "-c", "import gateway; print(gateway.WHICH)"],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        check=True,
    )
    assert out.stdout.strip() == "the spawning tree"


def test_spawn_starts_the_command_with_this_tree_first(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``spawn`` hands the command the path above, before the caller's own environment."""
    seen: dict[str, str] = {}

    class Started(Exception):
        pass

    def popen(argv: list[str], env: dict[str, str], **_kw: object) -> None:
        seen.update(env)
        raise Started

    monkeypatch.setattr(testing.subprocess, "Popen", popen)
    settings = testing.free_settings(tmp_path)
    with pytest.raises(Started):
        testing.spawn(settings, ["relay"], healthy="up", metrics_endpoint="relay_metrics")
    assert seen["PYTHONPATH"].split(os.pathsep)[0] == str(testing.REPO_ROOT)
