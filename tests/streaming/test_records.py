"""The driver's records from Kafka that pass the envelope but not the tables or the ledger:
one such record stopped the stream job at every restart (the checkpoint read it again), and
one refused trigger cost its batch's every firing. A book record or candle is dropped and
counted; a history page or market, which its request or snapshot counts, is made storable
instead, so the request is still answered and the snapshot completes."""

from __future__ import annotations

import threading

import pytest

from candlewire.triggers import TriggerRejected, add_request, condition
from proto import book_pb2, market_pb2
from proto import cep_pb2 as cep
from proto.envelope import to_record
from streaming.decode import (
    candle_key,
    candles_table,
    decode_records,
    ledger_page,
    staged_market,
    storable_book,
)
from streaming.firings import parse_firings
from streaming.queries.metadata import market_row

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


UNSTORABLE_BOOKS = [
    ("a snapshot reason no release names", book_pb2.BookSnapshot(ticker=TICKER, reason=42)),
    ("a book record that is no ticker", book_pb2.BookDelta(ticker="nope")),
]


@pytest.mark.parametrize(("why", "bad"), UNSTORABLE_BOOKS, ids=[w for w, _ in UNSTORABLE_BOOKS])
def test_a_book_record_the_tables_cannot_hold_is_dropped_and_counted(why: str, bad) -> None:
    good = type(bad)(ticker=TICKER, exchange_time_ns=1)
    records = [to_record(good), to_record(bad), to_record(good)]
    kept, dropped = decode_records(
        records, book_pb2.BookDelta | book_pb2.BookSnapshot, storable_book
    )
    assert kept == [good, good] and dropped == 1, why


def test_a_history_page_the_ledger_cannot_hold_still_answers_its_request() -> None:
    """Dropped, a page left its request waiting for ever: its texts' NULs are replaced, and a
    page number past PostgreSQL's integer becomes the request's error."""
    page = market_pb2.OHLCBatch(request_id="r-1", page=3, rows=[candle()])
    assert ledger_page(page) is page and page.page == 3 and len(page.rows) == 1
    lost = ledger_page(market_pb2.OHLCBatch(request_id="r-1", page=2**31, rows=[candle()]))
    assert lost.request_id == "r-1" and not lost.rows and "2**31" in lost.error
    # The first page carries where the answer goes: it stays, with the error.
    meta = market_pb2.HistoryRequestMetadata(
        request_id="r-1", expected_pages=2**32 - 1, notification_topic="RESPONSE:c-1"
    )
    first = ledger_page(market_pb2.OHLCBatch(request_id="r-1", metadata=meta))
    assert first.error and first.metadata.notification_topic == "RESPONSE:c-1"
    assert first.metadata.expected_pages == 2**31 - 1
    failed = ledger_page(market_pb2.OHLCBatch(request_id="r\x002", error="lost\x00"))
    assert (failed.request_id, failed.error) == ("r\ufffd2", "lost\ufffd")


def test_a_market_the_table_cannot_hold_is_kept_toward_its_snapshot() -> None:
    """A snapshot completes when all its markets are staged, so none is dropped (one was,
    and the exchange's refresh never completed again): a bad field becomes null, a status
    this build does not name its number, a NUL in the staging key U+FFFD. Tickers the
    client refuses (not upper case) are listings like any other."""
    odd = market_pb2.Market(
        ticker="OKX:USDe/USDT\x00",
        request_id="m-1",
        tick_size="0,01",
        lot_size="1e-8",
        min_notional="1e25",  # past DECIMAL(38,18): its cast failed the MERGE
        status=42,
    )
    staged = staged_market(odd)
    assert (staged.ticker, staged.request_id) == ("OKX:USDe/USDT\ufffd", "m-1")
    row = market_row(staged)
    assert (row["tick_size"], row["lot_size"], row["status"]) == (None, "1e-8", "42")
    assert row["min_notional"] is None
    listed = market_row(market_pb2.Market(ticker="OKX:USDe/USDT", status=market_pb2.TRADING))
    assert (row["ticker"][:13], listed["status"]) == ("OKX:USDe/USDT", "TRADING")


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


def test_the_desk_holds_at_most_cep_max_triggers_whatever_the_owners(tmp_path) -> None:
    """A client names its owners (any number of client ids under its key), so only a limit
    on the whole registry bounds what the job holds. The desk's decision alone: its Kafka
    and symbol reads are replaced, as its loop is not started."""
    from streaming.desk import TriggerDesk
    from tests.support import free_settings

    desk = TriggerDesk.__new__(TriggerDesk)
    desk.settings = free_settings(tmp_path).model_copy(update={"cep_max_triggers": 3})
    desk.registry, desk._fired, desk._fired_lock = {}, [], threading.Lock()
    desk._check_listed = lambda ticker: None  # type: ignore[method-assign]
    desk._write = lambda req: None  # type: ignore[method-assign]
    cross = condition("price_cross", level="1", direction="up")
    acks = [desk.handle(add_request(f"owner-{i}", f"t-{i}", TICKER, cross)) for i in range(4)]
    assert [a.accepted for a in acks] == [True, True, True, False]
    assert acks[3].reason == cep.OVER_LIMIT and "cep_max_triggers" in acks[3].error_message
    again = desk.handle(add_request("owner-0", "t-0", TICKER, cross))  # a retry: still fine
    assert again.accepted and len(desk.registry) == 3


def test_a_key_counts_as_one_owner_whatever_client_ids_it_names(tmp_path) -> None:
    """With CURVE on, a key takes any client ids under its name: the per-owner limit counts
    the key, else naming another client id was a way past it. A trigger's user is its owner
    whichever key registered it. The desk's decision alone, as above."""
    from candlewire.config import SecuritySettings
    from streaming.desk import TriggerDesk
    from tests.support import free_settings

    desk = TriggerDesk.__new__(TriggerDesk)
    settings = free_settings(tmp_path).model_copy(update={"cep_max_triggers_per_owner": 2})
    desk.settings = settings.model_copy(update={"security": SecuritySettings(curve=True)})
    desk.registry, desk._fired, desk._fired_lock = {}, [], threading.Lock()
    desk._check_listed = lambda ticker: None  # type: ignore[method-assign]
    desk._write = lambda req: None  # type: ignore[method-assign]
    cross = condition("price_cross", level="1", direction="up")
    names = ["alice.a", "alice.b", "alice.c", "bob.a"]
    acks = [desk.handle(add_request(c, f"t-{c}", TICKER, cross)) for c in names]
    assert [a.accepted for a in acks] == [True, True, False, True]
    assert acks[2].reason == cep.OVER_LIMIT and "alice has 2 triggers" in acks[2].error_message
    by = [("carol.a", "u-1"), ("erin.a", "u-2"), ("carol.b", "u-3")]
    for_dan = [desk.handle(add_request(c, t, TICKER, cross, user_id="dan")) for c, t in by]
    assert [a.accepted for a in for_dan] == [True, True, False]


def test_a_fired_one_shot_leaves_the_registry_and_only_its_own_registration(tmp_path) -> None:
    """The desk's decision alone, as above: the firing's REMOVE is written before the next
    request is handled, so the same trigger added again is stored anew; the same firing
    made again after a restart removes nothing added since."""
    from streaming.desk import TriggerDesk
    from tests.support import free_settings

    desk = TriggerDesk.__new__(TriggerDesk)
    desk.settings = free_settings(tmp_path)
    desk.registry, desk._fired = {}, []
    desk._fired_lock, desk._lock = threading.Lock(), threading.Lock()
    desk._check_listed = lambda ticker: None  # type: ignore[method-assign]
    written: list[cep.CEPTriggerRequest] = []
    kafka_away = False

    def produce(topic, key, req, what) -> None:
        if kafka_away:
            raise TriggerRejected(cep.TRIGGER_REJECT_REASON_UNSPECIFIED, "timed out")
        written.append(req)

    desk._write = written.append  # type: ignore[method-assign]
    desk._produce = produce  # type: ignore[method-assign]
    cross = condition("price_cross", level="1", direction="up")
    assert desk.handle(add_request("c", "t", TICKER, cross)).accepted
    first = desk.registry["t"].registered_ms = 1_000  # as a registration before this one
    desk.fired("t", first)
    assert desk.handle(add_request("c", "t", TICKER, cross)).accepted
    assert (written[1].action, written[1].registered_ms) == (cep.REMOVE, first)
    assert written[2].action == cep.ADD and desk.registry["t"].registered_ms > first
    desk.fired("t", first)  # made again after a restart
    desk.settle()
    assert len(written) == 3 and desk.registry["t"].registered_ms > first
    assert desk.settle() and desk._fired == []
    # Kafka away as it fires: no record may pass the firing, and the trigger is not taken
    # again until its REMOVE is written, in order before the new ADD.
    kafka_away = True
    desk.fired("t", desk.registry["t"].registered_ms)
    assert not desk.settle()
    refused = desk.handle(add_request("c", "t", TICKER, cross))
    assert not refused.accepted and "not recorded yet" in refused.error_message
    kafka_away = False
    assert desk.handle(add_request("c", "t", TICKER, cross)).accepted
    assert [r.action for r in written[3:]] == [cep.REMOVE, cep.ADD] and desk.settle()


def test_a_restore_falls_back_to_the_table_only_when_its_snapshot_is_gone() -> None:
    """Any failure of the time-travel read was taken for an expired snapshot: a catalog
    away for a moment restored from the table as it is now, which counts a batch written
    after the record twice. Only a snapshot the table no longer holds falls back; any other
    failure is the restart's. Spark stood in for."""
    from types import SimpleNamespace

    import pyarrow as pa

    from streaming.recovery import Ledger

    class Spark:
        def __init__(self, fails: bool) -> None:
            self.fails = fails

        def sql(self, query: str):
            if "VERSION AS OF" in query and self.fails:
                raise ConnectionError("the catalog closed the connection")
            return SimpleNamespace(toArrow=lambda: pa.table({"q": [query]}))

    class Tables(dict):
        def __init__(self, held: bool) -> None:
            super().__init__(ohlc="c.market.ohlc")
            self.held = held

        def holds_snapshot(self, table: str, snapshot_id: int) -> bool:
            return self.held and (table, snapshot_id) == ("ohlc", 7)

    def ledger(held: bool, fails: bool) -> Ledger:
        out = Ledger.__new__(Ledger)
        out.ctx = SimpleNamespace(spark=Spark(fails), tables=Tables(held))  # type: ignore[assignment]
        return out

    query = "SELECT * FROM {table}"
    gone = ledger(held=False, fails=True)._as_of("ohlc", 7, query)
    assert gone["q"].to_pylist() == ["SELECT * FROM c.market.ohlc"]
    held = ledger(held=True, fails=False)._as_of("ohlc", 7, query)
    assert held["q"].to_pylist() == ["SELECT * FROM c.market.ohlc VERSION AS OF 7"]
    with pytest.raises(ConnectionError):
        ledger(held=True, fails=True)._as_of("ohlc", 7, query)
