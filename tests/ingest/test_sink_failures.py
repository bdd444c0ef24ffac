"""KafkaSink reports records that could not be delivered (reports come for failures only),
and writes a run of trades as it writes each trade."""

from __future__ import annotations

import time
import weakref

import pytest

from candlewire.config import Settings
from candlewire.kafka import TICKS
from ingest.exchanges.base import TradeRun
from ingest.exchanges.sim import GENESIS_MS, MINUTE_MS, SimExchange
from ingest.jobs import run_history, run_metadata
from ingest.service import Ingestor
from ingest.sink import KafkaSink, SinkError
from proto import market_pb2
from proto.envelope import from_record
from tests.support import RecordingSink, history_work, new_topic


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


def test_an_outage_that_ended_fails_no_later_flush(broker_settings: Settings) -> None:
    # Records the broker refused (here: to a topic that does not exist) fail the flush that
    # covers them and stay counted, but a job that begins after is judged by its own records.
    # Before, the failures were kept for the sink's life and every later history job,
    # metadata refresh and gap repair of the ingestor failed.
    sink = KafkaSink(broker_settings, **{"message.timeout.ms": 1000})
    for i in range(3):
        sink.send("candlewire.no-such-topic", "k", market_pb2.Tick(trade_id=str(i)))
    with pytest.raises(SinkError, match=r"3 records failed"):
        sink.flush(10)
    mark, topic = sink.failures, new_topic(broker_settings)
    for i in range(3):
        sink.send(topic, "k", market_pb2.Tick(trade_id=str(i)))
    sink.flush(10, since=mark)
    assert sink.failures == mark == 3
    with pytest.raises(SinkError, match=r"3 records failed"):
        sink.flush(10)  # over the sink's whole life


HISTORY = history_work("SIM:BTC/USDT", 60, GENESIS_MS, GENESIS_MS + 10 * MINUTE_MS)


def test_jobs_are_judged_by_failures_after_they_began() -> None:
    sink = RecordingSink(failed_before=3)
    assert run_history(HISTORY, SimExchange(), sink, "ing-test") == 10  # type: ignore[arg-type]
    assert run_metadata(HISTORY, SimExchange(), sink) > 0  # type: ignore[arg-type]


def test_stopping_an_ingestor_delivers_what_it_queued(broker_settings: Settings) -> None:
    # A live stream's trades exist nowhere else once taken from the venue: stop() waits for
    # Kafka to acknowledge them instead of dropping librdkafka's queue with the process.
    ing = Ingestor(broker_settings, [SimExchange()], metrics=False)
    producer, topic = ing._sink._producer, new_topic(broker_settings)
    for i in range(1000):
        ing._sink.send(topic, "SIM:STOP/USDT", market_pb2.Tick(trade_id=str(i)))
    assert len(producer) > 0  # still queued or in flight
    ing.stop()
    assert len(producer) == 0 and ing._sink.failures == 0


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


def test_a_run_of_trades_is_written_as_each_of_its_ticks_would_be_in_order(settings) -> None:
    # Every odd-looking value a Tick carries: an unset side, zero times, empty texts, a
    # ticker beyond ASCII; and a queue that refuses now and then (the back-pressure path).
    sink = KafkaSink(settings, **{"message.timeout.ms": 300})
    run = TradeRun(
        "SIM:ÉTH/USDT",
        ["1", "", "3", "9" * 30],
        ["1.5", "0", "", "123456789.123456789"],
        ["2", "", "0.0001", "7"],
        [market_pb2.BUY, 0, market_pb2.SELL, 0],
        [1, 0, 2**62, 5],
        ingest_time_ns=42,
    )
    records: list[tuple[str, bytes, bytes]] = []
    refusals = iter([False, True, False, True, True, False] * 4)

    def produce(topic: str, value: bytes, key: bytes) -> None:
        if next(refusals):
            raise BufferError("queue full")
        records.append((topic, value, key))

    sink._produce = produce  # type: ignore[method-assign]
    sink.send_trades(TICKS.name, run.ticker, run)
    by_run, records[:] = list(records), []
    for tick in run.ticks():
        sink.send(TICKS.name, run.ticker, tick)
    assert by_run == records and len(records) == len(run)
    assert [from_record(v) for _, v, _ in records] == run.ticks()
    assert sink._sent == 2 * len(run)


def test_a_run_with_columns_of_different_lengths_is_refused() -> None:
    with pytest.raises(ValueError, match="differ in length"):
        TradeRun("SIM:BTC/USDT", ["1", "2"], ["1", "2"], ["1"], [0, 0], [1, 2])


def test_the_ingestors_records_wait_out_any_outage(settings) -> None:
    """librdkafka gave a record up after 5 minutes: the trades of a longer outage were lost
    with no gap recorded (the stream had seen each one). The ingestor's never expire."""
    assert KafkaSink(settings).message_timeout_ms == 0
    assert KafkaSink(settings, **{"message.timeout.ms": 300}).message_timeout_ms == 300
