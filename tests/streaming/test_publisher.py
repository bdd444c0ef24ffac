"""The publisher's positions, without sockets."""

from __future__ import annotations

import time

from proto import market_pb2
from proto.envelope import from_record, to_record
from streaming.publisher import Sequencer, StreamPublisher


def test_each_topic_counts_from_one_without_holes() -> None:
    seq = Sequencer(epoch=7)
    a = [seq.next(b"A|tick", 1, 0, o).seq for o in range(3)]
    b = [seq.next(b"B|ohlc:60", 2).seq for _ in range(2)]
    assert a == [1, 2, 3] and b == [1, 2]
    assert seq.last[b"A|tick"].source_offset == 2 and seq.last[b"B|ohlc:60"].source_offset == -1
    heads = {h.topic: h.last.seq for h in seq.heads()}
    assert heads == {"A|tick": 3, "B|ohlc:60": 2}


def test_quiet_topics_get_no_more_heads_but_keep_counting() -> None:
    seq = Sequencer(epoch=7)
    seq.next(b"A|ohlc:60", 1)
    seq.next(b"A|ohlc:60", 1)
    seq._seen_at[b"A|ohlc:60"] = time.monotonic() - 700
    seq.next(b"B|tick", 1)
    assert [h.topic for h in seq.heads(active_s=600)] == ["B|tick"]
    # A candle topic is ordered by seq alone: starting again at 1 would look like a repeat.
    assert seq.next(b"A|ohlc:60", 1).seq == 3


def test_a_journal_record_holds_its_run_typed_with_first_and_last() -> None:
    seq = Sequencer(epoch=7)
    records = []
    for offset in (40, 41, 45):
        pos = seq.next(b"A|tick", 1, 0, offset)
        tick = market_pb2.Tick(ticker="A", trade_id=str(offset))
        records.append(to_record(tick) + market_pb2.Tick(stream=pos).SerializeToString())
    batch = from_record(StreamPublisher._batch(b"A|tick", records[1:]))
    assert (batch.first.seq, batch.last.seq) == (2, 3)
    assert (batch.first.source_offset, batch.last.source_offset) == (41, 45)
    assert [t.trade_id for t in batch.ticks] == ["41", "45"] and not batch.candles
