"""``candlewire up | status | down`` with the services that exist, on free ports."""

from __future__ import annotations

import socket

import pytest

from candlewire.stack import Stack, StackError, default_services
from tests.support import free_settings


@pytest.fixture
def stack(tmp_path):
    settings = free_settings(tmp_path / "state")
    st = Stack(settings, default_services(settings))
    yield st
    st.down(lambda _: None)


def test_up_status_down_and_second_up_is_harmless(stack) -> None:
    said: list[str] = []
    stack.up(said.append)
    assert said == [
        f"relay: up on port {stack.settings.port('client_requests')} (log {stack.logfile(stack.services[0])})"
    ]
    rows = stack.status()
    assert [(r[0], r[3]) for r in rows] == [("relay", "healthy")]
    pid = rows[0][2]
    said.clear()
    stack.up(said.append)
    assert said == [f"relay: already running (pid {pid})"]
    stack.down(said.append)
    assert stack.status()[0][2:] == (None, "stopped")
    assert not stack.pidfile(stack.services[0]).exists()


def test_port_taken_is_a_one_line_error(stack) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", stack.settings.port("client_requests")))
        s.listen()
        with pytest.raises(StackError, match=r"port \d+ is taken by another process"):
            stack.up(lambda _: None)
