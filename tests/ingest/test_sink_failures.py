"""KafkaSink reports records that could not be delivered (reports come for failures only)."""

from __future__ import annotations

import time
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


def test_a_full_queue_holds_the_sender_back_until_there_is_room(settings) -> None:
    # A queue of two: the third send waits for the first records to leave it (here by timing
    # out, with no broker), and then goes in; nothing is dropped and nothing raises early.
    sink = KafkaSink(
        settings,
        **{
            "queue.buffering.max.messages": 2,
            "message.timeout.ms": 300,
            "socket.connection.setup.timeout.ms": 1000,
        },
    )
    started = time.monotonic()
    for i in range(5):
        sink.send(TICKS.name, f"SIM:T{i}/USDT", market_pb2.Tick(trade_id=str(i)))
    assert time.monotonic() - started >= 0.3  # it waited at least one record's timeout
    with pytest.raises(SinkError, match=r"5 records failed"):
        sink.flush(10)
