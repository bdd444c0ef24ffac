"""Level-2 order books (#38): one book, and the one judgement of which update comes next.

Sans-I/O, like :mod:`candlewire.market`: the ingestor runs :class:`BookSync` on a venue's
updates before anything reaches Kafka, and the client runs the same class on a live
stream's, so "apply, drop as stale, or ask for a fresh snapshot" is decided in one place.

The rule, for a delta numbered ``venue_seq`` whose predecessor is ``prev_seq`` (``venue_seq
- 1`` when the venue sends none), on a book that includes every update up to ``seq``:

- ``venue_seq <= seq``: already in the book (a repeat, or older than the snapshot): dropped;
- ``prev_seq > seq``: an update between them is missing: the book is no longer trusted;
- otherwise applied. ``prev_seq < seq`` is an overlap, as venues that number a delta by its
  first and last update send right after a snapshot; levels carry absolute sizes, so
  applying it again is exact.

After applying, a venue checksum (when the delta has one and the venue's formula is known)
must equal the book's; a mismatch untrusts the book too. An untrusted book applies nothing
until the next snapshot: its deltas wait in a bounded buffer, and those newer than the
snapshot are applied on top of it, which is what closes the seam between a REST snapshot
and a stream already running (cryptofeed#1016, #1082).
"""

from __future__ import annotations

import enum
import time
import zlib
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from decimal import Decimal, InvalidOperation
from itertools import chain
from operator import gt, le

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.message import DecodeError, Message

from candlewire.amounts import PLAIN_CHARS, held
from proto import book_pb2
from proto.envelope import RUN_HEADS, sub_payloads
from proto.market_pb2 import StreamPosition

Level = tuple[Decimal, Decimal]
Checksum = Callable[["Book"], int]
BUFFER_LIMIT = 10_000  # deltas held while a book waits for its snapshot
MAX_SEQ = (1 << 63) - 1  # venue numbers beyond a signed 64-bit one (the tables' LONG) are refused
# Ingestors write a snapshot of each book at least this often, so a reader that starts this
# far back finds one: a subscriber replays the journal from there (``JOIN_LOOKBACK_S``),
# and a rebuild from Iceberg looks back as far for its snapshot.
SNAPSHOT_EVERY_S = 30.0
JOIN_LOOKBACK_S = SNAPSHOT_EVERY_S + 5.0


class BookError(ValueError):
    """A level that is no decimal price and size; the update is dropped and counted."""


Parsed = list[tuple[Decimal, str, str]]
INF = float("inf")
PRICE_CACHE = 1 << 17  # price texts kept parsed; a book's levels recur, its sizes do not
_prices: dict[str, Decimal] = {}


def _price(text: str) -> Decimal:
    """A level's price: a decimal above 0 that the tables hold (DECIMAL(38,18), as a
    trade's), parsed once per spelling."""
    try:
        price = Decimal(text) if held(text) else Decimal(-1)
    except (InvalidOperation, TypeError):
        price = Decimal(-1)
    if not price.is_finite() or price <= 0:
        raise BookError(f"level price {text!r} is no decimal above 0 that DECIMAL(38,18) holds")
    if len(_prices) >= PRICE_CACHE:
        _prices.clear()
    _prices[text] = price
    return price


def _parse(updates: Iterable[book_pb2.BookLevel]) -> Parsed:
    """Each level as (price, price text, size text); "" for a size of zero in any spelling
    ("0", "0.000"): a removal. A size is a decimal of 0 or more that the tables hold, like a
    trade's (:func:`ingest.jobs.tick_problem`); of those, a float is 0 exactly when the
    value is ("1e-400" is no such size, though its float is 0)."""
    out: Parsed = []
    append, prices, plain = out.append, _prices, PLAIN_CHARS
    for level in updates:
        price, size = level.price, level.size
        key = prices.get(price) or _price(price)
        try:
            amount = float(size)
        except ValueError:
            amount = -1.0
        # A venue's plain text (under 20 digits and points, read as a float: at most one
        # point) is held; any other is judged exactly. Inline: this runs for every level.
        if not 0.0 <= amount < INF or (
            (len(size) > 19 or size.strip(plain)) and not held(size)
        ):  # NaN fails both
            raise BookError(
                f"level {price!r} size {size!r} is no decimal of 0 or more that "
                "DECIMAL(38,18) holds"
            )
        append((key, price, size if amount else ""))
    return out


def _put(side: dict[Decimal, tuple[str, str]], levels: Parsed) -> None:
    for key, price, size in levels:
        if size:
            side[key] = (price, size)
        else:
            side.pop(key, None)


@dataclass
class Book:
    """A ticker's book as of venue update ``seq``: price → (price text, size text) per side.

    The venue's own texts are kept, because checksums are computed over them; the views
    (:meth:`bids`, :meth:`asks`) give Decimals, best first.
    """

    ticker: str
    seq: int = 0
    time_ns: int = 0
    _bids: dict[Decimal, tuple[str, str]] = field(default_factory=dict)
    _asks: dict[Decimal, tuple[str, str]] = field(default_factory=dict)
    depth: int | None = None  # the views' default depth (a subscription's ``depth=``)
    position: StreamPosition | None = None  # of the last message applied, when subscribed

    @classmethod
    def from_snapshot(cls, snap: book_pb2.BookSnapshot) -> Book:
        if snap.venue_seq > MAX_SEQ:
            raise BookError(f"venue seq {snap.venue_seq} is beyond a signed 64-bit number")
        book = cls(snap.ticker, snap.venue_seq, snap.exchange_time_ns)
        _put(book._bids, _parse(snap.bids))
        _put(book._asks, _parse(snap.asks))
        return book

    def apply(self, delta: book_pb2.BookDelta) -> None:
        """Apply unconditionally; :class:`BookSync` decides whether a delta belongs here.
        A malformed level raises BookError before the book changes."""
        bids, asks = _parse(delta.bids), _parse(delta.asks)
        _put(self._bids, bids)
        _put(self._asks, asks)
        self.seq, self.time_ns = delta.venue_seq, delta.exchange_time_ns

    def bids(self, depth: int | None = None) -> list[Level]:
        """Bid levels, highest price first; ``depth`` of them (default: the book's own)."""
        side = self._bids
        return [(p, Decimal(side[p][1])) for p in self._prices(side, True, self._depth(depth))]

    def asks(self, depth: int | None = None) -> list[Level]:
        """Ask levels, lowest price first; ``depth`` of them (default: the book's own)."""
        side = self._asks
        return [(p, Decimal(side[p][1])) for p in self._prices(side, False, self._depth(depth))]

    def _depth(self, depth: int | None) -> int | None:
        return self.depth if depth is None else depth

    def texts(self, bid: bool, depth: int | None = None) -> list[tuple[str, str]]:
        """One side's levels as the venue spelled them, best first: what checksums read."""
        side = self._bids if bid else self._asks
        return [side[p] for p in self._prices(side, bid, depth)]

    @staticmethod
    def _prices(side: dict[Decimal, tuple[str, str]], bid: bool, depth: int | None) -> list:
        prices = sorted(side, reverse=bid)
        return prices if depth is None else prices[:depth]

    def snapshot(
        self, reason: book_pb2.SnapshotReason = book_pb2.SNAPSHOT_PERIODIC
    ) -> book_pb2.BookSnapshot:
        """The whole book as a BookSnapshot, best levels first."""
        return book_pb2.BookSnapshot(
            ticker=self.ticker,
            venue_seq=self.seq,
            exchange_time_ns=self.time_ns,
            bids=[book_pb2.BookLevel(price=p, size=s) for p, s in self.texts(True)],
            asks=[book_pb2.BookLevel(price=p, size=s) for p, s in self.texts(False)],
            reason=reason,
        )

    def same_levels(self, other: Book) -> bool:
        """Equal prices and sizes on both sides, whatever the spelling."""
        return self.bids() == other.bids() and self.asks() == other.asks()


def okx_checksum(book: Book) -> int:
    """OKX's: CRC-32 of the best 25 bids and asks interleaved, ``bidPx:bidSz:askPx:askSz:…``
    (a side that runs out leaves the other's levels alone). OKX sends it signed; here it is
    unsigned, as ``BookDelta.checksum`` holds it."""
    return okx_checksum_of(book.texts(True, 25), book.texts(False, 25))


def okx_checksum_of(bids: Sequence[tuple[str, str]], asks: Sequence[tuple[str, str]]) -> int:
    """:func:`okx_checksum` of levels already sorted best first (a venue computing its own)."""
    bids, asks = bids[:25], asks[:25]
    parts: list[str] = []
    for i in range(max(len(bids), len(asks))):
        if i < len(bids):
            parts.extend(bids[i])
        if i < len(asks):
            parts.extend(asks[i])
    return zlib.crc32(":".join(parts).encode())


def _kraken_text(value: str) -> str:
    return value.replace(".", "").lstrip("0")


def kraken_checksum(book: Book) -> int:
    """Kraken's (WebSocket v1): CRC-32 of the best 10 asks then the best 10 bids, each price
    and size without its decimal point and leading zeros, concatenated."""
    text = "".join(
        _kraken_text(price) + _kraken_text(size)
        for price, size in (*book.texts(False, 10), *book.texts(True, 10))
    )
    return zlib.crc32(text.encode())


# The formula of each venue that sends a checksum, by exchange name (SIM uses OKX's).
CHECKSUMS: dict[str, Checksum] = {"OKX": okx_checksum, "KRAKEN": kraken_checksum}
CHECKSUMS["SIM"] = okx_checksum


def _renumbered(snap: book_pb2.BookSnapshot, book: Book) -> bool:
    """A snapshot at or below the book's number that is nevertheless newer: one taken as its
    stream started again (never a periodic one), after the book's last update in the venue's
    time. A venue may number its updates afresh on a reconnect; the ingestor then starts
    over from such a snapshot, and so must every reader, or it would drop the new numbers'
    deltas as repeats and later apply them onto the old book."""
    return snap.reason != book_pb2.SNAPSHOT_PERIODIC and snap.exchange_time_ns > book.time_ns > 0


class Verdict(enum.Enum):
    """What :meth:`BookSync.on_delta` did with a delta."""

    APPLIED = "applied"
    STALE = "stale"  # already in the book: a repeat, or older than its snapshot
    WAITING = "waiting"  # no trusted book yet: held for the next snapshot
    GAP = "gap"  # an update before it is missing: a new snapshot is needed
    CHECKSUM = "checksum"  # the book disagrees with the venue's checksum: a new snapshot
    MALFORMED = "malformed"  # a level that is no price and size: dropped


@dataclass
class BookSync:
    """A book kept right across snapshots and deltas; ``needs_snapshot`` says when a fresh
    one must be fetched. Counters say what happened, for metrics and tests."""

    ticker: str
    checksum: Checksum | None = None
    buffer_limit: int = BUFFER_LIMIT
    book: Book | None = None
    counts: dict[Verdict, int] = field(default_factory=lambda: dict.fromkeys(Verdict, 0))
    _held: deque[book_pb2.BookDelta] = field(default_factory=deque)

    @property
    def needs_snapshot(self) -> bool:
        return self.book is None

    def on_snapshot(self, snap: book_pb2.BookSnapshot) -> list[tuple[book_pb2.BookDelta, Verdict]]:
        """Start over from ``snap``; the held deltas newer than it are applied on top.
        Returns each held delta with its verdict (one can still show a gap). A trusted book
        that already includes ``snap`` keeps going (a snapshot published again after a
        restart, or another ingestor's older one): nothing goes backwards. A malformed
        snapshot raises BookError and leaves the book as it was."""
        book = self.book
        if book is not None and snap.venue_seq <= book.seq and not _renumbered(snap, book):
            self.counts[Verdict.STALE] += 1
            return []
        self.book = Book.from_snapshot(snap)
        held, self._held = self._held, deque()
        return [(d, self.on_delta(d)) for d in held]

    def on_delta(self, delta: book_pb2.BookDelta) -> Verdict:
        verdict = self._judge(delta)
        self.counts[verdict] += 1
        return verdict

    def _judge(self, delta: book_pb2.BookDelta) -> Verdict:
        book = self.book
        if book is None:
            if len(self._held) >= self.buffer_limit:
                self._held.popleft()  # the oldest: a snapshot will come after it anyway
            self._held.append(delta)
            return Verdict.WAITING
        if delta.venue_seq <= book.seq:
            return Verdict.STALE
        if delta.venue_seq > MAX_SEQ:
            return Verdict.MALFORMED
        prev = delta.prev_seq or delta.venue_seq - 1
        if prev > book.seq:
            self._untrust(delta)
            return Verdict.GAP
        try:
            book.apply(delta)
        except BookError:
            return Verdict.MALFORMED
        if (
            self.checksum is not None
            and delta.HasField("checksum")
            and self.checksum(book) != delta.checksum
        ):
            self.book = None  # this delta is in it, so it is not held again
            return Verdict.CHECKSUM
        return Verdict.APPLIED

    def _untrust(self, delta: book_pb2.BookDelta) -> None:
        self.book = None
        self._held.append(delta)

    def on_run(self, run: DeltaRun) -> bool:
        """Apply a run of deltas whole, when :meth:`on_delta` would find each of them
        APPLIED: the book is trusted, each venue number comes after the one before (the
        book's, for the first) with its ``prev_seq`` at or before it, no checksum is to be
        checked (every level is a price and size: :meth:`DeltaRun.read` saw to that).
        Anything else is False, and the book as it was: the caller then offers the run's
        deltas one by one (:meth:`DeltaRun.deltas`), so a run is judged by the same rule,
        only faster when all of it applies."""
        book, n, c = self.book, len(run), run.columns
        seqs, prevs = c.venue_seq, c.prev_seq
        if book is None or len(seqs) != n or (self.checksum is not None and c.checksum):
            return False
        seqs = list(seqs)
        if seqs[-1] > MAX_SEQ:
            return False
        before = [book.seq, *seqs[:-1]]  # each delta's book: the one the delta before left
        if not all(map(gt, seqs, before)):
            return False  # a repeat or an older delta: STALE, one by one
        if prevs and (len(prevs) != n or not all(map(le, prevs, before))):
            return False  # a missing update before one of them (GAP), or mixed defaults
        if not prevs and (seqs[0] != book.seq + 1 or seqs[-1] - seqs[0] != n - 1):
            return False  # no prev_seq: each is venue_seq - 1, so the numbers run on
        _put_run(book._bids, run.bids)
        _put_run(book._asks, run.asks)
        last = run.last
        book.seq, book.time_ns = last.venue_seq, last.exchange_time_ns
        self.counts[Verdict.APPLIED] += n
        return True


# A run of fewer deltas is offered one by one: its two parses and Arrow's calls cost more
# than they save. A subscriber reads at most RUN_MAX queued messages at once.
RUN_MIN = 16
RUN_MAX = 1024


def _run_types() -> tuple[type[Message], type[Message]]:
    """Two shadows of a run of BookDelta payloads, each framed as one occurrence of a
    singular message field (so each is parsed within its own bytes, as alone; the framing
    is :data:`~proto.envelope.RUN_HEADS`).

    The first, ``Columns``, has BookDelta's field numbers and types with each scalar
    repeated and each message field singular: the parser merges the occurrences, so one
    parse, in C, gives every delta's venue numbers, and every bid's (ask's) price and size
    in order, with no object per delta or level. A value at its default is not on the
    wire, so a column is whole only with one value per delta, or none. The second,
    ``Counts``, counts what the first cannot: each delta's levels (one with neither price
    nor size adds nothing to a column), and any scalar sent packed, which a repeated field
    reads but BookDelta's singular one would not. Field numbers and types come from the
    contract's descriptors."""
    F = FieldDescriptor
    file = descriptor_pb2.FileDescriptorProto(name="book_runs.proto", syntax="proto3")
    file.package = "candlewire_book_runs"
    nested = {
        book_pb2.BookLevel.DESCRIPTOR.full_name: "Levels",
        StreamPosition.DESCRIPTOR.full_name: "Position",
    }

    def add(shadow: descriptor_pb2.DescriptorProto, f: FieldDescriptor, **kw: object) -> None:
        shadow.field.add(name=f.name, number=f.number, **kw)  # type: ignore[arg-type]

    levels = file.message_type.add(name="Levels")
    for f in book_pb2.BookLevel.DESCRIPTOR.fields:
        add(levels, f, type=f.type, label=F.LABEL_REPEATED)
    position, packed = (
        file.message_type.add(name="Position"),
        file.message_type.add(name="PositionPacked"),
    )
    for f in StreamPosition.DESCRIPTOR.fields:
        add(position, f, type=f.type, label=F.LABEL_REPEATED)
        add(packed, f, type=F.TYPE_BYTES, label=F.LABEL_REPEATED)
    columns, counts = file.message_type.add(name="Columns"), file.message_type.add(name="Counts")
    for f in book_pb2.BookDelta.DESCRIPTOR.fields:
        if f.message_type is None:
            add(columns, f, type=f.type, label=F.LABEL_REPEATED)
            if f.type not in (F.TYPE_STRING, F.TYPE_BYTES):
                add(counts, f, type=F.TYPE_BYTES, label=F.LABEL_REPEATED)
        elif f.is_repeated:  # the levels: merged, and counted as their bytes
            name = f".{file.package}.{nested[f.message_type.full_name]}"
            add(columns, f, type=F.TYPE_MESSAGE, label=F.LABEL_OPTIONAL, type_name=name)
            add(counts, f, type=F.TYPE_BYTES, label=F.LABEL_REPEATED)
        else:  # the position: merged, and its scalars sent packed caught
            name = f".{file.package}.{nested[f.message_type.full_name]}"
            add(columns, f, type=F.TYPE_MESSAGE, label=F.LABEL_OPTIONAL, type_name=name)
            add(counts, f, type=F.TYPE_MESSAGE, label=F.LABEL_OPTIONAL, type_name=f"{name}Packed")
    for name in ("Columns", "Counts"):
        run = file.message_type.add(name=f"Run{name}")
        run.field.add(
            name="deltas",
            number=1,
            type=F.TYPE_MESSAGE,
            label=F.LABEL_OPTIONAL,
            type_name=f".{file.package}.{name}",
        )
    pool = descriptor_pool.DescriptorPool()
    pool.Add(file)
    get = message_factory.GetMessageClass
    run_columns, run_counts = (
        get(pool.FindMessageTypeByName(f"{file.package}.{name}"))
        for name in ("RunColumns", "RunCounts")
    )
    return run_columns, run_counts


_RUN_COLUMNS, _RUN_COUNTS = _run_types()
# Counts' fields that catch a scalar sent packed: a delta's own, and its position's.
_COUNTS = _RUN_COUNTS.DESCRIPTOR.fields_by_name["deltas"].message_type
_PACKED = tuple(
    f.name
    for f in _COUNTS.fields
    if book_pb2.BookDelta.DESCRIPTOR.fields_by_name[f.name].message_type is None
)
_PACKED_POSITION = tuple(f.name for f in _COUNTS.fields_by_name["stream"].message_type.fields)


@dataclass(frozen=True, slots=True)
class DeltaRun:
    """BookDelta messages that came one after another on one topic, read at once (#38):
    their fields as columns (:func:`_run_types`), the first and last decoded whole (the
    positions a subscription's sequencing reads), and their payloads, decoded one by one
    only when the run cannot be applied whole (:meth:`BookSync.on_run`)."""

    frames: Sequence[Sequence[bytes]]
    payloads: list[bytes]
    columns: Message
    bids: _RunLevels
    asks: _RunLevels
    first: book_pb2.BookDelta
    last: book_pb2.BookDelta

    @classmethod
    def read(cls, run: Sequence[Sequence[bytes]], topic: bytes) -> DeltaRun | None:
        """A run of SUB messages (``[topic, version, body]`` each) as one DeltaRun; None
        when it is shorter than :data:`RUN_MIN`, any message is no BookDelta of ``topic``
        (or one too big to pass over its limits), does not parse, has a level that is no
        price and size, or is not sequenced one right after the other: the caller then
        takes the messages one by one, which judges and counts each."""
        payloads = sub_payloads(run, topic, book_pb2.BookDelta)
        return None if None in payloads else cls._read(run, payloads)  # type: ignore[arg-type]

    @classmethod
    def _read(cls, run: Sequence[Sequence[bytes]], payloads: list[bytes]) -> DeltaRun | None:
        """:meth:`read` of messages whose payloads :func:`sub_payloads` passed."""
        if len(payloads) < RUN_MIN:
            return None
        heads = map(RUN_HEADS.__getitem__, map(len, payloads))
        framed = b"".join(chain.from_iterable(zip(heads, payloads, strict=True)))
        try:
            columns = _RUN_COLUMNS.FromString(framed).deltas
            counts = _RUN_COUNTS.FromString(framed).deltas
            first, last = map(book_pb2.BookDelta.FromString, (payloads[0], payloads[-1]))
        except (DecodeError, RuntimeWarning):
            return None
        n, stream = len(payloads), columns.stream
        if any(len(getattr(counts, f)) for f in _PACKED) or any(
            len(getattr(counts.stream, f)) for f in _PACKED_POSITION
        ):
            return None  # a scalar sent packed: its singular field would not read it
        epochs, seqs = stream.epoch, stream.seq
        if len(seqs) != n or len(epochs) not in (0, n):
            return None  # a message without a position, or some in epoch 0 only
        seqs, epoch = list(seqs), first.stream.epoch
        if seqs[-1] - seqs[0] != n - 1 or seqs != list(range(seqs[0], seqs[0] + n)):
            return None
        if epochs and (list(epochs).count(epoch) != n):
            return None
        bids = _run_levels(columns.bids, len(counts.bids))
        asks = _run_levels(columns.asks, len(counts.asks))
        if bids is None or asks is None:
            return None  # a malformed level, or a text that would not decode
        return cls(run, payloads, columns, bids, asks, first, last)

    def __len__(self) -> int:
        return len(self.payloads)

    def deltas(self) -> list[book_pb2.BookDelta]:
        """Each delta decoded, as a subscription decodes one that comes alone."""
        return list(map(book_pb2.BookDelta.FromString, self.payloads))


def delta_pieces(
    run: Sequence[Sequence[bytes]], topic: bytes
) -> list[DeltaRun | Sequence[Sequence[bytes]]]:
    """Messages received one after another, in pieces, in order: each stretch of BookDelta
    messages of ``topic`` that :meth:`DeltaRun.read` reads at once, and the others (a head
    beacon, a snapshot, anything :func:`~proto.envelope.sub_payloads` does not pass, a
    stretch too short or that does not read) as they came, to be taken one by one."""
    if len(run) < RUN_MIN:
        return [run]
    payloads = sub_payloads(run, topic, book_pb2.BookDelta)
    others = [i for i, p in enumerate(payloads) if p is None]
    pieces: list[DeltaRun | Sequence[Sequence[bytes]]] = []
    start = i = 0  # the part not yet cut into pieces; the stretch of deltas looked at
    n = len(run)
    for j in [*others, n]:  # each stretch of deltas ends before a message that is none
        deltas = DeltaRun._read(run[i:j], payloads[i:j]) if j - i >= RUN_MIN else None  # type: ignore[arg-type]
        if deltas is not None:
            if start < i:
                pieces.append(run[start:i])
            pieces.append(deltas)
            start = j
        i = j + 1
    if start < n:
        pieces.append(run[start:])
    return pieces


# One side's levels in a run: each price's last level (price text, size text), by price.
_RunLevels = dict[Decimal, tuple[str, str]]


def _run_levels(levels: Message, count: int) -> _RunLevels | None:
    """One side's merged levels, each price's last; None when a level lacks its price or
    size, or either is no decimal as :func:`_parse` judges it. Read off the wire where the
    texts allow it (:func:`_wire_levels`), else level by level (:func:`_text_levels`)."""
    wired = _wire_levels(levels, count)
    return wired if wired is not None else _text_levels(levels, count)


def _price_keys(texts: list[str]) -> list[Decimal] | None:
    """Each price text's Decimal, from the cache, each text not in it parsed once by
    :func:`_price`; None when one is no price."""
    try:
        return list(map(_prices.__getitem__, texts))
    except KeyError:  # prices not seen before
        try:
            for text in set(texts).difference(_prices):
                _price(text)
        except BookError:
            return None
        return [_prices.get(p) or _price(p) for p in texts]  # (the cache may have been full)


def _text_levels(levels: Message, count: int) -> _RunLevels | None:
    """:func:`_run_levels` with each level's texts as Python strings. Sizes go through
    Arrow's cast, which reads no text that ``float`` refuses (a text it cannot read sends
    the run one by one, where ``float`` judges it), and the finite and not-negative check
    is :func:`_parse`'s."""
    import pyarrow as pa  # only a subscriber's runs read it: an ingestor's start does not
    import pyarrow.compute as pc

    prices, sizes = list(levels.price), list(levels.size)
    if len(prices) != count or len(sizes) != count:
        return None
    if not count:
        return {}
    keys = _price_keys(prices)
    if keys is None or not all(map(held, sizes)):
        return None
    try:
        amounts = pc.cast(pa.array(sizes, pa.string()), pa.float64())
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        return None
    if not pc.all(pc.is_finite(amounts)).as_py() or pc.min(amounts).as_py() < 0:
        return None
    return dict(zip(keys, zip(prices, sizes, strict=True), strict=True))


# A level's texts as the merged ``Levels`` serializes them: every price, then every size,
# each its tag, a length and its bytes. No byte of a decimal's text is below "+", so the
# bytes below it are where the tags and lengths are, to be checked as such.
_LEVEL_TAGS = tuple(
    f.number << 3 | 2 for f in book_pb2.BookLevel.DESCRIPTOR.fields
)  # (price, size): field number and wire type 2
_TEXT_LOWEST = ord("+")
_PLAIN_BYTES = PLAIN_CHARS.encode()  # a plain size's: digits and the point


def _wire_levels(levels: Message, count: int) -> _RunLevels | None:
    """:func:`_run_levels` with no Python object a level: the texts read off the merged
    levels' own bytes into Arrow, each price's last level found by Arrow and numpy, and
    only the distinct prices made Python strings. None when it cannot be read so (a text
    with a byte below "+" or of 43 bytes or more, a level missing a text, a size that is
    no decimal, a price spelled two ways): :func:`_text_levels` then reads it level by
    level. The bytes below "+" are taken as tags and lengths only when they cut the buffer
    into whole (tag, length, text) items from its first byte to its last, which is how the
    parser read them, so every text is what upb holds."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    if not count:
        return None
    b = np.frombuffer(levels.SerializeToString(), np.uint8)
    marks = np.flatnonzero(b < _TEXT_LOWEST)
    if len(marks) != 4 * count:
        return None
    tags, at = marks[0::2], marks[1::2]
    lengths = b[at].astype(np.int64)
    ends = np.append(tags[1:], len(b))
    if tags[0] != 0 or not ((at == tags + 1).all() and (at + 1 + lengths == ends).all()):
        return None
    kinds = b[tags]
    if not ((kinds[:count] == _LEVEL_TAGS[0]).all() and (kinds[count:] == _LEVEL_TAGS[1]).all()):
        return None
    keep = np.ones(len(b), bool)
    keep[marks] = False
    texts_bytes = b[keep]
    offsets = np.zeros(2 * count + 1, np.int32)
    np.cumsum(lengths, out=offsets[1:])
    data = pa.py_buffer(texts_bytes)
    prices = pa.StringArray.from_buffers(count, pa.py_buffer(offsets[: count + 1]), data)
    sizes = pa.StringArray.from_buffers(count, pa.py_buffer(offsets[count:]), data)
    sizes_bytes = texts_bytes[offsets[count] :].tobytes()
    if lengths[count:].max() >= 20 or sizes_bytes.translate(None, _PLAIN_BYTES):
        # Sizes not plain ("0e3", "-0"): those alone judged as the tables hold them.
        odd = pc.or_(
            pc.greater_equal(pc.utf8_length(sizes), 20), pc.match_substring_regex(sizes, "[^0-9.]")
        )
        if not all(map(held, sizes.filter(odd).to_pylist())):
            return None
    try:
        amounts = pc.cast(sizes, pa.float64())
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        return None
    if not pc.all(pc.is_finite(amounts)).as_py() or pc.min(amounts).as_py() < 0:
        return None
    coded = prices.dictionary_encode()  # each distinct price text once, and a code a level
    texts = coded.dictionary.to_pylist()
    first_from_end = np.full(len(texts), count, np.int64)  # each price's last level, from the end
    np.minimum.at(first_from_end, coded.indices.to_numpy()[::-1], np.arange(count))
    keys = _price_keys(texts)
    if keys is None:
        return None
    if len(set(keys)) != len(keys):
        return None  # a price spelled two ways ("100.5", "100.50"): which came last counts
    last = sizes.take(pa.array(count - 1 - first_from_end)).to_pylist()
    return dict(zip(keys, zip(texts, last, strict=True), strict=True))


def _put_run(side: dict[Decimal, tuple[str, str]], levels: _RunLevels) -> None:
    """:func:`_put` of a side's levels in order, which leaves each price as its last level
    left it: set, or removed by a size of zero."""
    pop = side.pop
    for key, level in levels.items():
        if float(level[1]):
            side[key] = level
        else:
            pop(key, None)


class Replayed:
    """What a book subscription emits once its replay of the journal is done (the live
    stream follows): see :meth:`BookFeed.offer`."""


REPLAYED = Replayed()


@dataclass
class BookFeed:
    """A subscription's book: offer it each message of ``{ticker}|book``; it answers with the
    book when the message changed it (and the book is trusted), else None. Before
    ``from_ns`` (a ``since=``) the book is built but not handed out; if the replay ends
    and none was, the book has not changed since ``from_ns``, and is handed out then, as it
    stood at ``from_ns``, rather than only at its next change."""

    ticker: str
    depth: int | None = None
    from_ns: int = 0
    sync: BookSync = field(init=False)
    handed: bool = field(init=False, default=False)

    def __post_init__(self) -> None:
        self.sync = BookSync(self.ticker)

    def offer(self, msg: object) -> Book | None:
        if isinstance(msg, book_pb2.BookDelta):
            if self.sync.on_delta(msg) is not Verdict.APPLIED:
                return None
        elif isinstance(msg, book_pb2.BookSnapshot):
            try:
                self.sync.on_snapshot(msg)
            except BookError:
                self.sync.counts[Verdict.MALFORMED] += 1
                return None
        elif isinstance(msg, Replayed):
            book = self.sync.book
            if self.handed or book is None or self.from_ns > time.time_ns():
                return None  # handed already, nothing to hand, or ``since`` still to come
            book.depth, self.handed = self.depth, True
            return book
        else:
            return None
        return self._handed(msg.stream)

    def offer_run(self, run: DeltaRun) -> Book | None:
        """:meth:`offer` for a run of deltas: the book once, after the run, when the run
        changed it (and it is trusted); the same book as offering them one by one."""
        if self.sync.on_run(run):
            return self._handed(run.last.stream)
        offer, changed = self.offer, False
        for delta in run.deltas():
            changed |= offer(delta) is not None
        return self.sync.book if changed else None

    def _handed(self, position: StreamPosition) -> Book | None:
        book = self.sync.book
        if book is None:
            return None
        book.position = position  # where the book stands, handed out or not yet
        if book.time_ns < self.from_ns and not self.handed:
            return None  # once handed out, each change is (a venue's time may step back)
        book.depth, self.handed = self.depth, True
        return book


def replay(
    snapshot: book_pb2.BookSnapshot, deltas: Sequence[book_pb2.BookDelta]
) -> tuple[Book, list[Verdict]]:
    """A book rebuilt from a snapshot and the deltas after it (the history path's)."""
    sync = BookSync(snapshot.ticker)
    sync.on_snapshot(snapshot)
    verdicts = [sync.on_delta(d) for d in deltas]  # no snapshot held anything back
    if sync.book is None:
        raise BookError(f"{snapshot.ticker}: deltas after seq {snapshot.venue_seq} have a gap")
    return sync.book, verdicts
