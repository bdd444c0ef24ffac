"""Secrets the local stack generates: in the state dir only, readable by its owner only.

Each is made once (``ensure_secret``) and read wherever a URL needs it
(:meth:`candlewire.config.Settings.secret`); ``CANDLEWIRE_SECRET_<NAME>`` overrides the file.
"""

from __future__ import annotations

import os
import secrets

from candlewire.config import Settings


def ensure_secret(settings: Settings, name: str) -> str:
    """The secret, made now (hex: safe in URLs) if there is none."""
    held = settings.secret(name)
    if held:
        return held
    folder = settings.state_dir / "secrets"
    folder.mkdir(parents=True, exist_ok=True)
    folder.chmod(0o700)
    path = folder / name
    value = secrets.token_hex(24)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(value + "\n")
    return value
