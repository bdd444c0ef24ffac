"""EventPublisher: routing by priority and watchers, acks and resends, and the journal."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
import uuid

import pytest
import zmq

from candlewire.events import EventPublisher, Route
from candlewire.testing import user_event
from candlewire.topics import user_topic
from proto import events_pb2 as ev
from proto.envelope import decode, decode_sub, encode, expect
from tests.support import free_port, wait_for


def event(user: str, priority: int) -> ev.UserEvent:
    return ev.UserEvent(
        user_id=user,
        event_id=uuid.uuid4().hex,
        timestamp=int(time.time() * 1000),
        event_type=ev.ORDER_FILLED,
        payload=b'{"qty": 1}',
        delivery=ev.DeliverySpec(priority=priority),
    )


class Gateway:
    """A gateway as the publisher sees it: a SUB for sessions and a ROUTER for critical events."""

    def __init__(self, ctx: zmq.Context, settings, endpoint: str) -> None:
        self.sub = ctx.socket(zmq.SUB)
        self.sub.setsockopt(zmq.LINGER, 0)
        self.sub.connect(settings.connect("user_events"))
        self.router = ctx.socket(zmq.ROUTER)
        self.router.setsockopt(zmq.LINGER, 0)
        self.router.bind(endpoint)

    def take(self, timeout: float = 5.0) -> tuple[list[bytes], ev.UserEvent] | None:
        if not self.router.poll(int(timeout * 1000)):
            return None
        frames = self.router.recv_multipart()
        return frames[:2], decode(frames[2:])

    def ack(self, route: list[bytes], event_id: str, status: int = ev.DELIVERED) -> None:
        self.router.send_multipart([*route, *encode(ev.EventAck(event_id=event_id, status=status))])

    def close(self) -> None:
        self.sub.close()
        self.router.close()


@pytest.fixture
def gateways(ctx, settings):
    endpoints = [f"tcp://127.0.0.1:{free_port()}" for _ in range(2)]
    gws = [Gateway(ctx, settings, e) for e in endpoints]
    yield gws, endpoints
    for g in gws:
        g.close()


def publisher(settings, endpoints, tmp_path, **kw) -> EventPublisher:
    return EventPublisher(
        settings, gateways=endpoints, journal=tmp_path / "pending.db", **kw
    ).start()


@pytest.mark.parametrize(
    ("priority", "watched", "route"),
    [
        (ev.INFORMATIONAL, True, Route.XPUB),
        (ev.INFORMATIONAL, False, Route.DROPPED),
        (ev.NORMAL, True, Route.XPUB),
        (ev.NORMAL, False, Route.DEALER),
        (ev.CRITICAL, True, Route.DEALER),
        (ev.CRITICAL, False, Route.DEALER),
    ],
)
def test_routing_by_priority_and_session(settings, gateways, tmp_path, priority, watched, route):
    gws, endpoints = gateways
    gw = gws[0]
    with publisher(settings, endpoints, tmp_path) as pub:
        if watched:
            gw.sub.subscribe(user_topic("u1"))
            wait_for(lambda: pub.watched("u1"))
        e = event("u1", priority)
        assert pub.publish(e) == route
        if route is Route.XPUB:
            assert gw.sub.poll(5000)
            topic, got = decode_sub(gw.sub.recv_multipart())
            assert topic == "USER:u1" and got.event_id == e.event_id
        if route is Route.DEALER:
            got = take_any(gws)
            assert got is not None and got[2].event_id == e.event_id


def test_watchers_are_counted_per_gateway_and_dropped_with_a_dead_one(
    ctx, settings, gateways, tmp_path
):
    (a, b), endpoints = gateways
    with publisher(settings, endpoints, tmp_path) as pub:
        a.sub.subscribe(user_topic("u2"))
        b.sub.subscribe(user_topic("u2"))
        wait_for(lambda: pub.watched("u2"))
        a.sub.unsubscribe(user_topic("u2"))
        time.sleep(0.3)
        assert pub.watched("u2"), "gateway b still watches u2"
        b.sub.close(linger=0)  # disconnects without unsubscribing
        wait_for(lambda: not pub.watched("u2"))


def take_any(gws: list[Gateway], timeout: float = 5.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for gw in gws:
            item = gw.take(0.05)
            if item is not None:
                return gw, *item
    return None


def test_unacked_event_goes_to_the_next_gateway(settings, gateways, tmp_path) -> None:
    gws, endpoints = gateways
    with publisher(settings, endpoints, tmp_path, ack_timeout=0.5) as pub:
        # The DEALER has a pipe to each gateway from connect() on (no ZMQ_IMMEDIATE), and
        # this event is the only thing it sends: its sends alternate, so the resend goes to
        # the other gateway even if a stalled test lets a third one reach the first again.
        e = event("u3", ev.CRITICAL)
        pub.publish(e)
        first, _, got = take_any(gws)
        assert got.event_id == e.event_id  # never acked: as if that gateway died
        (second,) = [gw for gw in gws if gw is not first]
        resent = second.take(10)
        assert resent is not None, "the unacked event was not sent to the other gateway"
        route, again = resent
        assert again.event_id == e.event_id
        second.ack(route, e.event_id)
        wait_for(lambda: pub.unacked() == 0, timeout=5)
        assert pub.acks["DELIVERED"] == 1


def test_an_ack_of_a_status_no_release_names_is_an_ack_and_the_thread_goes_on(
    settings, gateways, tmp_path
) -> None:
    """A newer gateway's status: counted by its number, the event no longer pending, and
    the next critical event still goes out (the name lookup killed the I/O thread)."""
    gws, endpoints = gateways
    with publisher(settings, endpoints, tmp_path) as pub:
        for status in (99, ev.DELIVERED):
            e = event("u4", ev.CRITICAL)
            pub.publish(e)
            gw, route, got = take_any(gws)
            assert got.event_id == e.event_id
            gw.ack(route, e.event_id, status=status)
            wait_for(lambda: pub.unacked() == 0, timeout=5)
        assert pub.acks["99"] == 1 and pub.acks["DELIVERED"] == 1


def test_pending_events_survive_kill_9_and_are_resent(settings, gateways, tmp_path) -> None:
    (a, _), endpoints = gateways
    journal = tmp_path / "pending.db"
    script = f"""
import sys, time, uuid
from candlewire.events import EventPublisher
from candlewire.config import Settings
from proto import events_pb2 as ev
s = Settings.model_validate_json({settings.model_dump_json()!r})
pub = EventPublisher(s, gateways=["tcp://127.0.0.1:{free_port()}"], journal=__import__("pathlib").Path({str(journal)!r})).start()
for i in range(5):
    pub.publish(ev.UserEvent(user_id="u4", event_id=f"e{{i}}", delivery=ev.DeliverySpec(priority=ev.CRITICAL)))
print("published", flush=True)
time.sleep(60)
"""
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "published"
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    finally:
        proc.kill()
    with publisher(settings, [endpoints[0]], tmp_path) as pub:
        got = set()
        while len(got) < 5:
            item = a.take(10)
            assert item is not None, f"only {sorted(got)} resent"
            got.add(item[1].event_id)
            a.ack(item[0], item[1].event_id)
        assert got == {f"e{i}" for i in range(5)}
        wait_for(lambda: pub.unacked() == 0)
    # Acked events stay acked: a restart resends nothing.
    with publisher(settings, [endpoints[0]], tmp_path):
        assert a.take(1.0) is None


def test_publishing_faster_than_the_io_thread_never_raises(ctx, settings, tmp_path) -> None:
    """A burst fills the inproc wake pipe; publish() must not fail on it (it once raised
    zmq.Again), and every event still goes out."""
    sub = ctx.socket(zmq.SUB)
    sub.setsockopt(zmq.LINGER, 0)
    sub.setsockopt(zmq.RCVHWM, 0)
    sub.subscribe(user_topic("burst"))
    sub.connect(settings.connect("user_events"))
    with publisher(settings, [f"tcp://127.0.0.1:{free_port()}"], tmp_path) as pub:
        wait_for(lambda: pub.watched("burst"))
        n = 30_000
        routes = {pub.publish(event("burst", ev.INFORMATIONAL)) for _ in range(n)}
        assert routes == {Route.XPUB}
        got = 0
        while got < n and sub.poll(5000):
            decode_sub(sub.recv_multipart())
            got += 1
        assert got == n
    sub.close()


@pytest.mark.parametrize("coalesce_s", [0.0, 0.1])
def test_events_published_one_at_a_time_leave_together(ctx, settings, tmp_path, coalesce_s) -> None:
    """With ``coalesce_s`` the I/O thread, once woken, lets the events published meanwhile
    gather and sends them as one outbox; without it, each event leaves without waiting for
    the next. Either way every event arrives, in order."""
    sub = ctx.socket(zmq.SUB)
    sub.setsockopt(zmq.LINGER, 0)
    sub.subscribe(user_topic("paced"))
    sub.connect(settings.connect("user_events"))
    endpoints = [f"tcp://127.0.0.1:{free_port()}"]

    def receive() -> str:
        assert sub.poll(5000), "an event did not arrive"
        return expect(decode_sub(sub.recv_multipart())[1], ev.UserEvent).event_id

    with publisher(settings, endpoints, tmp_path, coalesce_s=coalesce_s) as pub:
        wait_for(lambda: pub.watched("paced"))
        sent = [event("paced", ev.INFORMATIONAL) for _ in range(10)]
        before = pub.outboxes_sent
        got: list[str] = []
        start = time.monotonic()
        for e in sent:
            pub.publish(e)
            if coalesce_s:
                time.sleep(0.003)
            else:
                # The next is published only once this one arrived: a publisher that held
                # events for company would stall here until receive's timeout.
                got.append(receive())
        got += [receive() for _ in sent[len(got) :]]
        elapsed = time.monotonic() - start
        assert got == [e.event_id for e in sent]
        # Counted before its events are sent, so final once the last one arrived.
        outboxes = pub.outboxes_sent - before
    if coalesce_s:
        # The I/O thread waits coalesce_s (a hold, or a 100 ms poll) between two outboxes,
        # all taken between the first publish and the last arrival: however slowly a loaded
        # machine published, at most 1 + elapsed / coalesce_s of them (one more for slack).
        assert outboxes < len(sent), f"{outboxes} outboxes for {len(sent)} events"
        assert outboxes <= 2 + elapsed / coalesce_s, f"{outboxes} outboxes in {elapsed:.3f} s"
    else:
        assert outboxes == len(sent), f"{outboxes} outboxes for {len(sent)} events one at a time"
    sub.close()


def test_coalescing_is_bounded(settings, tmp_path) -> None:
    with pytest.raises(ValueError, match="coalesce_s"):
        EventPublisher(settings, journal=tmp_path / "p.db", coalesce_s=1.0)


def test_an_event_no_gateway_would_take_is_refused_not_journalled(settings, tmp_path) -> None:
    """A gateway refuses an event with a field past its limit or over the message size; a
    journalled sender would then send it again for ever. The publisher refuses it at once,
    and the events before and after it go on."""
    from proto.envelope import MAX_BYTES_FIELD, OversizedField

    pub = publisher(settings, [f"tcp://127.0.0.1:{free_port()}"], tmp_path)
    try:
        fine = user_event("u1", ev.CRITICAL, [(ev.EMAIL, False)])
        assert pub.publish(fine) == Route.DEALER
        too_big = user_event("u1", ev.CRITICAL, [(ev.EMAIL, False)])
        too_big.payload = b"x" * (MAX_BYTES_FIELD + 1)
        with pytest.raises(OversizedField, match="payload"):
            pub.publish(too_big)
        long_id = user_event("u1", ev.NORMAL, [(ev.EMAIL, False)])
        long_id.event_id = "e" * 5_000
        with pytest.raises(OversizedField, match="event_id"):
            pub.publish(long_id)
        over_message = user_event("u1", ev.CRITICAL, [(ev.EMAIL, False)])
        over_message.delivery.channels.extend(
            [ev.ChannelPreference(channel=ev.EMAIL)] * (settings.max_message_bytes // 2)
        )
        with pytest.raises(OversizedField, match="at most"):
            pub.publish(over_message)
        after = user_event("u1", ev.CRITICAL, [(ev.EMAIL, False)])
        assert pub.publish(after) == Route.DEALER
        assert pub.unacked() == 2
        assert list(pub.journal.replay()) == [fine.event_id, after.event_id]
    finally:
        pub.close()
