"""A replayed Binance Vision download lands in Iceberg exactly as recorded: history pages
from the zips into ``ohlc``, trades with their original times into ``ticks``, a file with a
bad checksum left out (the files: :mod:`tests.ingest.test_replay`)."""

from __future__ import annotations

from decimal import Decimal

from candlewire import Client
from candlewire.lake import NAMESPACE, catalog
from ingest.exchanges.replay import ReplayExchange
from tests.ingest.test_replay import expected, trades, utc_ms, vision_root, write
from tests.ingest.test_service import start_ingestor
from tests.support import wait_for


def test_a_replayed_download_lands_in_iceberg_row_for_row(live_pipeline, tmp_path) -> None:
    """History pages from the zips into ``ohlc``, and the trades with their original times
    into ``ticks``: equal to the files, a file with a bad checksum left out."""
    want = vision_root(tmp_path, symbol="VIZUSDT")
    folder = tmp_path / "spot/daily/trades/VIZUSDT"
    write(folder, "VIZUSDT-trades-2024-03-02", trades(utc_ms(2024, 3, 2), 50, 3_000, True))
    (folder / "VIZUSDT-trades-2024-03-02.zip.CHECKSUM").write_text("f" * 64 + "  x\n")
    ticker = "VISION:VIZ/USDT"
    replay = ReplayExchange("VISION", tmp_path, speed=float("inf"))
    ingestor = start_ingestor(live_pipeline, replay, always_on=[ticker])
    start, end = utc_ms(2024, 2, 20), utc_ms(2024, 3, 2)
    try:
        with Client(live_pipeline) as client:
            table = client.request_history(ticker, 3600, start, end, read=True, timeout=180)
        ticks = catalog(live_pipeline).load_table(f"{NAMESPACE}.ticks")

        def stored() -> list[dict]:
            ticks.refresh()
            return ticks.scan(row_filter=f"ticker = '{ticker}'").to_arrow().to_pylist()

        wait_for(lambda: len(stored()) >= len(want["trades"]), timeout=120, interval=1.0)
        # The recording's end ends the stream: nothing is replayed a second time.
        wait_for(lambda: f"stream:{ticker}" not in ingestor.jobs, timeout=60)
        assert f"stream:{ticker}" not in ingestor.pending
    finally:
        ingestor.stop()
    prices = ("open", "high", "low", "close", "volume")
    got = [
        (int(r["open_time"].timestamp() * 1000), *(r[f] for f in prices), r["trade_count"])
        for r in table.to_pylist()
    ]
    assert got == expected(want["klines"], start, end)
    rows = sorted(stored(), key=lambda r: int(r["trade_id"]))
    assert [(r["trade_id"], r["price"], r["size"], r["exchange_time_ns"]) for r in rows] == [
        (
            t[0],
            Decimal(t[1]),
            Decimal(t[2]),
            (int(t[4]) if int(t[4]) > 10**14 else int(t[4]) * 1000) * 1000,
        )
        for t in want["trades"]
    ]
    assert replay.errors == 1
