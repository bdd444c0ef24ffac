"""How ``make test``'s pytest-xdist workers share the suite (tests/conftest.py)."""

from __future__ import annotations

import pytest
from xdist.scheduler import LoadScopeScheduling


def in_unit(nodeid: str, together: tuple[str, ...]) -> bool:
    """Whether a test's module (the nodeid's path) is one of ``together``'s prefixes."""
    return nodeid.split("::", 1)[0].startswith(together)


class ModuleScheduling(LoadScopeScheduling):
    """Whole modules to whichever worker is free, and the modules under ``together`` (path
    prefixes) as one unit, first.

    xdist's ``loadgroup`` would make that unit from marks, but it renames the items through
    an attribute pytest 9 no longer reads, so its groups fell apart into single tests; a unit
    chosen here by module path needs neither.
    """

    def __init__(self, config: pytest.Config, log: object, together: tuple[str, ...]) -> None:
        super().__init__(config, log)  # type: ignore[arg-type]
        self.together = together

    def _split_scope(self, nodeid: str) -> str:
        return "together" if in_unit(nodeid, self.together) else nodeid.split("::", 1)[0]


class ByModule:
    """The plugin that hands pytest-xdist that scheduling (conftest registers it when xdist
    is there)."""

    def __init__(self, together: tuple[str, ...]) -> None:
        self.together = together

    def pytest_xdist_make_scheduler(self, config: pytest.Config, log: object) -> ModuleScheduling:
        """The collection's order (tests/conftest.py puts the unit first), not xdist's
        largest-unit-first by test count."""
        config.option.loadscopereorder = False
        return ModuleScheduling(config, log, self.together)
