"""A private local stack on free ports for benchmarks, so they never disturb `make up`."""

from __future__ import annotations

import contextlib
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

from candlewire.config import Settings
from candlewire.stack import Stack, default_services
from tests.support import free_settings


@contextlib.contextmanager
def private_stack() -> Iterator[Settings]:
    base = Path(tempfile.mkdtemp(prefix="candlewire-bench-"))
    base.chmod(0o755)  # PostgreSQL runs as the postgres user when we are root
    settings = free_settings(base)
    stack = Stack(settings, default_services(settings))
    try:
        stack.up(lambda line: print(line, flush=True))
        yield settings
    finally:
        stack.down(lambda _: None)
        shutil.rmtree(base, ignore_errors=True)
