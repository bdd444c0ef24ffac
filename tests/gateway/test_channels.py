"""Channels against stand-ins that speak the real protocols: SMTP (aiosmtpd, with and without
STARTTLS), Web Push (VAPID-signed, aes128gcm-encrypted) and Telegram's length limit; the rest
of Telegram is in test_critical."""

from __future__ import annotations

import datetime as dt
import email.utils
import ipaddress
import ssl
import time
from email import message_from_bytes, policy

import pytest
from aiosmtpd.controller import Controller
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from py_vapid import Vapid
from pywebpush import WebPushException

from candlewire.testing import new_user, user_event, wait_for
from gateway.channels.push import TRANSIENT_RETRY_S, _retry_after
from proto import events_pb2 as ev
from tests.gateway.conftest import gw_config
from tests.gateway.standins import PushStandIn, b64url
from tests.support import counted, free_port


class Inbox:
    """An aiosmtpd handler: keeps every message with whether it came over TLS."""

    def __init__(self) -> None:
        self.mail: list[tuple[bool, list[str], object]] = []

    async def handle_DATA(self, server, session, envelope) -> str:
        parsed = message_from_bytes(envelope.content, policy=policy.default)
        self.mail.append((session.ssl is not None, list(envelope.rcpt_tos), parsed))
        return "250 OK"


def self_signed(tmp_path) -> tuple[ssl.SSLContext, str]:
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "candlewire test smtp")])
    now = dt.datetime.now(dt.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=1))
        .not_valid_after(now + dt.timedelta(hours=1))
        .add_extension(
            x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
            critical=False,
        )
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    cert_file, key_file = tmp_path / "smtp.crt", tmp_path / "smtp.key"
    cert_file.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_file.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.load_cert_chain(cert_file, key_file)
    return ctx, str(cert_file)


@pytest.mark.parametrize("starttls", [False, True])
def test_email_reaches_a_real_smtp_server(
    gw_env, make_gateway, container, tmp_path, starttls
) -> None:
    inbox, port = Inbox(), free_port()
    tls, ca_file = self_signed(tmp_path) if starttls else (None, "")
    smtpd = Controller(
        inbox, hostname="127.0.0.1", port=port, tls_context=tls, require_starttls=starttls
    )
    smtpd.start()
    try:
        gw = make_gateway(
            gw_env,
            gw_config(
                smtp_host="127.0.0.1",
                smtp_port=port,
                smtp_starttls=starttls,
                smtp_ca_file=ca_file,
                smtp_from="alerts@candlewire.test",
            ),
        )
        user = new_user()
        gw.directory.set_user(user, email=f"{user}@example.test")
        event = user_event(
            user,
            ev.CRITICAL,
            [(ev.EMAIL, False)],
            payload={"ticker": "SIM:BTC/USDT", "side": "buy", "qty": "0.5"},
        )
        ack = container(gw_env).send(event)
        assert ack.status == ev.DELIVERED, ack.error_message
        assert len(inbox.mail) == 1
        over_tls, rcpt, mail = inbox.mail[0]
        assert over_tls is starttls
        assert rcpt == [f"{user}@example.test"]
        assert mail["Subject"] == "Order filled: SIM:BTC/USDT"
        assert mail["From"] == "alerts@candlewire.test"
        assert mail["X-Candlewire-Event"] == event.event_id
        body = mail.get_content()
        assert "side: buy" in body and "qty: 0.5" in body and event.event_id in body
    finally:
        smtpd.stop()


class Refusing:
    """An aiosmtpd handler that answers every recipient, or every message, with ``reply``."""

    def __init__(self, stage: str, reply: str) -> None:
        self.stage, self.reply = stage, reply

    async def handle_RCPT(self, server, session, envelope, address, options) -> str:
        if self.stage == "rcpt":
            return self.reply
        envelope.rcpt_tos.append(address)
        return "250 OK"

    async def handle_DATA(self, server, session, envelope) -> str:
        return self.reply


@pytest.mark.parametrize(
    ("stage", "reply", "status", "said"),
    [
        ("data", "451 4.3.0 mailbox busy, try later", ev.QUEUED, "smtp 451"),  # transient
        ("data", "554 5.7.1 message refused", ev.ERROR, "smtp 554"),  # for good
        ("rcpt", "550 5.1.1 no such user", ev.ERROR, "recipient refused"),
    ],
)
def test_an_smtp_server_s_refusal_is_retried_when_transient_and_final_when_not(
    gw_env, make_gateway, container, stage, reply, status, said
) -> None:
    """RFC 5321's reply classes: a 4yz is tried again later (the event queued), a 5yz is the
    channel's final answer, whether to the message or to its recipient."""
    port = free_port()
    smtpd = Controller(Refusing(stage, reply), hostname="127.0.0.1", port=port)
    smtpd.start()
    try:
        config = gw_config(smtp_host="127.0.0.1", smtp_port=port, smtp_starttls=False)
        gw = make_gateway(gw_env, config)
        user = new_user()
        gw.directory.set_user(user, email=f"{user}@example.test")
        ack = container(gw_env).send(user_event(user, ev.CRITICAL, [(ev.EMAIL, False)]))
        assert ack.status == status, ack.error_message
        assert said in ack.error_message
    finally:
        smtpd.stop()


def test_starttls_refuses_an_untrusted_certificate(
    gw_env, make_gateway, container, tmp_path
) -> None:
    inbox, port = Inbox(), free_port()
    tls, _ = self_signed(tmp_path)
    smtpd = Controller(
        inbox, hostname="127.0.0.1", port=port, tls_context=tls, require_starttls=True
    )
    smtpd.start()
    try:
        gw = make_gateway(gw_env, gw_config(smtp_host="127.0.0.1", smtp_port=port))
        user = new_user()
        gw.directory.set_user(user, email=f"{user}@example.test")
        ack = container(gw_env).send(user_event(user, ev.CRITICAL, [(ev.EMAIL, False)]))
        # Not delivered in the clear: queued for a retry, and nothing reached the server.
        assert ack.status == ev.QUEUED
        assert "EMAIL" in ack.error_message
        assert inbox.mail == []
    finally:
        smtpd.stop()


def test_web_push_is_signed_and_encrypted_for_the_subscription(
    gw_env, make_gateway, container
) -> None:
    gw, push = push_gateway(gw_env, make_gateway)
    try:
        user, gone = new_user(), new_user()
        gw.directory.set_user(user, push_subscription=push.subscription("phone"))
        gw.directory.set_user(gone, push_subscription=push.subscription("old-phone"))
        push.gone.add("old-phone")
        dealer = container(gw_env)
        event = user_event(
            user, ev.CRITICAL, [(ev.PUSH, False)], payload={"ticker": "SIM:ETH/USDT"}
        )
        ack = dealer.send(event)
        assert ack.status == ev.DELIVERED, (ack.error_message, push.rejected)
        assert push.rejected == []
        [got] = push.received
        assert got["subscription"] == "phone"
        assert got["title"] == "Order filled: SIM:ETH/USDT"
        assert got["event_id"] == event.event_id
        expired = dealer.send(user_event(gone, ev.CRITICAL, [(ev.PUSH, False)]))
        assert expired.status == ev.ERROR
        assert "expired" in expired.error_message
    finally:
        push.close()


def push_gateway(gw_env, make_gateway, **config: object) -> tuple[object, PushStandIn]:
    """A gateway with web push configured (and ``config``), and the push service it signs
    for."""
    vapid = Vapid()
    vapid.generate_keys()
    public = b64url(
        vapid.public_key.public_bytes(
            serialization.Encoding.X962, serialization.PublicFormat.UncompressedPoint
        )
    )
    push = PushStandIn(public)
    try:
        gw = make_gateway(
            gw_env,
            gw_config(
                vapid_private_key=vapid.private_pem().decode(),
                vapid_subject="mailto:ops@candlewire.test",
                **({"retry_poll_s": 0.1} | config),
            ),
        )
    except BaseException:
        push.close()
        raise
    return gw, push


@pytest.mark.parametrize("form", ["seconds", "date"])
def test_a_push_service_s_retry_after_is_waited_out_then_the_event_delivered_once(
    gw_env, make_gateway, container, form
) -> None:
    """RFC 8030's 429 with Retry-After, as delta-seconds or as an HTTP date (RFC 9110): the
    event is acked QUEUED, tried again once that time is up (not before, nor 30 s later),
    and delivered once."""
    gw, push = push_gateway(gw_env, make_gateway)
    try:
        user = new_user()
        gw.directory.set_user(user, push_subscription=push.subscription("busy"))
        wait_s = 2
        when = time.time() + wait_s
        push.busy["busy"] = [
            str(wait_s) if form == "seconds" else email.utils.formatdate(when, usegmt=True)
        ]
        event = user_event(user, ev.CRITICAL, [(ev.PUSH, False)], payload={"n": "1"})
        ack = container(gw_env).send(event)
        assert ack.status == ev.QUEUED and "PUSH" in ack.error_message, ack.error_message
        wait_for(lambda: push.received, timeout=15)
        time.sleep(0.5)  # a second delivery would come within the retry loop's poll
        assert [got["event_id"] for got in push.received] == [event.event_id]
        (_, first), (_, second) = push.attempts
        # An HTTP date has whole seconds: its retry is due at the date, not wait_s after
        # the first try (which came a moment after ``when`` was taken).
        due = int(when) if form == "date" else first + wait_s
        assert due - 0.05 <= second <= first + wait_s + 5
    finally:
        push.close()


@pytest.mark.parametrize("wait", ["Fri, 31 Dec 9999 23:59:59 GMT", "99999999999"])
def test_a_nonsense_retry_after_is_waited_out_no_longer_than_the_bound(
    gw_env, make_gateway, container, wait
) -> None:
    """A push service asking for thousands of years: the event is queued for a retry within
    MAX_RETRY_AFTER_S, not parked beyond every retry and ``max_retries``."""
    import sqlalchemy as sa

    from gateway.channels import MAX_RETRY_AFTER_S
    from gateway.directory import retries

    gw, push = push_gateway(gw_env, make_gateway)
    try:
        user = new_user()
        gw.directory.set_user(user, push_subscription=push.subscription("busy"))
        push.busy["busy"] = [wait]
        event = user_event(user, ev.CRITICAL, [(ev.PUSH, False)])
        sent = time.time()
        assert container(gw_env).send(event).status == ev.QUEUED
        with gw.directory.engine.connect() as db:
            due = db.execute(
                sa.select(retries.c.due_at).where(retries.c.event_id == event.event_id)
            ).scalar_one()
        assert sent + MAX_RETRY_AFTER_S - 60 <= due <= time.time() + MAX_RETRY_AFTER_S
    finally:
        push.close()


@pytest.mark.parametrize("max_retries", [20, 1])
def test_a_retry_asked_to_wait_again_is_queued_again_until_max_retries(
    gw_env, make_gateway, container, max_retries
) -> None:
    """A queued event whose retry gets another 429 is queued again, its attempts counted: it
    is delivered once on the third try, or given up after ``max_retries`` retries, never
    left queued."""
    gw, push = push_gateway(gw_env, make_gateway, max_retries=max_retries)
    try:
        user = new_user()
        gw.directory.set_user(user, push_subscription=push.subscription("busy"))
        push.busy["busy"] = ["1", "1"]
        event = user_event(user, ev.CRITICAL, [(ev.PUSH, False)])
        assert container(gw_env).send(event).status == ev.QUEUED
        finished = "delivered" if max_retries > 1 else "gave_up"
        wait_for(lambda: counted(gw.metrics.retries).get((finished,)) == 1, timeout=20)
        assert gw.directory.queued() == 0
        tries = 3 if max_retries > 1 else 2
        assert [name for name, _ in push.attempts] == ["busy"] * tries
        assert [got["event_id"] for got in push.received] == (
            [event.event_id] if max_retries > 1 else []
        )
    finally:
        push.close()


def test_a_channel_that_had_its_retries_hands_the_event_to_the_next_preference(
    gw_env, make_gateway, container
) -> None:
    """Push keeps saying "later": once it had ``max_retries`` retries the event goes on to the
    user's next preference (e-mail) and is delivered there, once, rather than given up with
    a channel left untried. A retry is claimed until a time, and settles only while that
    claim holds: a row another gateway took after it lapsed is not written over."""
    inbox, port = Inbox(), free_port()
    smtpd = Controller(inbox, hostname="127.0.0.1", port=port)
    smtpd.start()
    mail = {"smtp_host": "127.0.0.1", "smtp_port": port, "smtp_starttls": False}
    gw, push = push_gateway(gw_env, make_gateway, max_retries=1, **mail)
    try:
        user = new_user()
        gw.directory.set_user(
            user, push_subscription=push.subscription("busy"), email=f"{user}@example.test"
        )
        push.busy["busy"] = ["0"] * 10  # "later", at once
        event = user_event(user, ev.CRITICAL, [(ev.PUSH, False), (ev.EMAIL, False)])
        assert container(gw_env).send(event).status == ev.QUEUED
        wait_for(lambda: counted(gw.metrics.retries).get(("delivered",)) == 1, timeout=20)
        assert [name for name, _ in push.attempts] == ["busy"] * 2  # the first try, one retry
        assert [m[2]["X-Candlewire-Event"] for m in inbox.mail] == [event.event_id]
        assert gw.directory.queued() == 0
    finally:
        push.close()
        smtpd.stop()


def test_a_retry_settles_only_while_its_claim_holds(gw_env) -> None:
    """Two gateways: the first's claim lapsed (its channel was slow) and the second claimed
    the row again. The first's outcome must not delete or rewrite the second's row."""
    from gateway.directory import Directory, Retry

    directory = Directory(gw_env.sql_url()).create()
    event = user_event(new_user(), ev.CRITICAL, [(ev.PUSH, False)])
    with directory.engine.begin() as db:
        Directory._schedule(db, Retry(event, 0, 1), time.time() - 1)
    (first,), until_first = directory.claim_due(lease_s=0.0)  # lapses at once
    (second,), until_second = directory.claim_due(lease_s=60.0)
    assert first.event.event_id == second.event.event_id == event.event_id
    assert not directory.settle_retry(event.event_id, until_first, None)
    assert not directory.settle_retry(event.event_id, until_first, Retry(event, 0, 2), 0.0)
    assert directory.queued() == 1 and directory.claim_due(lease_s=60.0)[0] == []
    assert directory.settle_retry(event.event_id, until_second, None)
    assert directory.queued() == 0


@pytest.mark.parametrize(
    ("header", "low", "high"),
    [
        (None, TRANSIENT_RETRY_S, TRANSIENT_RETRY_S),  # none: the default
        ("soon", TRANSIENT_RETRY_S, TRANSIENT_RETRY_S),  # neither seconds nor a date
        ("inf", TRANSIENT_RETRY_S, TRANSIENT_RETRY_S),
        (" 7 ", 7.0, 7.0),
        ("Sun, 06 Nov 1994 08:49:37 GMT", 0.0, 0.0),  # a date gone by: at once
        # Not 1*DIGIT, which float() would read all the same.
        ("-5", TRANSIENT_RETRY_S, TRANSIENT_RETRY_S),
        ("+90", TRANSIENT_RETRY_S, TRANSIENT_RETRY_S),
        ("1_000", TRANSIENT_RETRY_S, TRANSIENT_RETRY_S),
        ("\uff19", TRANSIENT_RETRY_S, TRANSIENT_RETRY_S),  # a full-width 9
        ("9" * 400, TRANSIENT_RETRY_S, TRANSIENT_RETRY_S),  # past a double
    ],
)
def test_a_push_service_s_retry_after_is_read_as_rfc_9110_writes_it(header, low, high) -> None:
    class Response:
        status = 429
        headers = {} if header is None else {"Retry-After": header}

    assert low <= _retry_after(WebPushException("busy", Response())) <= high


def test_a_retry_after_date_without_a_zone_is_utc(monkeypatch) -> None:
    """On a machine off UTC too: a naive date read as local time would be hours out."""

    class Response:
        status = 503
        headers = {"Retry-After": email.utils.formatdate(time.time() + 60)}  # "-0000"

    monkeypatch.setenv("TZ", "Asia/Kolkata")
    time.tzset()
    try:
        assert 55 <= _retry_after(WebPushException("busy", Response())) <= 60
    finally:
        monkeypatch.undo()
        time.tzset()


def utf16_units(text: str) -> int:
    return len(text.encode("utf-16-le", "surrogatepass")) // 2


def test_an_event_past_telegrams_length_limit_is_cut_and_delivered(telegram, tmp_path) -> None:
    """sendMessage refuses a text past 4096 characters (400, on every retry): an event's
    text is cut to fit, with an ellipsis, and arrives."""
    import asyncio
    import json

    from gateway.channels import Outcome, Result
    from gateway.channels.telegram import TelegramChannel
    from gateway.directory import UserAddress
    from gateway.symbols import SymbolCatalog
    from tests.gateway.conftest import BOT_TOKEN
    from tests.support import free_settings

    event = user_event("u1", ev.CRITICAL, payload={"ticker": "SIM:BTC/USDT", "note": "x" * 6000})
    rendered = SymbolCatalog(free_settings(tmp_path)).render(event)
    whole = f"{rendered.title}\n{rendered.text}"

    async def raw(text: str) -> tuple[int, str]:
        """sendMessage as it is, past the channel's cut: what the stand-in answers."""
        channel = TelegramChannel(BOT_TOKEN, telegram.url, 5)
        try:
            status, body, _ = await channel.call("sendMessage", {"chat_id": "42", "text": text})
            return status, json.loads(body).get("description", "")
        finally:
            await channel.close()

    async def deliver() -> Result:
        channel = TelegramChannel(BOT_TOKEN, telegram.url, 5)
        try:
            return await channel.send(UserAddress("u1", telegram_chat_id="42"), event, rendered)
        finally:
            await channel.close()

    assert asyncio.run(raw(whole)) == (400, "Bad Request: message is too long")
    assert asyncio.run(raw("y" * 4096))[0] == 200
    assert asyncio.run(deliver()).outcome is Outcome.DELIVERED
    text = telegram.texts_to(42)[-1]
    assert utf16_units(text) == 4096
    assert text.startswith("Order filled: SIM:BTC/USDT\n") and text.endswith("\u2026")
    assert whole.startswith(text[:-1])


def test_a_text_is_cut_to_telegrams_limit_in_utf16_units_never_inside_an_emoji() -> None:
    from gateway.channels.telegram import MAX_TEXT, fit

    short = "\U0001f600" * (MAX_TEXT // 2)  # 4096 units exactly: as it is
    assert fit(short) is short
    for text in ("a" * 4093 + "\U0001f600" * 3, "a" * 4094 + "\U0001f600" * 3, "\U0001f600" * 3000):
        cut = fit(text)
        assert utf16_units(cut) <= MAX_TEXT and cut.endswith("\u2026")
        assert text.startswith(cut[:-1])
        cut.encode("utf-8")  # no half of a surrogate pair left
