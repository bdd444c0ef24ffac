"""Local stand-ins that speak the real protocols of services we cannot reach from here.

The Telegram Bot API stand-in lives in :mod:`candlewire.testing`, since the benchmarks use it too.
"""

from __future__ import annotations

import base64
import json
import time
from email.message import Message
from typing import Any

import http_ece
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec
from py_vapid import Vapid

from candlewire.testing import HttpStandIn
from candlewire.testing import TelegramStandIn as TelegramStandIn


def b64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def b64url_decode(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


class PushStandIn(HttpStandIn):
    """A push service (RFC 8030) that checks the VAPID signature (RFC 8292) against the
    key the subscription was made with and decrypts the aes128gcm payload (RFC 8291) with
    the browser's private key, as the browser would."""

    def __init__(self, vapid_public_key: str) -> None:
        self.vapid_public_key = vapid_public_key
        self.receiver = ec.generate_private_key(ec.SECP256R1())
        self.auth = b"0123456789abcdef"
        self.received: list[dict[str, Any]] = []
        self.rejected: list[str] = []
        self.gone: set[str] = set()
        # A subscription's next answers of 429, each with this Retry-After (seconds or a date).
        self.busy: dict[str, list[str]] = {}
        self.attempts: list[tuple[str, float]] = []  # (subscription, time) of every request
        super().__init__()

    def subscription(self, name: str) -> dict[str, Any]:
        """What the browser's PushManager.subscribe() would hand the page."""
        point = self.receiver.public_key().public_bytes(
            serialization.Encoding.X962, serialization.PublicFormat.UncompressedPoint
        )
        return {
            "endpoint": f"{self.url}/push/{name}",
            "keys": {"p256dh": b64url(point), "auth": b64url(self.auth)},
        }

    def handle(self, path: str, headers: Message, body: bytes) -> tuple[int, dict, bytes]:
        name = path.rsplit("/", 1)[-1]
        with self.lock:
            self.attempts.append((name, time.time()))
            waits = self.busy.get(name)
            wait = waits.pop(0) if waits else None
        if wait is not None:
            return 429, {"Retry-After": wait}, b"too many requests"
        if name in self.gone:
            return 410, {}, b"subscription gone"
        auth = headers.get("Authorization") or ""
        try:
            fields = dict(p.split("=", 1) for p in auth.partition(" ")[2].split(","))
            assert fields.get("k") == self.vapid_public_key, "signed with another key"
            assert Vapid.verify(auth), "bad ES256 signature"
            claims = json.loads(b64url_decode(fields["t"].split(".")[1]))
            assert claims["aud"] == self.url, f"audience {claims['aud']}"
            assert claims["exp"] > time.time(), "expired"
            assert claims["sub"].startswith(("mailto:", "https:")), "no contact"
        except (AssertionError, KeyError, ValueError) as exc:
            with self.lock:
                self.rejected.append(f"vapid: {exc}")
            return 401, {}, b"bad vapid"
        if headers.get("Content-Encoding") != "aes128gcm" or "TTL" not in headers:
            with self.lock:
                self.rejected.append("headers")
            return 400, {}, b"bad headers"
        plain = http_ece.decrypt(body, private_key=self.receiver, auth_secret=self.auth)
        with self.lock:
            self.received.append({"subscription": name, **json.loads(plain)})
        return 201, {"Location": f"{self.url}/msg/{len(self.received)}"}, b""
