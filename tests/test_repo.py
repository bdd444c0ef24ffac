"""Repository rules: lint and the README's promises (the docs' are in test_docs.py)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def ruff(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "ruff", *args], cwd=REPO, capture_output=True, text=True
    )


def test_ruff_check() -> None:
    out = ruff("check", ".")
    assert out.returncode == 0, out.stdout + out.stderr


def test_ruff_format() -> None:
    out = ruff("format", "--check", ".")
    assert out.returncode == 0, out.stdout + out.stderr


def test_quick_start_is_two_commands() -> None:
    readme = (REPO / "README.md").read_text()
    quick = readme.split("## Quick start", 1)[1].split("##", 1)[0]
    block = quick.split("```", 2)[1].strip().splitlines()
    assert block[1:] == ["make up", "make test"], block


def test_ci_runs_make_test() -> None:
    assert "make test" in (REPO / ".ci" / "run").read_text()
