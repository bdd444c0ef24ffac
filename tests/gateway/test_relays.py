"""A gateway given several relays hears candles through each and draws each once; when a
relay dies the chart goes on through the other."""

from __future__ import annotations

import time
import uuid

from candlewire.topics import market_data_topic, ohlc_type
from proto import market_pb2
from relay import Relay
from tests.gateway.conftest import gw_config, next_of, sign_in
from tests.gateway.test_metadata import chart, maybe_next, publish_until
from tests.support import FakePublisher, wait_for

A, B = "127.0.0.1", "127.0.0.2"


def candle(ticker: str, seq: int) -> market_pb2.OHLC:
    return market_pb2.OHLC(
        ticker=ticker,
        period_s=60,
        open_time_ms=1_700_000_000_000 + seq * 60_000,
        stream=market_pb2.StreamPosition(epoch=7, seq=seq),
    )


def drawn(ws, count: int = 0) -> list[int]:
    """The next ``count`` candles drawn (waiting up to 30 s each), then any more that follow."""
    got = [next_of(ws, "candle", timeout=30)["t"] for _ in range(count)]
    time.sleep(0.5)  # room for a copy drawn twice to show
    while (msg := maybe_next(ws, "candle")) is not None:
        got.append(msg["t"])
    return got


def test_each_candle_drawn_once_through_two_relays_and_on_after_one_dies(
    gw_env, ctx, make_gateway
) -> None:
    every = gw_env.model_copy(update={"relay_hosts": [A, B]})
    a = Relay(every, metrics=False).start()
    b = Relay(every.model_copy(update={"host": B, "bind_host": B}), metrics=False).start()
    pub = FakePublisher(ctx, every.bind("stream_pub"))  # each relay dials its own host's
    pub.sock.bind(f"tcp://{B}:{every.port('stream_pub')}")
    try:
        make_gateway(every, gw_config())
        ticker = f"GW{uuid.uuid4().hex[:6].upper()}:BAR/USD"
        topic = market_data_topic(ticker, ohlc_type(60))
        ws = sign_in(every, "relays-" + uuid.uuid4().hex[:6])
        chart(ws, ticker, 60)
        publish_until(pub, topic, candle(ticker, 1), lambda: maybe_next(ws, "candle"))
        wait_for(lambda: a._watched.watched(ticker) and b._watched.watched(ticker), 30)
        time.sleep(0.5)  # both relays' paths are up: what the first took, the second has too
        drawn(ws)
        for seq in range(2, 12):
            pub.publish(topic, candle(ticker, seq))
        assert drawn(ws, 10) == [candle(ticker, s).open_time_ms for s in range(2, 12)]
        a.stop()
        for seq in range(12, 22):
            pub.publish(topic, candle(ticker, seq))
        assert drawn(ws, 10) == [candle(ticker, s).open_time_ms for s in range(12, 22)]
        ws.close()
    finally:
        pub.close()
        b.stop()
        a.stop()
