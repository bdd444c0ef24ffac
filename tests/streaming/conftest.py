"""One Spark JVM for this package's in-process tests (the JVM decoder, the committing plan,
the live path's Java, the tables): each module starting its own paid a JVM start and its
warm-up, 10-13 s, five times over in CI."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from pyspark.sql import SparkSession

from candlewire.config import Settings
from candlewire.kafka import ensure_topics
from candlewire.spark import build_session


@pytest.fixture(scope="package")
def spark(lakehouse: Settings, kafka: object) -> Iterator[SparkSession]:
    """The test platform's catalog and broker (the live path journals to it), its topics made."""
    ensure_topics(lakehouse)
    session = build_session(lakehouse, "candlewire-streaming-tests")
    yield session
    session.stop()
