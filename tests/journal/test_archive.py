"""The journal's archive (Iceberg before the journal): each chunk reads a bounded window of
time, chosen from the files' statistics, and a replay from far back serves every row once,
in order."""

from __future__ import annotations

from datetime import UTC, datetime
from decimal import Decimal

import pyarrow as pa
import pytest

import journal.archive as archive
from candlewire.lake import NAMESPACE, catalog
from journal.archive import Span, window
from journal.reader import Seam
from proto import journal_pb2 as jr

DAY_MS = 86_400_000


def test_an_empty_archive_is_one_read_to_the_boundary() -> None:
    assert window([], 5, 1_000, 10) == (5, 1_000)


def test_a_stretch_without_files_is_skipped_in_one_step() -> None:
    files = [Span(500, 600, 3), Span(700, 800, 3)]
    assert window(files, 1, 10_000, 100)[0] == 500
    # A file that began before `since` does not move the start back.
    assert window(files, 550, 10_000, 100)[0] == 550


def test_the_window_ends_where_the_files_in_order_hold_a_chunk() -> None:
    files = [Span(700, 800, 6), Span(500, 600, 6), Span(900, 950, 6)]
    assert window(files, 1, 10_000, 10) == (500, 767)  # 4 of the second file's 6 rows
    assert window(files, 1, 10_000, 6) == (500, 601)
    assert window(files, 1, 10_000, 18) == (500, 10_000)  # the last file: to the boundary
    assert window(files, 1, 10_000, 100) == (500, 10_000)
    assert window(files, 1, 700, 10) == (500, 700)  # never past the boundary


def test_the_window_always_moves_on() -> None:
    # A file whose rows are mostly before `since` still gives a window after it.
    assert window([Span(0, 99, 1_000), Span(500, 600, 1)], 99, 10_000, 10) == (99, 100)


def test_a_file_of_many_chunks_is_read_a_chunk_at_a_time() -> None:
    """Its rows taken as spread over its time: a busy day's file read whole for each of its
    chunks made a day of N trades cost N²/40,000 rows read."""
    files = [Span(0, 1_399, 140), Span(5_000, 5_001, 1)]
    assert window(files, 0, 10_000, 7) == (0, 70)
    assert window(files, 70, 10_000, 7) == (70, 140)


def test_candles_end_a_chunk_of_periods_after_the_start() -> None:
    files = [Span(60_000, 600_000, 1_000_000)]  # every ticker's: the count says nothing
    assert window(files, 1, 10**9, 5, each_ms=60_000) == (60_000, 360_000)


@pytest.fixture
def small_chunks(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Chunks of 7 rows; what each read of the archive returned, in rows."""
    monkeypatch.setattr(archive, "ARCHIVE_CHUNK", 7)
    read: list[int] = []
    for name in ("read_ticks", "read_history"):
        real = getattr(archive, name)

        def counted(*args: object, _real=real, **kwargs: object) -> pa.Table:
            rows = _real(*args, **kwargs)
            read.append(rows.num_rows)
            return rows

        monkeypatch.setattr(archive, name, counted)
    return read


def replay(settings, topic: str, since_ms: int, boundary_ms: int) -> tuple[list, int]:
    """Every archived message a client asking chunk after chunk gets, and the chunks."""
    got, chunks = [], 0
    while since_ms < boundary_ms:
        reply = jr.FetchReply()
        archive.archive_chunk(
            settings, jr.FetchRequest(topic=topic, since_ms=since_ms), boundary_ms, reply
        )
        assert reply.archive_until_ms > since_ms, "a chunk must move the replay on"
        got += [m for run in reply.runs for m in (*run.ticks, *run.candles)]
        since_ms, chunks = reply.archive_until_ms, chunks + 1
    return got, chunks


def test_a_replay_from_long_ago_reads_a_window_a_chunk(lakehouse, small_chunks) -> None:
    """Ticks over four days, a file a day; a replay from 1970: every trade once, in time
    order, and each row read once. Before, each chunk read
    everything from `since` to the boundary again."""
    ticker = "SIM:ARCHIVE-TICKS/USD"
    table = catalog(lakehouse).load_table(f"{NAMESPACE}.ticks")
    first = (datetime.now(UTC).timestamp() * 1000 // DAY_MS - 10) * DAY_MS
    times = []
    for day in range(4):
        at = [int(first + day * DAY_MS + 1_000 * i) for i in range(10)]
        times += at
        rows = [
            {
                "ticker": ticker,
                "trade_id": f"{t}",
                "price": Decimal("1.5"),
                "size": Decimal("1"),
                "side": "BUY",
                "exchange_time": datetime.fromtimestamp(t / 1000, UTC),
                "ingest_time": None,
                "exchange_time_ns": t * 1_000_000,
            }
            for t in reversed(at)
        ]
        table.append(pa.Table.from_pylist(rows, schema=table.schema().as_arrow()))
    boundary = int(first + 5 * DAY_MS)
    got, chunks = replay(lakehouse, f"{ticker}|tick", 1, boundary)
    assert [t.exchange_time_ns // 1_000_000 for t in got] == times
    # Each window holds about a chunk of a day's file (its rows spread over its time), so
    # every row is read once; the last window reaches the boundary.
    assert max(small_chunks) <= 8 and sum(small_chunks) == len(times)
    assert chunks == len(small_chunks) <= 7


def test_candles_from_long_ago_skip_other_tickers_and_empty_stretches(
    lakehouse, small_chunks
) -> None:
    """1-minute candles in two stretches, in two months' files; the first month's file also
    holds another ticker's later candles, so its statistics promise more than this ticker
    has. Each candle once, in order; no read holds more than a chunk's periods; the month
    between is skipped in one step."""
    ticker, other = "SIM:ARCHIVE-CANDLES/USD", "SIM:ARCHIVE-OTHER/USD"
    table = catalog(lakehouse).load_table(f"{NAMESPACE}.ohlc")
    now = datetime.now(UTC)
    month = datetime(now.year - (now.month <= 3), (now.month - 4) % 12 + 1, 1, tzinfo=UTC)
    first = int(month.timestamp() * 1000)
    opens = [first + 60_000 * i for i in range(12)]
    later = first + 40 * DAY_MS  # in the next month
    opens += [later + 60_000 * i for i in range(9)]

    def candle(name: str, at: int) -> dict:
        price = Decimal(at % 997)
        return {
            "ticker": name,
            "period_s": 60,
            "open_time": datetime.fromtimestamp(at / 1000, UTC),
            "open": price,
            "high": price,
            "low": price,
            "close": price,
            "volume": Decimal(1),
            "trade_count": 1,
            "closed": True,
            "source": "live",
        }

    theirs = [candle(other, first + 60_000 * (20 + i)) for i in range(30)]
    rows = [candle(ticker, t) for t in opens] + theirs
    table.append(pa.Table.from_pylist(rows, schema=table.schema().as_arrow()))
    got, chunks = replay(lakehouse, f"{ticker}|ohlc:60", 1, later + 40 * DAY_MS)
    assert [c.open_time_ms for c in got] == opens
    assert {c.ticker for c in got} == {ticker} and all(c.closed for c in got)
    # 7 + 5 from the first month; the other ticker's 30 minutes read empty in windows of
    # 7, 14 and 28 minutes; then the second month's 9 to the boundary (7 served), and 2.
    assert small_chunks == [7, 5, 0, 0, 0, 9, 2] and chunks == 4


def test_the_seam_s_trades_are_left_to_the_journal_each_as_often_as_it_holds_it() -> None:
    """Two id-less trades alike at one nanosecond are two trades: the journal holding one
    leaves the other to the archive. A named trade is told by its id and time."""
    from proto import market_pb2

    seam = Seam()
    seam.add(market_pb2.Tick(trade_id="", price="1.50", size="2", exchange_time_ns=100))
    seam.add(market_pb2.Tick(trade_id="a", price="9", size="9", exchange_time_ns=90))
    rows = pa.table(
        {
            "trade_id": ["x", "a", "a", "", "", ""],
            "exchange_time_ns": [50, 90, 91, 100, 100, 100],
            "price": pa.array([Decimal("1.5")] * 5 + [Decimal(3)], pa.decimal128(38, 18)),
            "size": pa.array([Decimal(2)] * 6, pa.decimal128(38, 18)),
            "side": [None] * 6,
        }
    )
    kept = archive._without(rows, seam)
    assert kept.column("trade_id").to_pylist() == ["x", "a", "", ""]
    assert kept.column("exchange_time_ns").to_pylist() == [50, 91, 100, 100]
    assert [str(p) for p in kept.column("price").to_pylist()][-1].startswith("3")


def test_a_candle_still_open_at_the_boundary_is_served_open(lakehouse) -> None:
    """A day's candle that opened before the journal's oldest record and closes after it:
    served as it stood, not closed (the journal's revisions close it); the day before it,
    whose window ended before the boundary, is closed."""
    ticker = "SIM:ARCHIVE-DAY/USD"
    table = catalog(lakehouse).load_table(f"{NAMESPACE}.ohlc")
    today = int(datetime.now(UTC).timestamp() * 1000) // DAY_MS * DAY_MS
    rows = [
        {
            "ticker": ticker,
            "period_s": 86_400,
            "open_time": datetime.fromtimestamp(at / 1000, UTC),
            "open": Decimal(1),
            "high": Decimal(2),
            "low": Decimal(1),
            "close": Decimal(2),
            "volume": Decimal(5),
            "trade_count": 3,
            "closed": at < today,
            "source": "live",
        }
        for at in (today - DAY_MS, today)
    ]
    table.append(pa.Table.from_pylist(rows, schema=table.schema().as_arrow()))
    got, _ = replay(lakehouse, f"{ticker}|ohlc:86400", today - 2 * DAY_MS, today + 3_600_000)
    assert [(c.open_time_ms, c.closed) for c in got] == [(today - DAY_MS, True), (today, False)]


def test_a_busy_day_s_file_is_read_a_chunk_at_a_time(lakehouse, small_chunks) -> None:
    """One file of 20 chunks' trades: each read about a chunk, not the rest of the file."""
    ticker = "SIM:ARCHIVE-BUSY/USD"
    table = catalog(lakehouse).load_table(f"{NAMESPACE}.ticks")
    first = (int(datetime.now(UTC).timestamp() * 1000) // DAY_MS - 3) * DAY_MS
    times = [first + 10 * i for i in range(140)]
    rows = [
        {
            "ticker": ticker,
            "trade_id": f"{t}",
            "price": Decimal("2"),
            "size": Decimal("1"),
            "side": "SELL",
            "exchange_time": datetime.fromtimestamp(t / 1000, UTC),
            "ingest_time": None,
            "exchange_time_ns": t * 1_000_000,
        }
        for t in times
    ]
    table.append(pa.Table.from_pylist(rows, schema=table.schema().as_arrow()))
    got, chunks = replay(lakehouse, f"{ticker}|tick", 1, first + DAY_MS)
    assert [t.exchange_time_ns // 1_000_000 for t in got] == times
    assert sum(small_chunks) == len(times) and max(small_chunks) <= 8, small_chunks
    assert chunks == len(small_chunks) <= 21


def test_a_malformed_id_less_trade_in_the_journal_is_no_part_of_the_seam() -> None:
    from proto import market_pb2

    seam = Seam()
    seam.add(market_pb2.Tick(trade_id="", price="sNaN", size="1", exchange_time_ns=5))
    seam.add(market_pb2.Tick(trade_id="", price="", size="1", exchange_time_ns=6))
    assert not seam and seam.earliest_ns == 0
