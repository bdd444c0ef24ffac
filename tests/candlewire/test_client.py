from __future__ import annotations

import asyncio
import gc
import subprocess
import threading
import time
from collections.abc import Callable, Iterable
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from functools import partial

import pytest
import zmq

from candlewire import AsyncClient, Client, RequestRejected, RequestTimeout
from candlewire.market import Tick
from candlewire.testing import await_for, candlewire_command, wait_for
from proto import market_pb2
from proto import requests_pb2 as rq
from proto.envelope import decode_router, encode

START = 1_700_000_000_000
DAY_MS = 86_400_000


def feed(publisher, topic: str, stop: threading.Event, junk: bool = False) -> threading.Thread:
    def run() -> None:
        i = 0
        while not stop.is_set():
            if junk:
                publisher.send([topic.encode(), b"\x01", b"\x04\xff\xff"])
                bad = market_pb2.Tick(ticker=topic.split("|")[0], price="1,5", size="1")
                publisher.publish(topic, bad)  # a good envelope, a price that is not a number
            tick = market_pb2.Tick(
                ticker=topic.split("|")[0],
                trade_id=str(i),
                price=f"{100 + i}.50",
                size="0.0100",
                side=market_pb2.SELL,
                exchange_time_ns=START * 1_000_000 + i * 1_500,
            )
            publisher.publish(topic, tick)
            i += 1
            time.sleep(0.02)

    t = threading.Thread(target=run)
    t.start()
    return t


def test_async_history_both_patterns(settings, pipeline) -> None:
    async def main() -> list[int]:
        async with AsyncClient(settings) as client:
            a = await client.request_history("BINANCE:BTC/USDT", 60, START, START + DAY_MS)
            b = await client.request_history(
                "BINANCE:BTC/USDT", 3600, START, START + DAY_MS, notify="request"
            )
            return [a.row_count, b.row_count]

    assert asyncio.run(main()) == [1440, 24]


def test_async_rejection(settings, pipeline) -> None:
    async def main() -> None:
        async with AsyncClient(settings) as client:
            await client.submit("BINANCE:BTC/USDT", 45, START, START + DAY_MS)

    with pytest.raises(RequestRejected, match="BAD_PERIOD"):
        asyncio.run(main())


def test_submit_times_out_without_relay(settings) -> None:
    """In time, and saying which relays it asked and what to check."""
    t0 = time.monotonic()
    client = Client(settings, submit_timeout=1.5, attempt_timeout=0.5)
    with client, pytest.raises(RequestTimeout) as raised:
        client.submit("BINANCE:BTC/USDT", 60, START, START + DAY_MS)
    assert time.monotonic() - t0 < 5
    assert settings.relays("client_requests")[0] in str(raised.value)
    assert "candlewire status" in str(raised.value)


def test_a_rejection_whose_retry_runs_out_of_time_is_still_the_rejection(settings) -> None:
    """A relay that answers NO_INGESTOR, then answers no retry in time: the caller learns
    that no ingestor serves the exchange (retryable), not that the relay timed out."""
    router = zmq.Context.instance().socket(zmq.ROUTER)
    router.bind(settings.bind("client_requests"))
    asked: list[str] = []

    def reject_the_first() -> None:
        route, request = decode_router(router.recv_multipart())
        asked.append(request.request_id)
        answer = rq.SubmitResponse(
            request_id=request.request_id,
            status=rq.SUBMIT_REJECTED,
            reason=rq.NO_INGESTOR,
            error_message="no live ingestor serves KRAKEN",
        )
        router.send_multipart([*route, *encode(answer)])

    relay = threading.Thread(target=reject_the_first)
    relay.start()
    try:
        client = Client(settings, submit_timeout=3.0, attempt_timeout=5.0)
        with client, pytest.raises(RequestRejected) as info:
            client.submit("KRAKEN:BTC/USD", 60, START, START + DAY_MS)
        assert info.value.reason == "NO_INGESTOR" and info.value.retryable
        # Retried (no ingestor may come up in a moment), unanswered: the old answer stands.
        assert isinstance(info.value.__cause__, RequestTimeout)
    finally:
        relay.join()
        router.close(linger=0)
    assert len(asked) == 1


def test_subscribe_yields_only_its_topic_and_skips_malformed(
    settings, relay, publisher, served
) -> None:
    stop = threading.Event()
    feeders = [
        feed(publisher, "BINANCE:BTC/USDT|tick", stop, junk=True),
        feed(publisher, "BINANCE:BTC/USDT|tick2", stop),  # same prefix, other topic
    ]
    try:
        with Client(settings) as client:
            got, raw = [], []
            sub = client.subscribe("BINANCE:BTC/USDT", "tick", idle_timeout=10)
            for msg in sub:
                got.append(msg)
                if len(got) == 5:
                    break
            for msg in client.subscribe("BINANCE:BTC/USDT", "tick", idle_timeout=10, raw=True):
                raw.append(msg)
                if len(raw) == 5:
                    break
    finally:
        stop.set()
        for f in feeders:
            f.join()
    assert all(isinstance(m, Tick) and m.ticker == "BINANCE:BTC/USDT" for m in got)
    assert sub.stats.malformed >= 4  # each bad price dropped and counted, not raised
    for m in got:
        i = int(m.trade_id)
        assert (m.price, m.size, m.side) == (Decimal(f"{100 + i}.50"), Decimal("0.01"), "sell")
        start = datetime.fromtimestamp(START / 1000, UTC)
        assert m.time == start + timedelta(microseconds=i * 1_500 // 1_000)
        assert m.time.tzinfo is not None
        assert m.time_ns == START * 1_000_000 + i * 1_500
        with pytest.raises(AttributeError):
            m.price = Decimal(0)  # type: ignore[misc]  # frozen
    assert all(isinstance(m, market_pb2.Tick) for m in raw)


def test_async_subscribe(settings, relay, publisher, served) -> None:
    stop = threading.Event()
    feeder = feed(publisher, "COINBASE:ETH/USD|tick", stop)

    async def main() -> list[str]:
        async with AsyncClient(settings) as client:
            out = []
            async for msg in client.subscribe("COINBASE:ETH/USD", idle_timeout=10):
                assert isinstance(msg, Tick) and isinstance(msg.price, Decimal)
                out.append(msg.ticker)
                if len(out) == 3:
                    break
            return out

    try:
        assert asyncio.run(main()) == ["COINBASE:ETH/USD"] * 3
    finally:
        stop.set()
        feeder.join()


def test_a_subscription_is_in_place_when_subscribe_returns(settings, relay) -> None:
    """Subscribing is enough (its docstring says so): the relay sees the subscription before
    the first ``next``, so nothing published meanwhile is missed for want of it, and closing
    one never iterated takes it back. Both clients."""
    ticker = "BINANCE:BTC/USDT"
    watched = partial(relay._watched.watched, ticker)
    with Client(settings) as client:
        sub = client.subscribe(ticker, "ohlc:60", idle_timeout=5)
        wait_for(watched, timeout=10)
        sub.close()
        wait_for(lambda: not watched(), timeout=10)

    async def main() -> None:
        async with AsyncClient(settings) as client:
            sub = client.subscribe(ticker, idle_timeout=5)
            await await_for(watched)  # the async subscription reached the relay
            await sub.aclose()
            await await_for(lambda: not watched())

    asyncio.run(main())


def test_closing_a_client_closes_the_subscriptions_it_left_open(settings, relay) -> None:
    """A subscription neither closed nor dropped goes with its client: the relay sees it
    taken back (its socket is closed, not left to the context), and iterating it ends.
    Both clients."""
    ticker = "BINANCE:BTC/USDT"
    watched = partial(relay._watched.watched, ticker)
    client = Client(settings)
    sub = client.subscribe(ticker, "ohlc:60", idle_timeout=5)
    wait_for(watched, timeout=10)
    client.close()
    wait_for(lambda: not watched(), timeout=10)
    with pytest.raises(StopIteration):
        next(sub)

    async def main() -> None:
        client = AsyncClient(settings)
        sub = client.subscribe(ticker, idle_timeout=5)
        await await_for(watched)  # the async subscription reached the relay
        client.close()
        await await_for(lambda: not watched())
        with pytest.raises(StopAsyncIteration):
            await anext(sub)

    asyncio.run(main())


def read_on_a_thread(
    subscription: Callable[[], Iterable[object]],
) -> tuple[threading.Thread, list[BaseException | None]]:
    """A thread that iterates ``subscription()`` to its end, and what ended it (None: the
    iteration ended), for the tests to assert on."""
    ended: list[BaseException | None] = []

    def read() -> None:
        try:
            for _ in subscription():
                pass
        except BaseException as e:  # what ended it is the assertion
            ended.append(e)
        else:
            ended.append(None)

    reader = threading.Thread(target=read, daemon=True)  # a broken close fails, not hangs
    reader.start()
    return reader, ended


def polling(client: Client | AsyncClient) -> bool:
    """A subscription of ``client`` is being read: its emitting generator runs."""
    return any(run.reading for run in client._core.subscriptions)


@pytest.mark.parametrize("kept", [True, False], ids=["kept", "raw for loop"])
def test_closing_a_client_ends_a_subscription_read_elsewhere_from_the_reader_s_side(
    settings, relay, served, kept: bool
) -> None:
    """A caller may close the client from another thread (or coroutine) to stop a reader:
    the reader closes the socket itself once its current wait is over (libzmq's sockets are
    not thread-safe: closed under its poll, it failed with ENOTSOCK), and its iteration
    ends, with no ``idle_timeout`` to end it otherwise (and an ingestor stand-in, so that
    no NO_INGESTOR answer ends it after 2 s either). Both clients.

    ``kept=False``: ``for m in client.subscribe(..., raw=True)`` keeps only the emitting
    generator (a raw subscription's ``iter`` is that generator itself), not the object
    ``subscribe`` returned, and closing the client still ends the loop."""
    ticker = "BINANCE:BTC/USDT"
    watched = partial(relay._watched.watched, ticker)
    client = Client(settings)
    if kept:
        sub = client.subscribe(ticker)
        reader, ended = read_on_a_thread(lambda: sub)
    else:
        reader, ended = read_on_a_thread(lambda: client.subscribe(ticker, raw=True))
    wait_for(lambda: polling(client), timeout=5)
    wait_for(watched, timeout=10)
    client.close()
    reader.join(5)
    assert not reader.is_alive() and ended == [None]
    wait_for(lambda: not watched(), timeout=10)

    async def main() -> None:
        client = AsyncClient(settings)
        sub = client.subscribe(ticker) if kept else None

        async def read() -> None:
            async for _ in sub if sub is not None else client.subscribe(ticker, raw=True):
                pass

        task = asyncio.ensure_future(read())
        await await_for(lambda: watched() and polling(client))  # awaited
        client.close()
        await asyncio.wait_for(task, 5)
        await await_for(lambda: not watched())

    asyncio.run(main())


def test_a_dropped_subscription_closes_its_socket_at_once(settings, relay) -> None:
    """Dropped unread, whole or as a raw subscription's emitting generator (what a ``for``
    loop holds), a subscription closes its socket when its last reference goes, with no
    collection needed: the client keeps its subscriptions only weakly, and nothing of one
    makes a cycle."""
    ticker = "BINANCE:BTC/USDT"
    watched = partial(relay._watched.watched, ticker)
    gc.disable()
    try:
        with Client(settings) as client:
            sub = client.subscribe(ticker, idle_timeout=5)
            wait_for(watched, timeout=10)
            del sub
            wait_for(lambda: not watched(), timeout=10)
            emitting = iter(client.subscribe(ticker, raw=True, idle_timeout=5))
            wait_for(watched, timeout=10)
            del emitting
            wait_for(lambda: not watched(), timeout=10)
    finally:
        gc.enable()


def test_a_subscription_s_deadlines_start_at_its_first_next(settings, relay, monkeypatch) -> None:
    """Subscribed at once, waited on later: ``idle_timeout`` and the journal's deadline (a
    ``since``; no journal answers here) run from the first ``next``, not from ``subscribe``,
    so a caller who iterates a while later still gets its whole wait."""
    from candlewire import FellBehind

    monkeypatch.setattr("candlewire._core.FILL_TIMEOUT_S", 0.4)
    cases = [({"idle_timeout": 0.4}, RequestTimeout), ({"since": START}, FellBehind)]
    with Client(settings) as client:
        for kwargs, error in cases:
            sub = client.subscribe("BINANCE:BTC/USDT", **kwargs)
            time.sleep(0.6)
            t0 = time.monotonic()
            with pytest.raises(error):
                next(sub)
            assert time.monotonic() - t0 >= 0.3, f"{kwargs}: the wait ran from subscribe()"
            sub.close()


def test_subscribe_idle_timeout(settings, relay) -> None:
    with Client(settings) as client, pytest.raises(RequestTimeout):
        next(client.subscribe("BINANCE:BTC/USDT", idle_timeout=0.3))


def test_watch_cli_prints_live_messages(settings, relay, publisher, served) -> None:
    """One aligned line per tick for people; one JSON object per line with ``--format json``."""
    import json
    import os
    import re

    env = {**os.environ, **settings.to_env()}
    stop = threading.Event()
    feeder = feed(publisher, "BINANCE:SOL/USDT|tick", stop)
    try:
        out, machine = (
            subprocess.run(
                candlewire_command("watch", "BINANCE:SOL/USDT", "--count", "2", *extra),
                env=env,
                capture_output=True,
                text=True,
                timeout=30,
            )
            for extra in ([], ["--format", "json"])
        )
    finally:
        stop.set()
        feeder.join()
    lines = out.stdout.splitlines()
    assert out.returncode == 0, out.stderr
    line = r"2023-11-14 22:13:20\.\d{3}  BINANCE:SOL/USDT  sell  0\.01 @ \d+\.5"
    assert len(lines) == 2 and all(re.fullmatch(line, x) for x in lines), lines
    assert machine.returncode == 0, machine.stderr
    records = [json.loads(x) for x in machine.stdout.splitlines()]
    assert len(records) == 2
    assert records[0]["ticker"] == "BINANCE:SOL/USDT" and records[0]["size"] == "0.01"
    assert records[0]["time"].startswith("2023-11-14T22:13:20") and records[0]["side"] == "sell"
    assert re.fullmatch(r"\d+\.5", records[0]["price"]) and records[0]["repaired"] is False


def test_rejection_carries_relay_reason(settings, pipeline) -> None:
    with Client(settings) as client, pytest.raises(RequestRejected) as info:
        client.submit("BINANCE:BTC/USDT", 60, START + DAY_MS, START)
    assert info.value.response.reason == rq.BAD_RANGE


def test_a_request_given_up_leaves_nothing_behind(settings, pipeline) -> None:
    """A refused submit and a wait that timed out: neither the HistoryReady topic's
    subscription nor the request's expectation stays (each held for good, one a request),
    and a HistoryReady that comes after the wait is not kept."""
    from candlewire.errors import RequestTimeout

    with Client(settings) as client:
        inbox = client._core.inbox
        for _ in range(3):
            with pytest.raises(RequestRejected):
                client.request_history(
                    "BINANCE:BTC/USDT", 60, START + DAY_MS, START, notify="request", timeout=5
                )
        assert inbox._pending == set()
        with pytest.raises(RequestTimeout):  # accepted, and waited on for no time at all
            client.request_history("BINANCE:BTC/USDT", 60, START, START + 60_000, timeout=0)
        assert inbox._pending == set() and inbox._ready == {}


def test_watch_cli_reports_an_unservable_ticker_in_one_line(settings, relay) -> None:
    import os

    out = subprocess.run(
        candlewire_command("watch", "NOBODY:BTC/USDT"),
        env={**os.environ, **settings.to_env()},
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert out.returncode == 1
    assert out.stderr.strip().splitlines()[-1].startswith("error: subscription to NOBODY:BTC/USDT")
    assert "NO_INGESTOR" in out.stderr and "Traceback" not in out.stderr
