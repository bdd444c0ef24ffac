"""Web Push (RFC 8030) with VAPID (RFC 8292) and aes128gcm payloads (RFC 8291), by pywebpush.

The user's browser gives a PushSubscription (endpoint and keys) that the directory stores;
the payload is encrypted to it and signed with our VAPID key, so the push service learns
neither the content nor anything it could replay for another sender.
"""

from __future__ import annotations

import datetime as dt
import email.utils
import json
import math
import time

import aiohttp
from py_vapid import Vapid
from pywebpush import WebPushException, webpush_async

from gateway.channels import DELIVERED, Outcome, Result, unreachable
from gateway.directory import UserAddress
from gateway.symbols import Rendered
from proto import events_pb2 as ev

TRANSIENT_RETRY_S = 30.0


def load_vapid(key: str) -> Vapid:
    """A VAPID key from PEM text or a base64url raw/DER string."""
    if "-----BEGIN" in key:
        return Vapid.from_pem(key.strip().encode())
    return Vapid.from_string(key.strip())


def _retry_after(exc: WebPushException) -> float:
    """The seconds a push service's Retry-After asks for: delta-seconds (``1*DIGIT``) or an
    HTTP date (RFC 9110, 10.2.3). Missing or neither: TRANSIENT_RETRY_S. The critical path
    bounds what it waits (``MAX_RETRY_AFTER_S``)."""
    value = (exc.retry_after or "").strip()
    if value.isascii() and value.isdigit():
        seconds = float(value)  # inf past a double: unreadable, below
    else:
        try:
            when = email.utils.parsedate_to_datetime(value)
        except (TypeError, ValueError):
            return TRANSIENT_RETRY_S
        if when.tzinfo is None:  # "-0000": UTC, as HTTP dates are
            when = when.replace(tzinfo=dt.UTC)
        seconds = when.timestamp() - time.time()
    return max(seconds, 0.0) if math.isfinite(seconds) else TRANSIENT_RETRY_S


class PushChannel:
    kind = ev.PUSH

    def __init__(self, vapid_key: str, subject: str, timeout_s: float) -> None:
        self._vapid = load_vapid(vapid_key) if vapid_key else None
        self._subject, self._timeout = subject, timeout_s
        self._http: aiohttp.ClientSession | None = None

    async def send(self, user: UserAddress, event: ev.UserEvent, message: Rendered) -> Result:
        if self._vapid is None:
            return Result(Outcome.SKIPPED, "web push is not configured")
        if not user.push_subscription:
            return Result(Outcome.SKIPPED, "no push subscription for the user")
        if self._http is None:
            self._http = aiohttp.ClientSession()
        data = json.dumps({"title": message.title, "body": message.text, **message.data})
        try:
            await webpush_async(
                user.push_subscription,
                data,
                vapid_private_key=self._vapid,
                vapid_claims={"sub": self._subject},
                timeout=self._timeout,
                ttl=3600,
                aiohttp_session=self._http,
            )
        except WebPushException as exc:
            status = exc.status_code
            if status == 429 or (status is not None and status >= 500):
                return Result(Outcome.RETRY, f"push service {status}", _retry_after(exc))
            if status in (404, 410):
                return Result(Outcome.FAILED, "push subscription expired")
            return Result(Outcome.FAILED, f"push service {status}")
        except (aiohttp.ClientError, TimeoutError) as exc:
            return unreachable("push service", exc, TRANSIENT_RETRY_S)
        return DELIVERED

    async def close(self) -> None:
        if self._http is not None:
            await self._http.close()
