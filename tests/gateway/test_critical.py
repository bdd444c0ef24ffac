"""The critical path: acks, dedup by event_id, QUEUED retries, ERROR, and several gateways."""

from __future__ import annotations

import re
import signal
import time
from collections import Counter

from candlewire.config import Settings
from candlewire.testing import http_get as get
from candlewire.testing import new_user, user_event
from proto import events_pb2 as ev
from tests.gateway.conftest import gw_config, spawn_gateway
from tests.support import counted, free_port, wait_for

TELEGRAM_ONLY = [(ev.TELEGRAM, False)]


def refs(texts: list[str]) -> list[str]:
    return [m.group(1) for t in texts for m in [re.search(r"ref: (\w+)", t)] if m]


def test_a_resent_event_is_acked_again_not_delivered_again(
    gw_env, telegram, make_gateway, container
) -> None:
    first = make_gateway(gw_env, gw_config(telegram))
    other_env = gw_env.model_copy(
        update={
            "ports": gw_env.ports | {n: free_port() for n in ("critical_events", "gateway_http")}
        }
    )
    second = make_gateway(other_env, gw_config(telegram))
    user = new_user()
    first.directory.set_user(user, telegram_chat_id="7")
    event = user_event(user, ev.CRITICAL, TELEGRAM_ONLY)
    to_first, to_second = container(gw_env), container(other_env)
    assert to_first.send(event).status == ev.DELIVERED
    assert to_first.send(event).status == ev.DELIVERED  # the ack was lost; resent here
    assert to_second.send(event).status == ev.DELIVERED  # ... or to another gateway
    first.stop()
    restarted = make_gateway(gw_env, gw_config(telegram))  # ... or after a restart
    assert to_first.send(event).status == ev.DELIVERED
    assert refs(telegram.texts()) == [event.event_id]
    assert restarted.metrics.critical.labels("duplicate")._value.get() == 1
    assert second.metrics.critical.labels("duplicate")._value.get() == 1


def test_a_rate_limit_is_queued_and_retried_even_by_another_gateway(
    gw_env, telegram, make_gateway, container
) -> None:
    gw = make_gateway(gw_env, gw_config(telegram, retry_poll_s=0.1))
    user = new_user()
    gw.directory.set_user(user, telegram_chat_id="9")
    telegram.limit(calls=1, retry_after=2)
    event = user_event(user, ev.CRITICAL, TELEGRAM_ONLY)
    dealer = container(gw_env)
    t0 = time.monotonic()
    ack = dealer.send(event)
    assert ack.status == ev.QUEUED
    assert "rate limit" in ack.error_message
    gw.stop()  # the gateway that queued it goes away; the queue is in PostgreSQL
    again = make_gateway(gw_env, gw_config(telegram, retry_poll_s=0.1))
    assert dealer.send(event).status == ev.QUEUED  # a resend does not queue it twice
    wait_for(telegram.texts, timeout=15)
    assert time.monotonic() - t0 >= 2.0  # retry_after was honoured
    time.sleep(0.5)
    assert refs(telegram.texts()) == [event.event_id]
    assert telegram.refused == 1
    assert again.metrics.retries.labels("delivered")._value.get() == 1


def test_preferences_fall_through_and_end_in_error_with_reasons(
    gw_env, telegram, make_gateway, container
) -> None:
    gw = make_gateway(gw_env, gw_config(telegram))
    user = new_user()  # no session, no address in the directory
    event = user_event(user, ev.CRITICAL, [(ev.ACTIVE_SESSION, True), (ev.TELEGRAM, False)])
    ack = container(gw_env).send(event)
    assert ack.status == ev.ERROR
    assert "ACTIVE_SESSION: skipped, no active session" in ack.error_message
    assert "TELEGRAM: no telegram chat for the user" in ack.error_message
    gw.directory.set_user(user, telegram_chat_id="5")
    later = user_event(user, ev.CRITICAL, [(ev.ACTIVE_SESSION, True), (ev.TELEGRAM, False)])
    assert container(gw_env).send(later).status == ev.DELIVERED
    assert refs(telegram.texts()) == [later.event_id]


def test_malformed_frames_are_dropped_and_counted(gw_env, make_gateway, container) -> None:
    gw = make_gateway(gw_env, gw_config())
    dealer = container(gw_env)
    dealer.sock.send_multipart([b"", b"\x01", b"\x20not a protobuf"])
    dealer.sock.send_multipart([b"", b"garbage"])
    wait_for(lambda: dropped(gw) == 2)
    user = new_user()
    ack = dealer.send(user_event(user, ev.CRITICAL, [(ev.ACTIVE_SESSION, True)]))
    assert ack.status == ev.ERROR  # still serving


def dropped(gw) -> float:
    return sum(counted(gw.metrics.dropped).values())


# -- real processes: kill -9 with events in flight, two gateways ---------------------------


def delivered_by(settings: Settings) -> float:
    body = get(f"http://127.0.0.1:{settings.port('gateway_metrics')}/metrics").decode()
    m = re.search(r'candlewire_gateway_critical_total\{result="delivered"\} (\S+)', body)
    return float(m.group(1)) if m else 0.0


def test_kill_9_of_a_gateway_with_events_in_flight_loses_none_and_duplicates_none(
    gw_env, telegram, make_gateway, make_publisher
) -> None:
    a = gw_env
    b = gw_env.model_copy(
        update={
            "ports": gw_env.ports
            | {n: free_port() for n in ("critical_events", "gateway_http", "gateway_metrics")}
        }
    )
    # One delivery at a time: the kill can cut short at most one channel call.
    one = {"CANDLEWIRE_GATEWAY_MAX_INFLIGHT": "1"}
    procs = [spawn_gateway(a, telegram.url, one), spawn_gateway(b, telegram.url, one)]
    try:
        pub = make_publisher(
            gw_env,
            gateways=[a.connect("critical_events"), b.connect("critical_events")],
            ack_timeout=2.0,
        )
        user = new_user()
        from candlewire.lake import sql_url
        from gateway.directory import Directory

        directory = Directory(sql_url(gw_env))
        directory.set_user(user, telegram_chat_id="11")
        directory.close()
        sent = []
        for i in range(300):
            if i == 150:
                assert delivered_by(a) > 0 and delivered_by(b) > 0  # round robin
                procs[0].send_signal(signal.SIGKILL)  # events are in flight to it
                procs[0].wait()
            if i == 220:
                procs[0] = spawn_gateway(a, telegram.url, one)
            event = user_event(user, ev.CRITICAL, TELEGRAM_ONLY, payload={"n": i})
            pub.publish(event)
            sent.append(event.event_id)
            time.sleep(0.01)
        wait_for(lambda: pub.unacked() == 0, timeout=60)
        got = Counter(refs(telegram.texts()))
        assert set(got) == set(sent)  # at least once
        # Only the one event whose Telegram call the kill cut short may arrive twice.
        assert sum(got.values()) - len(sent) <= 1, [e for e, n in got.items() if n > 1]
        assert delivered_by(a) > 0  # the restarted gateway takes its share again
    finally:
        for p in procs:
            p.kill()
            p.wait()
