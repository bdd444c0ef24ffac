"""``candlewire chart``: Iceberg history as a self-contained HTML chart, opened in headless
Chromium from the file alone (no server, no internet): every candle, axes, a volume pane."""

from __future__ import annotations

import uuid

from candlewire.lake import NAMESPACE, catalog, ensure_tables
from launcher.cli import main
from tests.gateway.test_page import browser  # noqa: F401  (the fixture)
from tests.launcher.test_render import T0_MS, candles


def test_chart_writes_a_page_that_draws_every_candle(
    lakehouse,
    monkeypatch,
    capsys,
    tmp_path,
    browser,  # noqa: F811
) -> None:
    ensure_tables(lakehouse)
    ticker = f"CHART:{uuid.uuid4().hex[:6].upper()}/USDT"
    catalog(lakehouse).load_table(f"{NAMESPACE}.ohlc").append(candles(ticker))
    for key, value in lakehouse.to_env().items():
        monkeypatch.setenv(key, value)
    out = tmp_path / "chart.html"
    args = ["chart", ticker, "--period", "3600", "--start", "2024-01-01", "--end", "2024-01-02"]
    assert main([*args, "--output", str(out)]) == 0
    page = out.read_text()
    assert "http" not in page.split("<script>", 1)[0]  # nothing fetched from elsewhere
    browser.get(out.as_uri())
    drawn = browser.execute_script(
        "const c = window.cwChart;"
        "return [c.prices.data().map((b) => [b.time, b.close]), c.volume.data().length,"
        "        c.chart.priceScale('right').width(), c.chart.timeScale().height(),"
        "        c.chart.panes().length];"
    )
    bars, volumes, price_axis, time_axis, panes = drawn
    # The four written candles, at their hours, closes as stored (the last: 18 digits).
    assert [b[0] * 1000 for b in bars] == [T0_MS + i * 3_600_000 for i in range(4)]
    assert [b[1] for b in bars][:3] == [12972.75, 12980, 0.000123]
    assert volumes == 4 and price_axis > 20 and time_axis > 10 and panes == 2
    browser.save_screenshot(str(tmp_path / "chart.png"))
    capsys.readouterr()
    assert main([*args[:2], "--period", "60", *args[4:], "--output", str(out)]) == 1  # no 1m rows
    assert f"candlewire history {ticker} --period 60 " in capsys.readouterr().err  # the way on
