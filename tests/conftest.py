from __future__ import annotations

from collections.abc import Iterator

import pytest
import zmq

from candlewire.config import Settings
from relay import Relay
from tests.support import FakePublisher, free_settings


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
