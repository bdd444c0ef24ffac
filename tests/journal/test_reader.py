"""Taking a journal record's messages for a FETCH: whole runs, and runs at an edge."""

from __future__ import annotations

from journal.reader import Cursor, take
from proto import journal_pb2 as jr
from proto import market_pb2
from proto.envelope import decode, encode_with, expect


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


def runs(out: list[bytes]) -> list[jr.JournalBatch]:
    return [jr.JournalBatch.FromString(r) for r in out]


def offsets(out: list[bytes]) -> list[int]:
    return [t.stream.source_offset for r in runs(out) for t in r.ticks]


def test_a_run_inside_the_range_is_taken_whole() -> None:
    out: list[bytes] = []
    last, done, n = take(run(1, 1, [10, 11, 12]), None, None, 0, out)
    assert offsets(out) == [10, 11, 12] and last.seq == 3 and not done and n == 3
    whole = run(1, 4, [13, 14])
    as_read = whole.SerializeToString()
    assert take(whole, last, None, 0, out, as_read)[2] == 2
    assert out[-1] is as_read  # passed on as they are, not serialized again


def test_a_run_not_in_its_own_encoding_is_written_anew() -> None:
    """A field twice (the decoder keeps the last) is passed on once, so a reader of the
    wire sees what the decoder sees."""
    whole = run(1, 1, [10, 11])
    as_read = whole.SerializeToString() + jr.JournalBatch(topic="Y|tick").SerializeToString()
    out: list[bytes] = []
    take(jr.JournalBatch.FromString(as_read), None, None, 0, out, as_read)
    assert out[0] != as_read and jr.JournalBatch.FromString(out[0]).topic == "Y|tick"
    assert len(out[0]) == jr.JournalBatch.FromString(as_read).ByteSize()


def test_a_reply_carries_its_runs_as_bytes_after_its_own() -> None:
    reply = jr.FetchReply(request_id="f", status=jr.FETCH_OK, cursor=9)
    reply.runs.add(topic="X|tick")  # from the archive: its own runs come first
    more = [run(1, 1, [10, 11]).SerializeToString(), run(1, 3, [12]).SerializeToString()]
    got = expect(decode(encode_with(reply, "runs", more)), jr.FetchReply)
    assert (got.request_id, got.cursor) == ("f", 9)
    assert [[t.stream.source_offset for t in r.ticks] for r in got.runs] == [[], [10, 11], [12]]


def test_a_replayed_run_gives_only_what_follows_the_last_delivered() -> None:
    out = []
    after = run(1, 1, [10, 11, 12]).last
    assert take(run(2, 1, [9, 10]), after, None, 0, out) == (after, False, 0)
    last, _, n = take(run(2, 3, [11, 12, 13, 14]), after, None, 0, out)
    assert offsets(out) == [13, 14] and last.epoch == 2 and n == 2
    cut = runs(out)[0]
    assert (cut.first.source_offset, cut.last.source_offset) == (13, 14)


def test_until_stops_inside_a_run_and_since_skips_older_runs() -> None:
    out = []
    until = run(1, 2, [11]).last
    last, done, _ = take(run(1, 1, [10, 11, 12]), None, until, 0, out)
    assert offsets(out) == [10, 11] and done and last.seq == 2
    out = []
    assert take(run(1, 1, [10], at_ms=5), None, None, 6, out) == (None, False, 0)
    assert not out


class FakeConsumer:
    """consume() as librdkafka's: up to ``n`` of what is fetched, waiting (here: taking the
    next fetch's records) only when ``timeout`` allows."""

    def __init__(self, fetches: list[list[int]]) -> None:
        self.fetches, self.queued, self.calls = fetches, [], []

    def consume(self, n: int, timeout: float) -> list[int]:
        self.calls.append((n, timeout))
        if timeout and not self.queued and self.fetches:
            self.queued = self.fetches.pop(0)
        got, self.queued = self.queued[:n], self.queued[n:]
        return got


def test_a_read_takes_what_is_fetched_and_waits_only_for_a_first_record() -> None:
    """librdkafka's consume() waits for all ``n`` records or the timeout: a new reader's
    first read waited for the whole partition to arrive (#35)."""
    consumer = FakeConsumer([[1, 2, 3], [4, 5]])
    cursor = Cursor(consumer, 1)  # type: ignore[arg-type]
    assert cursor.read(100) == [1, 2, 3]
    assert consumer.calls == [(100, 0), (1, 0.2), (99, 0)]
    assert cursor.read(1) == [4] and cursor.read(100) == [5] and cursor.read(100) == []
    cursor.pending = [7, 8]
    assert cursor.read(100) == [7, 8] and cursor.pending == []
