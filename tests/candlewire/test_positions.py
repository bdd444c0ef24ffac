"""Sequencing, without sockets: what a subscription does with each position it sees."""

from __future__ import annotations

from candlewire._protocol import Sequence, Verdict
from candlewire.positions import is_after, is_next
from proto.market_pb2 import OHLC, StreamPosition


def tick(epoch: int, seq: int, offset: int) -> StreamPosition:
    return StreamPosition(epoch=epoch, seq=seq, source_offset=offset, publish_time_ms=1)


def candle(epoch: int, seq: int) -> StreamPosition:
    return StreamPosition(epoch=epoch, seq=seq, source_offset=-1, publish_time_ms=1)


def test_within_an_epoch_the_next_seq_is_the_only_next() -> None:
    assert is_next(candle(5, 8), candle(5, 7))
    assert not is_next(candle(5, 9), candle(5, 7))
    assert not is_next(candle(6, 8), candle(5, 7))  # a new run: not known to follow


def test_ticks_order_by_their_kafka_offset_across_epochs() -> None:
    last = tick(5, 100, 1_000)
    assert not is_after(tick(6, 1, 990), last)  # the new run replays what we have
    assert is_after(tick(6, 30, 1_001), last)
    assert is_after(candle(6, 1), candle(5, 999))


def test_a_subscription_takes_the_next_drops_repeats_and_fills_gaps() -> None:
    seq = Sequence("X|tick")
    assert seq.judge(tick(1, 1, 10)) is Verdict.NEXT  # no `since`: start with the first
    seq.take(tick(1, 1, 10))
    assert seq.judge(tick(1, 2, 11)) is Verdict.NEXT
    seq.take(tick(1, 2, 11))
    assert seq.judge(tick(1, 2, 11)) is Verdict.DUPLICATE
    assert seq.judge(tick(1, 4, 15)) is Verdict.GAP
    assert seq.judge(tick(2, 1, 9)) is Verdict.DUPLICATE  # a replay after a restart
    assert seq.judge(tick(2, 9, 12)) is Verdict.GAP  # new epoch: ask the journal
    assert seq.behind(tick(1, 3, 13)) and not seq.behind(tick(1, 2, 11))
    assert seq.stats.duplicates == 2 and seq.stats.heads == 2


def test_a_late_joiner_checks_its_first_live_message_against_the_journal() -> None:
    seq = Sequence("X|tick", since_ms=1)
    assert seq.judge(tick(1, 50, 60)) is Verdict.GAP
    # Published before ``since``: not asked for, and no FETCH from ``since`` brings it.
    assert Sequence("X|tick", since_ms=2).judge(tick(1, 50, 60)) is Verdict.EARLY
    seq.since_ms = 1_000
    req = seq.request(until=tick(1, 50, 60), cursor=0, request_id="r")
    assert req.since_ms == 1_000 and not req.HasField("after") and req.until.seq == 50
    seq.take(tick(1, 49, 59))
    req = seq.request(until=None, cursor=7, request_id="r")
    assert req.after.seq == 49 and req.cursor == 7 and not req.HasField("until")


def test_the_positions_a_chunk_skips_are_counted_lost() -> None:
    # The publisher publishes live when a journal write fails: that message is in no chunk,
    # and a replay or a gap's fill went past it without a word.
    seq = Sequence("X|ohlc:60")
    seq.take(candle(1, 3))
    chunk = [OHLC(stream=candle(1, s)) for s in (4, 5, 9, 10)]  # 6, 7 and 8 never journalled
    assert seq.accept_chunk(chunk, filled=True) == chunk
    assert seq.stats.lost == 3
    assert seq.accept_edges(candle(1, 12), candle(1, 14), 3, filled=True)  # 11 skipped
    assert seq.stats.lost == 4
    assert seq.accept_edges(candle(2, 1), candle(2, 2), 2, filled=True)  # a new epoch
    assert seq.stats.lost == 4 and seq.stats.delivered == 1 + 4 + 3 + 2
