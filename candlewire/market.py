"""Live messages as Python values: what :meth:`Client.subscribe` yields.

On the wire prices are decimal strings and times epoch nanoseconds or milliseconds (the
protobuf contract in ``proto/market.proto``); here they are :class:`~decimal.Decimal` and
timezone-aware UTC :class:`~datetime.datetime`. ``stream`` is the message's place in its
live stream: pass it as ``since=`` to resume right after it. ``subscribe(..., raw=True)``
yields the protobuf messages instead.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from decimal import Decimal
from operator import attrgetter

import pyarrow as pa
import pyarrow.compute as pc
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.message import Message

from candlewire.times import EPOCH
from proto import journal_pb2 as jr
from proto import market_pb2

SIDES = {market_pb2.BUY: "buy", market_pb2.SELL: "sell"}


def plain(value: Decimal) -> str:
    """A decimal as people write it: no exponent, no trailing zeros, zero as ``0``."""
    text = format(value.normalize(), "f")
    return "0" if text in ("-0", "0") else text


def utc(ns: int = 0, ms: int = 0) -> datetime:
    """Epoch nanoseconds or milliseconds as an aware datetime (to the microsecond)."""
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
            price=Decimal(m.price),
            size=Decimal(m.size),
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
            open=Decimal(m.open),
            high=Decimal(m.high),
            low=Decimal(m.low),
            close=Decimal(m.close),
            volume=Decimal(m.volume),
            trade_count=m.trade_count,
            closed=m.closed,
            revision=m.revision,
            stream=m.stream,
        )


def typed(msg: Message | pa.RecordBatch) -> Tick | Candle | Message | pa.RecordBatch:
    """A Tick or OHLC message as its dataclass; anything else (a replayed run's
    RecordBatch too) as it is."""
    if isinstance(msg, market_pb2.Tick):
        return Tick.from_proto(msg)
    if isinstance(msg, market_pb2.OHLC):
        return Candle.from_proto(msg)
    return msg


# -- the same messages as Arrow columns (``subscribe(..., batches=True)``) -------------------

DECIMAL = pa.decimal128(38, 18)  # the Iceberg tables' type, so a replay joins history as it is
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
    if bad is not None:  # drop those rows, then cast what is left
        keep = pc.invert(bad)
        arrays = [a.filter(keep) for a in arrays]
        cast, _ = _decimals(arrays, schema)
    batch = pa.RecordBatch.from_arrays(cast, schema=schema)
    return batch, n - len(batch)


def _shadow_columns() -> type[Message]:
    """The message type that reads a FetchReply's tick runs as columns (#35).

    It mirrors the reply down to the ticks with the same field numbers, but each of Tick's
    and StreamPosition's fields is repeated, and each message field on the way is singular.
    Parsing merges every occurrence of a singular message field and appends every value of
    a repeated one, so one parse, in C, of the reply's bytes gives each field's values over
    all its ticks, in order: no message object per tick. A value left at its default is not
    on the wire, so a column is whole only when it has one value per tick or none at all."""
    file = descriptor_pb2.FileDescriptorProto(name="tick_columns.proto", syntax="proto3")
    file.package = "candlewire_columns"
    types = {
        "Reply": (jr.FetchReply.DESCRIPTOR, {"runs": "Run"}),
        "Run": (jr.JournalBatch.DESCRIPTOR, {"ticks": "Tick"}),
        "Tick": (market_pb2.Tick.DESCRIPTOR, {"stream": "Position"}),
        "Position": (market_pb2.StreamPosition.DESCRIPTOR, {}),
    }
    for name, (desc, nested) in types.items():
        shadow = file.message_type.add(name=name)
        for f in desc.fields:
            if f.name in nested:
                shadow.field.add(
                    name=f.name,
                    number=f.number,
                    type=FieldDescriptor.TYPE_MESSAGE,
                    label=FieldDescriptor.LABEL_OPTIONAL,
                    type_name=f".{file.package}.{nested[f.name]}",
                )
            elif name in ("Tick", "Position"):
                enum = f.type == FieldDescriptor.TYPE_ENUM  # its number: the same varint
                shadow.field.add(
                    name=f.name,
                    number=f.number,
                    type=FieldDescriptor.TYPE_INT32 if enum else f.type,
                    label=FieldDescriptor.LABEL_REPEATED,
                )
    pool = descriptor_pool.DescriptorPool()
    pool.Add(file)
    return message_factory.GetMessageClass(pool.FindMessageTypeByName(f"{file.package}.Reply"))


_REPLY_COLUMNS = _shadow_columns()
# Fields whose default is "" (the others' is 0), from the contract itself.
_TEXTS = {
    f.name for f in market_pb2.Tick.DESCRIPTOR.fields if f.type == FieldDescriptor.TYPE_STRING
}


class _TickColumns:
    """A FetchReply's ticks as columns, for a replay as Arrow: what :func:`as_batch` makes
    of its messages, without a Python object per tick. ``first`` and ``last`` are the
    chunk's edge positions, which the sequencing rules read."""

    def __init__(self, columns: dict[str, Sequence], positions: dict[str, Sequence], n: int):
        self._columns, self._positions, self._n = columns, positions, n
        self.first, self.last = self._position(0), self._position(n - 1)

    @classmethod
    def of(cls, reply: jr.FetchReply, wire: bytes = b"") -> _TickColumns | None:
        """The reply's ticks as columns, or None when it holds anything else, nothing, or a
        field that is at its default in some ticks only (then the rows are read one by one).
        ``wire``: the reply's bytes as received, when the caller has them (else it is
        serialized again)."""
        runs = reply.runs
        n = sum(len(run.ticks) for run in runs)
        if not n or any(not run.ticks for run in runs):
            return None
        ticks = _REPLY_COLUMNS.FromString(wire or reply.SerializeToString()).runs.ticks
        columns = {name: getattr(ticks, name) for name in _TICK_FIELDS}
        positions = {name: getattr(ticks.stream, name) for name in _POSITION_FIELDS}
        if any(len(v) not in (0, n) for v in (*columns.values(), *positions.values())):
            return None
        return cls(columns, positions, n)

    def __len__(self) -> int:
        return self._n

    def _position(self, i: int) -> market_pb2.StreamPosition:
        return market_pb2.StreamPosition(
            **{name: values[i] for name, values in self._positions.items() if values}
        )

    def batch(self) -> tuple[pa.RecordBatch, int]:
        """The RecordBatch :func:`as_batch` makes of the same ticks, and the rows dropped."""
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
        return values if values else ["" if text else 0] * self._n


def _column(values: tuple, f: pa.Field) -> pa.Array:
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
            cast[i] = arrays[i].cast(DECIMAL)
            continue
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
            rows = pa.array([not _casts(v) for v in arrays[i].to_pylist()])
        bad = rows if bad is None else pc.or_(bad, rows)
    return cast, bad


def _casts(text: str | None) -> bool:
    try:
        pa.array([text], pa.string()).cast(DECIMAL)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        return False
    return True
