"""CURVE at the gateway: containers prove keys, and a container speaks for its own user only."""

from __future__ import annotations

import pytest
import zmq

from candlewire.curve import Keyring
from candlewire.events import Route
from candlewire.testing import new_user, user_event
from proto import events_pb2 as ev
from tests.gateway.conftest import gw_config, next_of, sign_in
from tests.relay.test_curve import outcome
from tests.support import counted, wait_for

TELEGRAM_ONLY = [(ev.TELEGRAM, False)]
FALLBACK = [(ev.ACTIVE_SESSION, True), (ev.TELEGRAM, False)]


@pytest.fixture
def env(gw_env):
    secured = gw_env.model_copy(update={"security": gw_env.security.model_copy()})
    secured.security.curve = True
    Keyring(secured).init()
    return secured


def carols_box(env, telegram, make_gateway) -> tuple:
    """A gateway, two users, and a container key bound to the first (``carol-box``)."""
    gw = make_gateway(env, gw_config(telegram))
    carol, mallory = new_user(), new_user()
    Keyring(env).add_client("carol-box", "container", user=carol)
    return gw, carol, mallory


def test_a_container_key_speaks_for_its_own_user_only(
    env, telegram, make_gateway, container
) -> None:
    gw, carol, mallory = carols_box(env, telegram, make_gateway)
    for user in (carol, mallory):
        gw.directory.set_user(user, telegram_chat_id=user)
    box = container(env, "carol-box")
    assert box.send(user_event(carol, ev.CRITICAL, TELEGRAM_ONLY)).status == ev.DELIVERED
    forged = box.send(user_event(mallory, ev.CRITICAL, TELEGRAM_ONLY))
    assert forged.status == ev.ERROR and carol in forged.error_message
    assert [m["chat_id"] for m in telegram.messages] == [carol]
    assert counted(gw.metrics.refused) == {("critical", "other_user"): 1}
    # The stream job's publisher key may send for anyone (its alerts).
    job = container(env, "stream")
    assert job.send(user_event(mallory, ev.CRITICAL, TELEGRAM_ONLY)).status == ev.DELIVERED


def test_the_fast_path_drops_another_users_events(
    env, telegram, make_gateway, make_publisher
) -> None:
    gw, carol, mallory = carols_box(env, telegram, make_gateway)
    pub = make_publisher(env, key="carol-box")
    to_carol, to_mallory = sign_in(env, carol), sign_in(env, mallory)
    wait_for(lambda: pub.watched(carol) and pub.watched(mallory))
    forged = user_event(mallory, ev.INFORMATIONAL, FALLBACK)
    assert pub.publish(forged) is Route.XPUB
    wait_for(lambda: counted(gw.metrics.refused).get(("events", "other_user")) == 1)
    own = user_event(carol, ev.INFORMATIONAL, FALLBACK)
    assert pub.publish(own) is Route.XPUB
    assert next_of(to_carol, "event")["event_id"] == own.event_id
    with pytest.raises(TimeoutError):
        next_of(to_mallory, "event", timeout=0.5)


def test_the_critical_channel_refuses_strangers_and_plaintext(ctx, env, telegram, make_gateway):
    gw = make_gateway(env, gw_config(telegram))
    address = env.connect("critical_events")
    client = ctx.socket(zmq.DEALER)  # a client key: not a container's role
    client.curve_publickey, client.curve_secretkey = Keyring(env).pair("local")
    client.curve_serverkey = Keyring(env).public("gateway")
    assert outcome(client, address) == "auth"
    assert outcome(ctx.socket(zmq.DEALER), address) != "ok"
    assert counted(gw.metrics.refused) == {("critical", "wrong_role"): 1}
