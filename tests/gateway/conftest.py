from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import sqlalchemy as sa
import zmq
from websockets.sync.client import ClientConnection

from candlewire import testing
from candlewire.config import Settings
from candlewire.curve import dial
from candlewire.events import EventPublisher
from candlewire.testing import TelegramStandIn, open_session
from gateway import Gateway, GatewaySettings, issue_token
from gateway.directory import Directory, retries
from gateway.telegram_sessions import SessionStore, sessions_table
from proto import events_pb2 as ev
from proto.envelope import decode, encode, expect
from relay import Relay
from tests.support import FakePublisher, free_port

SECRET = "test-secret-0123456789"
BOT_TOKEN = "123456:TEST-token"


def gateway_settings(lakehouse: Settings, state_dir: Path) -> Settings:
    """Fresh ports and state; the session's PostgreSQL and Iceberg catalog."""
    from candlewire.endpoints import ENDPOINTS

    return Settings(
        ports={name: free_port() for name in ENDPOINTS},
        state_dir=state_dir,
        catalog_url=lakehouse.catalog_db(),
        warehouse=lakehouse.warehouse_uri(),
    )


@pytest.fixture(autouse=True)
def symbols_read_here(monkeypatch: pytest.MonkeyPatch) -> None:
    """The gateways these tests start read ``symbol_metadata`` in their own process, where
    the worker has Iceberg's reader imported already. In a child (``read_apart``, a
    service's way, #36) each start imported it afresh, about 1.8 CPU seconds a gateway:
    this package's children took 208 of them, and 10 without (2026-12-07). The tests of
    reading apart set it themselves."""
    from gateway.symbols import SymbolCatalog

    monkeypatch.setattr(SymbolCatalog, "read_apart", False)


@pytest.fixture
def gw_env(lakehouse: Settings, tmp_path: Path) -> Iterator[Settings]:
    settings = gateway_settings(lakehouse, tmp_path)
    forget_queued(settings)
    yield settings
    forget_queued(settings)


def forget_queued(settings: Settings) -> None:
    """Gateways share queued retries and Telegram sessions through PostgreSQL; one test's
    must not reach the next test's stand-ins."""
    directory = Directory(settings.sql_url()).create()
    SessionStore(directory.engine, "").create()
    with directory.engine.begin() as db:
        db.execute(sa.delete(retries))
        db.execute(sa.delete(sessions_table))
    directory.close()


@pytest.fixture
def telegram() -> Iterator[TelegramStandIn]:
    server = TelegramStandIn(BOT_TOKEN)
    yield server
    server.close()


def gw_config(telegram: TelegramStandIn | None = None, **overrides: object) -> GatewaySettings:
    base: dict[str, object] = {"secret": SECRET, "retry_poll_s": 0.1}
    if telegram is not None:
        base |= {"telegram_token": BOT_TOKEN, "telegram_api": telegram.url}
    return GatewaySettings(**(base | overrides))  # type: ignore[arg-type]


@pytest.fixture
def make_gateway() -> Iterator[Callable[..., Gateway]]:
    started: list[Gateway] = []

    def make(settings: Settings, config: GatewaySettings) -> Gateway:
        g = Gateway(settings, config, metrics=False).start()
        started.append(g)
        return g

    yield make
    for g in started:
        g.stop()


@pytest.fixture
def make_publisher(tmp_path: Path) -> Iterator[Callable[..., EventPublisher]]:
    started: list[EventPublisher] = []

    def make(settings: Settings, gateways: list[str] | None = None, **kw: object) -> EventPublisher:
        name = f"pending-{len(started)}.db"
        pub = EventPublisher(settings, gateways=gateways, journal=tmp_path / name, **kw).start()  # type: ignore[arg-type]
        started.append(pub)
        return pub

    yield make
    for p in started:
        p.close()


@pytest.fixture
def market(gw_env, ctx):
    """A relay, and a stream-processor PUB behind it."""
    relay = Relay(gw_env, metrics=False).start()
    pub = FakePublisher(ctx, gw_env.bind("stream_pub"))
    yield pub
    pub.close()
    relay.stop()


def sign_in(settings: Settings, user: str, **kw: object) -> ClientConnection:
    return open_session(settings, user, issue_token(SECRET, user), **kw)


def next_of(ws: ClientConnection, kind: str, timeout: float = 10.0) -> dict:
    """The next message of a type, skipping others (candles, pongs)."""
    deadline = time.monotonic() + timeout
    while True:
        msg = json.loads(ws.recv(timeout=max(0.01, deadline - time.monotonic())))
        if msg["type"] == kind:
            return msg


def spawn_gateway(
    settings: Settings, telegram_url: str, extra_env: dict[str, str] | None = None
) -> subprocess.Popen:
    return testing.spawn_gateway(settings, SECRET, BOT_TOKEN, telegram_url, extra_env)


class Container:
    """A user container's DEALER, sending events by hand to see each ack."""

    def __init__(
        self, endpoint: str, settings: Settings | None = None, key: str | None = None
    ) -> None:
        self.ctx = zmq.Context()
        self.sock = self.ctx.socket(zmq.DEALER)
        if settings is not None:
            dial(self.sock, settings, "gateway", key)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.connect(endpoint)

    def send(self, event: ev.UserEvent, timeout: float = 10.0) -> ev.EventAck:
        self.sock.send_multipart([b"", *encode(event)])
        assert self.sock.poll(int(timeout * 1000)), "no ack"
        frames = self.sock.recv_multipart()
        return expect(decode(frames[1:]), ev.EventAck)

    def close(self) -> None:
        self.sock.close()
        self.ctx.term()


@pytest.fixture
def container():
    made: list[Container] = []

    def make(settings: Settings, key: str | None = None) -> Container:
        made.append(Container(settings.connect("critical_events"), settings, key))
        return made[-1]

    yield make
    for c in made:
        c.close()
