"""The live page against the real stack in headless Chromium: the SIM ingestor streams on
demand, the Spark job makes the candles, the relay and the gateway carry them, and the
chart (lightweight-charts) draws them on its axes and moves its last candle as trades come."""

from __future__ import annotations

from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import WebDriverWait

from candlewire.book import Book
from candlewire.market import plain
from candlewire.testing import new_user
from gateway import Gateway, issue_token
from ingest.exchanges.sim import SimExchange
from tests.gateway.conftest import SECRET, gw_config
from tests.gateway.test_page import browser  # noqa: F401  (the fixture)


def test_the_live_page_charts_what_the_job_makes(
    live_pipeline,
    browser,  # noqa: F811
    tmp_path,
) -> None:
    gateway = Gateway(live_pipeline, gw_config(), metrics=False).start()
    try:
        user = new_user()
        browser.get(f"http://127.0.0.1:{live_pipeline.port('gateway_http')}/")
        browser.find_element(By.ID, "token").send_keys(issue_token(SECRET, user))
        browser.find_element(By.ID, "signin-button").click()  # charts SIM:BTC/USDT, 1m

        def last() -> tuple | None:
            """The last bar and the count of plotted updates, read in one script: a plot
            between two reads would move the bar without the count the test compares."""
            bars, volumes, updates = browser.execute_script(
                "const c = window.cwChart;"
                "return [c.prices.data(), c.volume.data(),"
                " Number(document.getElementById('chart').dataset.updates)];"
            )
            if not bars:
                return None
            return (bars[-1]["time"], bars[-1]["close"], volumes[-1]["value"], updates)

        wait = WebDriverWait(browser, 120, poll_frequency=0.5)
        first = wait.until(lambda b: last())
        # SIM trades about once a second: the job's next live update moves the last candle
        # (a later close or a larger volume, or the next minute's candle).
        moved = wait.until(lambda b: (now := last()) is not None and now[:3] != first[:3] and now)
        assert moved[0] >= first[0]
        assert moved[3] > first[3]
        axes = browser.execute_script(
            "const c = window.cwChart.chart;"
            "return [c.priceScale('right').width(), c.timeScale().height()];"
        )
        assert axes[0] > 20 and axes[1] > 10
        text = browser.find_element(By.ID, "last-candle").text
        assert text.startswith("SIM:BTC/USDT ")

        # The depth panel (#38): the charted ticker's book, as SIM itself has it at the
        # update the panel shows, and redrawn as it changes.
        def depth() -> dict | None:
            return browser.execute_script("return window.cwDepth || null;")

        wait.until(lambda b: depth())
        # The book and the rows drawn from it, read in one script: the page redraws between
        # two separate reads.
        shown, rows = browser.execute_script(
            "return [window.cwDepth, [...document.querySelectorAll('#depth tr')]"
            ".map(r => r.innerText)];"
        )
        truth = Book.from_snapshot(SimExchange().book_at("SIM:BTC/USDT", shown["seq"]))
        as_text = [
            [[plain(p), plain(q)] for p, q in side] for side in (truth.bids(10), truth.asks(10))
        ]
        assert [shown["bids"], shown["asks"]] == as_text
        assert len(rows) == 20 and rows[9].split()[0] == shown["asks"][0][0]
        wait.until(lambda b: depth()["seq"] > shown["seq"])
        shot = tmp_path / "live-page.png"
        assert browser.save_screenshot(str(shot)) and shot.stat().st_size > 10_000
    finally:
        gateway.stop()
