"""What a gateway needs beyond the shared :class:`~candlewire.config.Settings`.

Credentials are :class:`~pydantic.SecretStr`: they print as ``**********`` in reprs, logs
and tracebacks. Each can come from the environment (``CANDLEWIRE_GATEWAY_TELEGRAM_TOKEN``)
or from a file in ``CANDLEWIRE_GATEWAY_SECRETS_DIR`` named like the variable in lower case
(``candlewire_gateway_telegram_token``), the layout Docker and Kubernetes secrets mount.
"""

from __future__ import annotations

import os
import secrets
from pathlib import Path

from pydantic import Field, SecretStr
from pydantic_settings import BaseSettings, SettingsConfigDict

from candlewire.config import Settings


class GatewaySettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="CANDLEWIRE_GATEWAY_", env_nested_delimiter="__")

    secret: SecretStr = SecretStr("")
    """Signs session tokens; required. ``candlewire gateway token USER`` mints one."""
    token_max_age_s: int = 30 * 24 * 3600
    directory_url: str | None = None
    """SQLAlchemy URL of the user directory; default the Iceberg catalog's database."""
    containers: list[str] = Field(default_factory=list)
    """XPUB endpoints of user events (informational path); default the local user
    container's and the stream processor's (CEP alerts)."""
    session_queue: int = 256
    """Messages a WebSocket session may have waiting; a client that falls further behind is
    disconnected rather than buffered without bound."""
    events_coalesce_ms: float = Field(default=1.0, ge=0, le=100)
    """After a short batch of informational events, wait this long before taking the next,
    so that events arriving one at a time are handled together: one at a time, each cost the
    gateway four times its share of a batch (a loop turn, a wake-up and a socket write each).
    Adds at most this much to an event's latency; 0 handles each as it comes."""
    max_ws_message_bytes: int = 64 * 1024
    max_sessions_per_user: int = 16
    allowed_origins: list[str] = Field(default_factory=list)
    """Browser origins whose pages may open sessions, besides the gateway's own page
    (http://host:port as clients reach it, 127.0.0.1 and localhost). A client that sends no
    Origin (not a browser) is not a cross-site page and may connect."""
    ws_messages_per_s: float = Field(default=20.0, gt=0)
    """Messages a session may send a second, on average; twice that at once. Beyond, it is
    closed (1008) and counted."""
    auth_timeout_s: float = 5.0
    dedup_window_s: float = 300.0
    """A critical event seen again within this window is acked again, not delivered again."""
    claim_lease_s: float = Field(default=60.0, gt=0)
    """How long a gateway's claim on a critical event it delivers keeps other gateways from
    delivering it too. Longer than a slow delivery (every channel's ``http_timeout_s``);
    it is also how long the events of a gateway killed mid-delivery wait for another one."""
    max_inflight: int = 128
    """Critical events this gateway works on at once, from receipt to the committed answer.
    Throughput is at most this many per round trip of one event (a batched lookup, the
    delivery, a batched commit: about 10 ms), so 16 capped it near 1,600/s; a kill -9 can
    deliver at most this many twice."""
    retry_poll_s: float = 1.0
    max_retries: int = 20
    """Rate-limited (QUEUED) deliveries tried this often before the gateway gives up."""

    telegram_token: SecretStr = SecretStr("")
    telegram_api: str = "https://api.telegram.org"
    telegram_sessions: bool = True
    """Long poll the Bot API's getUpdates, so that a chat's /start and /stop open and end a
    Telegram session that gets informational events. The Bot API serves one poller per bot
    (another gets 409 Conflict): in a pool of gateways sharing a bot token, leave it on in
    one only, which then holds every Telegram session."""
    telegram_poll_s: int = Field(default=25, ge=1, le=50)
    """How long one getUpdates waits for an update (Telegram allows up to 50)."""
    telegram_queue: int = 256
    """Messages waiting for Telegram sessions; beyond, informational ones are dropped and
    counted rather than held up."""
    smtp_host: str = ""
    smtp_port: int = 587
    smtp_user: str = ""
    smtp_password: SecretStr = SecretStr("")
    smtp_starttls: bool = True
    smtp_from: str = "candlewire@localhost"
    smtp_ca_file: str = ""
    """A CA bundle to trust for STARTTLS, for relays with private certificates."""
    vapid_private_key: SecretStr = SecretStr("")
    """The VAPID key (PEM, or the base64url raw key) that signs Web Push requests."""
    vapid_subject: str = "mailto:ops@localhost"
    http_timeout_s: float = 10.0

    @classmethod
    def load(cls, settings: Settings | None = None, **overrides: object) -> GatewaySettings:
        """From the environment and secret files: CANDLEWIRE_GATEWAY_SECRETS_DIR, else the
        local stack's ``<state_dir>/secrets`` when it exists."""
        env = os.environ.get("CANDLEWIRE_GATEWAY_SECRETS_DIR")
        local = local_secrets_dir(settings or Settings())
        secrets = Path(env) if env else (local if local.is_dir() else None)
        return cls(_secrets_dir=secrets, **overrides)  # type: ignore[arg-type]

    def container_endpoints(self, settings: Settings) -> list[str]:
        return self.containers or [settings.connect(e) for e in ("user_events", "stream_events")]


def local_secrets_dir(settings: Settings) -> Path:
    return settings.state_dir / "secrets"


def ensure_local_secret(settings: Settings) -> Path:
    """The local stack's session-token secret: made once, readable by its owner only."""
    folder = local_secrets_dir(settings)
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    path = folder / "candlewire_gateway_secret"
    if not path.exists():
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(secrets.token_urlsafe(32))
    return path
