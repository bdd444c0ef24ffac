"""REPLAY of Binance Vision downloads: zips and csvs, daily and monthly, checksums, both
timestamp units, indexed pages, the two clocks (end to end into Iceberg:
``tests/streaming/test_replay_files.py``).

The files are generated here in Binance Vision's layout, so the rows written are the oracle.
"""

from __future__ import annotations

import calendar
import hashlib
import random
import threading
import zipfile
from decimal import Decimal
from pathlib import Path

import pytest

from ingest.exchanges.base import Page, TradeRun
from ingest.exchanges.replay import ReplayExchange, ReplayFileError, build_index, parse_speed
from ingest.jobs import run_history
from tests.support import RecordingSink, history_work

HOUR_MS = 3_600_000
DAY_MS = 86_400_000


def utc_ms(*ymd: int) -> int:
    return calendar.timegm((*ymd, 0, 0, 0)) * 1000


def klines(start_ms: int, n: int, seed: int, micros: bool = False) -> list[list[str]]:
    """n hourly klines in Binance's 12 columns; times in µs as in files from 2025 on."""
    rng, price, rows = random.Random(seed), Decimal("100.00"), []
    for i in range(n):
        t = start_ms + i * HOUR_MS
        o = price
        price += Decimal(rng.randint(-300, 300)) / 100
        hi, lo = max(o, price) + Decimal("0.5"), min(o, price) - Decimal("0.25")
        unit = 1000 if micros else 1
        close_time = (t + HOUR_MS - 1) * unit
        vol = f"{rng.randint(1, 10**6) / 1000:.3f}"
        row = [t * unit, o, hi, lo, price, vol, close_time, "0", rng.randint(1, 99), "0", "0", "0"]
        rows.append([str(v) for v in row])
    return rows


def trades(start_ms: int, n: int, first_id: int, micros: bool) -> list[list[str]]:
    rng = random.Random(first_id)
    rows = []
    for i in range(n):
        t = start_ms + i * 997
        price = f"{100 + rng.randint(0, 5000) / 100:.2f}"
        rows.append(
            [
                str(first_id + i),
                price,
                f"{rng.randint(1, 9999) / 1000:.3f}",
                "0",
                str(t * 1000 if micros else t),
                "True" if rng.random() < 0.5 else "False",
                "True",
            ]
        )
    return rows


def write(folder: Path, name: str, rows: list[list[str]], packed: bool = True) -> Path:
    """``name``.zip holding ``name``.csv, with its CHECKSUM (or ``name``.csv)."""
    folder.mkdir(parents=True, exist_ok=True)
    text = "".join(",".join(r) + "\n" for r in rows)
    if not packed:
        path = folder / f"{name}.csv"
        path.write_text(text)
        return path
    path = folder / f"{name}.zip"
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as z:
        z.writestr(f"{name}.csv", text)
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    (folder / f"{name}.zip.CHECKSUM").write_text(f"{digest}  {name}.zip\n")
    return path


def vision_root(root: Path, symbol: str = "ABCUSDT") -> dict:
    """February 2024 monthly, Feb 28 and 29 daily (covered by the month: left out), March 1
    daily in µs; trades of March 1 (zip, µs) and March 3 (csv, ms)."""
    spot = root / "spot"
    month = klines(utc_ms(2024, 2, 1), 29 * 24, seed=1)
    write(spot / "monthly/klines" / symbol / "1h", f"{symbol}-1h-2024-02", month)
    for day in (28, 29):
        # Different numbers than the month holds: read, they would show up.
        rows = klines(utc_ms(2024, 2, day), 24, seed=day)
        write(spot / "daily/klines" / symbol / "1h", f"{symbol}-1h-2024-02-{day:02d}", rows)
    march = klines(utc_ms(2024, 3, 1), 24, seed=3, micros=True)
    write(spot / "daily/klines" / symbol / "1h", f"{symbol}-1h-2024-03-01", march)
    first = trades(utc_ms(2024, 3, 1), 400, 1_000, micros=True)
    third = trades(utc_ms(2024, 3, 3), 150, 5_000, micros=False)
    write(spot / "daily/trades" / symbol, f"{symbol}-trades-2024-03-01", first)
    write(spot / "daily/trades" / symbol, f"{symbol}-trades-2024-03-03", third, packed=False)
    by_time = {int(r[0]): r for r in month}
    by_time.update({int(r[0]) // 1000: r for r in march})
    return {"klines": by_time, "trades": first + third}


def fields(c) -> tuple:
    prices = (c.open, c.high, c.low, c.close, c.volume)
    return (c.open_time_ms, *(Decimal(p) for p in prices), c.trade_count)


def expected(rows: dict, start: int, end: int) -> list[tuple]:
    return [
        (t, *(Decimal(v) for v in r[1:6]), int(r[8]))
        for t, r in sorted(rows.items())
        if start <= t < end
    ]


def test_monthly_and_daily_zips_and_csvs_each_row_once(tmp_path) -> None:
    want = vision_root(tmp_path)
    replay = ReplayExchange("VISION", tmp_path)
    assert [m.ticker for m in replay.markets()] == ["VISION:ABC/USDT"]
    start, end = utc_ms(2024, 2, 27), utc_ms(2024, 3, 2)
    got = replay.ohlc_page("VISION:ABC/USDT", 3600, Page(0, start, end))
    assert [fields(c) for c in got] == expected(want["klines"], start, end)
    assert len(got) == 4 * 24
    assert replay.recorded_range("VISION:ABC/USDT", 3600) == (
        utc_ms(2024, 2, 1),
        utc_ms(2024, 3, 2),
    )
    stop = threading.Event()
    ticks = list(
        ReplayExchange("VISION", tmp_path, speed=float("inf")).trades("VISION:ABC/USDT", stop)
    )
    assert [(t.trade_id, t.price, t.size, t.exchange_time_ns) for t in ticks] == [
        (r[0], r[1], r[2], (int(r[4]) if int(r[4]) > 10**14 else int(r[4]) * 1000) * 1000)
        for r in want["trades"]
    ]


def test_the_index_leaves_out_covered_days_and_a_page_opens_only_its_files(tmp_path) -> None:
    vision_root(tmp_path)
    index = build_index(tmp_path)
    names = [f.path.name for f in index[("klines", "ABCUSDT", "1h")]]
    assert names == ["ABCUSDT-1h-2024-02.zip", "ABCUSDT-1h-2024-03-01.zip"]
    replay = ReplayExchange("VISION", tmp_path)
    opened: list[str] = []
    read = replay.files._read
    replay.files._read = lambda path, *a: opened.append(path.name) or read(path, *a)
    replay.ohlc_page("VISION:ABC/USDT", 3600, Page(0, utc_ms(2024, 3, 1), utc_ms(2024, 3, 2)))
    assert opened == ["ABCUSDT-1h-2024-03-01.zip"]
    for day in range(1, 29, 7):  # consecutive pages of the month parse it once
        page = Page(0, utc_ms(2024, 2, day), utc_ms(2024, 2, day) + 7 * DAY_MS)
        replay.ohlc_page("VISION:ABC/USDT", 3600, page)
    assert opened == ["ABCUSDT-1h-2024-03-01.zip", "ABCUSDT-1h-2024-02.zip"]


def test_a_bad_checksum_a_corrupt_zip_and_a_malformed_row_are_named(tmp_path) -> None:
    vision_root(tmp_path)
    folder = tmp_path / "spot/daily/klines/ABCUSDT/1h"
    march = folder / "ABCUSDT-1h-2024-03-01.zip"
    (folder / "ABCUSDT-1h-2024-03-01.zip.CHECKSUM").write_text("0" * 64 + "  x.zip\n")
    replay = ReplayExchange("VISION", tmp_path)
    page = Page(0, utc_ms(2024, 3, 1), utc_ms(2024, 3, 2))
    with pytest.raises(
        ReplayFileError, match=r"ABCUSDT-1h-2024-03-01.zip: sha256 .* does not match"
    ):
        replay.ohlc_page("VISION:ABC/USDT", 3600, page)
    # Another file's rows are still there.
    february = Page(0, utc_ms(2024, 2, 1), utc_ms(2024, 2, 2))
    assert len(replay.ohlc_page("VISION:ABC/USDT", 3600, february)) == 24
    (folder / "ABCUSDT-1h-2024-03-01.zip.CHECKSUM").unlink()
    march.write_bytes(march.read_bytes()[:100])
    with pytest.raises(ReplayFileError, match="not readable"):
        ReplayExchange("VISION", tmp_path).ohlc_page("VISION:ABC/USDT", 3600, page)
    rows = klines(utc_ms(2024, 3, 1), 24, seed=3)
    rows[7][4] = "NaN"
    write(folder, "ABCUSDT-1h-2024-03-01", rows)
    with pytest.raises(ReplayFileError, match=r"ABCUSDT-1h-2024-03-01.zip:8: malformed row"):
        ReplayExchange("VISION", tmp_path).ohlc_page("VISION:ABC/USDT", 3600, page)


def test_a_number_that_is_not_whole_where_a_whole_one_is_due_is_named(tmp_path) -> None:
    # A trade count of "5.0" and a trade time of "….0" pass the files' number check. They
    # raised ValueError, so a history request got no answer and a stream ended; now a page
    # fails with the file named, the history job says so, and the stream skips the file.
    want = vision_root(tmp_path)
    rows = klines(utc_ms(2024, 3, 1), 24, seed=3)
    rows[5][8] = "5.0"
    write(tmp_path / "spot/daily/klines/ABCUSDT/1h", "ABCUSDT-1h-2024-03-01", rows)
    replay = ReplayExchange("VISION", tmp_path, speed=float("inf"))
    req = history_work("VISION:ABC/USDT", 3600, utc_ms(2024, 3, 1), utc_ms(2024, 3, 2))
    sink = RecordingSink()
    run_history(req, replay, sink, "ing-test")  # type: ignore[arg-type]
    (marker,) = [b for _, _, b in sink.records if b.error]
    assert "ABCUSDT-1h-2024-03-01.zip: trade count '5.0' is not an integer" in marker.error
    first = trades(utc_ms(2024, 3, 1), 400, 1_000, micros=True)
    first[9][4] += ".0"
    write(tmp_path / "spot/daily/trades/ABCUSDT", "ABCUSDT-trades-2024-03-01", first)
    ticks = list(replay.trades("VISION:ABC/USDT", threading.Event()))
    assert [t.trade_id for t in ticks] == [r[0] for r in want["trades"][400:]]
    assert replay.errors == 1


def test_the_trade_stream_skips_a_bad_file_and_keeps_the_others(tmp_path) -> None:
    want = vision_root(tmp_path)
    bad = tmp_path / "spot/daily/trades/ABCUSDT/ABCUSDT-trades-2024-03-01.zip"
    bad.write_bytes(b"PK\x03\x04 not really a zip")
    (bad.parent / (bad.name + ".CHECKSUM")).unlink()
    replay = ReplayExchange("VISION", tmp_path, speed=float("inf"))
    ticks = list(replay.trades("VISION:ABC/USDT", threading.Event()))
    assert [t.trade_id for t in ticks] == [r[0] for r in want["trades"][400:]]
    assert replay.errors == 1


def test_the_live_clock_shifts_trades_to_now_at_the_asked_speed(tmp_path) -> None:
    import time

    vision_root(tmp_path)
    replay = ReplayExchange("VISION", tmp_path, speed=parse_speed("100x"), clock="live")
    stop, got = threading.Event(), []
    started = time.time()
    for tick in replay.trades("VISION:ABC/USDT", stop):
        got.append(tick)
        if len(got) == 101:
            break
    took = time.time() - started
    # 100 gaps of 0.997 s recorded, at 100x: about a second, and stamped now.
    assert 0.9 < took < 5.0
    assert abs(got[0].exchange_time_ns / 1e9 - started) < 1.0
    span = (got[-1].exchange_time_ns - got[0].exchange_time_ns) / 1e9
    assert span == pytest.approx(0.997, rel=0.05)
    assert parse_speed("max") == float("inf")
    with pytest.raises(ValueError):
        parse_speed("0x")


def test_agg_trades_stand_in_where_no_trades_were_downloaded(tmp_path) -> None:
    # aggTrades: id, price, qty, first_id, last_id, time, is_buyer_maker, is_best_match
    rows = [
        ["17", "100.5", "0.25", "40", "42", str(utc_ms(2024, 3, 1) * 1000 + 5), "True", "True"],
        ["18", "100.75", "1.5", "43", "43", str(utc_ms(2024, 3, 1) * 1000 + 9), "False", "True"],
    ]
    write(tmp_path / "spot/daily/aggTrades/AGGUSDT", "AGGUSDT-aggTrades-2024-03-01", rows)
    replay = ReplayExchange("VISION", tmp_path, speed=float("inf"))
    assert [m.ticker for m in replay.markets()] == ["VISION:AGG/USDT"]
    ticks = list(replay.trades("VISION:AGG/USDT", threading.Event()))
    assert [(t.trade_id, t.price, t.size, t.side) for t in ticks] == [
        ("a17", "100.5", "0.25", 2),  # the buyer was the maker: a sell
        ("a18", "100.75", "1.5", 1),
    ]
    assert ticks[1].exchange_time_ns == (utc_ms(2024, 3, 1) * 1000 + 9) * 1000


def test_the_command_line_and_the_config_file_point_replay_at_a_download(
    tmp_path, monkeypatch
) -> None:
    from candlewire.config import Settings
    from launcher.cli import build_parser, exchanges_of

    vision_root(tmp_path / "vision")
    (tmp_path / "candlewire.toml").write_text(
        f'[ingest.replay]\nroot = "{tmp_path / "vision"}"\nspeed = 5\n'
    )
    monkeypatch.setenv("CANDLEWIRE_CONFIG", str(tmp_path / "candlewire.toml"))
    args = build_parser().parse_args(["ingest", "--exchange", "REPLAY,SIM"])
    replay, sim = exchanges_of(args, Settings())
    assert (replay.root, replay.speed, replay.clock) == (tmp_path / "vision", 5.0, "original")
    assert [m.ticker for m in replay.markets()] == ["REPLAY:ABC/USDT"] and sim.name == "SIM"
    argv = ["ingest", "--exchange", "VISION=replay", "--replay-root", str(tmp_path / "vision")]
    args = build_parser().parse_args([*argv, "--speed", "10x", "--clock", "live"])
    (replay,) = exchanges_of(args, Settings())
    assert (replay.name, replay.speed, replay.clock) == ("VISION", 10.0, "live")
    with pytest.raises(SystemExit):
        build_parser().parse_args([*argv, "--speed", "fast"])
    with pytest.raises(ValueError, match="no spot/ folder"):
        exchanges_of(
            build_parser().parse_args([*argv[:3], "--replay-root", str(tmp_path)]), Settings()
        )


def test_an_unpaced_replay_streams_its_files_in_bounded_runs_a_paced_one_as_each_falls_due(
    tmp_path, monkeypatch
) -> None:
    import time

    from ingest.exchanges import replay as replay_module

    want = vision_root(tmp_path)
    monkeypatch.setattr(replay_module, "RUN_ROWS", 64)
    fast = ReplayExchange("VISION", tmp_path, speed=float("inf"))
    runs = list(fast.trade_runs("VISION:ABC/USDT", threading.Event()))
    assert all(isinstance(r, TradeRun) and 1 <= len(r) <= 64 for r in runs)
    assert max(map(len, runs)) == 64
    ticks = [t for r in runs for t in r.ticks()]
    assert [t.trade_id for t in ticks] == [r[0] for r in want["trades"]]
    # Paced at 100x (0.997 s apart recorded): no run holds a trade before it falls due.
    paced = ReplayExchange("VISION", tmp_path, speed=parse_speed("100x"), clock="live")
    stop, got = threading.Event(), []
    for run in paced.trade_runs("VISION:ABC/USDT", stop):
        got.append(run)
        if len(got) == 3:
            time.sleep(0.1)  # a slow reader: about ten trades fall due meanwhile
        if sum(map(len, got)) >= 30:
            break
    assert all(max(r.times_ns) <= r.ingest_time_ns for r in got)
    assert max(map(len, got)) > 1


def _as_lists(recording) -> tuple[list[list[str]], list[int]]:
    return [list(r) for r in recording.rows], list(recording.times)


@pytest.mark.parametrize("seed", range(12))
def test_a_file_read_as_a_table_is_what_the_line_by_line_check_reads_or_left_to_it(
    seed: int,
) -> None:
    """Arrow's reading of a file equals ``_checked``'s, or it declines (None) and
    ``_checked`` reads the file and names a bad line: it never accepts other rows."""
    import io
    import random

    from ingest.exchanges.replay import _checked, _read_as_table

    rng = random.Random(seed)
    t0 = 1_704_067_200_000 * (1000 if seed % 2 else 1)  # µs from 2025 on, ms before
    lines = [
        f"{i},{rng.randrange(1, 10**6) / 100},{rng.random():.6f},1e{rng.randrange(0, 3)},"
        f"{t0 + rng.randrange(0, 10**6)},{rng.choice(['True', 'False'])},True"
        for i in range(300)
    ]
    if seed % 3 == 0:
        lines.insert(0, "id,price,qty,quote_qty,time,is_buyer_maker,is_best_match")
    faults = ['"5"', "", " ", "abc", "1.2.3", "-1", "1e", "7,", "\r"]
    for _ in range(seed % 4):  # none in some seeds; a field, a line or a byte in others
        k = rng.randrange(1 + (seed % 3 == 0), len(lines))
        fields = lines[k].split(",")
        fields[rng.randrange(len(fields))] = rng.choice(faults)
        lines[k] = ",".join(fields)
    if seed % 5 == 1:
        lines.insert(len(lines) // 2, "")  # a blank line
    text = ("\r\n" if seed % 4 == 2 else "\n").join(lines) + ("\n" if seed % 2 else "")
    table = _read_as_table(text.encode(), 5, 4)
    try:
        checked = _checked(io.StringIO(text, newline=""), Path("f.csv"), 5, 4)
    except (ReplayFileError, ValueError):
        assert table is None
        return
    if table is not None:
        assert _as_lists(table) == _as_lists(checked)
    elif seed % 4 == 0 and seed % 5 != 1:
        raise AssertionError("a plain file was left to the line-by-line reading")


def test_reading_a_file_as_a_table_loads_no_pandas(tmp_path) -> None:
    # pyarrow loads pandas (about 40 MiB) for a scalar made of a Python int or a to_numpy():
    # an ingestor replaying files must not carry it.
    import subprocess
    import sys

    vision_root(tmp_path)
    script = (
        "import sys, threading\n"
        "from ingest.exchanges.replay import ReplayExchange\n"
        f"r = ReplayExchange('VISION', {str(tmp_path)!r}, speed=float('inf'))\n"
        "n = sum(len(x) for x in r.trade_runs('VISION:ABC/USDT', threading.Event()))\n"
        "print(n, 'pyarrow' in sys.modules, 'pandas' in sys.modules, flush=True)\n"
        # Arrow's thread pool can abort the interpreter's teardown now and then (SIGABRT,
        # apache/arrow#34314); what is asked here is settled by then.
        "import os; os._exit(0)\n"
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    count, arrow, pandas = out.stdout.split()
    assert int(count) > 0 and arrow == "True" and pandas == "False"
