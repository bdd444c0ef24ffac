"""Order of positions in a sequenced live stream, for the client and the journal service.

Within an epoch, ``seq`` counts each topic's messages without holes, so the next message is
known exactly. Across epochs (the stream processor restarted and replays what its commits
had not covered), ticks are ordered by the Kafka record they came from: a ticker's ticks
share one partition of ``candlewire.ticks``, so ``source_offset`` only grows, and a replayed
tick has the offset it had before. Other messages are ordered by (epoch, seq).
"""

from __future__ import annotations

from proto.market_pb2 import StreamPosition


def by_source(pos: StreamPosition) -> bool:
    """Whether ``pos`` carries its Kafka source offset (ticks do, candles do not)."""
    return pos.source_offset >= 0


def is_after(pos: StreamPosition, last: StreamPosition | None) -> bool:
    """Whether ``pos`` comes after ``last`` (None: before everything)."""
    if last is None:
        return True
    if by_source(pos) and by_source(last):
        return pos.source_offset > last.source_offset
    return (pos.epoch, pos.seq) > (last.epoch, last.seq)


def is_next(pos: StreamPosition, last: StreamPosition | None) -> bool:
    """Whether ``pos`` is the very next message after ``last``, with nothing between."""
    return last is not None and pos.epoch == last.epoch and pos.seq == last.seq + 1


def describe(pos: StreamPosition | None) -> str:
    """``pos`` in words, for logs and errors."""
    if pos is None:
        return "(start)"
    source = f" offset {pos.source_offset}" if by_source(pos) else ""
    return f"epoch {pos.epoch} seq {pos.seq}{source}"
