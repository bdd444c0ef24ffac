"""The layers, read from every import in the source (including imports inside functions).

``proto`` is the wire contract and imports nothing of ours; ``candlewire`` is the lower
layer every part shares and imports no service; a service imports no other service; the
launcher sits above them all; benchmarks reuse ``candlewire.testing``, never the tests.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SERVICES = ("relay", "ingest", "streaming", "journal", "gateway", "orchestration")
OURS = ("proto", "candlewire", "launcher", "bench", "tests", *SERVICES)
# What each package may import of ours, besides itself.
ALLOWED: dict[str, set[str]] = {
    "proto": set(),
    "candlewire": {"proto"},
    **{service: {"proto", "candlewire"} for service in SERVICES},
    "launcher": {"proto", "candlewire", *SERVICES},
    "bench": {"proto", "candlewire", "launcher", *SERVICES},
}


def imported_packages(path: Path) -> set[str]:
    """Top-level packages of ours that a file imports, anywhere in it."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module]
        else:
            continue
        found.update(n.split(".")[0] for n in names if n.split(".")[0] in OURS)
    return found


def violations(package: str) -> list[str]:
    out = []
    for path in sorted((ROOT / package).rglob("*.py")):
        bad = imported_packages(path) - ALLOWED[package] - {package}
        out += [f"{path.relative_to(ROOT)} imports {p}" for p in sorted(bad)]
    return out


@pytest.mark.parametrize("package", sorted(ALLOWED))
def test_each_package_imports_only_the_layers_below_it(package: str) -> None:
    assert (ROOT / package).is_dir()
    assert violations(package) == []


def test_the_check_sees_imports_inside_functions(tmp_path: Path) -> None:
    """A lazy import inside a function is still a dependency: the check must catch it."""
    source = tmp_path / "lazy.py"
    source.write_text("def run():\n    from relay import Relay\n    import gateway.config\n")
    assert imported_packages(source) == {"relay", "gateway"}
