"""Hostile frames on the gateway's critical ROUTER and on a container's event XPUB, while
events are delivered (tests/fuzz.py)."""

from __future__ import annotations

import random

import zmq

from candlewire.testing import new_user, user_event
from proto import events_pb2 as ev
from tests.fuzz import FRAMES, SETTLE_S, Good, blast, malformed, not_subscription, peer
from tests.gateway.conftest import gw_config, next_of, sign_in
from tests.gateway.test_critical import refs
from tests.support import counted, wait_for

TELEGRAM_ONLY = [(ev.TELEGRAM, False)]


def test_critical_events(gw_env, telegram, make_gateway, container, ctx) -> None:
    """Every malformed event is dropped and counted; every good one is acked and delivered."""
    gw = make_gateway(gw_env, gw_config(telegram))
    user = new_user()
    gw.directory.set_user(user, telegram_chat_id="42")
    box = container(gw_env)
    rng = random.Random("critical")
    samples = [user_event(user, ev.CRITICAL, TELEGRAM_ONLY)]
    sent: list[str] = []

    def deliver() -> bool:
        event = user_event(user, ev.CRITICAL, TELEGRAM_ONLY)
        sent.append(event.event_id)
        return box.send(event).status == ev.DELIVERED

    def make() -> list[bytes]:
        return [b"", *malformed(rng, samples)] if rng.random() < 0.5 else malformed(rng, samples)

    def dropped() -> float:
        return sum(
            v for (path, _), v in counted(gw.metrics.dropped).items() if path == "critical_events"
        )

    fuzzer = peer(ctx, zmq.DEALER, gw_env.connect("critical_events"))
    with Good(deliver, pause_s=0.05) as good:
        blast(fuzzer, lambda: make() or [b""])
        wait_for(lambda: dropped() >= FRAMES, timeout=SETTLE_S)
    good.check()
    assert dropped() == FRAMES
    assert sorted(refs(telegram.texts())) == sorted(sent)


def test_a_containers_event_socket(gw_env, telegram, make_gateway, make_publisher, ctx) -> None:
    """What a gateway's SUB sends up to a container's XPUB that is no subscription is counted,
    while the user's open session gets every event."""
    make_gateway(gw_env, gw_config(telegram))
    pub = make_publisher(gw_env)
    user = new_user()
    session = sign_in(gw_env, user)
    wait_for(lambda: pub.watched(user))
    rng = random.Random("events")

    def informs() -> bool:
        event = user_event(user, ev.INFORMATIONAL, [(ev.ACTIVE_SESSION, True)])
        pub.publish(event)
        return next_of(session, "event")["event_id"] == event.event_id

    fuzzer = peer(ctx, zmq.XSUB, gw_env.connect("user_events"))
    with Good(informs, pause_s=0.05) as good:
        blast(fuzzer, lambda: [not_subscription(rng)])
        wait_for(lambda: pub.dropped_frames >= FRAMES, timeout=SETTLE_S)
    good.check()
    assert pub.dropped_frames == FRAMES
