"""The gateway: user events to people, over WebSocket sessions, Telegram, e-mail and push.

Read in this order: :mod:`gateway.config` (what it needs), :mod:`gateway.auth` (session
tokens), :mod:`gateway.directory` (users and shared delivery state in PostgreSQL),
:mod:`gateway.symbols` (metadata and rendering), :mod:`gateway.sessions` (WebSocket
sessions), :mod:`gateway.channels` (one file per channel), :mod:`gateway.critical` (the
at-least-once path) and :mod:`gateway.service` (the process that ties them together).
"""

from gateway.auth import issue_token, verify_token
from gateway.config import GatewaySettings
from gateway.service import Gateway

__all__ = ["Gateway", "GatewaySettings", "issue_token", "verify_token"]
