"""Live messages as Python values: what :meth:`Client.subscribe` yields.

On the wire prices are decimal strings and times epoch nanoseconds or milliseconds (the
protobuf contract in ``proto/market.proto``); here they are :class:`~decimal.Decimal` and
timezone-aware UTC :class:`~datetime.datetime`. ``stream`` is the message's place in its
live stream: pass it as ``since=`` to resume right after it. ``subscribe(..., raw=True)``
yields the protobuf messages instead.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from decimal import Decimal, InvalidOperation
from operator import attrgetter

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.message import DecodeError, Message

from candlewire.amounts import amount, plain
from candlewire.times import EPOCH
from proto import journal_pb2 as jr
from proto import market_pb2
from proto.envelope import MAX_STRING_BYTES, EnvelopeError, expect, from_record, to_record

SIDES = {market_pb2.BUY: "buy", market_pb2.SELL: "sell"}


# Trailing zeros of a fraction, and its point when nothing else is left of it.
_TRAILING_ZEROS = r"(\.[0-9]*[1-9])0+$|\.0+$"


def plain_texts(column: pa.Array | pa.ChunkedArray) -> pa.ChunkedArray:
    """:func:`plain` of each value of a decimal column (nulls stay null), by Arrow: a
    value in Python costs more than everything else a replay does with it."""
    text = pc.replace_substring_regex(pc.cast(column, pa.string()), _TRAILING_ZEROS, r"\1")
    if isinstance(text, pa.Array):
        text = pa.chunked_array([text], pa.string())
    if not pc.any(pc.match_substring(text, "E")).as_py():
        return text
    # Arrow writes a value under 1e-6, and a zero, with an exponent: those few in Python.
    return pa.chunked_array(
        [[plain(Decimal(t)) if t is not None and "E" in t else t for t in text.to_pylist()]],
        pa.string(),
    )


# The epoch milliseconds of datetime's first and last (years 1 and 9999), which utc() holds.
_FIRST_MS, _LAST_MS = (
    (d.replace(tzinfo=EPOCH.tzinfo) - EPOCH) // timedelta(milliseconds=1)
    for d in (datetime.min, datetime.max)
)


def utc(ns: int = 0, ms: int = 0) -> datetime:
    """Epoch nanoseconds or milliseconds as an aware datetime (to the microsecond); a time
    beyond datetime's years 1 to 9999 (a valid int64 all the same) raises OverflowError."""
    return EPOCH + timedelta(microseconds=ns // 1000 if ns else ms * 1000)


@dataclass(frozen=True, slots=True)
class Tick:
    """One trade: ``price`` and ``size`` exact, ``time`` when the exchange matched it."""

    ticker: str
    price: Decimal
    size: Decimal
    side: str  # "buy", "sell", or "" when the venue does not say
    trade_id: str
    time: datetime  # when the exchange matched it, UTC
    time_ns: int  # the same, exactly
    stream: market_pb2.StreamPosition = field(compare=False, hash=False, repr=False)

    @classmethod
    def from_proto(cls, m: market_pb2.Tick) -> Tick:
        """From the wire's ``Tick`` message."""
        return cls(
            ticker=m.ticker,
            price=amount(m.price),
            size=amount(m.size),
            side=SIDES.get(m.side, ""),
            trade_id=m.trade_id,
            time=utc(ns=m.exchange_time_ns),
            time_ns=m.exchange_time_ns,
            stream=m.stream,
        )


@dataclass(frozen=True, slots=True)
class Candle:
    """One OHLCV candle of ``period_s`` seconds from ``open_time``; ``closed`` once its
    interval can no longer change."""

    ticker: str
    period_s: int
    open_time: datetime  # the interval's inclusive start, UTC
    open: Decimal
    high: Decimal
    low: Decimal
    close: Decimal
    volume: Decimal
    trade_count: int
    closed: bool  # False while the interval is still forming
    # 0 as first closed; a closed candle corrected after trades lost upstream were fetched
    # again comes again with this one higher, and the highest is final (docs: gaps)
    revision: int
    stream: market_pb2.StreamPosition = field(compare=False, hash=False, repr=False)

    @classmethod
    def from_proto(cls, m: market_pb2.OHLC) -> Candle:
        """From the wire's ``OHLC`` message."""
        return cls(
            ticker=m.ticker,
            period_s=m.period_s,
            open_time=utc(ms=m.open_time_ms),
            open=amount(m.open),
            high=amount(m.high),
            low=amount(m.low),
            close=amount(m.close),
            volume=amount(m.volume),
            trade_count=m.trade_count,
            closed=m.closed,
            revision=m.revision,
            stream=m.stream,
        )


# What typed() raises for a Tick or OHLC that makes no Tick or Candle: a price or size that
# is no decimal DECIMAL(38,18) holds (as the Arrow batches refuse it), a time that is no
# datetime. A typed subscription drops and counts it.
MALFORMED = (InvalidOperation, OverflowError)


def typed(msg: Message | pa.RecordBatch) -> Tick | Candle | Message | pa.RecordBatch:
    """A Tick or OHLC message as its dataclass; anything else (a replayed run's
    RecordBatch too) as it is. A Tick or OHLC that makes none raises one of
    :data:`MALFORMED`."""
    if isinstance(msg, market_pb2.Tick):
        return Tick.from_proto(msg)
    if isinstance(msg, market_pb2.OHLC):
        return Candle.from_proto(msg)
    return msg


# -- the same messages as Arrow columns (``subscribe(..., batches=True)``) -------------------

DECIMAL = pa.decimal128(38, 18)  # the Iceberg tables' type, so a replay joins history as it is
_DECIMAL_MAX = pa.scalar(Decimal("99999999999999999999.999999999999999999"), DECIMAL)
_DECIMAL_MIN = pa.scalar(Decimal("-99999999999999999999.999999999999999999"), DECIMAL)
DISTINCT_SAMPLE = 1024  # the rows of a decimal column that tell whether its texts repeat
ROWS_ONE_BY_ONE = 64  # a failing slice this short is checked text by text
POSITION = pa.struct(
    [
        ("epoch", pa.uint64()),
        ("seq", pa.uint64()),
        ("publish_time_ms", pa.int64()),
        ("source_partition", pa.int32()),
        ("source_offset", pa.int64()),
    ]
)
TICK_SCHEMA = pa.schema(
    [
        ("ticker", pa.string()),
        ("price", DECIMAL),
        ("size", DECIMAL),
        ("side", pa.string()),
        ("trade_id", pa.string()),
        ("time", pa.timestamp("ns", tz="UTC")),
        ("stream", POSITION),
    ]
)
CANDLE_SCHEMA = pa.schema(
    [
        ("ticker", pa.string()),
        ("period_s", pa.uint32()),
        ("open_time", pa.timestamp("ms", tz="UTC")),
        ("open", DECIMAL),
        ("high", DECIMAL),
        ("low", DECIMAL),
        ("close", DECIMAL),
        ("volume", DECIMAL),
        ("trade_count", pa.uint64()),
        ("closed", pa.bool_()),
        ("revision", pa.uint32()),
        ("stream", POSITION),
    ]
)
_CANDLE = attrgetter(
    "ticker", "period_s", "open_time_ms", "open", "high", "low", "close", "volume",
    "trade_count", "closed", "revision", "stream",
)  # fmt: skip
# Each message's fields in the schema's order (the position last), as attrgetter reads them
# row by row and _TickColumns reads them as columns.
_TICK_FIELDS = ("ticker", "price", "size", "side", "trade_id", "exchange_time_ns")
_POSITION_FIELDS = ("epoch", "seq", "publish_time_ms", "source_partition", "source_offset")
_TICK = attrgetter(*_TICK_FIELDS, "stream")
_POSITION = attrgetter(*_POSITION_FIELDS)
_SIDE_NAMES = pa.array(["", *(SIDES.get(v, "") for v in range(1, max(SIDES) + 1))])


def as_batch(msgs: Sequence[Message]) -> tuple[pa.RecordBatch, int]:
    """A run of Tick or OHLC messages (one type) as one RecordBatch in the columns and values
    of :class:`Tick` and :class:`Candle`, and how many rows were dropped because a price or
    size is no decimal (as a typed subscription drops them). Each message is read once,
    field by field in C (``attrgetter``); Arrow parses the decimals."""
    if not msgs:
        raise ValueError("an empty run has no batch")
    tick = isinstance(msgs[0], market_pb2.Tick)
    schema, getter = (TICK_SCHEMA, _TICK) if tick else (CANDLE_SCHEMA, _CANDLE)
    *columns, streams = zip(*map(getter, msgs), strict=True)
    return _batch(schema, columns, zip(*map(_POSITION, streams), strict=True), len(msgs))


def _batch(
    schema: pa.Schema, columns: Iterable[Sequence], positions: Iterable[Sequence], n: int
) -> tuple[pa.RecordBatch, int]:
    """:func:`as_batch` from each field's values (the schema's order, the position's last),
    however they were read: row by row, or as columns (:class:`_TickColumns`)."""
    arrays = [_column(values, f) for values, f in zip(columns, schema, strict=False)]
    if schema is TICK_SCHEMA:  # the Side enum's number as its name; an unknown one as ""
        side = schema.get_field_index("side")
        numbers = arrays[side]
        known = pc.and_(pc.greater(numbers, 0), pc.less(numbers, len(_SIDE_NAMES)))
        arrays[side] = _SIDE_NAMES.take(pc.if_else(known, numbers, 0))
    arrays.append(
        pa.StructArray.from_arrays(
            [pa.array(v, f.type) for v, f in zip(positions, POSITION, strict=True)],
            fields=list(POSITION),
        )
    )
    cast, bad = _decimals(arrays, schema)
    if schema is CANDLE_SCHEMA:  # a time no datetime holds, as the typed Candle refuses it
        at = arrays[schema.get_field_index("open_time")].cast(pa.int64())
        outside = pc.or_(pc.less(at, _FIRST_MS), pc.greater(at, _LAST_MS))
        if pc.any(outside).as_py():
            bad = outside if bad is None else pc.or_(bad, outside)
    if bad is not None:  # drop those rows, then cast what is left
        keep = pc.invert(bad)
        arrays = [a.filter(keep) for a in arrays]
        cast, _ = _decimals(arrays, schema)
    batch = pa.RecordBatch.from_arrays(cast, schema=schema)
    return batch, n - len(batch)


def _shadow_columns() -> tuple[type[Message], ...]:
    """The message types that read a FetchReply's tick runs as columns (#35), and count
    its ticks.

    The first mirrors the reply down to the ticks with the same field numbers, but each of
    Tick's and StreamPosition's fields is repeated, and each message field on the way is
    singular. Parsing merges every occurrence of a singular message field and appends every
    value of a repeated one, so one parse, in C, of the reply's bytes gives each field's
    values over all its ticks, in order: no message object per tick. A value left at its
    default is not on the wire, so a column is whole only when it has one value per tick or
    none at all, and the ticks are counted apart: the second type holds each run's ticks as
    bytes. The reply's own fields are kept as they are, a run's topics and positions are
    parsed (so checked), and its other items kept as bytes, so what is no tick run is seen
    (an enum is its number: the same varint). The others read one run at a time: a run as
    the first reads it, and the reply's runs as bytes."""
    file = descriptor_pb2.FileDescriptorProto(name="tick_columns.proto", syntax="proto3")
    file.package = "candlewire_columns"
    types = {
        "Reply": (jr.FetchReply.DESCRIPTOR, {"runs": "Run"}),
        "Run": (jr.JournalBatch.DESCRIPTOR, {"ticks": "Tick"}),
        "Tick": (market_pb2.Tick.DESCRIPTOR, {"stream": "Position"}),
        "Position": (market_pb2.StreamPosition.DESCRIPTOR, {}),
    }
    F = FieldDescriptor
    for name, (desc, nested) in types.items():
        shadow = file.message_type.add(name=name)
        for f in desc.fields:
            kind = F.TYPE_INT32 if f.type == F.TYPE_ENUM else f.type
            if f.name in nested:
                shadow.field.add(
                    name=f.name,
                    number=f.number,
                    type=F.TYPE_MESSAGE,
                    label=F.LABEL_OPTIONAL,
                    type_name=f".{file.package}.{nested[f.name]}",
                )
            elif name == "Reply":
                shadow.field.add(name=f.name, number=f.number, type=kind, label=F.LABEL_OPTIONAL)
            elif name == "Run" and f.message_type is market_pb2.StreamPosition.DESCRIPTOR:
                shadow.field.add(  # first, last: parsed, so checked as the decoder checks them
                    name=f.name,
                    number=f.number,
                    type=F.TYPE_MESSAGE,
                    label=F.LABEL_OPTIONAL,
                    type_name=f".{file.package}.Position",
                )
            else:  # Tick's and Position's fields; a run's topic and its other items
                kind = F.TYPE_BYTES if kind == F.TYPE_MESSAGE else kind
                shadow.field.add(name=f.name, number=f.number, type=kind, label=F.LABEL_REPEATED)
    counts = file.message_type.add(name="Counts")
    counts.field.add(
        name="runs",
        number=jr.FetchReply.DESCRIPTOR.fields_by_name["runs"].number,
        type=F.TYPE_MESSAGE,
        label=F.LABEL_REPEATED,
        type_name=f".{file.package}.RunCount",
    )
    file.message_type.add(name="RunCount").field.add(
        name="ticks",
        number=jr.JournalBatch.DESCRIPTOR.fields_by_name["ticks"].number,
        type=F.TYPE_BYTES,
        label=F.LABEL_REPEATED,
    )
    file.message_type.add(name="RunBytes").field.add(
        name="runs",
        number=jr.FetchReply.DESCRIPTOR.fields_by_name["runs"].number,
        type=F.TYPE_BYTES,
        label=F.LABEL_REPEATED,
    )
    pool = descriptor_pool.DescriptorPool()
    pool.Add(file)
    return tuple(  # type: ignore[return-value]
        message_factory.GetMessageClass(pool.FindMessageTypeByName(f"{file.package}.{name}"))
        for name in ("Reply", "Counts", "Run", "RunBytes")
    )


_REPLY_COLUMNS, _REPLY_COUNTS, _RUN_COLUMNS, _REPLY_RUNS = _shadow_columns()
_RUN_HEAD = to_record(jr.JournalBatch())  # a run's bytes after it are a journal record
# The text fields of a tick by number (their default is "", the others' is 0), from the
# contract itself: the only fields of a tick with a limit (StreamPosition has no text).
_TEXT_NUMBERS = {
    f.number: f.name
    for f in market_pb2.Tick.DESCRIPTOR.fields
    if f.type == FieldDescriptor.TYPE_STRING
}
_TEXTS = frozenset(_TEXT_NUMBERS.values())


class _TickColumns:
    """A FetchReply's ticks as columns, for a replay as Arrow: what :func:`as_batch` makes
    of its messages, without a Python object per tick. ``first`` and ``last`` are the
    chunk's edge positions, which the sequencing rules read. A chunk whose ticks cannot all
    be read as columns at once is read run by run: columns where a run's can, messages
    where not (a run with one tick whose side is unknown, or whose offset is 0)."""

    def __init__(
        self, pieces: list[_Columns | list[market_pb2.Tick]], topics: Sequence[str]
    ) -> None:
        self._pieces = pieces
        self._n = sum(map(len, pieces))
        self.first, self.last = _edge(pieces[0], 0), _edge(pieces[-1], -1)
        self.topics = topics  # each run's, in order

    def only(self, topic: str) -> bool:
        """Whether every run of the chunk is ``topic``'s: a run of another topic's is
        dropped and counted on the messages' path (``positions.run_fits``)."""
        return all(t == topic for t in self.topics)

    @classmethod
    def read(
        cls, payload: bytes, counts: list[int] | None = None
    ) -> tuple[Message, _TickColumns] | None:
        """A FetchReply's payload as its own fields (a message with the reply's field names)
        and its ticks as columns. The payload's frames, and its fields down to its runs', are
        checked already (``proto.envelope.checked_payload``, or ``payload_of(..., depth=1)``),
        and the ticks' text here. ``counts``: each run's ticks, as that check read them (else
        counted here). None when it is no OK reply of ticks from the journal, holds nothing,
        or a tick past a limit: the caller then decodes it whole (``decode_body``), which
        refuses what is wrong."""
        try:
            reply = _REPLY_COLUMNS.FromString(payload)
        except (DecodeError, RuntimeWarning):
            return None
        run = reply.runs
        if reply.status != jr.FETCH_OK or reply.archive_until_ms:
            return None
        if run.candles or run.book_deltas or run.book_snapshots:
            return None
        if counts is None:
            counts = [len(counted.ticks) for counted in _REPLY_COUNTS.FromString(payload).runs]
        n = sum(counts)
        if not n:
            return None
        whole = _Columns.of(run.ticks, n)
        pieces = [whole] if whole is not None else _run_pieces(payload, counts)
        if pieces is None or len(run.topic) != len(counts):  # a run without a topic
            return None
        return reply, cls(pieces, list(run.topic))

    def __len__(self) -> int:
        return self._n

    def batch(self) -> tuple[pa.RecordBatch, int]:
        """The RecordBatch :func:`as_batch` makes of the same ticks, and the rows dropped."""
        made = [p.batch() if isinstance(p, _Columns) else as_batch(p) for p in self._pieces]
        if len(made) == 1:
            return made[0]
        return pa.concat_batches([b for b, _ in made]), sum(d for _, d in made)


class _Columns:
    """A stretch of ticks as columns: the values of each field, in order, one per tick."""

    def __init__(self, columns: dict[str, Sequence], positions: dict[str, Sequence], n: int):
        self._columns, self._positions, self._n = columns, positions, n

    @classmethod
    def of(cls, ticks: Message, n: int) -> _Columns | None:
        """The shadow's merged ``ticks`` of ``n`` ticks as columns; None when a field is at
        its default in some ticks only (which ones is not on the wire), or a text is past
        its limit."""
        columns = {name: getattr(ticks, name) for name in _TICK_FIELDS}
        positions = {name: getattr(ticks.stream, name) for name in _POSITION_FIELDS}
        if any(len(v) not in (0, n) for v in (*columns.values(), *positions.values())):
            return None
        # Every field out of the shadow's own bytes: each text field's n values one after
        # another, each number one packed field of varints, which numpy decodes without a
        # Python object each.
        ticks.DiscardUnknownFields()
        fields, texts = _wire_columns(ticks.SerializeToString(), n, ticks)
        if texts is None:
            return None
        columns.update(texts)
        stream = _wire_fields(fields.get(_STREAM_NUMBER, b""))
        for got, numbers, out in (
            (fields, _TICK_NUMBERS, columns),
            (stream, _POSITION_NUMBERS, positions),
        ):
            for name, (number, dtype) in numbers.items():
                if out[name]:
                    out[name] = _varints(got[number], dtype)
        return cls(columns, positions, n)

    def __len__(self) -> int:
        return self._n

    def position(self, i: int) -> market_pb2.StreamPosition:
        return market_pb2.StreamPosition(
            **{name: int(values[i]) for name, values in self._positions.items() if len(values)}
        )

    def batch(self) -> tuple[pa.RecordBatch, int]:
        columns, positions = self._columns, self._positions
        return _batch(
            TICK_SCHEMA,
            [self._full(columns[name], name in _TEXTS) for name in _TICK_FIELDS],
            [self._full(positions[name], False) for name in _POSITION_FIELDS],
            self._n,
        )

    def _full(self, values: Sequence, text: bool) -> Sequence:
        """A column's values (the repeated field itself: Arrow reads it as a sequence); its
        default in every row when none was on the wire."""
        if len(values):
            return values
        return pa.repeat("", self._n) if text else np.zeros(self._n, np.int64)


def _edge(piece: _Columns | list[market_pb2.Tick], i: int) -> market_pb2.StreamPosition:
    return piece.position(i) if isinstance(piece, _Columns) else piece[i].stream


def _run_pieces(payload: bytes, counts: list[int]) -> list[_Columns | list[market_pb2.Tick]] | None:
    """A FetchReply's ticks run by run (``counts``: each run's ticks, as the reply's count
    found them): each run's as columns where they can be, else its messages, decoded whole
    (so held to every limit); None when a run does not decode."""
    pieces: list[_Columns | list[market_pb2.Tick]] = []
    for raw, n in zip(_REPLY_RUNS.FromString(payload).runs, counts, strict=True):
        if not n:
            continue
        piece = _Columns.of(_RUN_COLUMNS.FromString(raw).ticks, n)
        if piece is None:
            try:
                piece = list(expect(from_record(_RUN_HEAD + raw), jr.JournalBatch).ticks)
            except EnvelopeError:
                return None
        pieces.append(piece)
    return pieces or None


# The numbers of a tick and of its position as _TickColumns decodes them: field number and
# the numpy type of the protobuf type (no other numeric type is in these messages).
_NUMPY = {
    FieldDescriptor.TYPE_INT64: np.int64,
    FieldDescriptor.TYPE_UINT64: np.uint64,
    FieldDescriptor.TYPE_INT32: np.int32,
    FieldDescriptor.TYPE_ENUM: np.int32,
}
_TICK_NUMBERS, _POSITION_NUMBERS = (
    {
        f.name: (f.number, _NUMPY[f.type])
        for f in desc.fields
        if f.name in names and f.type != FieldDescriptor.TYPE_STRING
    }
    for desc, names in (
        (market_pb2.Tick.DESCRIPTOR, _TICK_FIELDS),
        (market_pb2.StreamPosition.DESCRIPTOR, _POSITION_FIELDS),
    )
)
_STREAM_NUMBER = market_pb2.Tick.DESCRIPTOR.fields_by_name["stream"].number
_SHIFTS = [np.uint64(7 * k) for k in range(10)]  # a varint's bytes: 7 bits each, 10 at most


def _wire_fields(buf: bytes) -> dict[int, memoryview]:
    """The fields of a message serialized here, by number: each a packed repeated scalar
    or a sub-message, so length-delimited and once (no unknown fields: discarded)."""
    out, i, view = {}, 0, memoryview(buf)
    while i < len(buf):
        key, i = _varint(buf, i)
        size, i = _varint(buf, i)
        if key & 7 != 2:
            raise ValueError(f"field {key >> 3} is not length-delimited")
        out[key >> 3], i = view[i : i + size], i + size
    return out


def _wire_columns(
    buf: bytes, n: int, ticks: Message
) -> tuple[dict[int, memoryview], dict[str, pa.Array] | None]:
    """The shadow's ``ticks`` as serialized here (:func:`_wire_fields`' fields, and each
    text field's ``n`` values one after another) as its numeric fields by number and its
    text columns as Arrow; None for the texts when one is past its limit.

    A text field whose values all have one byte length (a ticker, a chunk's trade ids,
    prices and sizes of one width) is one matrix of ``n`` rows, tag, length and value, whose
    values column is the Arrow array's data as it is: no Python object each (upb checked the
    UTF-8 as it parsed). Any other comes through Python strings from ``ticks``."""
    out: dict[int, memoryview] = {}
    texts: dict[str, pa.Array] = {}
    b, view, i = np.frombuffer(buf, np.uint8), memoryview(buf), 0
    while i < len(buf):
        start = i
        key, i = _varint(buf, i)
        name = _TEXT_NUMBERS.get(key >> 3)
        if name is None:
            if key & 7 != 2:
                raise ValueError(f"field {key >> 3} is not length-delimited")
            size, i = _varint(buf, i)
            out[key >> 3], i = view[i : i + size], i + size
            continue
        length = buf[i]
        width = 2 + length  # tag and length, one byte each, then the value
        rows = b[start : start + n * width]
        if i == start + 1 and length < 0x80 and len(rows) == n * width:
            rows = rows.reshape(n, width)
            if (rows[:, 0] == key).all() and (rows[:, 1] == length).all():
                offsets = np.arange(n + 1, dtype=np.int32) * np.int32(length)
                data = np.ascontiguousarray(rows[:, 2:])
                texts[name] = pa.StringArray.from_buffers(
                    n, pa.py_buffer(offsets), pa.py_buffer(data)
                )
                i = start + n * width
                continue
        text = pa.array(getattr(ticks, name), pa.string())
        lengths = pc.binary_length(text).to_numpy().astype(np.int64)
        if lengths.max(initial=0) > MAX_STRING_BYTES:
            return out, None
        texts[name] = text
        # each value: its tag (one byte: fields 1-15), its length as a varint, its bytes
        i = start + int((1 + _varint_sizes(lengths) + lengths).sum())
    return out, texts


def _varint_sizes(values: np.ndarray) -> np.ndarray:
    """Bytes each value takes as a varint (values below 2**28: a length's limit is far less)."""
    return 1 + (values >= 1 << 7) + (values >= 1 << 14) + (values >= 1 << 21)


def _varint(buf: bytes, i: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        byte = buf[i]
        value, shift, i = value | (byte & 0x7F) << shift, shift + 7, i + 1
        if byte < 0x80:
            return value, i


def _varints(packed: memoryview | bytes, dtype: type[np.integer]) -> np.ndarray:
    """A packed field's varints as numbers, decoded by numpy a byte position at a time (a
    varint is at most 10 bytes), as ``dtype``: a negative int64 is 10 bytes of two's
    complement, and an int32 the same sign-extended, so the low bits are the value."""
    b = np.frombuffer(packed, np.uint8)
    ends = np.flatnonzero(b < 0x80)  # each varint's last byte
    width = int(ends[0]) + 1 if len(ends) else 0
    if width and len(ends) * width == len(b) and (b[width - 1 :: width] < 0x80).all():
        # Every varint as wide as the first (a chunk's times, epochs, ids of one size): each
        # row of ``width`` bytes ends one, and there are no other ends, so each row is one.
        rows = b.reshape(-1, width)
        values = (rows[:, 0] & 0x7F).astype(np.uint64)
        for k in range(1, width):
            values |= (rows[:, k] & 0x7F).astype(np.uint64) << _SHIFTS[k]
        return values.view(np.int64).astype(dtype, copy=False)
    lengths = np.diff(ends, prepend=-1)
    starts = ends - lengths + 1
    values = (b[starts] & 0x7F).astype(np.uint64)
    for k in range(1, int(lengths.max(initial=1))):
        more = lengths > k
        values[more] |= (b[starts[more] + k] & 0x7F).astype(np.uint64) << _SHIFTS[k]
    return values.view(np.int64).astype(dtype, copy=False)


def _column(values: Sequence | pa.Array, f: pa.Field) -> pa.Array:
    if isinstance(values, pa.Array):  # a text column already made (_TickColumns.read)
        return values
    if f.type == DECIMAL:
        return pa.array(values, pa.string())  # cast once the rows that are no decimal are out
    return pa.array(values, pa.int32() if f.name == "side" else f.type)  # side: its number


def _decimals(arrays: list[pa.Array], schema: pa.Schema) -> tuple[list[pa.Array], pa.Array | None]:
    """The arrays with each decimal column cast to DECIMAL(38,18), and which rows hold one
    that does not cast (None when all do: the rule, checked row by row only when a whole
    column fails). Each column is cast once."""
    cast, bad = list(arrays), None
    for i, f in enumerate(schema):
        if f.type != DECIMAL:
            continue
        try:
            cast[i] = _as_decimal(arrays[i])
            continue
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
            rows = [False] * len(arrays[i])
            for j in _refused_rows(arrays[i], failed=True):
                rows[j] = True
        bad = pa.array(rows) if bad is None else pc.or_(bad, pa.array(rows))
    return cast, bad


def _refused_rows(text: pa.Array, start: int = 0, failed: bool = False) -> list[int]:
    """The rows (from ``start``) whose text :func:`cast_decimals` refuses, found by halves: a chunk
    with one bad price was cast row by row, about 14 µs a row (0.7 s for 50,000), and now
    takes a few casts of shrinking slices for each bad row, row by row only below
    ``ROWS_ONE_BY_ONE``. ``failed``: ``text`` was cast whole already, and refused."""
    if not failed:
        try:
            cast_decimals(text)
            return []
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
            pass
    if len(text) <= ROWS_ONE_BY_ONE:
        return [start + j for j, v in enumerate(text.to_pylist()) if not _casts(v)]
    half = len(text) // 2
    return _refused_rows(text.slice(0, half), start) + _refused_rows(text.slice(half), start + half)


def _as_decimal(text: pa.Array) -> pa.Array:
    """Decimal texts as DECIMAL, each distinct spelling parsed once when they repeat: a run's
    prices sit on the venue's tick grid (a few hundred in 50,000 trades), and hashing a
    text costs a third of parsing it. Texts that mostly differ (sizes, as a rule) are parsed
    one by one, which is cheaper than hashing them too; the first rows tell which."""
    head = text.slice(0, DISTINCT_SAMPLE)
    if len(text) >= 4 * DISTINCT_SAMPLE and pc.count_distinct(head).as_py() * 4 < len(head):
        encoded = pc.dictionary_encode(text)
        return cast_decimals(encoded.dictionary).take(encoded.indices)
    return cast_decimals(text)


def cast_decimals(text: pa.Array) -> pa.Array:
    """Decimal texts as DECIMAL, refusing (ArrowInvalid, as a text that is no decimal) one
    whose value the cast does not keep. Arrow scales a text's digits in 128 bits unchecked,
    so some texts past DECIMAL's 20 integer digits wrap to another value ("4e20", "7e20",
    "400000000000000000000") and a few with far too many decimals come out 0 ("1e-77")
    instead of failing. Only a text :func:`_may_wrap` finds can be one: when there is none,
    as in a venue's prices and sizes, this costs a look at the lengths and a search of the
    bytes (about 1 ns a row); else each value is compared with its text read as a float."""
    data = text.buffers()[2]  # a slice's are its whole parent's: a row too many, at worst
    raw = b"" if data is None else data.to_pybytes()  # a copy, memchr-fast
    longest = pc.max(pc.binary_length(text)).as_py() or 0  # None: no text
    wraps = _may_wrap(raw, longest)
    if wraps and _HUGE_EXPONENT.search(raw):  # Arrow's cast ends the process on some
        raise pa.ArrowInvalid("a decimal text whose exponent DECIMAL(38,18) cannot hold")
    cast = text.cast(DECIMAL)
    if wraps:
        _refuse_unkept(text, cast)
    return cast


# An exponent of 10,000 or more: no DECIMAL holds such a value but zero (so written, the one
# text the batches drop and the typed values keep), and pyarrow 26's cast of one near an
# int's least (1E-2147483600) ends the process (SIGSEGV), not refuses it.
_HUGE_EXPONENT = re.compile(rb"[eE][+-]?0*[1-9][0-9]{4}")


def _may_wrap(data: bytes, longest: int) -> bool:
    """Whether texts of these bytes, the longest ``longest`` bytes, may hold one Arrow's cast
    does not keep: one with an exponent, or more than 20 characters (shorter ones have at
    most 20 integer digits, and past 18 decimals the cast fails)."""
    return longest > 20 or b"e" in data or b"E" in data


def _refuse_unkept(text: pa.Array, cast: pa.Array) -> None:
    """ArrowInvalid when a value ``cast`` holds is not its text's: far from the text read as
    a float (wrapped), or beyond DECIMAL's range (the float of 128 bits' least value has the
    wrong sign), or a text no float holds."""
    value = text.cast(pa.float64())
    off = pc.abs(pc.subtract(cast.cast(pa.float64()), value))
    kept = pc.and_(pc.is_finite(value), pc.less_equal(off, pc.multiply(pc.abs(value), 1e-9)))
    held = pc.and_(pc.less_equal(cast, _DECIMAL_MAX), pc.greater_equal(cast, _DECIMAL_MIN))
    if pc.any(pc.invert(pc.and_(kept, held))).as_py():
        raise pa.ArrowInvalid("a decimal text whose value DECIMAL(38,18) does not hold")


def _casts(text: str | None) -> bool:
    """Whether one text casts as :func:`cast_decimals` casts it in a column (its test of the bytes on
    the str's: for one row far cheaper than Arrow's kernels)."""
    column = pa.array([text], pa.string())
    try:
        raw = b"" if text is None else text.encode()
        wraps = _may_wrap(raw, len(raw))
        if wraps and _HUGE_EXPONENT.search(raw):
            return False
        cast = column.cast(DECIMAL)
        if wraps:
            _refuse_unkept(column, cast)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        return False
    return True
