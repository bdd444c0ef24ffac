"""Publishers found by DNS: the relay follows a name's addresses as they come and go.

Two publishers bind the same port on 127.0.0.2 and 127.0.0.3 (one host each, as behind a
headless service); the name's answer is changed under the running relay.
"""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator

import pytest
import zmq

from candlewire.config import Settings
from candlewire.curve import dial
from candlewire.testing import free_port
from proto import market_pb2
from proto.envelope import decode, encode_topic
from relay import Relay
from relay.discovery import Discovery, endpoint, parse_name, resolve
from tests.support import FakePublisher, free_settings, secured_settings, wait_for

TOPIC = "BINANCE:BTC/USDT|tick"
HOSTS = ("127.0.0.2", "127.0.0.3")


class Answers:
    """A name server whose answer the test sets; ``None`` fails the lookup."""

    def __init__(self) -> None:
        self.addresses: list[str] | None = []
        self.lookups = 0
        self._lock = threading.Lock()

    def __call__(self, host: str) -> list[str]:
        assert host == "publishers.test"
        with self._lock:
            self.lookups += 1
            if self.addresses is None:
                raise socket.gaierror(socket.EAI_AGAIN, "temporary failure")
            return list(self.addresses)

    def answer(self, addresses: list[str] | None) -> None:
        with self._lock:
            self.addresses, self.lookups = addresses, 0

    def wait_looked_up(self, times: int = 2) -> None:
        wait_for(lambda: self.lookups >= times, timeout=10)


@pytest.fixture(params=["plain", "curve"])
def settings(request, tmp_path) -> Settings:
    port = free_port()
    kw = {"publisher_names": [f"publishers.test:{port}"], "discovery_interval_s": 0.1}
    if request.param == "curve":
        return secured_settings(tmp_path, **kw)
    return free_settings(tmp_path, **kw)


@pytest.fixture
def answers() -> Answers:
    return Answers()


@pytest.fixture
def relay(settings, answers) -> Iterator[Relay]:
    r = Relay(settings, resolver=answers).start()
    yield r
    r.stop()


def test_the_relay_follows_the_names_addresses(ctx, settings, answers, relay) -> None:
    port = int(settings.publisher_names[0].rsplit(":", 1)[1])
    pubs = {host: FakePublisher(ctx, f"tcp://{host}:{port}", settings=settings) for host in HOSTS}
    sub = dial(ctx.socket(zmq.SUB), settings, "relay", "ingest")
    sub.subscribe(TOPIC.encode())
    sub.connect(settings.connect("market_data"))

    def heard() -> set[str]:
        """Which publishers reach the subscriber now (each stamps its host on its ticks)."""
        for host, pub in pubs.items():
            pub.publish(TOPIC, market_pb2.Tick(trade_id=host))
        got: set[str] = set()
        while sub.poll(100):
            got.add(decode(sub.recv_multipart()[1:]).trade_id)
        return got

    def hears_only(hosts: set[str]) -> bool:
        heard()  # what was in flight before the change
        return heard() == hosts == heard()

    try:
        assert relay.metrics.publishers._value.get() == 0
        answers.answer([HOSTS[0]])
        wait_for(lambda: hears_only({HOSTS[0]}), timeout=10, interval=0.05)
        answers.answer(list(HOSTS))
        wait_for(lambda: hears_only(set(HOSTS)), timeout=10, interval=0.05)
        assert relay.metrics.publishers._value.get() == 2
        answers.answer([HOSTS[1]])  # the first publisher went away
        wait_for(lambda: hears_only({HOSTS[1]}), timeout=10, interval=0.05)

        answers.answer(None)  # the name server is down: keep the last addresses
        answers.wait_looked_up()
        wait_for(lambda: hears_only({HOSTS[1]}), timeout=10, interval=0.05)
        assert relay.metrics.discovery_failures._value.get() >= 2
        assert relay.metrics.publishers._value.get() == 1
    finally:
        sub.close()
        for pub in pubs.values():
            pub.close()


def test_the_static_publisher_still_works_beside_discovery(ctx, settings, answers, relay) -> None:
    static = FakePublisher(ctx, settings.bind("stream_pub"), settings=settings)
    sub = dial(ctx.socket(zmq.SUB), settings, "relay", "ingest")
    sub.subscribe(TOPIC.encode())
    sub.connect(settings.connect("market_data"))

    def arrives() -> bool:
        static.publish(TOPIC, market_pb2.Tick(trade_id="static"))
        return sub.poll(100) and decode(sub.recv_multipart()[1:]).trade_id == "static"

    answers.answer(["127.0.0.9"])  # a publisher that is not there changes nothing
    answers.wait_looked_up()
    wait_for(arrives, timeout=10, interval=0.05)
    static.close()
    sub.close()


def test_changes_are_computed_per_name_and_a_failed_lookup_keeps_the_last() -> None:
    table: dict[str, list[str] | None] = {"a": ["10.0.0.1", "10.0.0.2"], "b": ["fd00::5"]}

    def lookup(host: str) -> list[str]:
        got = table[host]
        if got is None:
            raise socket.gaierror(socket.EAI_NONAME, "no such name")
        return got

    d = Discovery([parse_name("a", (5557, 5562)), parse_name("b:7000", ())], lookup)
    added, removed = d.refresh()
    assert added == {
        "tcp://10.0.0.1:5557",
        "tcp://10.0.0.1:5562",
        "tcp://10.0.0.2:5557",
        "tcp://10.0.0.2:5562",
        "tcp://[fd00::5]:7000",
    }
    assert removed == set()
    table["a"], table["b"] = ["10.0.0.2", "10.0.0.3"], None
    added, removed = d.refresh()
    assert added == {"tcp://10.0.0.3:5557", "tcp://10.0.0.3:5562"}
    assert removed == {"tcp://10.0.0.1:5557", "tcp://10.0.0.1:5562"}
    assert "tcp://[fd00::5]:7000" in d.current and d.failures == 1
    assert d.refresh() == (set(), set())


@pytest.mark.parametrize("bad", ["host:", ":5557", "host:port", "host:70000"])
def test_a_bad_name_is_a_clear_error(bad) -> None:
    with pytest.raises(ValueError, match="host or host:port"):
        parse_name(bad, (5557,))


def test_the_system_resolver_answers_from_the_hosts_file() -> None:
    assert "127.0.0.1" in resolve("localhost")
    assert endpoint("::1", 5557) == "tcp://[::1]:5557"


def test_publishers_dropped_and_added_mid_stream_leave_the_relay_serving(
    ctx, settings, answers, relay
) -> None:
    """A publisher removed while it streams: the relay may hold the first frame of one of its
    messages when it disconnects it, which aborted the process inside libzmq. Each publisher
    streams without pause while the name's answer flips between one and both."""
    port = int(settings.publisher_names[0].rsplit(":", 1)[1])
    pubs = [FakePublisher(ctx, f"tcp://{host}:{port}", settings=settings) for host in HOSTS]
    sub = dial(ctx.socket(zmq.SUB), settings, "relay", "ingest")
    sub.subscribe(TOPIC.encode())
    sub.connect(settings.connect("market_data"))
    stop = threading.Event()

    def stream(pub: FakePublisher) -> None:
        frames = encode_topic(TOPIC, market_pb2.Tick(trade_id="x" * 64))
        while not stop.is_set():
            pub.send(frames)

    threads = [threading.Thread(target=stream, args=(p,)) for p in pubs]
    for t in threads:
        t.start()
    got = 0
    try:
        for flip in range(30):
            answers.answer(list(HOSTS) if flip % 2 else [HOSTS[0]])
            answers.wait_looked_up()
            for _ in range(1000):  # the streams never pause
                if not sub.poll(0):
                    break
                sub.recv_multipart()
                got += 1
        assert got > 0
        assert relay.metrics.up._value.get() == 1
    finally:
        stop.set()
        for t in threads:
            t.join()
        sub.close()
        for pub in pubs:
            pub.close()
