"""The live page in headless Chromium (Debian's chromium and chromedriver, via selenium):
sign in with a token, see an event arrive, see the chart draw candles from the relay."""

from __future__ import annotations

import shutil
import time

import pytest
from selenium import webdriver
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import WebDriverWait

from candlewire.testing import new_user, user_event
from candlewire.topics import market_data_topic, ohlc_type
from gateway import issue_token
from proto import events_pb2 as ev
from proto import market_pb2
from tests.gateway.conftest import SECRET, gw_config
from tests.support import wait_for

CHROMIUM, CHROMEDRIVER = "/usr/bin/chromium", "/usr/bin/chromedriver"


@pytest.fixture
def browser():
    # `make test` installs both from Debian's packages (the Makefile's browser target).
    assert shutil.which(CHROMEDRIVER), "chromium-driver missing: run `make browser`"
    opts = webdriver.ChromeOptions()
    opts.binary_location = CHROMIUM
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu"):
        opts.add_argument(arg)
    driver = webdriver.Chrome(options=opts, service=webdriver.ChromeService(CHROMEDRIVER))
    yield driver
    driver.quit()


def test_sign_in_see_an_event_and_a_live_chart(
    gw_env, market, make_gateway, make_publisher, browser
) -> None:
    make_gateway(gw_env, gw_config())
    events = make_publisher(gw_env)
    user = new_user()
    wait = WebDriverWait(browser, 15)
    browser.get(f"http://127.0.0.1:{gw_env.port('gateway_http')}/")
    assert browser.title == "candlewire"

    browser.find_element(By.ID, "token").send_keys(issue_token(SECRET, user))
    browser.find_element(By.ID, "signin-button").click()
    wait.until(lambda b: b.find_element(By.ID, "status").text == f"signed in as {user}")

    wait_for(lambda: events.watched(user))
    event = user_event(user, ev.INFORMATIONAL, None, {"level": "42"}, ev.ALERT_TRIGGERED)
    events.publish(event)
    item = wait.until(
        lambda b: b.find_element(By.CSS_SELECTOR, f'#events li[data-event-id="{event.event_id}"]')
    )
    assert "Alert triggered" in item.text and "level: 42" in item.text

    ticker = "SIM:BTC/USDT"  # the page's default chart, requested on sign-in
    canvas = browser.find_element(By.ID, "chart")
    topic = market_data_topic(ticker, ohlc_type(60))
    start = 1_700_000_000_000
    for i in range(40):
        close = str(100 + i)
        candle = market_pb2.OHLC(ticker=ticker, period_s=60, open_time_ms=start + 60_000 * (i // 4))
        candle.open, candle.high, candle.low, candle.close = "100", str(101 + i), "99", close
        candle.volume, candle.closed = "1", False
        market.publish(topic, candle)
        time.sleep(0.05)
        if int(canvas.get_attribute("data-updates")) >= 8:
            break
    wait.until(lambda b: int(canvas.get_attribute("data-candles")) >= 2)
    text = browser.find_element(By.ID, "last-candle").text
    assert text.startswith(f"{ticker} ") and "(forming)" in text
    # The canvas was drawn on: some pixel is not the background.
    painted = browser.execute_script(
        "const c = document.getElementById('chart');"
        "const d = c.getContext('2d').getImageData(0, 0, c.width, c.height).data;"
        "let n = 0; for (let i = 3; i < d.length; i += 4) if (d[i]) n++; return n;"
    )
    assert painted > 100
