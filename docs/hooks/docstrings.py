"""A griffe extension for the docs build: every public member the API reference renders has a
docstring, or the build warns (and ``mkdocs build --strict`` fails).

mkdocstrings renders what a page's ``::: identifier`` blocks name and silently leaves out a
member without a docstring, so a public method added without one would just be missing from
the reference. This reads those identifiers from the pages and checks, once the package is
loaded, the module or class each names and its public classes, functions and methods.
Attributes are left out: a dataclass's or settings model's fields are described by their
class's docstring, or by their own where they have one.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import griffe

DOCS = Path(__file__).resolve().parents[1]
IDENTIFIER = re.compile(r"^::: *([\w.]+)", re.MULTILINE)


def rendered() -> list[str]:
    """The identifiers of every ``:::`` block in the pages."""
    return [m for page in sorted(DOCS.rglob("*.md")) for m in IDENTIFIER.findall(page.read_text())]


def undocumented(obj: griffe.Object) -> list[str]:
    """``obj`` and its public non-attribute members, recursively, that have no docstring."""
    missing = [] if obj.docstring else [obj.path]
    for name, member in obj.members.items():
        if name.startswith("_") or member.is_alias or member.is_attribute:
            continue
        missing += undocumented(member)
    return missing


class RequireDocstrings(griffe.Extension):
    """Warn for each undocumented public member under a rendered identifier."""

    def on_package(self, *, pkg: griffe.Module, loader: griffe.GriffeLoader, **kwargs: Any) -> None:
        for identifier in rendered():
            top, _, rest = identifier.partition(".")
            if top != pkg.name:
                continue
            obj = pkg.get_member(rest) if rest else pkg
            if obj.is_alias:
                obj = obj.final_target
            for path in undocumented(obj):
                griffe.logger.warning(f"{path} has no docstring (the API reference renders it)")
