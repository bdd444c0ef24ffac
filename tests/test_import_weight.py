"""What a service's start imports: only what it uses (#36, the stack's memory).

Every service starts through ``launcher.cli`` and imports some ``candlewire`` module; before
the package's names were lazy, that alone loaded pyiceberg, SQLAlchemy, pyarrow and pandas
(about 140 MiB and a second) into a relay. The Dagster code server only lists definitions,
so loading them must not import Spark or the lake's stack either.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

HEAVY = ("pyarrow", "pandas", "pyiceberg", "pyspark", "dagster_pyspark")


def loaded(code: str) -> set[str]:
    """The heavy modules that ``code``, run in a fresh interpreter, leaves imported."""
    probe = f"{code}\nimport sys\nprint(' '.join(m for m in {HEAVY!r} if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    return set(out.stdout.split())


@pytest.mark.parametrize(
    "code",
    [
        "import launcher.cli, relay, journal.service, ingest.service, gateway.service",
        "import orchestration.definitions as d; d.defs()",
        "import candlewire; candlewire.Settings; candlewire.condition",
    ],
)
def test_a_start_imports_no_heavy_stack(code: str) -> None:
    assert loaded(code) == set()


def test_the_client_still_loads_on_first_use() -> None:
    """The lazy names resolve to the real objects: the public API is unchanged."""
    code = "import candlewire; from candlewire.client import Client; assert candlewire.Client is Client"
    assert "pyarrow" in loaded(code)


def test_every_public_name_resolves() -> None:
    """``__all__`` and the lazy table name the same things: ``import *`` gets them all."""
    code = "from candlewire import *; import candlewire; assert dir(candlewire) == sorted(candlewire.__all__)"
    assert "pyarrow" in loaded(code)  # the client among them
