"""Live messages as Python values: Decimal prices, aware UTC times, frozen, and everything
else passed through as it came."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from decimal import Decimal

import numpy as np
import pyarrow as pa
import pytest

from candlewire.client import AsyncSubscription, Subscription, SubscriptionStats
from candlewire.market import (
    _REPLY_COLUMNS,
    CANDLE_SCHEMA,
    DECIMAL,
    DISTINCT_SAMPLE,
    MALFORMED,
    TICK_SCHEMA,
    Candle,
    Tick,
    _as_decimal,
    _casts,
    _refused_rows,
    _TickColumns,
    _varints,
    _wire_fields,
    as_batch,
    plain,
    plain_texts,
    typed,
)
from candlewire.positions import add_items
from proto import journal_pb2 as jr
from proto import market_pb2
from proto import requests_pb2 as rq
from proto.envelope import (
    MAX_REPEATED,
    MAX_STRING_BYTES,
    TYPE_IDS,
    MalformedPayload,
    OversizedField,
    checked_payload,
    decode,
    decode_body,
    encode,
)

NS = 1_704_067_200_123_456_789  # 2024-01-01T00:00:00.123456789Z


def test_a_tick_keeps_exact_numbers_and_its_time() -> None:
    msg = market_pb2.Tick(
        ticker="X:A/B",
        trade_id="7",
        price="12972.750000",
        size="0.001",
        side=market_pb2.BUY,
        exchange_time_ns=NS,
        stream=market_pb2.StreamPosition(epoch=1, seq=9),
    )
    tick = typed(msg)
    assert isinstance(tick, Tick)
    assert (tick.price, tick.size, tick.side, tick.trade_id) == (
        Decimal("12972.75"),
        Decimal("0.001"),
        "buy",
        "7",
    )
    assert tick.time == datetime(2024, 1, 1, 0, 0, 0, 123456, tzinfo=UTC)
    assert tick.time_ns == NS and tick.stream.seq == 9
    with pytest.raises(dataclasses.FrozenInstanceError):
        tick.price = Decimal(1)  # type: ignore[misc]
    # Equal and hashable by content; where it stood in the stream is not part of it.
    again = typed(
        market_pb2.Tick(
            ticker="X:A/B",
            trade_id="7",
            price="12972.75",
            size="0.001",
            side=market_pb2.BUY,
            exchange_time_ns=NS,
        )
    )
    assert again == tick and hash(again) == hash(tick)


def test_a_candle_keeps_exact_numbers_and_its_open_time() -> None:
    msg = market_pb2.OHLC(
        ticker="X:A/B",
        period_s=3600,
        open_time_ms=1_704_067_200_000,
        open="1",
        high="2.5",
        low="0.75",
        close="2",
        volume="10.000",
        trade_count=4,
        closed=True,
    )
    candle = typed(msg)
    assert isinstance(candle, Candle)
    assert candle.open_time == datetime(2024, 1, 1, tzinfo=UTC)
    assert (candle.high, candle.low, candle.volume) == (Decimal("2.5"), Decimal("0.75"), 10)
    assert (candle.period_s, candle.trade_count, candle.closed) == (3600, 4, True)


def test_other_messages_pass_through_and_bad_numbers_raise() -> None:
    other = rq.SubscriptionError(ticker="X:A/B")
    assert typed(other) is other
    from decimal import InvalidOperation

    with pytest.raises(InvalidOperation):
        typed(market_pb2.Tick(ticker="X:A/B", price="1,5", size="1"))


@pytest.mark.parametrize("aio", [False, True], ids=["sync", "async"])
def test_a_time_no_datetime_holds_is_malformed_and_the_subscription_goes_on(aio: bool) -> None:
    """A valid int64 time beyond datetime's years 1 to 9999 makes no Candle (a tick's
    nanoseconds cannot reach beyond them): the message is dropped and counted as one whose price is no decimal, and the messages after
    it still come (resuming would only bring the same message again)."""

    def candle(seq: int, open_time_ms: int, close: str = "1") -> market_pb2.OHLC:
        return market_pb2.OHLC(
            ticker="X:A/B",
            period_s=60,
            open_time_ms=open_time_ms,
            open="1",
            high="1",
            low="1",
            close=close,
            volume="1",
            stream=market_pb2.StreamPosition(epoch=1, seq=seq),
        )

    msgs = [
        candle(1, 60_000),
        candle(2, 2**62),  # past year 9999
        candle(3, -(2**62)),  # before year 1
        candle(4, 120_000, close="1,5"),  # a price that is no decimal, as before
        candle(5, 180_000),
    ]
    stats = SubscriptionStats()
    if aio:

        async def source() -> AsyncIterator[market_pb2.OHLC]:
            for m in msgs:
                yield m

        async def read() -> list:
            return [m async for m in AsyncSubscription(source(), stats)]

        got = asyncio.run(read())
    else:
        got = list(Subscription(iter(msgs), stats))
    assert [(type(m), m.stream.seq) for m in got] == [(Candle, 1), (Candle, 5)]
    assert got[1].open_time == datetime(1970, 1, 1, 0, 3, tzinfo=UTC)
    assert stats.malformed == 3


def as_row(item: Tick | Candle) -> dict:
    """A typed message in the columns of its RecordBatch (times as epoch integers)."""
    row = {f.name: getattr(item, f.name) for f in dataclasses.fields(item) if f.name in COLUMNS}
    if isinstance(item, Tick):
        row["time"] = item.time_ns
    else:
        row["open_time"] = int(item.open_time.timestamp() * 1000)
    s = item.stream
    row["stream"] = {
        "epoch": s.epoch,
        "seq": s.seq,
        "publish_time_ms": s.publish_time_ms,
        "source_partition": s.source_partition,
        "source_offset": s.source_offset,
    }
    return row


COLUMNS = set(TICK_SCHEMA.names) | set(CANDLE_SCHEMA.names)


def batch_rows(batch) -> list[dict]:
    import pyarrow as pa

    times = [c for c in ("time", "open_time") if c in batch.schema.names]
    for name in times:
        i = batch.schema.get_field_index(name)
        batch = batch.set_column(i, name, batch.column(i).cast(pa.int64()))
    return batch.to_pylist()


def test_a_run_as_arrow_holds_what_the_typed_messages_hold_row_for_row() -> None:
    ticks = [
        market_pb2.Tick(
            ticker="X:A/B",
            trade_id=str(i),
            price=f"{12_000 + i}.{i:04d}",
            size="0.000000000000000001" if i == 3 else f"{i % 5}.5",
            side=i % 4,  # 3 is no Side the proto knows: "" like a typed tick
            exchange_time_ns=NS + i,
            stream=market_pb2.StreamPosition(
                epoch=2, seq=i + 1, publish_time_ms=9, source_partition=4, source_offset=70 + i
            ),
        )
        for i in range(20)
    ]
    batch, dropped = as_batch(ticks)
    assert dropped == 0 and batch.schema == TICK_SCHEMA
    assert batch_rows(batch) == [as_row(typed(t)) for t in ticks]
    assert batch.column("side").to_pylist()[:4] == ["", "buy", "sell", ""]

    candles = [
        market_pb2.OHLC(
            ticker="X:A/B",
            period_s=60,
            open_time_ms=60_000 * i,
            open="1.5",
            high="2",
            low="0.25",
            close=str(i),
            volume="1000000.123",
            trade_count=i,
            closed=i % 2 == 0,
            revision=i // 2,  # a closed candle corrected after a gap comes again, one higher
            stream=market_pb2.StreamPosition(epoch=2, seq=i + 1, source_offset=-1),
        )
        for i in range(5)
    ]
    batch, dropped = as_batch(candles)
    assert dropped == 0 and batch.schema == CANDLE_SCHEMA
    assert batch_rows(batch) == [as_row(typed(c)) for c in candles]
    assert [typed(c).revision for c in candles] == batch.column("revision").to_pylist()
    assert batch.column("revision").to_pylist() == [0, 0, 1, 1, 2]


def test_rows_arrow_cannot_hold_are_dropped_and_counted_and_the_rest_kept() -> None:
    ticks = [
        market_pb2.Tick(ticker="X:A/B", trade_id=str(i), price=p, size="1", exchange_time_ns=NS)
        for i, p in enumerate(["1.5", "abc", "2", "1e400", "", "3"])
    ]
    batch, dropped = as_batch(ticks)
    assert dropped == 3
    assert batch.column("trade_id").to_pylist() == ["0", "2", "5"]
    assert [str(v.normalize()) for v in batch.column("price").to_pylist()] == ["1.5", "2", "3"]
    with pytest.raises(ValueError):
        as_batch([])


# Texts Arrow's cast (pyarrow 26) turns into another value instead of refusing: scaled to 18
# decimals in 128 bits unchecked, some past DECIMAL's 20 integer digits wrap ("4.2e20" came out
# 79717633079061536536.6...), 2**127's at 18 decimals flips its sign, and a few with far too
# many decimals come out 0.
WRAPS = [
    "1e30",
    "4.2e20",
    "-7E+20",
    "3e22",
    "400000000000000000000",
    "-400000000000000000000.5",
    "170141183460469231731.687303715884105728",
    "1e-77",
    "1" + "0" * 400,
]
# ... and texts at DECIMAL's edges, with an exponent or long, that it holds as they are
HOLDS = [
    "1.5",
    "99999999999999999999.5",
    "-99999999999999999999.999999999999999999",
    "1e19",
    "4.2E-17",
    "12345678901234567890123456789012345678e-18",
]


def test_a_decimal_text_arrow_would_turn_into_another_value_is_no_decimal() -> None:
    """Such a row is dropped and counted as a row whose price is no decimal, never kept
    with a value other than its typed message's; the rest are kept, as they are."""
    prices = [p for pair in zip(HOLDS, WRAPS, strict=False) for p in pair] + WRAPS[len(HOLDS) :]
    ticks = [
        market_pb2.Tick(ticker="X:A/B", trade_id=str(i), price=p, size="1", exchange_time_ns=NS)
        for i, p in enumerate(prices)
    ]
    batch, dropped = as_batch(ticks)
    assert dropped == len(WRAPS)
    assert batch.column("price").to_pylist() == [Decimal(p) for p in HOLDS]
    assert batch.column("trade_id").to_pylist() == [str(prices.index(p)) for p in HOLDS]
    # a size too, and a run long enough that its repeating texts are parsed once each
    for i, text in enumerate(WRAPS):
        sizes = [*HOLDS * DISTINCT_SAMPLE, text] if i % 2 else [text, *HOLDS * DISTINCT_SAMPLE]
        with pytest.raises(pa.ArrowInvalid):
            _as_decimal(pa.array(sizes, pa.string()))
    batch, dropped = as_batch([market_pb2.Tick(ticker="X:A/B", price="2", size=p) for p in prices])
    assert dropped == len(WRAPS)
    assert batch.column("size").to_pylist() == [Decimal(p) for p in HOLDS]


ODD = [
    "12345e-22",
    "1e30",
    "0.0000000000000000001",
    "NaN",
    "Infinity",
    "-sNaN",
    "1_000",
    " 1",
    "\u0661\u0662",
    "+1.5",
    "1.",
    ".5",
    "1E+2",
    "-0",
    "0",
    "1.50000000000000000000",
    "",
    "100000000000000000000",
    "99999999999999999999.999999999999999999",
    "1e-18",
    "1e-19",
    "1E-2147483600",  # pyarrow's cast of it ended the process
    "0E2147483648",
    "1E2147483647",
    "0E-30",
]  # fmt: skip (a zero with an exponent of 10,000 or more is the one known difference)


@pytest.mark.parametrize("text", [*HOLDS, *WRAPS, *ODD])
def test_a_typed_value_is_refused_where_the_batch_drops_its_row(text: str) -> None:
    # One subscription can take both paths (a replay's batches, then live values): the
    # typed one kept NaN, "1e30", a 19th decimal and "1_000", which the batches drop.
    tick = market_pb2.Tick(ticker="X:A/B", price="2", size=text, exchange_time_ns=NS)
    candle = market_pb2.OHLC(ticker="X:A/B", period_s=60, open=text, high="2", low="1",
                             close="1", volume="1")  # fmt: skip
    for msg in (tick, candle):
        _batch, dropped = as_batch([msg])
        try:
            typed(msg)
            refused = False
        except MALFORMED:
            refused = True
        assert refused == bool(dropped), (text, type(msg).__name__)


@pytest.mark.parametrize(
    "open_ms", [2**62, 253_402_300_800_000, 253_402_300_799_999, -62_135_596_800_001, 0, -1]
)
def test_a_candle_time_is_refused_by_the_batch_where_the_typed_candle_refuses_it(
    open_ms: int,
) -> None:
    # The batch kept a candle of 2**62 ms, which the typed path drops (no datetime holds it).
    candle = market_pb2.OHLC(ticker="X:A/B", period_s=60, open_time_ms=open_ms, open="1",
                             high="1", low="1", close="1", volume="1")  # fmt: skip
    batch, dropped = as_batch([candle, market_pb2.OHLC(ticker="X:A/B", period_s=60, open="2",
                                                       high="2", low="2", close="2",
                                                       volume="2")])  # fmt: skip
    try:
        typed(candle)
        refused = False
    except MALFORMED:
        refused = True
    assert dropped == refused and len(batch) == 2 - dropped
    assert batch.column("open")[-1].as_py() == Decimal(2)


def varied_tick(i: int, **fields: object) -> market_pb2.Tick:
    values: dict = {
        "ticker": "X:A/B",
        "trade_id": str(10**9 + i),
        "price": f"{30000 + i % 700 * 0.01:.2f}",
        "size": f"0.{i % 997 + 1:05d}",
        "side": 1 + i % 2,
        "exchange_time_ns": NS + i * 1000,
        "ingest_time_ns": NS,
        "stream": market_pb2.StreamPosition(
            epoch=17,
            seq=i + 1,
            publish_time_ms=i // 100 + 1,
            source_partition=3,
            source_offset=i + 1,
        ),
    }
    return market_pb2.Tick(**(values | fields))


EXTREMES = [
    {
        "side": side,
        "exchange_time_ns": ns,
        "stream": market_pb2.StreamPosition(
            epoch=2**64 - 1 - k,
            seq=k + 1,
            publish_time_ms=ms,
            source_partition=p,
            source_offset=off,
        ),
    }
    for k, (side, ns, ms, p, off) in enumerate(
        [
            (1, -1, 1, -1, -1),
            (2, 2**63 - 1, 2**62, 2**31 - 1, 2**63 - 1),
            (7, -(2**63), -(2**40), -(2**31), 1),
            (-3, 127, 128, 300, 2**35),
            (2**31 - 1, 2**14, -2, 1, 16383),
        ]
    )
]


def columns_of(reply: jr.FetchReply) -> _TickColumns | None:
    """The reply's ticks as the Arrow replay reads them off the wire, or None: the same with
    each run's ticks counted by the check of the payload (``checked_payload``, as the client
    reads a reply) as counted apart."""
    payload = reply.SerializeToString()
    read = _TickColumns.read(payload)
    _, checked = checked_payload(encode(reply), jr.FetchReply)
    again = _TickColumns.read(payload, [len(run.ticks) for run in checked.runs])
    assert (read is None) == (again is None)
    if read is not None and again is not None:
        assert read[0] == again[0] and len(read[1]) == len(again[1])
        assert read[1].batch()[0].equals(again[1].batch()[0])
    return read[1] if read else None


def reply_of(*runs: list) -> jr.FetchReply:
    reply = jr.FetchReply(request_id="r", status=jr.FETCH_OK)
    for items in runs:
        add_items(reply.runs.add(topic="X:A/B|tick"), items)
    return reply


@pytest.mark.parametrize(
    "runs",
    [
        [[varied_tick(i) for i in range(100)], [varied_tick(i) for i in range(100, 250)]],
        # fields at their default in every tick: not on the wire at all
        [[varied_tick(i, side=0, stream=market_pb2.StreamPosition(seq=i + 1)) for i in range(9)]],
        [[varied_tick(i, price="x" if i == 7 else str(i + 1)) for i in range(20)]],  # dropped
        # every varint length, negatives (10 bytes on the wire), unknown sides
        [[varied_tick(i, **EXTREMES[i % len(EXTREMES)]) for i in range(200)]],
        # texts of many byte lengths (some past 127: two bytes of length), multibyte UTF-8,
        # and widths that change from one field to the next and within one only at its end
        [
            [
                varied_tick(
                    i,
                    ticker="Ü:A/B",
                    trade_id="é" * (i % 5) + "x" * (i * 37 % 300) + str(i),
                    price=str(1 + i * 0.5),
                    size="0.5" if i < 59 else "0.25",
                )
                for i in range(60)
            ]
        ],
    ],
    ids=["two runs", "defaults", "no decimal", "extremes", "texts of mixed widths"],
)
def test_ticks_read_as_columns_make_the_batch_their_messages_make(runs: list) -> None:
    reply = reply_of(*runs)
    msgs = [t for run in runs for t in run]
    columns = columns_of(reply)
    assert columns is not None and len(columns) == len(msgs)
    assert (columns.first, columns.last) == (msgs[0].stream, msgs[-1].stream)
    batch, dropped = columns.batch()
    expected, expected_dropped = as_batch(msgs)
    assert batch.equals(expected) and dropped == expected_dropped


@pytest.mark.parametrize(
    "values",
    [
        *([2 ** (7 * (w - 1)) + k for k in range(50)] for w in range(1, 10)),  # one width each
        [-(2**63), -1, -5, -(2**31)],  # negatives: ten bytes each
        [200, 5, 20_000],  # widths 2, 1, 3: as many bytes as three of the first's width
        [1, 300, 2**40, -7, 2**63 - 1],
    ],
    ids=lambda v: f"{len(v)} values",
)
def test_packed_varints_decode_as_protobuf_encodes_them(values: list[int]) -> None:
    ticks = _REPLY_COLUMNS().runs.ticks
    ticks.exchange_time_ns.extend(values)  # packed int64: protobuf's own encoding
    packed = _wire_fields(ticks.SerializeToString())[6]
    assert _varints(packed, np.int64).tolist() == values
    assert _varints(packed, np.int32).tolist() == [
        int(np.int64(v).astype(np.int32)) for v in values
    ]


@pytest.mark.parametrize(
    "texts",
    [
        [f"{30000 + i % 300 * 0.5:.1f}" for i in range(8 * DISTINCT_SAMPLE)],  # a tick grid
        [f"0.{i:07d}" for i in range(8 * DISTINCT_SAMPLE)],  # every one different
        # repeating at first, then not; spellings of one value; the smallest and largest
        ["1", "1.0", "01.000"] * DISTINCT_SAMPLE + [str(i) for i in range(5 * DISTINCT_SAMPLE)],
        ["0.000000000000000001", "99999999999999999999.5"] * (4 * DISTINCT_SAMPLE),
    ],
    ids=["grid", "distinct", "repeating then not", "extremes"],
)
def test_decimal_texts_cast_as_arrow_casts_them_one_by_one(texts: list[str]) -> None:
    column = pa.array(texts, pa.string())
    assert _as_decimal(column).equals(column.cast(DECIMAL))
    bad = pa.array([*texts[:-1], "1e"], pa.string())  # no decimal: refused either way
    with pytest.raises(pa.ArrowInvalid):
        _as_decimal(bad)


@pytest.mark.parametrize(
    "bad_at",
    [[0], [4999], [2500, 2501], [1, 700, 701, 3333, 4998], list(range(0, 5000, 97)), []],
    ids=["first", "last", "adjacent", "scattered", "every 97th", "none"],
)
def test_the_rows_a_column_refuses_are_the_ones_refused_one_by_one(bad_at: list[int]) -> None:
    # Found by halves, not text by text (a chunk with one bad price cost 0.7 s): the same
    # rows, whatever makes each one bad.
    spoilers = ["abc", "1e400", "4.2e20", "", "1e", "NaN"]
    texts = [f"{30000 + i % 300 * 0.5:.1f}" for i in range(5000)]
    for k, i in enumerate(bad_at):
        texts[i] = spoilers[k % len(spoilers)]
    column = pa.array(texts, pa.string())
    refused = _refused_rows(column)
    assert refused == [i for i, t in enumerate(texts) if not _casts(t)] == bad_at
    batch, dropped = as_batch(
        [market_pb2.Tick(ticker="X:A/B", price=t, size="1", exchange_time_ns=NS) for t in texts]
    )
    assert dropped == len(bad_at) and len(batch) == 5000 - len(bad_at)


def test_a_run_whose_fields_are_at_their_default_in_some_ticks_only_is_read_as_messages() -> None:
    """Such a field has fewer values than ticks, and which ticks lack it is not on the wire:
    that run's ticks are decoded as messages, the chunk's other runs still as columns, and
    the batch is the one their messages make."""
    some_sides = [varied_tick(i, side=i % 3) for i in range(30)]
    first_at_0 = [varied_tick(i, stream=market_pb2.StreamPosition(seq=i + 1, source_offset=i))
                  for i in range(30, 60)]  # fmt: skip
    whole = [varied_tick(i) for i in range(60, 100)]
    for runs in ([some_sides], [first_at_0, whole], [whole, some_sides, whole[:3]]):
        msgs = [t for run in runs for t in run]
        columns = columns_of(reply_of(*runs))
        assert columns is not None and len(columns) == len(msgs)
        assert (columns.first, columns.last) == (msgs[0].stream, msgs[-1].stream)
        batch, dropped = columns.batch()
        expected, expected_dropped = as_batch(msgs)
        assert batch.equals(expected) and dropped == expected_dropped
    candles = [market_pb2.OHLC(ticker="X:A/B", period_s=60, open="1")]
    for runs in ([candles], [[varied_tick(1)], candles], []):
        assert columns_of(reply_of(*runs)) is None


def test_a_reply_read_as_columns_keeps_its_own_fields_and_counts_every_tick() -> None:
    reply = reply_of([varied_tick(i) for i in range(50)])
    reply.cursor, reply.done, reply.available_from_ms = 77, True, 123
    read = _TickColumns.read(reply.SerializeToString())
    assert read is not None
    head, columns = read
    assert (head.request_id, head.status, head.cursor, head.done) == ("r", jr.FETCH_OK, 77, True)
    assert head.available_from_ms == 123 and len(columns) == 50
    # A tick with every field at its default is an empty message: no column holds a value
    # of it, so only counting the ticks themselves finds it (and its run is read as messages).
    msgs = [*(varied_tick(i) for i in range(10)), market_pb2.Tick()]
    blank = columns_of(reply_of(msgs))
    assert blank is not None and len(blank) == 11
    assert blank.batch() == as_batch(msgs)


def test_what_the_columns_cannot_vouch_for_is_left_to_the_whole_decode() -> None:
    """A text past its limit in the last of 100k ticks, a reply that is not OK or comes from
    the archive, bytes that do not parse: the replay decodes those whole (``decode_body``),
    which refuses or reads them message by message."""
    ticks = [varied_tick(i) for i in range(MAX_REPEATED)]
    ticks[-1].trade_id = "x" * (MAX_STRING_BYTES + 1)
    oversized = reply_of(ticks[:50_000], ticks[50_000:])
    assert columns_of(oversized) is None
    with pytest.raises(OversizedField):
        decode(encode(oversized))
    ticks[-1].trade_id = "x" * MAX_STRING_BYTES  # at the limit: read as columns
    assert len(columns_of(reply_of(ticks[:50_000], ticks[50_000:]))) == MAX_REPEATED
    archived = reply_of([varied_tick(i) for i in range(5)])
    archived.archive_until_ms = 1
    failed = reply_of([varied_tick(i) for i in range(5)])
    failed.status = jr.FETCH_OUT_OF_RANGE
    assert columns_of(archived) is None and columns_of(failed) is None
    assert _TickColumns.read(b"\xff" * 100) is None


def test_a_run_s_own_fields_are_parsed_as_the_decoder_parses_them() -> None:
    """A topic that is no UTF-8, or a position that does not parse, is refused by the
    decoder; the columns do not vouch for such a reply."""
    good = reply_of([varied_tick(i) for i in range(5)]).SerializeToString()
    assert columns_of(jr.FetchReply.FromString(good)) is not None
    runs = jr.FetchReply.DESCRIPTOR.fields_by_name["runs"].number
    for run_field in (b"\x0a\x01\xff", b"\x12\x02\x08\xff"):  # topic; first: a cut varint
        payload = good + bytes([runs << 3 | 2, len(run_field)]) + run_field
        with pytest.raises(MalformedPayload):
            decode_body(bytes([TYPE_IDS[jr.FetchReply]]) + payload)
        assert _TickColumns.read(payload) is None


@pytest.mark.parametrize(
    ("value", "text"),
    [
        ("99999999999999999999.999999999999999999", "99999999999999999999.999999999999999999"),
        ("12345678901.123456789012345678", "12345678901.123456789012345678"),
        ("100.500000000000000000", "100.5"),
        ("1E+5", "100000"),
        ("0E-18", "0"),
        ("-0.0", "0"),
        ("0.000000000000000001", "0.000000000000000001"),
        ("-1.50", "-1.5"),
    ],
)
def test_plain_text_is_exact_at_every_digit_the_tables_hold(value: str, text: str) -> None:
    """38 digits, not the decimal context's 28: the chart's candles and the archive's
    replay rounded ``12345678901.123456789012345678`` to ``12345678901.12345678901234568``."""
    assert plain(Decimal(value)) == text
    column = pa.array([Decimal(value), None], pa.decimal128(38, 18))
    assert plain_texts(column).to_pylist() == [text, None]


def test_plain_texts_of_a_column_are_plain_of_each_value() -> None:
    rng = np.random.default_rng(7)
    values = [
        Decimal(int(d)).scaleb(-int(s))
        for d, s in zip(
            rng.integers(-(10**18), 10**18, 5_000), rng.integers(0, 19, 5_000), strict=True
        )
    ]
    column = pa.chunked_array([values[:2_500], values[2_500:]], pa.decimal128(38, 18))
    assert plain_texts(column).to_pylist() == [plain(v) for v in values]
