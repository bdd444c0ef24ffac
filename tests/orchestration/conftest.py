from __future__ import annotations

from collections.abc import Iterator

import pytest

from candlewire.config import Settings


@pytest.fixture
def platform_env(live_pipeline: Settings, monkeypatch: pytest.MonkeyPatch) -> Iterator[Settings]:
    """The live pipeline's settings as CANDLEWIRE_* variables, which Dagster resources read."""
    for key, value in live_pipeline.to_env().items():
        monkeypatch.setenv(key, value)
    yield live_pipeline
