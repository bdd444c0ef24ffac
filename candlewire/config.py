"""Runtime configuration: one settings object, read from ``CANDLEWIRE_*`` variables.

Ports come from :mod:`candlewire.endpoints`; ``ports`` only overrides them (tests use free
ports so they can run beside ``make up``).
"""

from __future__ import annotations

import json
from pathlib import Path

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from candlewire.endpoints import ENDPOINTS

# Candle periods the platform aggregates and serves, in seconds.
PERIODS_S: tuple[int, ...] = (60, 300, 900, 3600, 14400, 86400)


class Settings(BaseSettings):
    """Where things are. Defaults are safe: everything on 127.0.0.1."""

    model_config = SettingsConfigDict(env_prefix="CANDLEWIRE_", env_nested_delimiter="__")

    host: str = "127.0.0.1"
    """Address clients and services connect to."""
    bind_host: str = "127.0.0.1"
    """Address services bind; set 0.0.0.0 deliberately to expose them."""
    ports: dict[str, int] = Field(default_factory=dict)
    """Overrides of ENDPOINTS ports by name, e.g. CANDLEWIRE_PORTS__MARKET_DATA=6558."""
    extra_publishers: list[str] = Field(default_factory=list)
    """More stream-publisher endpoints the relay's XSUB connects to."""
    state_dir: Path = Path(".candlewire")
    max_message_bytes: int = 1 << 20
    """Largest inbound ZMQ message a service accepts; larger peers are disconnected."""
    max_history_rows: int = 1_100_000
    """Largest history request the relay accepts, in candles (two years of 1-minute bars)."""

    def port(self, name: str) -> int:
        if name not in ENDPOINTS:
            raise KeyError(f"unknown endpoint {name!r}; known: {', '.join(ENDPOINTS)}")
        return self.ports.get(name, ENDPOINTS[name].port)

    def connect(self, name: str) -> str:
        """The ZMQ address a peer connects to."""
        return f"tcp://{self.host}:{self.port(name)}"

    def bind(self, name: str) -> str:
        """The ZMQ address the owning service binds."""
        return f"tcp://{self.bind_host}:{self.port(name)}"

    def to_env(self) -> dict[str, str]:
        """These settings as CANDLEWIRE_* variables, for child processes."""
        env = {
            "CANDLEWIRE_HOST": self.host,
            "CANDLEWIRE_BIND_HOST": self.bind_host,
            "CANDLEWIRE_STATE_DIR": str(self.state_dir),
            "CANDLEWIRE_MAX_MESSAGE_BYTES": str(self.max_message_bytes),
            "CANDLEWIRE_MAX_HISTORY_ROWS": str(self.max_history_rows),
        }
        env.update({f"CANDLEWIRE_PORTS__{k.upper()}": str(v) for k, v in self.ports.items()})
        if self.extra_publishers:
            env["CANDLEWIRE_EXTRA_PUBLISHERS"] = json.dumps(self.extra_publishers)
        return env
