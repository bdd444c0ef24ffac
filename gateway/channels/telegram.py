"""Telegram: the Bot API over HTTPS (httpx): ``sendMessage`` here, and the raw calls that
:mod:`gateway.telegram_sessions` makes (``getUpdates``) through the same client.

The bot token is part of every URL, so httpx's own request logging is silenced and errors
are reported by type and status, never by URL.
"""

from __future__ import annotations

import json
import logging
from typing import Any

import httpx

from gateway.channels import DELIVERED, Outcome, Result, unreachable
from gateway.directory import UserAddress
from gateway.symbols import Rendered
from proto import events_pb2 as ev

logging.getLogger("httpx").setLevel(logging.WARNING)
logging.getLogger("httpcore").setLevel(logging.WARNING)

TRANSIENT_RETRY_S = 5.0
# sendMessage takes "1-4096 characters"; a longer text is refused (400 "message is too
# long") on every try, so the event is never delivered. Counted in UTF-16 code units (an
# emoji is two), as Telegram counts entity offsets: the stricter reading of the limit.
MAX_TEXT = 4096
ELLIPSIS = "\u2026"


def message_text(message: Rendered) -> str:
    """An event as a chat message: the same words on the critical and the session path, cut
    to what one message holds (a payload may be 64 KiB)."""
    return fit(f"{message.title}\n{message.text}")


def fit(text: str, limit: int = MAX_TEXT) -> str:
    """``text`` if sendMessage takes it, else its start and an ellipsis, ``limit`` UTF-16
    code units in all; a surrogate pair (an emoji) is never cut in two."""
    if len(text) <= limit // 2:  # two units a character at most: no need to count
        return text
    units = text.encode("utf-16-le", "surrogatepass")
    if len(units) <= 2 * limit:
        return text
    head = units[: 2 * (limit - len(ELLIPSIS))].decode("utf-16-le", "surrogatepass")
    if "\ud800" <= head[-1] <= "\udbff":  # the first half of a pair cut in two
        head = head[:-1]
    return head + ELLIPSIS


def result_of(status: int, data: dict[str, Any], reason: str = "") -> Result:
    """What a Bot API answer means for a delivery: 429 and 5xx are "later"."""
    if status == 200 and data.get("ok"):
        return DELIVERED
    description = str(data.get("description", reason))[:200]
    if status == 429:
        return Result(Outcome.RETRY, f"telegram rate limit: {description}", retry_after(data))
    if status >= 500:
        return Result(Outcome.RETRY, f"telegram {status}", TRANSIENT_RETRY_S)
    return Result(Outcome.FAILED, f"telegram {status}: {description}")


def retry_after(data: dict[str, Any], default: float = 1.0) -> float:
    """The seconds a 429 asks us to wait (``parameters.retry_after``)."""
    params = data.get("parameters")
    value = params.get("retry_after") if isinstance(params, dict) else None
    return float(value) if isinstance(value, int | float) and value >= 0 else default


class TelegramChannel:
    kind = ev.TELEGRAM

    def __init__(self, token: str, api: str, timeout_s: float) -> None:
        self._token = token
        self.timeout_s = timeout_s
        self._http = httpx.AsyncClient(base_url=api.rstrip("/"), timeout=timeout_s)

    @property
    def configured(self) -> bool:
        return bool(self._token)

    @property
    def bot_id(self) -> str:
        """The bot's public id, the token's part before the colon (not a secret)."""
        return self._token.split(":", 1)[0]

    async def call(
        self, method: str, body: dict[str, Any], timeout_s: float | None = None
    ) -> tuple[int, bytes, str]:
        """One Bot API call: status, raw body and reason. Raises httpx.HTTPError when the
        API is unreachable; callers report its type only (its message holds the URL)."""
        resp = await self._http.post(
            f"/bot{self._token}/{method}", json=body, timeout=timeout_s or self.timeout_s
        )
        return resp.status_code, resp.content, resp.reason_phrase

    async def send_text(self, chat_id: str, text: str) -> tuple[int, Result]:
        """``sendMessage`` to a chat: the HTTP status (0 when unreachable) and its meaning."""
        try:
            status, body, reason = await self.call(
                "sendMessage", {"chat_id": chat_id, "text": fit(text)}
            )
        except httpx.HTTPError as exc:
            return 0, unreachable("telegram", exc, TRANSIENT_RETRY_S)
        return status, result_of(status, json_object(body), reason)

    async def send(self, user: UserAddress, event: ev.UserEvent, message: Rendered) -> Result:
        if not self._token:
            return Result(Outcome.SKIPPED, "telegram is not configured")
        if not user.telegram_chat_id:
            return Result(Outcome.SKIPPED, "no telegram chat for the user")
        return (await self.send_text(user.telegram_chat_id, message_text(message)))[1]

    async def close(self) -> None:
        await self._http.aclose()


def json_object(body: bytes) -> dict[str, Any]:
    """A JSON object, or empty for anything else (an HTML error page from a proxy)."""
    try:
        data = json.loads(body)
    except ValueError:
        return {}
    return data if isinstance(data, dict) else {}
