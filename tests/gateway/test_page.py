"""The live page in headless Chromium (Debian's chromium and chromedriver, via selenium):
sign in with a token, see an event arrive, a burst kept to the newest, see the chart draw
history and live candles, and the depth panel draw the gateway's book messages."""

from __future__ import annotations

import shutil
import time
import urllib.error
import urllib.request

import pytest
from selenium import webdriver
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import WebDriverWait

from candlewire.book import Book
from candlewire.testing import new_user, user_event
from candlewire.topics import market_data_topic, ohlc_type
from gateway import issue_token
from gateway.service import _depth_message
from proto import book_pb2, market_pb2
from proto import events_pb2 as ev
from tests.gateway.conftest import SECRET, gw_config
from tests.gateway.test_metadata import write_candles
from tests.support import wait_for

CHROMIUM, CHROMEDRIVER = "/usr/bin/chromium", "/usr/bin/chromedriver"
KEPT = 150  # the events the page's list keeps (?events=), fewer than the test sends


@pytest.fixture
def browser():
    # `make test` installs both from Debian's packages (the Makefile's browser target).
    assert shutil.which(CHROMEDRIVER), "chromium-driver missing: run `make browser`"
    opts = webdriver.ChromeOptions()
    opts.binary_location = CHROMIUM
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu"):
        opts.add_argument(arg)
    driver = webdriver.Chrome(options=opts, service=webdriver.ChromeService(CHROMEDRIVER))
    driver.set_window_size(1400, 900)
    yield driver
    driver.quit()


def test_sign_in_see_an_event_and_a_live_chart(
    gw_env, market, make_gateway, make_publisher, browser, tmp_path
) -> None:
    """History from Iceberg first, then live candles on a lightweight-charts chart with
    axes and a volume pane; a live update moves the last candle; an alert is a marker; the
    period switch asks for another chart. A screenshot is left in the test's directory."""
    ticker = "SIM:BTC/USDT"  # the page's default chart, requested on sign-in
    minute = int(time.time()) // 60 * 60
    write_candles(gw_env, ticker, [minute - 180, minute - 120])  # the chart's recent past
    make_gateway(gw_env, gw_config())
    events = make_publisher(gw_env)
    user = new_user()
    wait = WebDriverWait(browser, 20)
    browser.get(f"http://127.0.0.1:{gw_env.port('gateway_http')}/?events={KEPT}")
    assert browser.title == "candlewire"
    assert browser.execute_script("return typeof window.LightweightCharts") == "object"

    browser.find_element(By.ID, "token").send_keys(issue_token(SECRET, user))
    browser.find_element(By.ID, "signin-button").click()
    wait.until(lambda b: b.find_element(By.ID, "status").text == f"signed in as {user}")

    def bars() -> list[dict]:
        return browser.execute_script("return window.cwChart.prices.data()")

    # History first: the two candles written to Iceberg, before anything live.
    wait.until(lambda b: {minute - 180, minute - 120} <= {bar["time"] for bar in bars()})

    wait_for(lambda: events.watched(user))
    event = user_event(user, ev.INFORMATIONAL, None, {"level": "42"}, ev.ALERT_TRIGGERED)
    events.publish(event)
    item = wait.until(
        lambda b: b.find_element(By.CSS_SELECTOR, f'#events li[data-event-id="{event.event_id}"]')
    )
    assert "Alert triggered" in item.text and "level: 42" in item.text
    # A burst: the page asks for batches, so what the gateway has queued comes as arrays.
    burst = [user_event(user, ev.INFORMATIONAL, None, {"n": i}) for i in range(200)]
    for e in burst:
        events.publish(e)
    # The list keeps the newest KEPT: the last of the burst shows once all of it is in.
    newest = f'#events li[data-event-id="{burst[-1].event_id}"]'
    wait.until(lambda b: b.find_elements(By.CSS_SELECTOR, newest))
    shown = browser.execute_script(
        "return [...document.querySelectorAll('#events li')].map(li => li.dataset.eventId)"
    )
    assert shown[::-1] == [e.event_id for e in [event, *burst]][-KEPT:]

    topic = market_data_topic(ticker, ohlc_type(60))

    def live(open_s: int, close: str, volume: str = "3") -> None:
        candle = market_pb2.OHLC(ticker=ticker, period_s=60, open_time_ms=open_s * 1000)
        candle.open, candle.high, candle.low, candle.close = "100", "120.25", "95", close
        candle.volume, candle.closed = volume, False
        market.publish(topic, candle)

    def last() -> dict | None:
        data = bars()
        return data[-1] if data else None

    # The relay passes our subscription on a moment after the chart request: publish until
    # the forming candle shows.
    wait.until(lambda b: live(minute, "101.5") or (last() or {}).get("time") == minute)
    assert last()["close"] == 101.5
    live(minute, "117.75", volume="5")  # a live update moves the last candle
    wait.until(lambda b: last()["close"] == 117.75)
    assert [b["time"] for b in bars()][-3:] == [minute - 180, minute - 120, minute]
    volumes = browser.execute_script("return window.cwChart.volume.data()")
    assert volumes[-1]["value"] == 5 and len(volumes) >= 3

    # Axes and the volume pane, as the library lays them out.
    axes = browser.execute_script(
        "const c = window.cwChart.chart;"
        "return [c.priceScale('right').width(), c.timeScale().height(), c.panes().length,"
        "        c.options().crosshair.mode];"
    )
    assert axes[0] > 20 and axes[1] > 10 and axes[2] == 2 and axes[3] == 0  # 0: Normal
    assert browser.find_element(By.ID, "last-candle").text.startswith(f"{ticker} ")

    # A CEP alert on this ticker is a marker on the candle it fell in.
    alert = user_event(
        user,
        ev.INFORMATIONAL,
        None,
        {
            "ticker": ticker,
            "trigger_id": "t1",
            "value": "117.75",
            "event_time_ms": (minute + 30) * 1000,
        },
        ev.ALERT_TRIGGERED,
    )
    events.publish(alert)
    wait.until(
        lambda b: (
            b.execute_script("return window.cwChart.markers.markers()")
            and b.execute_script("return window.cwChart.markers.markers()[0].time") == minute
        )
    )
    shot = tmp_path / "live-page.png"
    assert browser.save_screenshot(str(shot)) and shot.stat().st_size > 10_000

    # The period switch asks for the hourly chart: the minute candles go.
    browser.find_element(By.CSS_SELECTOR, '#periods button[data-period="3600"]').click()
    wait.until(lambda b: all(bar["time"] % 3600 == 0 for bar in bars()))


def test_the_depth_panel_draws_the_charted_ticker_s_book_asks_above_bids(
    gw_env, make_gateway, browser
) -> None:
    """The page's drawing of the gateway's depth message (made by the gateway's own function
    from a book): asks above with the best at the bottom, bids below with the best at the
    top, each side's sizes in a column of their own, the book's update number on the table
    and in the note. A book of another ticker is not drawn, a failure is said in the note,
    and a new chart empties the panel. ``tests/gateway/test_depth.py`` holds the messages
    themselves to the books a relay and journal carry."""
    make_gateway(gw_env, gw_config())
    browser.get(f"http://127.0.0.1:{gw_env.port('gateway_http')}/")
    ticker = browser.find_element(By.ID, "ticker").get_attribute("value")

    def level(price: str, size: str) -> book_pb2.BookLevel:
        return book_pb2.BookLevel(price=price, size=size)

    def depth(ticker: str, seq: int, t_ns: int) -> dict:
        snap = book_pb2.BookSnapshot(
            ticker=ticker,
            venue_seq=seq,
            exchange_time_ns=t_ns,
            bids=[level("100.5", "2"), level("100", "0.25")],
            asks=[level("101", "1.5"), level("101.25", "3.0")],
        )
        return _depth_message(Book.from_snapshot(snap))

    def panel() -> tuple[list[list[str]], str, str]:
        rows = browser.execute_script(
            "return [...document.querySelectorAll('#depth tr')]"
            "  .map(tr => [tr.className, ...[...tr.cells].map(td => td.textContent)])"
        )
        table = browser.find_element(By.ID, "depth").get_attribute("data-seq")
        return rows, table, browser.find_element(By.ID, "depth-note").text

    assert panel() == ([], "0", "no book yet")
    t_ns = 1_700_000_000_123_000_000  # 2023-11-14 22:13:20.123 UTC
    browser.execute_script("handle(arguments[0])", depth(ticker, 7, t_ns))
    drawn = [
        ["ask", "", "101.25", "3"],
        ["ask", "", "101", "1.5"],
        ["bid", "2", "100.5", ""],
        ["bid", "0.25", "100", ""],
    ]
    assert panel() == (drawn, "7", f"{ticker} · update 7 · 22:13:20.123")

    browser.execute_script("handle(arguments[0])", depth("OTHER:X/USDT", 8, t_ns))
    assert panel() == (drawn, "7", f"{ticker} · update 7 · 22:13:20.123")

    failed = {"type": "depth", "ticker": ticker, "error": "no book at this venue"}
    browser.execute_script("handle(arguments[0])", failed)
    assert panel()[2] == "no book: no book at this venue"

    browser.execute_script("handle(arguments[0])", {"type": "chart", "ticker": ticker})
    assert panel() == ([], "0", "no book yet")


def test_the_gateway_serves_the_chart_library_itself(gw_env, make_gateway) -> None:
    make_gateway(gw_env, gw_config())
    base = f"http://127.0.0.1:{gw_env.port('gateway_http')}"
    with urllib.request.urlopen(f"{base}/vendor/lightweight-charts.js", timeout=10) as r:
        assert r.headers["Content-Type"].startswith("text/javascript")
        assert b"LightweightCharts" in r.read()
    for path in ("/vendor/../service.py", "/vendor/other.js"):
        with pytest.raises(urllib.error.HTTPError) as err:
            urllib.request.urlopen(f"{base}{path}", timeout=10)
        assert err.value.code == 404
