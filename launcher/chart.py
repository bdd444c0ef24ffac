"""``candlewire chart``: history as a self-contained HTML chart.

The same library as the live page (lightweight-charts, bundled by ``make install`` and
inlined here), so the file opens anywhere without a server or the internet: candles with
price and time axes, a crosshair and a volume pane.
"""

from __future__ import annotations

import json
from importlib import resources

import pyarrow as pa

from candlewire.errors import CandlewireError

LIBRARY = "static/vendor/lightweight-charts.js"
CANDLES = "static/candles.js"  # the chart's look, shared with the live page
PAGE = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>{title}</title>
<style>body {{ margin: 0; background: #0f1419; color: #d8dee9; font: 14px system-ui; }}
h1 {{ font-size: 15px; margin: 10px 16px; }} #chart {{ height: calc(100vh - 44px); }}</style>
</head><body><h1>{title}</h1><div id="chart"></div>
<script>{library}</script>
<script>{candles}</script>
<script>
"use strict";
const rows = {rows};
const {{ chart, prices, volume }} = window.cwCandleChart(document.getElementById("chart"), {{
  intraday: {intraday}, volumeHeight: 120, precision: {precision},
}});
prices.setData(rows.map((r) => ({{ time: r[0], open: r[1], high: r[2], low: r[3], close: r[4] }})));
volume.setData(rows.map((r) => ({{ time: r[0], value: r[5],
  color: r[4] >= r[1] ? "#a3be8c66" : "#bf616a66" }})));
chart.timeScale().fitContent();
window.cwChart = {{ chart, prices, volume }};
</script></body></html>
"""


class ChartLibraryMissing(CandlewireError, RuntimeError):
    """The bundled chart library is not built."""


def library() -> str:
    path = resources.files("gateway").joinpath(LIBRARY)
    if not path.is_file():
        raise ChartLibraryMissing(
            f"{LIBRARY} is not built: run `make install` (npm ci in gateway/web)"
        )
    return path.read_text()


def html_chart(table: pa.Table, ticker: str, period_s: int) -> str:
    """``table``: history rows (``client.history``), in time order."""
    closes = table["close"]
    scale = closes.type.scale if pa.types.is_decimal(closes.type) else 8
    precision = max(2, min(8, scale))
    times = [int(t.timestamp()) for t in table["open_time"].to_pylist()]
    columns = [
        [float(v) for v in table[c].to_pylist()] for c in ("open", "high", "low", "close", "volume")
    ]
    rows = [[t, *values] for t, *values in zip(times, *columns, strict=True)]
    first, last = (table["open_time"][i].as_py() for i in (0, -1)) if rows else (None, None)
    span = f"{first:%Y-%m-%d %H:%M} to {last:%Y-%m-%d %H:%M} UTC" if rows else "no candles"
    return PAGE.format(
        title=f"{ticker} · {period_s} s · {span}",
        library=library(),
        candles=resources.files("gateway").joinpath(CANDLES).read_text(),
        rows=json.dumps(rows),
        intraday="true" if period_s < 86_400 else "false",
        precision=precision,
    )
