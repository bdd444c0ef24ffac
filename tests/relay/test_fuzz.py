"""Hostile frames on each of the relay's five sockets while clients are served (tests/fuzz.py).

Each inbound message is counted once: answered (``requests``) or dropped (``dropped``, by
socket and reason). What a publisher sends into ``publisher_ingress`` is forwarded by libzmq
unread, so there the subscriber's decoder is the one that drops and counts.
"""

from __future__ import annotations

import contextlib
import random
import socket

import pytest
import zmq

from candlewire import Client
from proto import cep_pb2 as cep
from proto import market_pb2
from proto import requests_pb2 as rq
from proto.envelope import EnvelopeError, decode_sub, encode, encode_topic
from tests.fuzz import FRAMES, SETTLE_S, Good, blast, drain, malformed, not_subscription, peer
from tests.support import counted, relay_call, wait_for

START = 1_700_000_000_000
TICKER = "BINANCE:BTC/USDT"
FAR_FUTURE = 4_102_444_800_000  # 2100


def submit(settings) -> bool:
    with Client(settings, submit_timeout=10) as client:
        return client.submit(TICKER, 60, START, START + 3_600_000).status == rq.SUBMIT_OK


def hostile_requests() -> list:
    """Valid envelopes with values the relay must refuse, each with an answer."""
    hist = {"request_id": "h", "client_id": "c", "ticker": TICKER, "period_s": 60}
    trig = {"request_id": "t", "client_id": "c", "trigger_id": "x", "ticker": TICKER}
    return [
        rq.SubmitHistoricalRequest(**hist, start_ms=-START, end_ms=START),
        rq.SubmitHistoricalRequest(**hist, start_ms=FAR_FUTURE, end_ms=FAR_FUTURE + 60_000),
        rq.SubmitHistoricalRequest(**hist, start_ms=START + 60_000, end_ms=START),
        rq.SubmitHistoricalRequest(**{**hist, "period_s": 7}, start_ms=START, end_ms=START + 1),
        rq.SubmitHistoricalRequest(**{**hist, "ticker": "no ticker"}, start_ms=START, end_ms=1),
        rq.SubmitHistoricalRequest(**hist, start_ms=0, end_ms=1 << 62),
        cep.CEPTriggerRequest(**trig, action=cep.ADD, price_cross=cep.PriceCross(level="NaN")),
        cep.CEPTriggerRequest(**trig, action=cep.ADD, price_cross=cep.PriceCross(level="-5")),
        cep.CEPTriggerRequest(**trig, action=cep.ADD, price_cross=cep.PriceCross(level="1e999")),
        rq.DataRequest(
            request_id="d", kind=rq.REALTIME_SUBSCRIBE, ticker=TICKER, exchange="KRAKEN"
        ),
        rq.DataRequest(request_id="d", kind=rq.REALTIME_SUBSCRIBE, exchange="binance"),
        rq.SubmitResponse(request_id="r"),  # a message the relay sends, never takes
    ]


def handled(relay) -> float:
    m = relay.metrics
    return sum(sum(counted(c).values()) for c in (m.requests, m.dropped))


def test_client_requests(ctx, settings, relay, served) -> None:
    """Malformed requests (half with a REQ delimiter, which get an answer) and valid ones
    with hostile values: each is answered or dropped, never accepted."""
    rng = random.Random("client_requests")
    samples = [m for m in hostile_requests() if not isinstance(m, rq.SubmitResponse)]
    hostile = hostile_requests()

    def make() -> list[bytes]:
        delimiter = [b""] if rng.random() < 0.5 else []
        if rng.random() < 0.1:
            return [b"", *encode(rng.choice(hostile))]
        return [*delimiter, *malformed(rng, samples)] or [b""]

    def served_work() -> bool:
        """A submission accepted; the ingestor reads its work, as a live one does (one that
        stopped reading would stop answering heartbeats too, and be dropped)."""
        ok = submit(settings)
        drain(served.sock)
        return ok

    sock = peer(ctx, zmq.DEALER, settings.connect("client_requests"))
    before, accepted = handled(relay), counted(relay.metrics.requests).get(("ok",), 0)
    with Good(served_work) as good:
        blast(sock, make)
        wait_for(
            lambda: drain(sock) >= 0 and handled(relay) - before >= FRAMES + good.sent,
            timeout=SETTLE_S,
        )
    good.check()
    assert handled(relay) - before == FRAMES + good.sent
    assert counted(relay.metrics.requests).get(("ok",), 0) - accepted == good.sent


@pytest.mark.parametrize("endpoint", ["market_data", "work_queue", "control"])
def test_subscriber_sockets(ctx, settings, relay, served, publisher, endpoint) -> None:
    """An XPUB's subscribers send (un)subscriptions only; anything else is counted, while
    market data, work and control keep flowing."""
    rng = random.Random(endpoint)
    sub = peer(ctx, zmq.SUB, settings.connect("market_data"))
    sub.subscribe(f"{TICKER}|tick")
    control = peer(ctx, zmq.SUB, settings.connect("control"))
    control.subscribe("")
    n = iter(range(1 << 30))

    def settled() -> bool:
        """Both subscriptions went all the way up: a probe tick and a probe cancel arrive."""
        publisher.publish(f"{TICKER}|tick", market_pb2.Tick(ticker=TICKER, trade_id="probe"))
        relay_call(settings, rq.IngestorControl(action=rq.CANCEL_REALTIME, exchange="BINANCE"))
        arrived = sub.poll(100) and control.poll(100)
        for s in (sub, control):
            drain(s)
        return arrived

    wait_for(settled)

    def flows() -> bool:
        i = next(n)
        publisher.publish(f"{TICKER}|tick", market_pb2.Tick(ticker=TICKER, trade_id=str(i)))
        cancel = rq.IngestorControl(
            action=rq.CANCEL_REALTIME, ticker=TICKER, exchange="BINANCE", request_id=str(i)
        )
        ok = submit(settings) and relay_call(settings, cancel).status == rq.SUBMIT_OK
        socks = (sub, control, served.sock)
        if not ok or not all(s.poll(10_000) for s in socks):
            return False
        got = [decode_sub(s.recv_multipart())[1] for s in socks]
        return got[0].trade_id == str(i) and got[1].request_id == str(i)

    fuzzer = peer(ctx, zmq.XSUB, settings.connect(endpoint))
    key = (endpoint, "not_subscription")
    with Good(flows) as good:
        blast(fuzzer, lambda: [not_subscription(rng)])
        wait_for(lambda: counted(relay.metrics.dropped).get(key, 0) >= FRAMES, timeout=SETTLE_S)
    good.check()
    assert counted(relay.metrics.dropped).get(key, 0) == FRAMES


def test_publisher_ingress(ctx, settings, relay) -> None:
    """The relay forwards a publisher's frames unread; a subscriber's decoder drops every
    malformed one, and every good tick arrives among them."""
    rng = random.Random("ingress")
    topic = f"{TICKER}|tick"
    sub = peer(ctx, zmq.SUB, settings.connect("market_data"))
    sub.subscribe(topic)
    good_pub = peer(ctx, zmq.PUB, settings.connect("publisher_ingress"))
    fuzzer = peer(ctx, zmq.PUB, settings.connect("publisher_ingress"))
    wait_for(lambda: relay._watched.topics)
    sample = [market_pb2.Tick(ticker=TICKER, trade_id="1", price="1", size="1")]
    good_ids = [str(i) for i in range(1_000)]
    for trade_id in good_ids:
        good_pub.send_multipart(
            encode_topic(topic, market_pb2.Tick(ticker=TICKER, trade_id=trade_id))
        )
        blast(fuzzer, lambda: [topic.encode(), *malformed(rng, sample)], FRAMES // len(good_ids))
    refused, delivered = 0, []
    expected = FRAMES // len(good_ids) * len(good_ids)
    while len(delivered) < len(good_ids) or refused < expected:
        assert sub.poll(10_000), (len(delivered), refused)
        try:
            delivered.append(decode_sub(sub.recv_multipart())[1].trade_id)
        except EnvelopeError:
            refused += 1
    assert delivered == good_ids and refused == expected


def test_raw_tcp_garbage_on_each_port(settings, relay, served) -> None:
    """Bytes that are not even ZMTP: the handshake fails, the peer is dropped."""
    rng = random.Random(7)
    for name in ("client_requests", "market_data", "publisher_ingress", "work_queue", "control"):
        for _ in range(20):
            addr = ("127.0.0.1", settings.port(name))
            with socket.create_connection(addr, timeout=2) as s, contextlib.suppress(OSError):
                s.sendall(rng.randbytes(rng.randint(1, 5000)))
    assert submit(settings)


def test_oversized_message_disconnects_peer_not_relay(ctx, settings, relay, served) -> None:
    dealer = ctx.socket(zmq.DEALER)
    dealer.setsockopt(zmq.LINGER, 0)
    dealer.connect(settings.connect("client_requests"))
    dealer.send_multipart([b"", b"\x01", b"\x10" + b"x" * (10 << 20)])  # 10 MB
    assert not dealer.poll(500)
    dealer.close()
    assert submit(settings)
    # A well-formed envelope still gets its reply after all that.
    req = ctx.socket(zmq.REQ)
    req.connect(settings.connect("client_requests"))
    req.send_multipart(encode(rq.SubmitResponse()))
    assert req.poll(5000)
    req.close(linger=0)
