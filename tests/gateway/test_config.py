"""Credentials: from the environment or secret files, and never in a repr, a log or an ack."""

from __future__ import annotations

import logging

from candlewire.testing import new_user, user_event
from gateway import GatewaySettings
from proto import events_pb2 as ev
from tests.gateway.conftest import BOT_TOKEN, gw_config
from tests.support import free_port


def test_secrets_come_from_files_and_never_print(tmp_path, monkeypatch) -> None:
    (tmp_path / "candlewire_gateway_telegram_token").write_text("999:from-a-file")
    (tmp_path / "candlewire_gateway_secret").write_text("a-secret-from-a-file-0123")
    monkeypatch.setenv("CANDLEWIRE_GATEWAY_SECRETS_DIR", str(tmp_path))
    monkeypatch.setenv("CANDLEWIRE_GATEWAY_SMTP_PASSWORD", "from-the-env")
    gw = GatewaySettings.load()
    assert gw.telegram_token.get_secret_value() == "999:from-a-file"
    assert gw.secret.get_secret_value() == "a-secret-from-a-file-0123"
    assert gw.smtp_password.get_secret_value() == "from-the-env"
    shown = repr(gw) + str(gw) + gw.model_dump_json()
    for secret in ("999:from-a-file", "a-secret-from-a-file", "from-the-env"):
        assert secret not in shown


def test_an_unreachable_telegram_leaks_no_token(gw_env, make_gateway, container, caplog) -> None:
    dead = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    gw = make_gateway(gw_env, gw_config(telegram_token=BOT_TOKEN, telegram_api=dead))
    user = new_user()
    gw.directory.set_user(user, telegram_chat_id="3")
    with caplog.at_level(logging.DEBUG):
        ack = container(gw_env).send(user_event(user, ev.CRITICAL, [(ev.TELEGRAM, False)]))
    assert ack.status == ev.QUEUED
    assert ack.error_message == "TELEGRAM: telegram unreachable (ConnectError)"
    assert BOT_TOKEN not in caplog.text and BOT_TOKEN.split(":")[1] not in ack.error_message
