"""CURVE at the relay: each channel admits known keys of its roles only, refuses plaintext,
and checks each message's sender (:mod:`relay.policy`)."""

from __future__ import annotations

import time

import pytest
import zmq
import zmq.utils.monitor

from candlewire import Client
from candlewire.curve import Keyring, dial
from candlewire.errors import RequestRejected
from candlewire.topics import history_ready_topic, ingestor_topic, response_topic
from proto import requests_pb2 as rq
from proto.envelope import decode_sub, encode
from tests.support import FakePublisher, counted, relay_call, secured_settings, wait_for

START = 1_700_000_000_000


@pytest.fixture
def settings(tmp_path):
    settings = secured_settings(tmp_path)
    ring = Keyring(settings)
    ring.add_client("alice", "client")
    ring.add_client("bob", "client")
    ring.add_client("carol-box", "container", user="carol")
    return settings


def outcome(sock: zmq.Socket, endpoint: str, timeout: float = 3.0) -> str:
    """How a connection's handshake ended: ok, auth (ZAP said no) or failed (no CURVE)."""
    mon = sock.get_monitor_socket(
        zmq.EVENT_HANDSHAKE_SUCCEEDED
        | zmq.EVENT_HANDSHAKE_FAILED_AUTH
        | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL
        | zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL
        | zmq.EVENT_DISCONNECTED
    )
    sock.setsockopt(zmq.RECONNECT_IVL, -1)  # one attempt: each counts as one refusal
    sock.connect(endpoint)
    try:
        if not mon.poll(int(timeout * 1000)):
            return "none"
        event = zmq.utils.monitor.recv_monitor_message(mon)["event"]
    finally:
        sock.disable_monitor()
        mon.close(linger=0)
        sock.close(linger=0)
    return {zmq.EVENT_HANDSHAKE_SUCCEEDED: "ok", zmq.EVENT_HANDSHAKE_FAILED_AUTH: "auth"}.get(
        event, "failed"
    )


# channel, endpoint, the socket a peer uses, a key of the right role, a key of a wrong one
CHANNELS = [
    ("requests", "client_requests", zmq.DEALER, "alice", "stream"),
    ("work", "work_queue", zmq.SUB, "ingest", "alice"),
    ("control", "control", zmq.SUB, "ingest", "stream"),
    ("market", "market_data", zmq.SUB, "alice", "stream"),
    ("ingress", "publisher_ingress", zmq.PUB, "stream", "alice"),
]


@pytest.mark.parametrize(("channel", "endpoint", "kind", "good", "wrong"), CHANNELS)
def test_each_channel_admits_only_known_keys_of_its_roles(
    ctx, settings, relay, channel, endpoint, kind, good, wrong
) -> None:
    address = settings.connect(endpoint)
    stranger = secured_settings(settings.state_dir / "elsewhere")  # keys nobody allowed here
    stranger_sock = dial(ctx.socket(kind), stranger, "relay", "local")
    stranger_sock.curve_serverkey = Keyring(settings).public("relay")

    def refusals() -> dict:
        return {k: v for k, v in counted(relay.metrics.refused).items() if k[0] == channel}

    assert outcome(dial(ctx.socket(kind), settings, "relay", good), address) == "ok"
    assert outcome(stranger_sock, address) == "auth"
    assert refusals() == {(channel, "unknown_key"): 1}
    assert outcome(dial(ctx.socket(kind), settings, "relay", wrong), address) == "auth"
    assert refusals() == {(channel, "unknown_key"): 1, (channel, "wrong_role"): 1}
    assert outcome(ctx.socket(kind), address) != "ok"  # plaintext


def test_a_refused_peer_gets_nothing_and_an_admitted_one_everything(ctx, settings, relay) -> None:
    """Refusal is not only a handshake event: no data reaches a plaintext subscriber."""
    topic = "BINANCE:BTC/USDT|tick"
    subs = {
        "curve": dial(ctx.socket(zmq.SUB), settings, "relay", "alice"),
        "plain": ctx.socket(zmq.SUB),
    }
    for sub in subs.values():
        sub.subscribe(topic)
        sub.connect(settings.connect("market_data"))
    pub = FakePublisher(ctx, settings.bind("stream_pub"), settings=settings)
    note = rq.HistoryReadyNotification(request_id="x")
    wait_for(lambda: pub.publish(topic, note) or subs["curve"].poll(100), timeout=10)
    pub.publish(topic, note)
    assert not subs["plain"].poll(500)
    pub.close()


def test_the_allow_list_is_read_again_without_a_restart(ctx, settings, relay) -> None:
    late = secured_settings(settings.state_dir / "late")
    address = settings.connect("market_data")
    sock = dial(ctx.socket(zmq.SUB), settings, "relay", "alice")
    sock.curve_publickey, sock.curve_secretkey = Keyring(late).pair("local")
    assert outcome(sock, address) == "auth"
    Keyring(settings).add_client("dave", "client")
    dave = dial(ctx.socket(zmq.SUB), settings, "relay", "dave")
    assert outcome(dave, address) == "ok"


def test_a_client_cannot_hear_another_clients_notifications(ctx, settings, relay) -> None:
    pub = FakePublisher(ctx, settings.bind("stream_pub"), settings=settings)
    own = response_topic("alice.cl-1")
    alice = dial(ctx.socket(zmq.SUB), settings, "relay", "alice")
    bob = dial(ctx.socket(zmq.SUB), settings, "relay", "bob")
    alice.subscribe(own)
    for topic in (own, "", "RESP", response_topic("alice"), history_ready_topic("")):
        bob.subscribe(topic)
    for sub in (alice, bob):
        sub.connect(settings.connect("market_data"))
    note = rq.HistoryReadyNotification(request_id="alice.req-1")
    wait_for(lambda: pub.publish(own, note) or alice.poll(100), timeout=10)
    assert decode_sub(alice.recv_multipart())[1] == note
    pub.publish(own, note)
    pub.publish(history_ready_topic("alice.req-1"), note)
    assert not bob.poll(500), "bob heard alice's notification"
    wait_for(lambda: counted(relay.metrics.refused).get(("market", "foreign_topic")) == 5)
    pub.close()


def test_the_client_library_works_with_curve_and_owns_its_topics(settings, pipeline) -> None:
    with Client(settings) as client:
        assert client.client_id.startswith("local.")
        note = client.request_history(
            "BINANCE:BTC/USDT", 60, START, START + 60_000, notify="request", timeout=10
        )
    assert note.status == rq.HISTORY_OK and note.request_id.startswith("local.")


def test_a_client_may_not_claim_another_clients_id(settings, pipeline) -> None:
    with Client(settings, client_id="bob.cl-1") as client, pytest.raises(RequestRejected) as info:
        client.submit("BINANCE:BTC/USDT", 60, START, START + 60_000)
    assert info.value.reason == "FORBIDDEN"


def test_a_request_notified_by_its_own_topic_is_named_where_its_client_can_hear(
    settings, pipeline
) -> None:
    """A request id outside the key's name: its HistoryReady topic is one the relay would
    not let this client hear, so it was accepted and then answered to nobody."""
    with Client(settings) as client:
        with pytest.raises(RequestRejected) as info:
            client.request_history(
                "BINANCE:BTC/USDT",
                60,
                START,
                START + 60_000,
                notify="request",
                request_id="job-42",
                timeout=10,
            )
        assert info.value.reason == "FORBIDDEN" and "job-42" in str(info.value)
        note = client.request_history(
            "BINANCE:BTC/USDT",
            60,
            START,
            START + 60_000,
            notify="request",
            request_id="local.job-42",
            timeout=10,
        )
    assert (note.status, note.request_id) == (rq.HISTORY_OK, "local.job-42")


def test_only_ingestors_steer_ingestors(settings, relay) -> None:
    cancel = rq.IngestorControl(
        action=rq.CANCEL_REALTIME, ticker="BINANCE:BTC/USDT", exchange="BINANCE", request_id="c1"
    )
    refused = relay_call(settings, cancel, key="local")
    assert (refused.status, refused.reason) == (rq.SUBMIT_REJECTED, rq.FORBIDDEN)
    assert relay_call(settings, cancel, key="ingest").status == rq.SUBMIT_OK


def test_a_key_held_to_a_user_registers_triggers_for_that_user_alone(settings, relay) -> None:
    """Its alerts would reach another user's Telegram or e-mail. A key without a user (the
    operator's, ``local``) addresses any, as the tutorial's ``trigger add --user alice``."""
    from candlewire.triggers import add_request, condition

    Keyring(settings).add_client("dave-key", "client", user="dave")
    cross = condition("price_cross", level="1", direction="up")

    def reason(key: str, client_id: str, user_id: str) -> int:
        req = add_request(client_id, "t-1", "BINANCE:BTC/USDT", cross, user_id=user_id)
        return relay_call(settings, req, key=key).reason

    assert reason("dave-key", "dave-key.c", "erin") == rq.FORBIDDEN
    # Past the policy, refused only as nothing evaluates triggers here.
    assert reason("dave-key", "dave-key.c", "dave") == rq.NO_TRIGGER_DESK
    assert reason("dave-key", "dave-key.c", "") == rq.NO_TRIGGER_DESK
    assert reason("local", "local.c", "erin") == rq.NO_TRIGGER_DESK


def test_an_ingestor_key_publishes_heartbeats_only(ctx, settings, relay) -> None:
    sub = dial(ctx.socket(zmq.SUB), settings, "relay", "gateway")
    sub.subscribe(b"")
    sub.connect(settings.connect("market_data"))
    ing = FakePublisher(ctx, settings.connect("publisher_ingress"), False, settings, "ingest")
    beat = rq.IngestorControl(action=rq.HEARTBEAT, exchange="BINANCE", ingestor_id="i1")
    wait_for(lambda: ing.sock.send_multipart(encode_beat(beat)) or sub.poll(100), timeout=10)
    sub.recv_multipart()
    before = counted(relay.metrics.refused).get(("ingress", "not_publisher"), 0)
    ing.publish("BINANCE:BTC/USDT|tick", beat)
    time.sleep(0.3)
    while sub.poll(0):
        assert sub.recv_multipart()[0].startswith(ingestor_topic("").encode())
    wait_for(
        lambda: counted(relay.metrics.refused).get(("ingress", "not_publisher"), 0) == before + 1
    )
    ing.close()


def encode_beat(beat: rq.IngestorControl) -> list[bytes]:
    return [ingestor_topic(beat.exchange).encode(), *encode(beat)]
