"""Order of positions in a sequenced live stream, for the client and the journal service.

Within an epoch, ``seq`` counts each topic's messages without holes, so the next message is
known exactly. Across epochs (the stream processor restarted and replays what its commits
had not covered), ticks are ordered by the Kafka record they came from: a ticker's ticks
share one partition of ``candlewire.ticks``, so ``source_offset`` only grows, and a replayed
tick has the offset it had before. Other messages are ordered by (epoch, seq).
"""

from __future__ import annotations

from collections.abc import Sequence

from google.protobuf.message import Message

from candlewire.topics import book_type, tick_type
from proto import book_pb2, market_pb2
from proto import journal_pb2 as jr
from proto.market_pb2 import StreamPosition

# Which repeated field of a JournalBatch holds each sequenced message type.
RUN_FIELDS: dict[type[Message], str] = {
    market_pb2.Tick: "ticks",
    market_pb2.OHLC: "candles",
    book_pb2.BookDelta: "book_deltas",
    book_pb2.BookSnapshot: "book_snapshots",
}


# The fields each kind of topic's runs leave empty: a kind is a data type, every
# ``ohlc:{period}`` one kind.
_EMPTY_FIELDS = {
    kind: tuple(f for f in RUN_FIELDS.values() if f not in held)
    for kind, held in (
        (tick_type(), ("ticks",)),
        (book_type(), ("book_deltas", "book_snapshots")),
        ("ohlc", ("candles",)),
    )
}


def run_fits(run: jr.JournalBatch, topic: str) -> bool:
    """Whether a journal run is one of ``topic``'s: that topic, and messages only in the
    field(s) its type goes in. Anything else (a broken writer's run) is no part of the
    topic's stream: the journal serves none of it and a reader drops and counts it. Read
    as they were, its messages reached a tick subscriber as candles, or ended the
    subscription as Arrow found no price in a candle, and a run with ticks and candles
    lost its candles without a word (:func:`run_items` reads one field)."""
    if run.topic != topic:
        return False
    data_type = topic.rpartition("|")[2]
    empty = _EMPTY_FIELDS.get("ohlc" if data_type.startswith("ohlc:") else data_type)
    return empty is not None and not any(getattr(run, f) for f in empty)


def run_size(run: jr.JournalBatch) -> int:
    """How many messages a run holds, in every field."""
    return sum(len(getattr(run, f)) for f in RUN_FIELDS.values())


def run_items(run: jr.JournalBatch) -> Sequence[Message]:
    """A journal run's messages in position order. A run holds one topic's messages, so one
    field, except a book run: its snapshots and deltas are merged back by seq (one run is
    one publisher's, so one epoch)."""
    if run.ticks:
        return run.ticks
    if run.candles:
        return run.candles
    if run.book_snapshots and run.book_deltas:
        return sorted([*run.book_snapshots, *run.book_deltas], key=_seq)
    return run.book_deltas or run.book_snapshots


def add_items(run: jr.JournalBatch, items: Sequence[Message]) -> None:
    """Put messages into the run's fields, in order (what :func:`run_items` reads back).
    Ticks and candles each fill a run of their own, in one call; only a book run mixes
    two types."""
    if not items:
        return
    kind = type(items[0])
    if kind is market_pb2.Tick or kind is market_pb2.OHLC:
        getattr(run, RUN_FIELDS[kind]).extend(items)
        return
    for item in items:
        getattr(run, RUN_FIELDS[type(item)]).append(item)


def _seq(msg: Message) -> int:
    return msg.stream.seq  # type: ignore[attr-defined]


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
