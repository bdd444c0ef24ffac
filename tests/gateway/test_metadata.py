"""METADATA_UPDATE: the gateway reloads symbols from Iceberg, and charts and event texts use them.

The notification travels the real way: a stream-processor PUB, the relay's XSUB → XPUB, the
gateway's SUB. Candles for a chart come the same way.
"""

from __future__ import annotations

import base64
import datetime as dt
import json
import pickle
import subprocess
import sys
import time
import uuid
from decimal import Decimal
from typing import Any

import pyarrow as pa

from candlewire.lake import NAMESPACE, catalog
from candlewire.testing import new_user, user_event
from candlewire.topics import (
    market_data_topic,
    metadata_update_topic,
    ohlc_type,
    subscription_error_topic,
)
from proto import events_pb2 as ev
from proto import market_pb2
from proto import requests_pb2 as rq
from tests.gateway.conftest import gw_config, next_of, sign_in
from tests.support import FakePublisher, wait_for


def list_symbols(settings, exchange: str, pairs: list[tuple[str, str, str]]) -> None:
    """What the stream job's metadata MERGE leaves in Iceberg, written with pyiceberg."""
    table = catalog(settings).load_table(f"{NAMESPACE}.symbol_metadata")
    now = dt.datetime.now(dt.UTC)
    rows = [
        {
            "ticker": f"{exchange}:{base}/{quote}",
            "exchange": exchange,
            "base": base,
            "quote": quote,
            "exchange_symbol": f"{base}{quote}",
            "tick_size": Decimal(tick),
            "lot_size": Decimal("0.001"),
            "min_notional": Decimal("10"),
            "status": "TRADING",
            "update_time": now,
        }
        for base, quote, tick in pairs
    ]
    table.append(pa.Table.from_pylist(rows, schema=table.schema().as_arrow()))


def publish_until(pub: FakePublisher, topic: str, msg, done, timeout: float = 10.0) -> None:
    """Publish until the subscriber has it: a new subscription takes a moment to propagate."""
    deadline = time.monotonic() + timeout
    while not done():
        assert time.monotonic() < deadline, f"nothing arrived on {topic}"
        pub.publish(topic, msg)
        time.sleep(0.1)


def write_candles(settings, ticker: str, opens_s: list[int], forming: int | None = None) -> None:
    """Closed candles of ``ticker``, except the one that opens at ``forming``."""
    table = catalog(settings).load_table(f"{NAMESPACE}.ohlc")
    rows = [
        {
            "ticker": ticker,
            "period_s": 60,
            "open_time": dt.datetime.fromtimestamp(t, dt.UTC),
            "open": Decimal("100"),
            "high": Decimal("101"),
            "low": Decimal("99"),
            "close": Decimal("100.50"),
            "volume": Decimal("2"),
            "trade_count": 3,
            "closed": t != forming,
            "source": "live",
            "update_time": dt.datetime.now(dt.UTC),
        }
        for t in opens_s
    ]
    table.append(pa.Table.from_pylist(rows, schema=table.schema().as_arrow()))


def chart(ws, ticker: str, period: int) -> None:
    ws.send(json.dumps({"op": "chart", "ticker": ticker, "period": period}))


def error_saying(ws, text: str) -> dict:
    """The next error that says ``text``: the first chart's own error (no ingestor serves an
    exchange nobody lists) may come before it, as the symbols are read beside the start."""
    while text not in (error := next_of(ws, "error"))["message"]:
        pass
    return error


def maybe_next(ws, kind: str) -> dict | None:
    try:
        return next_of(ws, kind, timeout=0.2)
    except TimeoutError:
        return None


def test_metadata_update_reloads_symbols_used_by_charts_and_events(
    gw_env, market, make_gateway, make_publisher
) -> None:
    exchange = f"GW{uuid.uuid4().hex[:6].upper()}"
    gw = make_gateway(gw_env, gw_config())
    events = make_publisher(gw_env)
    user = new_user()
    ws = sign_in(gw_env, user)
    chart(ws, f"{exchange}:NOPE/USD", 60)
    assert next_of(ws, "chart")["ticker"] == f"{exchange}:NOPE/USD"  # exchange not listed yet

    wait_for(lambda: gw.symbols.loads, timeout=60)  # the read at start runs beside it
    list_symbols(gw_env, exchange, [("FOO", "USD", "0.01")])
    loads = gw.symbols.loads
    note = market_pb2.SymbolMetadataUpdated(exchange=exchange, symbol_count=1, added=1)
    publish_until(
        market, metadata_update_topic(), note, lambda: gw.symbols.loads > loads, timeout=60
    )
    assert gw.symbols.get(f"{exchange}:FOO/USD").tick_size == Decimal("0.01")

    chart(ws, f"{exchange}:NOPE/USD", 60)
    refused = error_saying(ws, "is not listed")["message"]
    assert refused == f"{exchange}:NOPE/USD is not listed on {exchange}"
    chart(ws, f"{exchange}:FOO/USD", 7)
    assert error_saying(ws, "period 7")

    ticker = f"{exchange}:FOO/USD"
    minute = int(time.time()) // 60 * 60
    # The chart's recent past. The last minute has ended by the clock, but the job stored it
    # forming (its feed's watermark, the clock less the allowance, had not passed it): the
    # seed says what the table says.
    write_candles(gw_env, ticker, [minute - 120, minute - 60], forming=minute - 60)
    chart(ws, f"{ticker}", 60)
    assert next_of(ws, "chart")["ticker"] == ticker
    seeded = [next_of(ws, "candle"), next_of(ws, "candle")]
    assert [(c["seed"], c["t"], c["c"], c["closed"]) for c in seeded] == [
        (True, (minute - 120) * 1000, "100.5", True),
        (True, (minute - 60) * 1000, "100.5", False),
    ]
    candle = market_pb2.OHLC(
        ticker=ticker, period_s=60, open_time_ms=1_700_000_040_000, open="1", high="3", low="1"
    )
    candle.close, candle.volume = "2", "5"
    got: list[dict] = []
    publish_until(
        market,
        market_data_topic(ticker, ohlc_type(60)),
        candle,
        lambda: got.extend(m for m in [maybe_next(ws, "candle")] if m) or got,
    )
    assert (got[0]["c"], got[0]["t"], got[0]["period"]) == ("2", 1_700_000_040_000, 60)

    wait_for(lambda: events.watched(user))
    events.publish(
        user_event(user, ev.INFORMATIONAL, payload={"ticker": ticker, "price": "101.23456"})
    )
    assert "price: 101.23\n" in next_of(ws, "event")["text"]
    ws.close()


READ_SYMBOLS = """
import base64, json, pickle, sys
from gateway.symbols import SymbolCatalog
catalog = SymbolCatalog(pickle.loads(base64.b64decode(sys.stdin.read())))
count = catalog.reload()
symbol = catalog.get(sys.argv[1])
heavy = sorted(m for m in ("pyarrow", "pyiceberg", "pandas", "numpy") if m in sys.modules)
print(json.dumps([count, str(symbol.tick_size) if symbol else None, heavy]))
"""


def test_the_gateway_reads_symbols_in_a_child_and_keeps_none_of_icebergs_reader(
    gw_env,
) -> None:
    """#36: pyiceberg, pyarrow and pandas are about 130 MiB a process keeps once imported;
    the gateway needs them only to read ``symbol_metadata``, so a child process reads it."""
    exchange = f"GW{uuid.uuid4().hex[:6].upper()}"
    list_symbols(gw_env, exchange, [("FOO", "USD", "0.25"), ("BAR", "USD", "0.5")])
    done = subprocess.run(
        [sys.executable, "-c", READ_SYMBOLS, f"{exchange}:FOO/USD"],
        input=base64.b64encode(pickle.dumps(gw_env)).decode(),
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    count, tick, heavy = json.loads(done.stdout.splitlines()[-1])
    assert count >= 2 and Decimal(tick) == Decimal("0.25")
    assert heavy == []


def test_a_failed_read_apart_keeps_the_symbols_it_had(gw_env) -> None:
    """The child's error comes back as the reload's failure, logged, never a crash."""
    from gateway.symbols import SymbolCatalog

    catalog = SymbolCatalog(gw_env)
    catalog.read_apart = True  # a service's way, which this package's fixture turns off
    exchange = f"GW{uuid.uuid4().hex[:6].upper()}"
    list_symbols(gw_env, exchange, [("FOO", "USD", "0.01")])
    assert catalog.reload() >= 1 and catalog.loads == 1
    broken = gw_env.model_copy(update={"catalog_url": "postgresql://x@127.0.0.1:1/none"})
    catalog.settings = broken
    assert catalog.reload() == len(catalog) >= 1
    assert catalog.loads == 1 and catalog.get(f"{exchange}:FOO/USD") is not None


def test_a_chart_keeps_flowing_while_another_session_on_it_leaves(
    gw_env, market, make_gateway
) -> None:
    make_gateway(gw_env, gw_config())
    staying, leaving, topic, candle = _two_sessions_on_a_chart(gw_env, market)
    leaving.send(json.dumps({"op": "unchart"}))
    assert next_of(leaving, "chart")["ticker"] is None
    leaving.close()
    time.sleep(0.5)  # an unsubscribe, had one been sent, reaches the relay
    while maybe_next(staying, "candle"):
        pass  # what came before the other left
    publish_until(market, topic, candle, lambda: maybe_next(staying, "candle"))
    staying.close()


def test_a_session_that_moves_to_another_chart_gets_none_of_the_old_one_s_candles(
    gw_env, market, make_gateway
) -> None:
    """Candles go to the sessions drawing their chart: one that moved on to another chart
    gets none of the old one's, while a session still drawing it does."""
    make_gateway(gw_env, gw_config())
    staying, moving, topic, candle = _two_sessions_on_a_chart(gw_env, market)
    other = f"GW{uuid.uuid4().hex[:6].upper()}:BAZ/USD"
    chart(moving, other, 60)
    assert next_of(moving, "chart")["ticker"] == other
    time.sleep(0.5)  # what was on its way to it before the move
    while maybe_next(moving, "candle"):
        pass
    while maybe_next(staying, "candle"):
        pass
    publish_until(market, topic, candle, lambda: maybe_next(staying, "candle"))
    time.sleep(0.3)
    assert maybe_next(moving, "candle") is None
    staying.close()
    moving.close()


def test_a_chart_s_subscription_error_reaches_the_sessions_drawing_it_only(
    gw_env, market, make_gateway
) -> None:
    """An error about a chart's ticker goes to the sessions drawing that chart, not to a
    session drawing another."""
    make_gateway(gw_env, gw_config())
    ticker = f"GW{uuid.uuid4().hex[:6].upper()}:BAR/USD"
    other = f"GW{uuid.uuid4().hex[:6].upper()}:BAZ/USD"
    drawing, elsewhere = sign_in(gw_env, new_user()), sign_in(gw_env, new_user())
    for ws, shown in ((drawing, ticker), (elsewhere, other)):
        chart(ws, shown, 60)
        assert next_of(ws, "chart")["ticker"] == shown
    text = f"no ingestor for {ticker} ({uuid.uuid4().hex[:8]})"
    error = rq.SubscriptionError(ticker=ticker, error_message=text)
    got: list[dict] = []

    def arrived() -> bool:
        got.extend(iter(lambda: maybe_next(drawing, "error"), None))
        return any(e["message"] == text for e in got)

    publish_until(market, subscription_error_topic(ticker), error, arrived)
    time.sleep(0.5)  # what was sent to the other, had it been
    seen = list(iter(lambda: maybe_next(elsewhere, "error"), None))
    assert all(e["message"] != text for e in seen), seen
    drawing.close()
    elsewhere.close()


def _two_sessions_on_a_chart(gw_env, market) -> tuple[Any, Any, str, market_pb2.OHLC]:
    """Two sessions of two users drawing one new 1-minute chart, the second already getting
    its candles: the sessions, the chart's topic and the candle published on it."""
    ticker = f"GW{uuid.uuid4().hex[:6].upper()}:BAR/USD"
    first, second = sign_in(gw_env, new_user()), sign_in(gw_env, new_user())
    for ws in (first, second):
        chart(ws, ticker, 60)
        assert next_of(ws, "chart")["ticker"] == ticker
    candle = market_pb2.OHLC(ticker=ticker, period_s=60, open_time_ms=1_700_000_040_000)
    topic = market_data_topic(ticker, ohlc_type(60))
    publish_until(market, topic, candle, lambda: maybe_next(second, "candle"))
    return first, second, topic, candle
