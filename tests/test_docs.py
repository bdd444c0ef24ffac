"""The documentation site builds clean, and its reference pages keep up with the code.

``mkdocs build --strict`` fails on a broken link or anchor, a page left out of the nav, and
(through ``docs/hooks/docstrings.py``) a public member of the API reference without a
docstring. The pages that restate the code (ports, metrics, CLI) are checked against it here.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
from pathlib import Path

from prometheus_client.metrics import MetricWrapperBase

from candlewire.endpoints import markdown_table
from launcher.cli import FIRST_STEPS, build_parser

REPO = Path(__file__).resolve().parents[1]
DOCS = REPO / "docs"
README_MAX_LINES = 250


def test_docs_build_strict(tmp_path: Path) -> None:
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    out = subprocess.run(
        [
            *(sys.executable, "-m", "mkdocs", "build", "--strict", "--quiet"),
            *("--config-file", str(REPO / "mkdocs.yml"), "--site-dir", str(tmp_path / "site")),
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert (tmp_path / "site" / "reference" / "api" / "client" / "index.html").exists()


def test_ports_page_matches_code() -> None:
    assert markdown_table() in (DOCS / "reference" / "ports.md").read_text(), (
        "docs/reference/ports.md's endpoint table is stale: paste `candlewire endpoints`"
    )


def defined_metrics() -> set[str]:
    """Every metric the services define, as exported (counters with ``_total``)."""
    from gateway.metrics import GatewayMetrics
    from ingest.metrics import IngestMetrics
    from journal.service import JournalMetrics
    from relay.metrics import RelayMetrics
    from streaming.metrics import StreamMetrics

    names = set()
    for cls in (RelayMetrics, IngestMetrics, StreamMetrics, JournalMetrics, GatewayMetrics):
        for metric in vars(cls()).values():
            if isinstance(metric, MetricWrapperBase):
                names.add(metric._name + ("_total" if metric._type == "counter" else ""))
    return names


def test_metrics_page_names_every_metric() -> None:
    page = (DOCS / "reference" / "metrics.md").read_text()
    missing = sorted(n for n in defined_metrics() if f"`{n}`" not in page)
    assert not missing, f"add these to docs/reference/metrics.md: {missing}"


def verbs_and_options(
    parser: argparse.ArgumentParser, path: tuple[str, ...] = ()
) -> list[tuple[str, str]]:
    """(verb path, option or subverb) for every subcommand of ``parser``, recursively."""
    found = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                found.append((" ".join(path), name))
                found += verbs_and_options(sub, (*path, name))
        else:
            found += [(" ".join(path), o) for o in action.option_strings if o.startswith("--")]
    return [(p, o) for p, o in found if o != "--help"]


def test_cli_page_names_every_verb_and_option() -> None:
    page = (DOCS / "reference" / "cli.md").read_text()
    missing = [
        f"{path} {o}".strip() for path, o in verbs_and_options(build_parser()) if o not in page
    ]
    assert not missing, f"document these in docs/reference/cli.md: {missing}"


def test_the_first_steps_in_the_help_are_commands_the_cli_takes() -> None:
    """``candlewire --help`` ends with the tutorial's first steps; each must still parse."""
    joined = re.sub(r"\s*\\\n\s+", " ", FIRST_STEPS)  # a line continued after a backslash
    lines = [line.strip().split("  ")[0].split() for line in joined.splitlines()]
    commands = [c[1:] for c in lines if c[:1] == ["candlewire"] and c[1:2] != ["COMMAND"]]
    assert [c[0] for c in commands] == ["up", "watch", "watch", "history", "status", "down"]
    for argv in commands:
        assert build_parser().parse_args(argv).command == argv[0]


def test_readme_is_a_front_door() -> None:
    lines = len((REPO / "README.md").read_text().splitlines())
    assert lines <= README_MAX_LINES, (
        f"README.md has {lines} lines (at most {README_MAX_LINES}): reference material goes in docs/"
    )
