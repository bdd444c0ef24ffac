"""KafkaSink reports records that could not be delivered (reports come for failures only)."""

from __future__ import annotations

import weakref

import pytest

from candlewire.kafka import TICKS
from ingest.sink import KafkaSink, SinkError
from proto import market_pb2


def test_undeliverable_records_fail_the_flush(settings) -> None:
    # No broker listens on this settings' Kafka port; records time out in librdkafka.
    sink = KafkaSink(
        settings, **{"message.timeout.ms": 300, "socket.connection.setup.timeout.ms": 1000}
    )
    for i in range(3):
        sink.send(
            TICKS.name, "SIM:BTC/USDT", market_pb2.Tick(ticker="SIM:BTC/USDT", trade_id=str(i))
        )
    with pytest.raises(SinkError, match=r"3 records failed: .*timed out"):
        sink.flush(10)
    ref = weakref.ref(sink)
    del sink
    assert ref() is None  # nothing keeps the producer (and its reconnect attempts) alive
