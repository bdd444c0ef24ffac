"""The relay against real sockets on 127.0.0.1; tests play the ingestor and publisher roles."""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
import urllib.request

import pytest
import zmq

from candlewire import Client, HistoryFailed, RequestRejected
from candlewire.config import Settings
from candlewire.curve import dial
from candlewire.testing import candlewire_command
from candlewire.topics import history_ready_topic, work_prefix
from proto import requests_pb2 as rq
from proto.envelope import decode, encode
from relay import Relay
from relay.server import NOTIFY_HOLD_S
from relay.validation import Rejected, validate
from tests.support import (
    FakeIngestor,
    FakePublisher,
    counted,
    free_settings,
    relay_call,
    relay_frames,
    secured_settings,
    serve_pipeline,
    wait_for,
)

DAY_MS = 86_400_000
START = 1_700_000_000_000


@pytest.fixture(params=["plain", "curve"])
def settings(request, tmp_path) -> Settings:
    """Every test here runs with CURVE off and on: the same behaviour, through the keys."""
    return secured_settings(tmp_path) if request.param == "curve" else free_settings(tmp_path)


@pytest.mark.parametrize("notify", ["client", "request"])
def test_full_history_flow(settings, pipeline, notify) -> None:
    with Client(settings) as client:
        note = client.request_history(
            "BINANCE:BTC/USDT", 60, START, START + DAY_MS, notify=notify, timeout=10
        )
    assert note.status == rq.HISTORY_OK
    assert note.row_count == 1440
    assert note.iceberg_table == "candlewire.ohlc"
    assert (note.start_ms, note.end_ms) == (START, START + DAY_MS)


def test_per_client_topic_serves_many_requests(settings, pipeline) -> None:
    with Client(settings) as client:
        ids = [
            client.request_history("BINANCE:ETH/USDT", 300, START, START + i * DAY_MS, timeout=10)
            for i in (1, 2, 3)
        ]
    assert [n.row_count for n in ids] == [288, 576, 864]


def test_error_notification_raises(ctx, settings, publisher, relay) -> None:
    stop = threading.Event()
    t = threading.Thread(
        target=serve_pipeline, args=(ctx, settings, publisher, stop, rq.HISTORY_ERROR)
    )
    t.start()
    time.sleep(0.2)
    try:
        with Client(settings) as client, pytest.raises(HistoryFailed, match="unknown symbol"):
            client.request_history("BINANCE:NOPE/USDT", 60, START, START + DAY_MS, timeout=10)
    finally:
        stop.set()
        t.join()


def test_subscribe_before_submit_race(settings, relay, pipeline, long_hold) -> None:
    """The notification is published the instant the work appears; it is never missed.

    Each client is new, so its subscription and its request race on two fresh connections.
    The relay holds the work until the subscription has passed it (never for the full hold
    here), and the publisher's repeats cover the last hop, which no relay can order.
    """
    for _ in range(25):
        with Client(settings) as client:
            note = client.request_history(
                "BINANCE:BTC/USDT", 60, START, START + DAY_MS, notify="request", timeout=30
            )
        assert note.status == rq.HISTORY_OK
    assert released(relay).get("timed_out", 0) == 0


@pytest.fixture
def long_hold(monkeypatch: pytest.MonkeyPatch) -> None:
    """A hold of 10 s, not 1: the tests that say work waited for its listener ("heard", never
    "timed_out") must not see a subscription that a loaded machine delayed past the hold."""
    monkeypatch.setattr("relay.server.NOTIFY_HOLD_S", 10.0)


def released(relay: Relay) -> dict[str, float]:
    """History work published so far, by what released it."""
    return {labels[0]: n for labels, n in counted(relay.metrics.held).items()}


def history_request(request_id: str) -> rq.SubmitHistoricalRequest:
    return rq.SubmitHistoricalRequest(
        request_id=request_id,
        client_id="raw",
        ticker="BINANCE:BTC/USDT",
        period_s=60,
        start_ms=START,
        end_ms=START + DAY_MS,
        notify=rq.NOTIFY_REQUEST,
    )


def test_work_waits_for_its_notification_topic_to_be_subscribed(
    ctx, settings, relay, long_hold
) -> None:
    """The race that subscribe-first alone leaves open: a request overtaking its subscription."""
    ing = FakeIngestor(ctx, settings, [work_prefix("BINANCE")])
    wait_for(lambda: relay.has_ingestor("BINANCE"))
    try:
        assert relay_call(settings, history_request("late-sub")).status == rq.SUBMIT_OK
        assert ing.recv(0.3) is None, "work went out before anyone could hear its notification"
        sub = dial(ctx.socket(zmq.SUB), settings, "relay", "ingest")
        sub.setsockopt(zmq.LINGER, 0)
        sub.subscribe(history_ready_topic("late-sub"))
        sub.connect(settings.connect("market_data"))
        got = ing.recv(30.0)
        sub.close()
    finally:
        ing.close()
    assert got is not None and got[1].request_id == "late-sub"
    assert released(relay) == {"heard": 1}


def test_work_nobody_listens_for_still_goes_out_after_the_hold(ctx, settings, relay) -> None:
    ing = FakeIngestor(ctx, settings, [work_prefix("BINANCE")])
    wait_for(lambda: relay.has_ingestor("BINANCE"))
    try:
        assert relay_call(settings, history_request("no-sub")).status == rq.SUBMIT_OK
        got = ing.recv(NOTIFY_HOLD_S + 5.0)
    finally:
        ing.close()
    assert got is not None and got[1].request_id == "no-sub"
    assert released(relay) == {"timed_out": 1}


def test_a_full_hold_sends_work_at_once(ctx, settings, relay, monkeypatch, long_hold) -> None:
    """The hold is bounded: past it, work goes out without waiting for a listener."""
    monkeypatch.setattr("relay.server.MAX_HELD", 1)
    ing = FakeIngestor(ctx, settings, [work_prefix("BINANCE")])
    wait_for(lambda: relay.has_ingestor("BINANCE"))
    try:
        for request_id in ("held", "overflow"):
            assert relay_call(settings, history_request(request_id)).status == rq.SUBMIT_OK
        first = ing.recv(30.0)
        second = ing.recv(10.0 + 30.0)  # past long_hold's hold
    finally:
        ing.close()
    assert [first[1].request_id, second[1].request_id] == ["overflow", "held"]
    assert released(relay) == {"hold_full": 1, "timed_out": 1}


def test_a_subscribed_client_is_not_held(settings, pipeline, relay, long_hold) -> None:
    with Client(settings) as client:
        for i in range(3):
            client.request_history("BINANCE:BTC/USDT", 60, START, START + i * DAY_MS + 1)
    assert released(relay).get("timed_out", 0) == 0
    assert released(relay)["not_held"] >= 2  # the first may race its client's subscription


def test_exchange_prefix_routing(ctx, settings, relay) -> None:
    binance = FakeIngestor(ctx, settings, [work_prefix("BINANCE")])
    coinbase = FakeIngestor(ctx, settings, [work_prefix("COINBASE")])
    binance_us = FakeIngestor(ctx, settings, [work_prefix("BINANCEUS")])
    wait_for(lambda: all(map(relay.has_ingestor, ("BINANCE", "COINBASE", "BINANCEUS"))), 30)
    with Client(settings) as client:
        client.submit("COINBASE:BTC/USD", 60, START, START + DAY_MS)
        client.submit("BINANCE:BTC/USDT", 60, START, START + DAY_MS)
        client.submit("BINANCEUS:BTC/USD", 60, START, START + DAY_MS)
    seen = {}
    for name, ing in (("binance", binance), ("coinbase", coinbase), ("binanceus", binance_us)):
        got = [ing.recv(30)[1].ticker]  # what it is sent, then nothing more
        while (m := ing.recv(0.5)) is not None:
            got.append(m[1].ticker)
        seen[name] = got
        ing.close()
    assert seen == {
        "binance": ["BINANCE:BTC/USDT"],
        "coinbase": ["COINBASE:BTC/USD"],
        "binanceus": ["BINANCEUS:BTC/USD"],
    }


def test_relay_restart_under_connected_client(ctx, settings, publisher) -> None:
    relays = [Relay(settings).start()]
    stop = threading.Event()
    t = threading.Thread(target=serve_pipeline, args=(ctx, settings, publisher, stop))
    t.start()
    try:
        time.sleep(0.2)
        with Client(settings, attempt_timeout=1.0) as client:
            first = client.request_history(
                "BINANCE:BTC/USDT", 60, START, START + DAY_MS, timeout=10
            )
            assert first.row_count == 1440
            relays.pop().stop()
            # Submitted while the relay is down: Lazy Pirate retries until it is back.
            restart = threading.Timer(1.5, lambda: relays.append(Relay(settings).start()))
            restart.start()
            note = client.request_history(
                "BINANCE:BTC/USDT", 60, START, START + 2 * DAY_MS, timeout=15
            )
            restart.join()
            assert note.row_count == 2880
            # ...and later requests complete too.
            assert (
                client.request_history(
                    "BINANCE:BTC/USDT", 300, START, START + DAY_MS, timeout=10
                ).row_count
                == 288
            )
    finally:
        stop.set()
        t.join()
        for r in relays:
            r.stop()


@pytest.mark.parametrize(
    ("kwargs", "reason"),
    [
        ({"ticker": "btcusdt"}, "BAD_TICKER"),
        ({"ticker": "BINANCE:BTC-USDT"}, "BAD_TICKER"),
        ({"period": 61}, "BAD_PERIOD"),
        ({"start": START + DAY_MS, "end": START}, "BAD_RANGE"),
        ({"start": START, "end": START}, "BAD_RANGE"),
        ({"start": 1_700_000_000, "end": 1_800_000_000}, "BAD_RANGE"),
        ({"start": START - 400 * 5 * 365 * DAY_MS // 400, "end": START}, "RANGE_TOO_LARGE"),
    ],
)
def test_validation_rejects_with_reason(settings, pipeline, kwargs, reason) -> None:
    args = {"ticker": "BINANCE:BTC/USDT", "period": 60, "start": START, "end": START + DAY_MS}
    args.update(kwargs)
    with Client(settings) as client, pytest.raises(RequestRejected) as info:
        client.submit(args["ticker"], args["period"], args["start"], args["end"])
    assert info.value.reason == reason


def history_submit(**fields: object) -> rq.SubmitHistoricalRequest:
    """A client's history request, valid unless ``fields`` make it not: validated here
    without a relay."""
    valid = {
        "request_id": "r",
        "client_id": "c",
        "ticker": "BINANCE:BTC/USDT",
        "period_s": 60,
        "start_ms": START,
        "end_ms": START + DAY_MS,
    }
    return rq.SubmitHistoricalRequest(**{**valid, **fields})


def test_a_range_that_starts_now_is_refused_not_left_unanswered() -> None:
    # The range is cut at now, so one starting there held nothing: no page was fetched and
    # no HistoryReady ever came. A millisecond earlier there is a candle to answer with.
    now = START + DAY_MS
    req = history_submit(start_ms=now, end_ms=now + DAY_MS)
    with pytest.raises(Rejected, match="start_ms is not in the past") as info:
        validate(req, max_rows=100_000, now_ms=now)
    assert info.value.reason == rq.BAD_RANGE
    req.start_ms = now - 1
    work = validate(req, max_rows=100_000, now_ms=now).work
    assert (work.start_ms, work.end_ms) == (now - 1, now)


@pytest.mark.parametrize("request_id", ["book:x", "stream:x"])
def test_a_request_id_shaped_like_a_live_jobs_key_is_refused(request_id: str) -> None:
    req = history_submit(request_id=request_id)
    with pytest.raises(Rejected, match="must not start with stream: or book:") as info:
        validate(req, max_rows=100_000, now_ms=START + 2 * DAY_MS)
    assert info.value.reason == rq.BAD_REQUEST_ID


@pytest.mark.parametrize(
    ("fields", "reason", "said"),
    [
        # A client id is a topic's suffix: a separator in it would reach another's topic.
        ({"client_id": "c|other"}, rq.BAD_REQUEST_ID, "client_id"),
        ({"client_id": "", "notify": rq.NOTIFY_CLIENT}, rq.BAD_REQUEST_ID, "client_id"),
        ({"notify": 7}, rq.BAD_REQUEST_ID, "unknown notify mode 7"),  # a newer sender's
        ({"ticker": "BTCUSDT"}, rq.BAD_TICKER, "EXCHANGE:BASE/QUOTE"),
        ({"period_s": 90}, rq.BAD_PERIOD, "period_s 90"),
    ],
)
def test_a_request_is_refused_with_the_reason_that_names_its_fault(
    fields: dict, reason: int, said: str
) -> None:
    with pytest.raises(Rejected, match=said) as info:
        validate(history_submit(**fields), max_rows=100_000, now_ms=START + 2 * DAY_MS)
    assert info.value.reason == reason


@pytest.mark.parametrize(
    ("frames", "reason"),
    [
        ([b"\x09", b"\x10"], rq.UNSUPPORTED_VERSION),
        ([b"\x01", b"\x66hello"], rq.UNEXPECTED_TYPE),
        ([b"\x01"], rq.MALFORMED),
        ([b"\x01", b"\x10", b"extra"], rq.MALFORMED),
        ([b"\x01", b"\x10\x0a\x05ab"], rq.MALFORMED),
        ([b"\x01", b""], rq.MALFORMED),
        (encode(rq.SubmitResponse()), rq.UNEXPECTED_TYPE),
        (encode(rq.DataRequest(kind=rq.HISTORICAL, exchange="BINANCE")), rq.UNEXPECTED_TYPE),
        # A kind this build cannot name: forwarded, it would reach every ingestor.
        (encode(rq.DataRequest(kind=99, exchange="BINANCE", request_id="k")), rq.UNEXPECTED_TYPE),
        # A metadata request's id is its job's key among ingestors: one they would drop.
        (
            encode(
                rq.DataRequest(kind=rq.SYMBOL_METADATA, exchange="BINANCE", request_id="book:x")
            ),
            rq.BAD_REQUEST_ID,
        ),
        (encode(rq.DataRequest(kind=rq.SYMBOL_METADATA, exchange="BINANCE")), rq.BAD_REQUEST_ID),
    ],
)
def test_malformed_req_always_gets_an_error_reply(ctx, settings, pipeline, frames, reason) -> None:
    resp = relay_frames(settings, frames)
    assert resp.status == rq.SUBMIT_REJECTED
    assert resp.reason == reason
    # ...and the relay still serves.
    with Client(settings) as client:
        assert client.submit("BINANCE:BTC/USDT", 60, START, START + DAY_MS).status == rq.SUBMIT_OK


def test_dealer_garbage_is_dropped_and_counted(ctx, settings, relay) -> None:
    dealer = dial(ctx.socket(zmq.DEALER), settings, "relay", "ingest")
    dealer.setsockopt(zmq.LINGER, 0)
    dealer.connect(settings.connect("client_requests"))
    dealer.send_multipart([b"\x07", b"junk"])
    dealer.send_multipart([b"\x01", b"\xee"])
    wait_for(lambda: sum(counted(relay.metrics.dropped).values()) >= 2)
    assert not dealer.poll(200), "a DEALER sending garbage gets no reply"
    dealer.close()


def test_trusted_forwarding_of_control_and_realtime(ctx, settings, relay) -> None:
    control = dial(ctx.socket(zmq.SUB), settings, "relay", "ingest")
    control.subscribe(work_prefix("BINANCE"))
    control.connect(settings.connect("control"))
    ing = FakeIngestor(ctx, settings, ["BINANCE:"])
    wait_for(lambda: relay.has_ingestor("BINANCE"), 30)
    cancel = rq.IngestorControl(
        action=rq.CANCEL_REALTIME, ticker="BINANCE:BTC/USDT", exchange="BINANCE", request_id="c1"
    )
    # Sent until heard: a control SUB's subscription reaches the relay in its own time.
    deadline = time.monotonic() + 30
    while True:
        assert relay_call(settings, cancel).status == rq.SUBMIT_OK
        if control.poll(200):
            break
        assert time.monotonic() < deadline, "the cancel never reached the control channel"
    assert decode(control.recv_multipart()[1:]) == cancel
    meta = rq.DataRequest(request_id="m1", kind=rq.SYMBOL_METADATA, exchange="BINANCE")
    assert relay_call(settings, meta).status == rq.SUBMIT_OK
    assert ing.recv(30.0)[1] == meta
    wrong = rq.DataRequest(
        request_id="m2", kind=rq.REALTIME_SUBSCRIBE, exchange="KRAKEN", ticker="BINANCE:BTC/USDT"
    )
    assert relay_call(settings, wrong).reason == rq.BAD_TICKER
    control.close()
    ing.close()


def test_market_data_fanout_from_bound_and_connecting_publishers(
    ctx, settings, relay, publisher
) -> None:
    from proto import market_pb2

    extra = FakePublisher(ctx, settings.connect("publisher_ingress"), bind=False, settings=settings)
    sub = dial(ctx.socket(zmq.SUB), settings, "relay", "ingest")
    sub.subscribe(b"BINANCE:BTC/USDT|tick")
    sub.connect(settings.connect("market_data"))

    def both_arrive() -> bool:
        publisher.publish("BINANCE:BTC/USDT|tick", market_pb2.Tick(trade_id="a"))
        extra.publish("BINANCE:BTC/USDT|tick", market_pb2.Tick(trade_id="b"))
        got = set()
        while sub.poll(50):
            got.add(decode(sub.recv_multipart()[1:]).trade_id)
        return got == {"a", "b"}

    wait_for(both_arrive, timeout=10, interval=0.05)
    extra.close()
    sub.close()


def test_metrics_endpoint(settings, relay, pipeline) -> None:
    with Client(settings) as client:
        client.submit("BINANCE:BTC/USDT", 60, START, START + DAY_MS)
        with pytest.raises(RequestRejected):
            client.submit("BINANCE:BTC/USDT", 7, START, START + DAY_MS)
    url = settings.metrics_url("relay_metrics")
    body = urllib.request.urlopen(url, timeout=5).read().decode()
    assert 'candlewire_relay_requests_total{result="ok"} 1.0' in body
    assert 'candlewire_relay_rejections_total{reason="bad_period"} 1.0' in body
    assert "candlewire_relay_up 1.0" in body


def test_second_relay_on_same_ports_fails_clearly(settings, relay) -> None:
    with pytest.raises(OSError, match="cannot bind"):
        Relay(settings, metrics=False).start()


def test_no_ingestor_is_a_clear_retryable_rejection(ctx, settings, relay) -> None:
    with Client(settings, submit_timeout=1.0) as client, pytest.raises(RequestRejected) as info:
        client.submit("KRAKEN:BTC/USD", 60, START, START + DAY_MS)
    assert info.value.reason == "NO_INGESTOR" and info.value.retryable
    ing = FakeIngestor(ctx, settings, ["KRAKEN:"])
    wait_for(lambda: relay.has_ingestor("KRAKEN"))
    ing.close()
    wait_for(lambda: not relay.has_ingestor("KRAKEN"))


def test_cli_relay_stops_gracefully_on_sigterm(ctx, settings: Settings) -> None:
    env = {**os.environ, **settings.to_env()}
    proc = subprocess.Popen(candlewire_command("relay"), env=env)
    ing = FakeIngestor(ctx, settings, ["BINANCE:"])
    try:
        with Client(settings) as client:
            assert (
                client.submit("BINANCE:BTC/USDT", 60, START, START + DAY_MS).status == rq.SUBMIT_OK
            )
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(10) == 0
    finally:
        ing.close()
        proc.kill()
