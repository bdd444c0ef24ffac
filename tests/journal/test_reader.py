"""Taking a journal record's messages for a FETCH: whole runs, and runs at an edge."""

from __future__ import annotations

from journal.reader import take
from proto import journal_pb2 as jr
from proto import market_pb2
from proto.envelope import from_record, to_record


def run(epoch: int, first_seq: int, offsets: list[int], at_ms: int = 1) -> jr.JournalBatch:
    records = []
    for i, o in enumerate(offsets):
        pos = market_pb2.StreamPosition(
            epoch=epoch, seq=first_seq + i, source_offset=o, publish_time_ms=at_ms
        )
        records.append(to_record(market_pb2.Tick(ticker="X", trade_id=str(o), stream=pos)))
    first, last = (from_record(records[i]).stream for i in (0, -1))
    return jr.JournalBatch(topic="X|tick", first=first, last=last, records=records)


def offsets(out: list[bytes]) -> list[int]:
    return [from_record(r).stream.source_offset for r in out]


def test_a_run_inside_the_range_is_taken_whole() -> None:
    out: list[bytes] = []
    last, done = take(run(1, 1, [10, 11, 12]), None, None, 0, out)
    assert offsets(out) == [10, 11, 12] and last.seq == 3 and not done


def test_a_replayed_run_gives_only_what_follows_the_last_delivered() -> None:
    out: list[bytes] = []
    after = run(1, 1, [10, 11, 12]).last
    assert take(run(2, 1, [9, 10]), after, None, 0, out) == (after, False)
    last, _ = take(run(2, 3, [11, 12, 13, 14]), after, None, 0, out)
    assert offsets(out) == [13, 14] and last.epoch == 2


def test_until_stops_inside_a_run_and_since_skips_older_runs() -> None:
    out: list[bytes] = []
    until = run(1, 2, [11]).last
    last, done = take(run(1, 1, [10, 11, 12]), None, until, 0, out)
    assert offsets(out) == [10, 11] and done and last.seq == 2
    out.clear()
    assert take(run(1, 1, [10], at_ms=5), None, None, 6, out) == (None, False) and not out
