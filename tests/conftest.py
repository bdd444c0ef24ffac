from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import pytest
import zmq

from candlewire.config import Settings
from proto import requests_pb2 as rq
from relay import Relay
from tests.support import FakePublisher, free_settings, serve_pipeline


@pytest.fixture
def settings(tmp_path) -> Settings:
    return free_settings(tmp_path)


@pytest.fixture
def ctx() -> Iterator[zmq.Context]:
    ctx = zmq.Context()
    yield ctx
    ctx.destroy(linger=0)


@pytest.fixture
def relay(settings: Settings) -> Iterator[Relay]:
    r = Relay(settings).start()
    yield r
    r.stop()


@pytest.fixture
def publisher(ctx: zmq.Context, settings: Settings) -> Iterator[FakePublisher]:
    pub = FakePublisher(ctx, settings.bind("stream_pub"))
    yield pub
    pub.close()


@pytest.fixture
def pipeline(ctx, settings, publisher, relay) -> Iterator[None]:
    """A BINANCE ingestor and stream processor that answer each request once, at once."""
    stop = threading.Event()
    t = threading.Thread(
        target=serve_pipeline, args=(ctx, settings, publisher, stop, rq.HISTORY_OK, False)
    )
    t.start()
    time.sleep(0.2)  # the fake ingestor's subscription reaches the relay
    yield
    stop.set()
    t.join()
