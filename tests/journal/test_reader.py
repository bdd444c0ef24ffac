"""Taking a journal record's messages for a FETCH: whole runs, and runs at an edge."""

from __future__ import annotations

from journal.reader import take
from proto import journal_pb2 as jr
from proto import market_pb2


def run(epoch: int, first_seq: int, offsets: list[int], at_ms: int = 1) -> jr.JournalBatch:
    out = jr.JournalBatch(topic="X|tick")
    for i, o in enumerate(offsets):
        pos = market_pb2.StreamPosition(
            epoch=epoch, seq=first_seq + i, source_offset=o, publish_time_ms=at_ms
        )
        out.ticks.add(ticker="X", trade_id=str(o), stream=pos)
    out.first.CopyFrom(out.ticks[0].stream)
    out.last.CopyFrom(out.ticks[-1].stream)
    return out


def offsets(out: jr.FetchReply) -> list[int]:
    return [t.stream.source_offset for r in out.runs for t in r.ticks]


def test_a_run_inside_the_range_is_taken_whole() -> None:
    out = jr.FetchReply()
    last, done, n = take(run(1, 1, [10, 11, 12]), None, None, 0, out)
    assert offsets(out) == [10, 11, 12] and last.seq == 3 and not done and n == 3


def test_a_replayed_run_gives_only_what_follows_the_last_delivered() -> None:
    out = jr.FetchReply()
    after = run(1, 1, [10, 11, 12]).last
    assert take(run(2, 1, [9, 10]), after, None, 0, out) == (after, False, 0)
    last, _, n = take(run(2, 3, [11, 12, 13, 14]), after, None, 0, out)
    assert offsets(out) == [13, 14] and last.epoch == 2 and n == 2
    assert (out.runs[0].first.source_offset, out.runs[0].last.source_offset) == (13, 14)


def test_until_stops_inside_a_run_and_since_skips_older_runs() -> None:
    out = jr.FetchReply()
    until = run(1, 2, [11]).last
    last, done, _ = take(run(1, 1, [10, 11, 12]), None, until, 0, out)
    assert offsets(out) == [10, 11] and done and last.seq == 2
    out = jr.FetchReply()
    assert take(run(1, 1, [10], at_ms=5), None, None, 6, out) == (None, False, 0)
    assert not out.runs
