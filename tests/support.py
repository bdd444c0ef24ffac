"""Helpers that play the other roles around the relay in tests: ingestors and publishers."""

from __future__ import annotations

import socket
import time
from collections.abc import Callable

import zmq
from google.protobuf.message import Message

from candlewire.config import Settings
from candlewire.endpoints import ENDPOINTS
from proto.envelope import decode_sub, encode_topic


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def free_settings(tmp_path: object, **overrides: object) -> Settings:
    """Settings with every endpoint on its own free port, state under tmp_path."""
    return Settings(
        ports={name: free_port() for name in ENDPOINTS},
        state_dir=tmp_path,  # type: ignore[arg-type]
        **overrides,  # type: ignore[arg-type]
    )


def wait_for(
    predicate: Callable[[], object], timeout: float = 10.0, interval: float = 0.02
) -> object:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"condition not met within {timeout}s: {predicate}")


class FakeIngestor:
    """An ingestor's work-queue side: SUB with exchange prefixes."""

    def __init__(self, ctx: zmq.Context, settings: Settings, prefixes: list[str]) -> None:
        self.sock = ctx.socket(zmq.SUB)
        self.sock.setsockopt(zmq.LINGER, 0)
        for p in prefixes:
            self.sock.subscribe(p)
        self.sock.connect(settings.connect("work_queue"))

    def recv(self, timeout: float = 5.0) -> tuple[str, Message] | None:
        if not self.sock.poll(int(timeout * 1000)):
            return None
        return decode_sub(self.sock.recv_multipart())

    def close(self) -> None:
        self.sock.close()


class FakePublisher:
    """The stream processor's publishing side: PUB bound where the relay's XSUB connects."""

    def __init__(self, ctx: zmq.Context, endpoint: str, bind: bool = True) -> None:
        self.sock = ctx.socket(zmq.PUB)
        self.sock.setsockopt(zmq.LINGER, 0)
        if bind:
            self.sock.bind(endpoint)
        else:
            self.sock.connect(endpoint)

    def publish(self, topic: str, msg: Message) -> None:
        self.sock.send_multipart(encode_topic(topic, msg))

    def close(self) -> None:
        self.sock.close()
