"""The page's depth panel end to end: a charted ticker's L2 book, published sequenced by the
stream job's own publisher through a real relay and journal, reaches the chart's sessions
as its best levels; the panel follows the chart; a venue with no book says so. And, in one
process, the depth offered after a chart reply is the latest, to a session still charting it."""

from __future__ import annotations

import json
import time
import uuid
from decimal import Decimal

import pytest
import zmq

from candlewire.book import Book
from candlewire.market import plain
from candlewire.testing import new_user, wait_for
from candlewire.topics import book_type, market_data_topic, work_prefix
from gateway.service import DEPTH_EVERY_S, DEPTH_LEVELS
from tests.gateway.conftest import gw_config, next_of, sign_in
from tests.journal.test_journal import (  # noqa: F401
    book_updates,
    books_after_each,
    ingestor,
    journal,
    journal_settings,
    relay,
    stream_pub,
)
from tests.support import FakeIngestor

VENUE = "DEPTHVENUE"  # an exchange the shared catalog never lists: any of its pairs charts


@pytest.fixture
def venue(journal_settings, relay):  # noqa: F811
    """An ingestor of the test's own exchange behind the relay."""
    ctx = zmq.Context()
    ing = FakeIngestor(ctx, journal_settings, [work_prefix(VENUE)])
    wait_for(lambda: relay.has_ingestor(VENUE))
    yield ing
    ing.close()
    ctx.destroy(linger=0)


def best(book: Book) -> tuple[list[list[str]], list[list[str]]]:
    """The panel's view of a book: its best levels a side, as the page shows them."""

    def side(levels: list[tuple[Decimal, Decimal]]) -> list[list[str]]:
        return [[plain(p), plain(q)] for p, q in levels]

    return side(book.bids(DEPTH_LEVELS)), side(book.asks(DEPTH_LEVELS))


def test_a_charted_ticker_s_book_reaches_its_sessions_as_its_best_levels_to_the_last(
    journal_settings,  # noqa: F811
    journal,  # noqa: F811
    stream_pub,  # noqa: F811
    venue,
    make_gateway,
) -> None:
    """The book as the journal holds it when the chart opens, then live: every panel
    message equals the book of the same updates applied one by one, and once updates stop,
    the last one shown is the last book, even when it came within ``DEPTH_EVERY_S`` of the
    one before (a panel throttled on the leading edge only would keep a stale book). A
    session that charts a quiet book is shown it without waiting for its next update."""
    ticker = f"{VENUE}:D{uuid.uuid4().hex[:6].upper()}/USDT"
    topic = market_data_topic(ticker, book_type()).encode()
    updates = book_updates(ticker, 40, seed=11)
    expected = books_after_each(ticker, updates, best)
    stream_pub.publish_sequenced([(topic, m) for m in updates[:11]])
    stream_pub._journal.flush(10)
    gateway = make_gateway(journal_settings, gw_config())
    ws = sign_in(journal_settings, new_user())
    try:
        ws.send(json.dumps({"op": "chart", "ticker": ticker, "period": 60}))
        assert next_of(ws, "chart")["ticker"] == ticker
        shown: list[dict] = []

        def shown_until(seq: int) -> None:
            deadline = time.monotonic() + 30
            while not shown or shown[-1]["seq"] != seq:
                try:
                    shown.append(next_of(ws, "depth", timeout=deadline - time.monotonic()))
                except TimeoutError:
                    at = shown[-1]["seq"] if shown else None
                    pytest.fail(f"the panel stayed at update {at}, not {seq}")

        shown_until(11)  # the book as the journal holds it, with no live update after it
        assert shown[0]["ticker"] == ticker and "error" not in shown[0]
        replayed = len(shown)
        # Live: the rest at once, well within DEPTH_EVERY_S of the book just shown.
        started = time.monotonic()
        stream_pub.publish_sequenced([(topic, m) for m in updates[11:]])
        shown_until(updates[-1].venue_seq)
        live = len(shown) - replayed
        for msg in shown:
            assert (msg["bids"], msg["asks"]) == expected[msg["seq"]], msg["seq"]
        assert shown[-1]["bids"] and shown[-1]["asks"]
        # Throttled: at most one a DEPTH_EVERY_S (and one at once), not one an update.
        assert replayed <= 3 and live <= 1 + (time.monotonic() - started) / DEPTH_EVERY_S
        assert live < len(updates) - 11
        # The book goes quiet. A session that charts the ticker now, and this one switching
        # to another period (whose "chart" reply clears the page's panel), are shown the
        # last book at once, after that reply, without waiting for an update.
        other = sign_in(journal_settings, new_user())
        try:
            for session, period in ((other, 60), (ws, 3600)):
                session.send(json.dumps({"op": "chart", "ticker": ticker, "period": period}))
                assert next_of(session, "chart")["period"] == period
                again = next_of(session, "depth", timeout=5)
                assert again["seq"] == shown[-1]["seq"]
                assert (again["bids"], again["asks"]) == expected[again["seq"]]
            # The panel follows the charts: the book's subscription ends with the last one.
            for session in (ws, other):
                session.send(json.dumps({"op": "unchart"}))
                assert next_of(session, "chart")["ticker"] is None
            wait_for(lambda: ticker not in gateway._depth, timeout=10)
        finally:
            other.close()
    finally:
        ws.close()


def test_a_venue_with_no_book_tells_the_panel_once_and_the_chart_goes_on(
    journal_settings,  # noqa: F811
    journal,  # noqa: F811
    relay,  # noqa: F811
    make_gateway,
) -> None:
    """An exchange with no ingestor behind the relay: the panel gets one error message for
    the ticker, and the session goes on (a ping is answered)."""
    ticker = f"NOBOOKVENUE:D{uuid.uuid4().hex[:6].upper()}/USDT"
    make_gateway(journal_settings, gw_config())
    ws = sign_in(journal_settings, new_user())
    try:
        ws.send(json.dumps({"op": "chart", "ticker": ticker, "period": 60}))
        assert next_of(ws, "chart")["ticker"] == ticker
        depth = next_of(ws, "depth", timeout=30)
        assert depth["ticker"] == ticker and depth["error"]
        ws.send(json.dumps({"op": "ping"}))
        assert next_of(ws, "pong")["type"] == "pong"
    finally:
        ws.close()


def test_the_depth_offered_after_a_chart_reply_is_the_book_shown_last_when_it_goes_out(
    tmp_path,
) -> None:
    """A chart command's reply clears the page's panel, so the ticker's last depth is offered
    after it, on the loop's next turn. A newer book shown before that turn must be the one
    offered: the page does not compare ``seq``, and an older book would stay drawn."""
    import asyncio

    from gateway.service import Gateway
    from tests.support import free_settings

    class Socket:
        async def close(self, code: int, reason: str) -> None:
            pass

    async def main() -> None:
        gw = Gateway(free_settings(tmp_path), gw_config(), metrics=False)
        ctx = zmq.Context.instance()
        gw._events, gw._market = ctx.socket(zmq.SUB), ctx.socket(zmq.SUB)
        gw.symbols.check_chart = lambda ticker, period: None  # type: ignore[method-assign]

        async def idle(*_: object) -> None:  # no history to seed, no book to follow
            await asyncio.sleep(3600)

        gw._seed_chart, gw._book = idle, idle  # type: ignore[method-assign]
        ticker = f"{VENUE}:A/B"
        gw._depth_shown[ticker] = {"type": "depth", "ticker": ticker, "seq": 1}
        session = gw.sessions.open("alice", Socket())  # type: ignore[arg-type]
        assert session is not None
        reply = gw._command(session, json.dumps({"op": "chart", "ticker": ticker}))
        assert reply == {"type": "chart", "ticker": ticker, "period": 60}
        gw._depth_shown[ticker] = {"type": "depth", "ticker": ticker, "seq": 2}  # shown since
        await asyncio.sleep(0)
        assert [json.loads(m)["seq"] for m in session.outbox] == [2]

        # Unless the session charts another ticker by then: nothing of this one's is offered
        # (another session keeps the ticker followed, its last depth kept).
        bob = gw.sessions.open("bob", Socket())  # type: ignore[arg-type]
        assert bob is not None
        gw._command(bob, json.dumps({"op": "chart", "ticker": ticker}))
        gw._command(session, json.dumps({"op": "chart", "ticker": f"{VENUE}:C/D"}))
        gw._command(session, json.dumps({"op": "chart", "ticker": ticker}))
        gw._command(session, json.dumps({"op": "chart", "ticker": f"{VENUE}:C/D"}))
        session.outbox.clear()
        await asyncio.sleep(0)
        assert list(session.outbox) == []
        assert [json.loads(m)["seq"] for m in bob.outbox] == [2]
        for task in asyncio.all_tasks() - {asyncio.current_task()}:
            task.cancel()
        gw._events.close(0)
        gw._market.close(0)

    asyncio.run(main())
