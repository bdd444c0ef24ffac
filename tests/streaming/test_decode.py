"""Kafka values to rows: what a malformed record becomes. Both the live and the committing
query rely on the tick decoder's validation; the history query on the candle table's."""

from __future__ import annotations

from datetime import UTC, datetime
from decimal import Decimal

import pyarrow as pa

from proto import market_pb2
from proto.envelope import to_record
from streaming.decode import DECIMAL, candles_table, decode_ticks, kept_count


def test_malformed_prices_and_sizes_are_invalid_ticks() -> None:
    good = market_pb2.Tick(ticker="X:A/B", trade_id="1", price="1.5", size="2", exchange_time_ns=1)
    bad = [
        market_pb2.Tick(ticker="X:A/B", trade_id="2", price=p, size=z, exchange_time_ns=1)
        for p, z in (
            *(("abc", "1"), ("NaN", "1"), ("1", "Infinity"), ("", "1"), ("1", "")),
            *(("-1", "1"), ("0", "1"), ("0.00", "1"), ("1", "-0.5")),  # price > 0, size >= 0
        )
    ]
    batch = pa.RecordBatch.from_pydict({"value": [to_record(t) for t in [good, *bad]]})
    (out,) = decode_ticks(iter([batch]))
    assert out.column("valid").to_pylist() == [True] + [False] * len(bad)
    assert out.column("idle").to_pylist() == [False] * (1 + len(bad))


def test_an_idle_mark_is_neither_a_tick_nor_a_bad_record() -> None:
    mark = market_pb2.FeedIdle(ticker="X:A/B", event_time_ns=7, last_trade_ns=5)
    batch = pa.RecordBatch.from_pydict({"value": [to_record(mark), b"junk"]})
    (out,) = decode_ticks(iter([batch]))
    rows = out.select(["valid", "idle", "ticker", "trade_id", "exchange_time_ns"]).to_pylist()
    assert rows[0] == {
        "valid": False,
        "idle": True,
        "ticker": "X:A/B",
        "trade_id": None,
        "exchange_time_ns": 7,
    }
    assert (rows[1]["valid"], rows[1]["idle"]) == (False, False)


def candle(i: int, open_: str = "1.5", volume: str = "3") -> market_pb2.OHLC:
    return market_pb2.OHLC(
        ticker="X:A/B",
        period_s=60,
        open_time_ms=i * 60_000,
        open=open_,
        high="2",
        low="1",
        close="1.25",
        volume=volume,
        trade_count=4,
        closed=True,
    )


def test_candle_rows_are_typed_as_the_table_is() -> None:
    rows, dropped = candles_table([candle(0), candle(1, "1e3")], "history")
    assert dropped == set()
    assert rows.schema.field("open").type == DECIMAL
    assert rows.column("open").to_pylist() == [Decimal("1.5"), Decimal("1000")]
    assert rows.column("open_time").to_pylist()[1] == datetime(1970, 1, 1, 0, 1, tzinfo=UTC)
    assert rows.column("source").to_pylist() == ["history", "history"]


def test_candles_with_a_malformed_decimal_are_dropped_and_counted() -> None:
    batch = [
        candle(0),
        candle(1, "NaN"),
        candle(2, "abc"),
        candle(3, volume=""),
        candle(4, "1e400"),  # beyond DECIMAL(38,18)
        candle(5, "1.0000000000000000004"),  # more digits than the scale: rounded, kept
    ]
    rows, dropped = candles_table(batch, "history")
    assert dropped == {("X:A/B", 60, m * 60_000) for m in (1, 2, 3, 4)}
    assert rows.column("open_time").to_pylist() == [
        datetime(1970, 1, 1, 0, m, tzinfo=UTC) for m in (0, 5)
    ]
    assert rows.column("open").to_pylist() == [Decimal("1.5"), Decimal("1")]


def test_history_ready_counts_only_the_candles_that_were_kept() -> None:
    page_one, page_two = [candle(0), candle(1, "NaN")], [candle(2), candle(3, volume="x")]
    _, dropped = candles_table(page_one + page_two, "history")
    assert [kept_count(page, dropped) for page in (page_one, page_two)] == [1, 1]
    assert kept_count(page_one, set()) == 2


def test_a_decimal_arrow_would_wrap_becomes_null_not_another_number() -> None:
    # Arrow's cast took "1e30" whole, as 18960114910927365649.47...: a history candle's
    # volume stored as another number. Null is what the writers leave out and count.
    from streaming.decode import decimal_column

    assert decimal_column(["3", "1e30", "4e20", "0.5"]).to_pylist() == [
        Decimal(3),
        None,
        None,
        Decimal("0.5"),
    ]
