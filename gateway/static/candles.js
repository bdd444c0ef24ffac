"use strict";
// The candle chart of the live page and of `candlewire chart`, one look for both:
// lightweight-charts (window.LightweightCharts, loaded first), candles with price and time
// axes in UTC and a crosshair, volume in a pane of its own below.
window.cwCandleChart = function (element, { intraday = true, volumeHeight = 90, precision } = {}) {
  const LC = window.LightweightCharts;
  const line = "#3b4252";
  const chart = LC.createChart(element, {
    autoSize: true,
    layout: { background: { color: "#0f1419" }, textColor: "#d8dee9",
              panes: { separatorColor: line } },
    grid: { vertLines: { color: "#1b2129" }, horzLines: { color: "#1b2129" } },
    crosshair: { mode: LC.CrosshairMode.Normal },
    rightPriceScale: { borderColor: line },
    timeScale: { borderColor: line, timeVisible: intraday, secondsVisible: false },
    localization: {
      timeFormatter: (t) => new Date(t * 1000).toISOString().slice(0, intraday ? 16 : 10)
        .replace("T", " "),
    },
  });
  const prices = chart.addSeries(LC.CandlestickSeries, {
    upColor: "#a3be8c", downColor: "#bf616a", wickUpColor: "#a3be8c", wickDownColor: "#bf616a",
    borderVisible: false,
    ...(precision === undefined ? {} : {
      priceFormat: { type: "price", precision, minMove: 10 ** -precision },
    }),
  });
  const volume = chart.addSeries(LC.HistogramSeries, { priceFormat: { type: "volume" } }, 1);
  chart.panes()[1].setHeight(volumeHeight);
  return { chart, prices, volume };
};
