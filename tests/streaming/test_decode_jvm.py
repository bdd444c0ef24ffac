"""The JVM tick decoder (jvm/decoder's DecodeTick) against the Python reference: the same row
for every Kafka value, valid, idle, malformed and fuzzed alike."""

from __future__ import annotations

import os
import random

import pyarrow as pa

from proto import market_pb2
from proto.envelope import to_record
from streaming.decode import TICK_ROWS, decode_ticks, decode_ticks_in_jvm


def tick(**fields: object) -> bytes:
    base: dict[str, object] = {
        "ticker": "SIM:A/B",
        "trade_id": "7",
        "price": "1.5",
        "size": "2",
        "side": market_pb2.BUY,
        "exchange_time_ns": 1_700_000_000_000_000_001,
        "ingest_time_ns": 1_700_000_000_000_000_009,
    }
    return to_record(market_pb2.Tick(**{**base, **fields}))


GOOD_DECIMALS = ["1", "1.", ".5", "+1.5e-3", "2E+5", "0.00000001", "65000.10", "5.e3", "+.5"]
# Decimals, but no price (not above zero) or no size (below zero): invalid ticks too.
NOT_PRICES = ["0", "0.000", "+0e5", "-1", "-0.5", "-2E+5", ".0", "00.00e7", "-.5e+10"]
NOT_SIZES = ["-1", "-0.001", "-2E+5"]
BAD_DECIMALS = ["", "abc", "NaN", "Infinity", "-inf", "1_000", " 1", "1 ", "\u0661", "1e", "e5"]
BAD_DECIMALS += [".", "1.2.3", "+", "1e+", "0x10", ".e1", "++1", "1e5.5", "1.5E", "-e5", "1\n"]


def crafted() -> list[bytes | None]:
    ohlc = market_pb2.OHLC(ticker="SIM:A/B", period_s=60, open="1", high="1", low="1")
    values: list[bytes | None] = [
        tick(),
        tick(side=market_pb2.SELL, ingest_time_ns=0),
        tick(side=0),
        tick(side=7),  # an enum value this build does not know: kept, no side
        tick(trade_id=""),
        tick(ticker=""),
        tick(ticker="ÜNÏ:Ä/B", trade_id="é"),
        *(tick(price=d, size=d) for d in GOOD_DECIMALS),
        *(tick(price=d) for d in BAD_DECIMALS),
        *(tick(size=d) for d in BAD_DECIMALS),
        *(tick(price=d) for d in NOT_PRICES),
        *(tick(size=d) for d in NOT_SIZES),
        tick(size="0"),  # a size of zero is a size
        # proto.envelope.MAX_STRING_BYTES, in UTF-8 bytes: at the limit, and one past it
        tick(trade_id="x" * 4096),
        tick(trade_id="x" * 4097),
        tick(ticker="SIM:" + "é" * 2047 + "/B"),  # 4099 bytes in 2051 characters
        tick(price="1" + "0" * 4096),
        # past it, then replaced by a later occurrence: the value the parse keeps is judged
        tick(trade_id="x" * 4097) + market_pb2.Tick(trade_id="7").SerializeToString(),
        to_record(market_pb2.FeedIdle(ticker="SIM:A/" + "B" * 4091, event_time_ns=5)),
        to_record(market_pb2.FeedIdle(ticker="SIM:A/B", event_time_ns=5, last_trade_ns=3)),
        to_record(market_pb2.FeedIdle(event_time_ns=5)),
        to_record(ohlc),
        None,
        b"",
        b"\x01",
        b"\x02" + tick()[1:],  # another protocol version
        b"\x01\x7f" + tick()[2:],  # unknown type byte
        b"\x01\x05" + tick()[2:],  # a Tick's bytes under the OHLC type
        tick()[:-3],  # truncated
        b"\x01\x04\x0a\x02\xff\xfe",  # ticker that is not UTF-8
        b"\x01\x04\x0a\x7f",  # a length past the end
        b"\x01\x04\x08",  # a varint field cut short
        tick() + b"\x0a\x07SIM:C/D",  # the ticker twice: the last one counts
        tick() + b"\xfb\x07\xfc\x07",  # an unknown empty group (field 127)
        tick() + b"\xfb\x07" * 60 + b"\xfc\x07" * 60,  # nested 60 deep
        tick() + b"\xfb\x07" * 120 + b"\xfc\x07" * 120,  # past the decoders' depth
    ]
    return values


def fuzzed(n: int, seed: int = 18) -> list[bytes]:
    """Valid envelopes with random bytes flipped, cut or appended."""
    rng = random.Random(seed)
    idle = to_record(market_pb2.FeedIdle(ticker="SIM:A/B", event_time_ns=5, last_trade_ns=3))
    seeds = [tick(), tick(price="0.1", size="3e2"), idle]
    out = []
    for _ in range(n):
        value = bytearray(rng.choice(seeds))
        for _ in range(rng.randint(1, 4)):
            op = rng.random()
            if op < 0.6 and len(value) > 2:
                value[rng.randrange(2, len(value))] = rng.randrange(256)
            elif op < 0.8:
                del value[rng.randrange(2, max(3, len(value))) :]
            else:
                value += bytes(rng.randrange(256) for _ in range(rng.randint(1, 6)))
        out.append(bytes(value))
    return out


def python_rows(values: list[bytes | None]) -> list[dict]:
    batch = pa.RecordBatch.from_pydict({"value": values}, pa.schema([("value", pa.binary())]))
    (out,) = decode_ticks(iter([batch]))
    return out.to_pylist()


def jvm_rows(spark, values: list[bytes | None]) -> list[dict]:
    records = spark.createDataFrame(
        [(v, 0, i) for i, v in enumerate(values)], "value binary, partition int, offset bigint"
    )
    rows = decode_ticks_in_jvm(spark, records).orderBy("offset").collect()
    return [{name: row[name] for name in TICK_ROWS.names} for row in rows]


def assert_grouped_by_their_feed(spark, values: list[bytes | None], rows: list[dict]) -> None:
    """The committing query groups raw records by ``Commit.feedOf`` and judges each group as
    one feed's state: every tick and idle mark the decoder accepts must land in its ticker's
    group (a rejected one may go anywhere; its group counts it as the ``""`` group would)."""
    feed_of = spark._jvm.io.candlewire.spark.Commit.feedOf
    for value, row in zip(values, rows, strict=True):
        if row["valid"] or row["idle"]:
            assert feed_of(value) == row["ticker"], value


def test_both_decoders_give_the_same_rows_for_crafted_records(spark) -> None:
    values = crafted()
    expected = python_rows(values)
    assert jvm_rows(spark, values) == expected
    assert_grouped_by_their_feed(spark, values, expected)
    # The cases mean something: the reference finds valid ticks, idle marks and rejects.
    valid = [r["valid"] for r in expected]
    assert valid[:4] == [True] * 4 and valid.count(True) == 12 + len(GOOD_DECIMALS)
    assert valid[-4:] == [True, True, True, False] and expected[-4]["ticker"] == "SIM:C/D"
    assert [r["idle"] for r in expected].count(True) == 1
    assert expected[3]["side"] is None and expected[1]["ingest_time_ns"] is None


# `make fuzz` runs 200,000 (and another seed); CI runs 3,000.
FUZZ_RECORDS = int(os.environ.get("CANDLEWIRE_FUZZ_RECORDS", "3000"))
FUZZ_SEED = int(os.environ.get("CANDLEWIRE_FUZZ_SEED", "18"))


def test_both_decoders_give_the_same_rows_for_fuzzed_records(spark) -> None:
    values = fuzzed(FUZZ_RECORDS, FUZZ_SEED)
    expected = python_rows(values)
    assert jvm_rows(spark, values) == expected
    assert_grouped_by_their_feed(spark, values, expected)
    kinds = {(r["valid"], r["idle"]) for r in expected}
    assert {(True, False), (False, False)} <= kinds  # the fuzz reaches both outcomes


def test_the_decoder_keeps_each_record_s_kafka_position(spark) -> None:
    records = spark.createDataFrame(
        [(tick(trade_id=str(i)), i % 3, 100 + i) for i in range(6)],
        "value binary, partition int, offset bigint",
    )
    rows = decode_ticks_in_jvm(spark, records).orderBy("offset").collect()
    assert [(r["trade_id"], r["partition"], r["offset"]) for r in rows] == [
        (str(i), i % 3, 100 + i) for i in range(6)
    ]
