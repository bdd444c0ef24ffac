"""Telegram: the Bot API's ``sendMessage`` over HTTPS (httpx).

The bot token is part of every URL, so httpx's own request logging is silenced and errors
are reported by type and status, never by URL.
"""

from __future__ import annotations

import logging

import httpx

from gateway.channels import DELIVERED, Outcome, Result, unreachable
from gateway.directory import UserAddress
from gateway.symbols import Rendered
from proto import events_pb2 as ev

logging.getLogger("httpx").setLevel(logging.WARNING)
logging.getLogger("httpcore").setLevel(logging.WARNING)

TRANSIENT_RETRY_S = 5.0


class TelegramChannel:
    kind = ev.TELEGRAM

    def __init__(self, token: str, api: str, timeout_s: float) -> None:
        self._token = token
        self._http = httpx.AsyncClient(base_url=api.rstrip("/"), timeout=timeout_s)

    async def send(self, user: UserAddress, event: ev.UserEvent, message: Rendered) -> Result:
        if not self._token:
            return Result(Outcome.SKIPPED, "telegram is not configured")
        if not user.telegram_chat_id:
            return Result(Outcome.SKIPPED, "no telegram chat for the user")
        body = {"chat_id": user.telegram_chat_id, "text": f"{message.title}\n{message.text}"}
        try:
            resp = await self._http.post(f"/bot{self._token}/sendMessage", json=body)
        except httpx.HTTPError as exc:
            return unreachable("telegram", exc, TRANSIENT_RETRY_S)
        try:
            data = resp.json()
        except ValueError:
            data = {}
        if resp.status_code == 200 and data.get("ok"):
            return DELIVERED
        description = str(data.get("description", resp.reason_phrase))[:200]
        if resp.status_code == 429:
            retry_after = float((data.get("parameters") or {}).get("retry_after", 1))
            return Result(Outcome.RETRY, f"telegram rate limit: {description}", retry_after)
        if resp.status_code >= 500:
            return Result(Outcome.RETRY, f"telegram {resp.status_code}", TRANSIENT_RETRY_S)
        return Result(Outcome.FAILED, f"telegram {resp.status_code}: {description}")

    async def close(self) -> None:
        await self._http.aclose()
