"""bench.oracle's reading of the live journal ends while the job journals on: the stack's
own feeds and idle marks share its partitions, and a read that waited for a quiet second
held ``bench.stream`` for good once (2026-12-07)."""

from __future__ import annotations

import threading
import time
from decimal import Decimal

from confluent_kafka import Producer

from bench.oracle import Journal
from candlewire.config import Settings
from candlewire.kafka import JOURNAL, ensure_topics, journal_partition, producer_config
from candlewire.topics import market_data_topic
from proto import journal_pb2 as jr
from proto import market_pb2
from proto.envelope import to_record


def test_the_journal_is_read_to_its_end_while_other_feeds_journal_on(
    platform_settings: Settings, kafka
) -> None:
    ensure_topics(platform_settings)
    ticker = f"BENCH:J{time.monotonic_ns()}/USDT"  # fresh in the session's journal
    topic = market_data_topic(ticker, "ohlc:60")
    part = journal_partition(topic)
    producer = Producer(producer_config(platform_settings))
    candle = market_pb2.OHLC(
        ticker=ticker, period_s=60, open_time_ms=60_000, open="1", high="2", low="1",
        close="2", volume="3", trade_count=2,
    )  # fmt: skip
    record = to_record(jr.JournalBatch(topic=topic, candles=[candle]))
    producer.produce(JOURNAL.name, record, key=topic.encode(), partition=part)
    producer.flush(10)
    stop = threading.Event()

    def journal_on() -> None:  # another feed of the same partition, never quiet for 1 s
        other = to_record(jr.JournalBatch(topic="OTHER:X/Y|tick"))
        while not stop.is_set():
            producer.produce(JOURNAL.name, other, key=b"OTHER:X/Y|tick", partition=part)
            producer.poll(0)
            time.sleep(0.05)

    flood = threading.Thread(target=journal_on, daemon=True)
    flood.start()
    journal = Journal(platform_settings, [ticker])
    reader = threading.Thread(target=journal.read, daemon=True)
    try:
        reader.start()
        reader.join(30)
        assert not reader.is_alive(), "the read never ended"
        want = (60_000, *map(Decimal, ("1", "2", "1", "2", "3")), 2)
        assert journal.rows(ticker)[60] == [want]
    finally:
        stop.set()
        flood.join()
        reader.join(5)
        if not reader.is_alive():
            journal.close()
        producer.flush(10)
