"""E-mail over SMTP (aiosmtplib), with STARTTLS on by default.

``smtp_ca_file`` trusts a private CA, for relays with internal certificates.
"""

from __future__ import annotations

import ssl
from email.message import EmailMessage

import aiosmtplib

from gateway.channels import DELIVERED, Outcome, Result, unreachable
from gateway.directory import UserAddress
from gateway.symbols import Rendered
from proto import events_pb2 as ev

TRANSIENT_RETRY_S = 30.0


class EmailChannel:
    kind = ev.EMAIL

    def __init__(
        self,
        host: str,
        port: int,
        sender: str,
        *,
        username: str = "",
        password: str = "",
        starttls: bool = True,
        ca_file: str = "",
        timeout_s: float = 10.0,
    ) -> None:
        self._host, self._port, self._sender = host, port, sender
        self._username, self._password = username or None, password or None
        self._starttls, self._timeout = starttls, timeout_s
        self._tls = ssl.create_default_context(cafile=ca_file or None) if starttls else None

    async def send(self, user: UserAddress, event: ev.UserEvent, message: Rendered) -> Result:
        if not self._host:
            return Result(Outcome.SKIPPED, "email is not configured")
        if not user.email:
            return Result(Outcome.SKIPPED, "no email address for the user")
        mail = EmailMessage()
        mail["From"], mail["To"], mail["Subject"] = self._sender, user.email, message.title
        mail["X-Candlewire-Event"] = message.event_id
        mail.set_content(message.text)
        try:
            await aiosmtplib.send(
                mail,
                hostname=self._host,
                port=self._port,
                username=self._username,
                password=self._password,
                start_tls=self._starttls,
                tls_context=self._tls,
                timeout=self._timeout,
            )
        except aiosmtplib.SMTPRecipientsRefused as exc:
            return Result(Outcome.FAILED, f"recipient refused: {list(exc.recipients)[:1]}")
        except aiosmtplib.SMTPResponseException as exc:
            if 400 <= exc.code < 500:
                return Result(Outcome.RETRY, f"smtp {exc.code}", TRANSIENT_RETRY_S)
            return Result(Outcome.FAILED, f"smtp {exc.code}: {exc.message[:200]}")
        except (aiosmtplib.SMTPException, OSError) as exc:
            return unreachable("smtp", exc, TRANSIENT_RETRY_S)
        return DELIVERED

    async def close(self) -> None:
        return None
