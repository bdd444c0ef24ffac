"""The CLI's tables: decimals as people write them, aligned on the point; a narrow terminal
drops whole columns in the stated order; the machine formats keep every column exactly."""

from __future__ import annotations

import csv
import io
import json
import uuid
from datetime import UTC, datetime
from decimal import Decimal

import pyarrow as pa
import pyarrow.parquet as pq

from candlewire.lake import NAMESPACE, catalog, ensure_tables
from candlewire.market import plain
from launcher.cli import main
from launcher.render import DROP_ORDER, aligned, fit, print_table, to_file
from streaming.decode import ohlc_rows

T0 = datetime(2024, 1, 1, tzinfo=UTC)
T0_MS = 1_704_067_200_000


def candles(ticker: str = "BINANCE:BTC/USDT") -> pa.Table:
    prices = ["12972.75", "12980", "0.000123", "12972.750000000000000001"]
    return ohlc_rows(
        {
            "ticker": [ticker] * 4,
            "period_s": [3600] * 4,
            "open_time_ms": [T0_MS + i * 3_600_000 for i in range(4)],
            **{f: [Decimal(p) for p in prices] for f in ("open", "high", "low", "close")},
            "volume": [Decimal("1.5")] * 4,
            "trade_count": [7] * 4,
            "closed": [True] * 4,
        },
        "history",
    )


def test_decimals_print_normalized_and_aligned_on_the_point() -> None:
    assert plain(Decimal("12972.750000000000000000")) == "12972.75"
    assert plain(Decimal("100.000")) == "100"
    assert plain(Decimal("0E-18")) == "0"
    texts = aligned(["12972.75", "12980", "0.000123", None])
    assert len({len(t) for t in texts}) == 1
    assert len({t.index(".") for t in texts if "." in t}) == 1
    assert [t.strip() for t in texts] == ["12972.75", "12980", "0.000123", ""]


def test_a_narrow_terminal_drops_whole_columns_in_the_stated_order() -> None:
    widths = {"ticker": 16, "open_time": 19, "open": 8, "close": 8, "update_time": 19}
    assert fit(widths, 200) == list(widths)
    kept = fit(widths, 60)
    assert kept == ["open_time", "open", "close"]  # update_time, then ticker: DROP_ORDER
    assert DROP_ORDER.index("update_time") < DROP_ORDER.index("ticker")
    assert fit(widths, 10) == ["open_time"]  # never nothing


def test_the_printed_table_fits_and_names_what_it_left_out() -> None:
    table = candles()
    for width in (80, 120, 250):
        out = io.StringIO()
        print_table(table, width=width, out=out)
        lines = out.getvalue().splitlines()
        assert max(len(line) for line in lines) <= width
        text = out.getvalue()
        rows = [line for line in lines if "2024-01-01 0" in line]
        points = {line.rindex(".") for line in rows if "12980 " not in line}
        assert len(rows) == 4 and len(points) == 1  # the close column, aligned on the point
        assert "12972.750000000000000000" not in text and "…" not in text
        assert "12972.750000000000000001" in text  # exact, never rounded
        if width < 250:
            assert "columns left out to fit" in text and "update_time" in text


def test_machine_formats_keep_every_column_exactly(tmp_path) -> None:
    table = candles()
    csv_path, json_path, pq_path = (tmp_path / f"c.{ext}" for ext in ("csv", "json", "parquet"))
    assert to_file(table, str(csv_path), None) == "csv"
    assert to_file(table, str(json_path), None) == "json"
    assert to_file(table, str(pq_path), "parquet") == "parquet"
    rows = list(csv.DictReader(csv_path.open()))
    assert [r["close"] for r in rows] == [
        "12972.75",
        "12980",
        "0.000123",
        "12972.750000000000000001",
    ]
    assert rows[0]["open_time"] == "2024-01-01T00:00:00Z"
    assert set(rows[0]) == set(table.column_names)
    assert json.loads(json_path.read_text())[1]["high"] == "12980"
    assert pq.read_table(pq_path).equals(table)


def test_history_from_the_command_line(lakehouse, monkeypatch, capsys) -> None:
    """Real Iceberg: ISO times on the command line, json to stdout, and a table."""
    ensure_tables(lakehouse)
    ticker = f"CLI:{uuid.uuid4().hex[:6].upper()}/USDT"
    catalog(lakehouse).load_table(f"{NAMESPACE}.ohlc").append(candles(ticker))
    base = ["history", ticker, "--period", "3600", "--start", "2024-01-01", "--end"]
    for key, value in lakehouse.to_env().items():
        monkeypatch.setenv(key, value)
    assert main([*base, "2024-01-01T03:00Z", "--format", "json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [r["close"] for r in rows] == ["12972.75", "12980", "0.000123"]
    assert main([*base, str(T0_MS + 2 * 3_600_000)]) == 0  # epoch ms works too
    printed = capsys.readouterr().out
    assert "2 rows" in printed and "12972.75" in printed
