"""Local stand-ins that speak the real protocols of services we cannot reach from here."""

from __future__ import annotations

import base64
import json
import threading
import time
from email.message import Message
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import http_ece
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec
from py_vapid import Vapid


def b64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def b64url_decode(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


class _Server:
    """A threaded HTTP server on 127.0.0.1 whose handler calls ``self.handle``."""

    def __init__(self) -> None:
        owner = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"  # keep-alive, as the real services offer
            disable_nagle_algorithm = True

            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                status, headers, reply = owner.handle(self.path, self.headers, body)
                self.send_response(status)
                for k, v in headers.items():
                    self.send_header(k, v)
                self.send_header("Content-Length", str(len(reply)))
                self.end_headers()
                self.wfile.write(reply)

            def log_message(self, *args: object) -> None:
                pass

        self.lock = threading.Lock()
        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.httpd.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def handle(self, path: str, headers: Message, body: bytes) -> tuple[int, dict, bytes]:
        raise NotImplementedError

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


class TelegramStandIn(_Server):
    """The Bot API's sendMessage: checks the token, records messages, can rate-limit.

    ``limit(n, retry_after)`` answers the next ``n`` calls with 429 and ``retry_after``,
    as Telegram does when a bot sends too fast.
    """

    def __init__(self, token: str) -> None:
        self.token = token
        self.messages: list[dict[str, Any]] = []
        self.refused = 0
        self._limited, self._retry_after = 0, 1
        super().__init__()

    def limit(self, calls: int, retry_after: int) -> None:
        with self.lock:
            self._limited, self._retry_after = calls, retry_after

    def handle(self, path: str, headers: Message, body: bytes) -> tuple[int, dict, bytes]:
        ctype = {"Content-Type": "application/json"}
        if path != f"/bot{self.token}/sendMessage":
            return 404, ctype, json.dumps({"ok": False, "error_code": 404}).encode()
        with self.lock:
            if self._limited > 0:
                self._limited -= 1
                self.refused += 1
                reply = {
                    "ok": False,
                    "error_code": 429,
                    "description": f"Too Many Requests: retry after {self._retry_after}",
                    "parameters": {"retry_after": self._retry_after},
                }
                return 429, ctype, json.dumps(reply).encode()
            try:
                msg = json.loads(body)
            except ValueError:
                msg = {}
            if not msg.get("chat_id") or not msg.get("text"):
                return 400, ctype, b'{"ok":false,"error_code":400,"description":"Bad Request"}'
            self.messages.append(msg)
            result = {"message_id": len(self.messages), "chat": {"id": msg["chat_id"]}}
        return 200, ctype, json.dumps({"ok": True, "result": result}).encode()

    def texts(self) -> list[str]:
        with self.lock:
            return [m["text"] for m in self.messages]


class PushStandIn(_Server):
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
