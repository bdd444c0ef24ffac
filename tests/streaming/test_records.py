"""The driver's records from Kafka that pass the envelope but not the tables or the ledger:
each is dropped and counted, and the records beside it go on. One such record stopped the
stream job at every restart (the checkpoint read it again), and one refused trigger cost
its batch's every firing."""

from __future__ import annotations

import pytest

from candlewire.triggers import add_request, condition
from proto import book_pb2, market_pb2
from proto import cep_pb2 as cep
from proto.envelope import to_record
from streaming.decode import (
    candle_key,
    candles_table,
    decode_records,
    storable_book,
    storable_market,
    storable_page,
)
from streaming.firings import parse_firings

TICKER = "SIM:BTC/USDT"


def candle(**kw) -> market_pb2.OHLC:
    fields = {"ticker": TICKER, "period_s": 60, "open_time_ms": 1_700_000_040_000}
    prices = {"open": "1", "high": "2", "low": "1", "close": "2", "volume": "3"}
    return market_pb2.OHLC(**{**fields, **prices, "trade_count": 2, **kw})


def firing(client_id: str, trigger_id: str) -> cep.CepFiring:
    cross = condition("price_cross", level="100", direction="up")
    trigger = add_request(client_id, trigger_id, TICKER, cross, user_id="alice")
    return cep.CepFiring(trigger=trigger, event=cep.CEPTriggerEvent(trigger_id=trigger_id))


def test_a_firing_whose_trigger_is_refused_costs_only_itself() -> None:
    batch = cep.CepFirings(firings=[firing("client-1", "good"), firing("", "bad")])
    fired, refused = parse_firings(batch.SerializeToString())
    assert [(t.trigger_id, e.trigger_id) for t, e in fired] == [("good", "good")]
    assert [trigger_id for trigger_id, _ in refused] == ["bad"]
    assert "client_id" in refused[0][1]


UNSTORABLE = [
    ("a page number past PostgreSQL's integer", market_pb2.OHLCBatch(page=2**31)),
    (
        "an expected page count past it",
        market_pb2.OHLCBatch(metadata=market_pb2.HistoryRequestMetadata(expected_pages=2**32 - 1)),
    ),
    ("a NUL in the error", market_pb2.OHLCBatch(request_id="r", error="lost\x00")),
    ("a NUL in the request id", market_pb2.OHLCBatch(request_id="r\x00")),
    ("a status no release names", market_pb2.Market(ticker=TICKER, status=42)),
    ("a tick size that is no decimal", market_pb2.Market(ticker=TICKER, tick_size="0,01")),
    ("a snapshot size past an integer", market_pb2.Market(ticker=TICKER, snapshot_size=2**31)),
    ("a market that is no ticker", market_pb2.Market(ticker="BTCUSDT")),
    ("a snapshot reason no release names", book_pb2.BookSnapshot(ticker=TICKER, reason=42)),
    ("a book record that is no ticker", book_pb2.BookDelta(ticker="nope")),
]
STORABLE = {
    market_pb2.OHLCBatch: (storable_page, market_pb2.OHLCBatch(request_id="r", page=3)),
    market_pb2.Market: (
        storable_market,
        market_pb2.Market(ticker=TICKER, tick_size="1e-8", status=market_pb2.TRADING),
    ),
    book_pb2.BookSnapshot: (storable_book, book_pb2.BookSnapshot(ticker=TICKER, reason=1)),
    book_pb2.BookDelta: (storable_book, book_pb2.BookDelta(ticker=TICKER, exchange_time_ns=1)),
}


@pytest.mark.parametrize(("why", "bad"), UNSTORABLE, ids=[why for why, _ in UNSTORABLE])
def test_a_record_the_tables_cannot_hold_is_dropped_and_counted(why: str, bad) -> None:
    storable, good = STORABLE[type(bad)]
    records = [to_record(good), to_record(bad), to_record(good)]
    kept, dropped = decode_records(records, type(bad), storable)
    assert kept == [good, good] and dropped == 1, why


def test_candles_the_table_cannot_hold_are_left_out_and_named() -> None:
    good = candle()
    bad = [
        candle(open_time_ms=2**62),  # past year 9999: Arrow refused the whole page
        candle(period_s=61),
        candle(ticker="BTCUSDT"),
        candle(open_time_ms=1_700_000_100_000, volume="1,5"),  # no decimal: as before
    ]
    rows, dropped = candles_table([good, *bad], "history")
    assert rows.num_rows == 1 and rows.column("period_s").to_pylist() == [60]
    assert dropped == {candle_key(c) for c in bad}
