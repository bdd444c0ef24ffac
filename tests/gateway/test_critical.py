"""The critical path: acks, dedup by event_id, QUEUED retries, ERROR, and several gateways."""

from __future__ import annotations

import asyncio
import json
import logging
import re
import signal
import threading
import time
from collections import Counter

import pytest

from candlewire.config import Settings
from candlewire.testing import http_get as get
from candlewire.testing import new_user, user_event
from gateway.critical import Batcher
from proto import events_pb2 as ev
from proto.envelope import decode, encode, expect
from tests.gateway.conftest import gw_config, sign_in, spawn_gateway
from tests.support import counted, free_port, wait_for

TELEGRAM_ONLY = [(ev.TELEGRAM, False)]


def refs(texts: list[str]) -> list[str]:
    return [m.group(1) for t in texts for m in [re.search(r"ref: (\w+)", t)] if m]


def second_env(gw_env: Settings) -> Settings:
    """Another gateway's ports on the same platform (and the same PostgreSQL)."""
    ports = {n: free_port() for n in ("critical_events", "gateway_http", "gateway_metrics")}
    return gw_env.model_copy(update={"ports": gw_env.ports | ports})


def two_gateways(gw_env: Settings, telegram, make_gateway, chat_id: str):
    """Two gateways on one platform, the second's settings, and a user with a Telegram chat."""
    first = make_gateway(gw_env, gw_config(telegram))
    other_env = second_env(gw_env)
    second = make_gateway(other_env, gw_config(telegram))
    user = new_user()
    first.directory.set_user(user, telegram_chat_id=chat_id)
    return first, second, other_env, user


def test_a_resent_event_is_acked_again_not_delivered_again(
    gw_env, telegram, make_gateway, container
) -> None:
    first, second, other_env, user = two_gateways(gw_env, telegram, make_gateway, "7")
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


def held_telegram(gw, monkeypatch) -> tuple[threading.Event, threading.Event]:
    """Make ``gw``'s Telegram calls wait: (entered, go on)."""
    entered, go_on = threading.Event(), threading.Event()
    send = gw.channels[ev.TELEGRAM].send

    async def held(*args):
        entered.set()
        await asyncio.to_thread(go_on.wait, 30)
        return await send(*args)

    monkeypatch.setattr(gw.channels[ev.TELEGRAM], "send", held)
    return entered, go_on


def test_a_resend_to_another_gateway_mid_delivery_is_not_delivered_twice(
    gw_env, telegram, make_gateway, container, monkeypatch
) -> None:
    first, second, other_env, user = two_gateways(gw_env, telegram, make_gateway, "8")
    entered, go_on = held_telegram(first, monkeypatch)
    event = user_event(user, ev.CRITICAL, TELEGRAM_ONLY)
    to_first, to_second = container(gw_env), container(other_env)
    try:
        to_first.sock.send_multipart([b"", *encode(event)])
        assert entered.wait(20)  # the first gateway is delivering it ...
        to_second.sock.send_multipart([b"", *encode(event)])  # ... when the ack is late
        wait_for(lambda: second.metrics.critical.labels("elsewhere")._value.get() == 1)
        assert to_second.sock.poll(500) == 0  # left to the first: no answer, no delivery
    finally:
        go_on.set()
    assert acks_of(to_first, 1)[0].status == ev.DELIVERED
    assert to_second.send(event).status == ev.DELIVERED  # sent again: the first's answer
    assert refs(telegram.texts()) == [event.event_id]


def test_a_stopping_gateway_gives_up_its_claims_and_another_delivers_at_once(
    gw_env, telegram, make_gateway, container, monkeypatch
) -> None:
    # The second gateway will not wait out the first's lease (60 s).
    first, second, other_env, user = two_gateways(gw_env, telegram, make_gateway, "6")
    entered, go_on = held_telegram(first, monkeypatch)
    event = user_event(user, ev.CRITICAL, TELEGRAM_ONLY)
    try:
        container(gw_env).sock.send_multipart([b"", *encode(event)])
        assert entered.wait(20)
        first.stop()  # mid-delivery: no answer, no ack
    finally:
        go_on.set()
    assert container(other_env).send(event).status == ev.DELIVERED
    assert refs(telegram.texts()) == [event.event_id]
    assert second.metrics.critical.labels("elsewhere")._value.get() == 0


def test_a_stopping_gateway_answers_the_deliveries_in_flight_first(
    gw_env, telegram, make_gateway, container, monkeypatch
) -> None:
    gw = make_gateway(gw_env, gw_config(telegram))
    user = new_user()
    gw.directory.set_user(user, telegram_chat_id="4")
    entered, go_on = held_telegram(gw, monkeypatch)
    event = user_event(user, ev.CRITICAL, TELEGRAM_ONLY)
    dealer = container(gw_env)
    dealer.sock.send_multipart([b"", *encode(event)])
    try:
        assert entered.wait(20)
        stopping = threading.Thread(target=gw.stop)
        stopping.start()  # mid-delivery ...
        time.sleep(0.5)
    finally:
        go_on.set()  # ... which then succeeds: answered and acked before the gateway goes
    assert acks_of(dealer, 1)[0].status == ev.DELIVERED
    stopping.join(20)
    assert not stopping.is_alive()
    assert refs(telegram.texts()) == [event.event_id]


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
    # The counter follows the queue row's removal, which comes after the text is sent.
    delivered = again.metrics.retries.labels("delivered")._value
    wait_for(lambda: delivered.get() == 1, timeout=10)
    assert delivered.get() == 1


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


def test_a_channel_no_release_names_is_not_available_and_the_next_delivers(
    gw_env, telegram, make_gateway, container
) -> None:
    """A newer container's channel: passed over by its number, never an event left
    unanswered for the container to resend for ever."""
    gw = make_gateway(gw_env, gw_config(telegram))
    user = new_user()
    gw.directory.set_user(user, telegram_chat_id="6")
    event = user_event(user, ev.CRITICAL, [(99, False), (ev.TELEGRAM, False)])  # type: ignore[list-item]
    assert container(gw_env).send(event).status == ev.DELIVERED
    assert refs(telegram.texts()) == [event.event_id]
    lone = user_event(user, ev.CRITICAL, [(99, False)])  # type: ignore[list-item]
    ack = container(gw_env).send(lone)
    assert ack.status == ev.ERROR and ack.error_message == "99: not available"


def test_a_session_channel_that_finds_no_session_falls_through_to_one_that_waits(
    gw_env, telegram, make_gateway, container
) -> None:
    """A session channel answers at once, without a task (no session here: SKIPPED); the
    event goes on down its preferences to a channel that waits on a service."""
    ack = past_the_session_channel(gw_env, telegram, make_gateway, container, chat_id="7")
    assert ack.status == ev.ERROR
    assert ack.error_message == "ACTIVE_SESSION: no active session on this gateway"


def past_the_session_channel(gw_env, telegram, make_gateway, container, chat_id: str):
    """An event whose session channel does not deliver goes on to Telegram, which does;
    returns the ack of one with the session channel alone."""
    gw = make_gateway(gw_env, gw_config(telegram))
    user = new_user()
    gw.directory.set_user(user, telegram_chat_id=chat_id)
    event = user_event(user, ev.CRITICAL, [(ev.ACTIVE_SESSION, False), (ev.TELEGRAM, False)])
    assert container(gw_env).send(event).status == ev.DELIVERED
    assert refs(telegram.texts()) == [event.event_id]
    lone = user_event(user, ev.CRITICAL, [(ev.ACTIVE_SESSION, False)])
    return container(gw_env).send(lone)


def test_a_channel_that_raises_leaves_its_event_queued_whether_it_waits_or_not(
    gw_env, telegram, make_gateway, container, monkeypatch
) -> None:
    from gateway.channels.telegram import TelegramChannel
    from gateway.sessions import SessionChannel

    def broken(*_args: object) -> None:
        raise RuntimeError("a bug")

    async def broken_later(*_args: object) -> None:
        raise LookupError("a bug")

    monkeypatch.setattr(SessionChannel, "send_now", broken)
    monkeypatch.setattr(TelegramChannel, "send", broken_later)
    gw = make_gateway(gw_env, gw_config(telegram))
    user = new_user()
    gw.directory.set_user(user, telegram_chat_id="8")
    for channel, error in ((ev.ACTIVE_SESSION, "RuntimeError"), (ev.TELEGRAM, "LookupError")):
        ack = container(gw_env).send(user_event(user, ev.CRITICAL, [(channel, False)]))
        assert ack.status == ev.QUEUED
        assert ack.error_message == f"{ev.ChannelType.Name(channel)}: {error}"


def test_a_payload_too_deep_to_encode_fails_its_channel_at_once_and_goes_on_down(
    gw_env, telegram, make_gateway, container, monkeypatch
) -> None:
    """Not queued to fail the same way at every retry: the next preference sends the text."""
    from gateway.sessions import SessionChannel

    def too_deep(*_args: object) -> None:  # as the encoder raises past its recursion limit
        raise RecursionError("maximum recursion depth exceeded while encoding a JSON object")

    monkeypatch.setattr(SessionChannel, "send_now", too_deep)
    ack = past_the_session_channel(gw_env, telegram, make_gateway, container, chat_id="9")
    assert ack.status == ev.ERROR
    assert ack.error_message == "ACTIVE_SESSION: payload nested too deep to send"


def test_malformed_frames_are_dropped_and_counted(gw_env, make_gateway, container) -> None:
    gw = make_gateway(gw_env, gw_config())
    dealer = container(gw_env)
    dealer.sock.send_multipart([b"", b"\x01", b"\x20not a protobuf"])
    dealer.sock.send_multipart([b"", b"garbage"])
    wait_for(lambda: dropped(gw) == 2)
    user = new_user()
    ack = dealer.send(user_event(user, ev.CRITICAL, [(ev.ACTIVE_SESSION, True)]))
    assert ack.status == ev.ERROR  # still serving


def test_an_event_too_large_to_take_is_answered_error_so_it_is_not_sent_again(
    gw_env, make_gateway, container
) -> None:
    """A sender that did not check (another build, another language) journals it and sends
    it again until acked: dropped unanswered, it came back every 30 s for ever."""
    from proto.envelope import MAX_BYTES_FIELD

    gw = make_gateway(gw_env, gw_config())
    dealer = container(gw_env)
    event = user_event(new_user(), ev.CRITICAL, [(ev.ACTIVE_SESSION, True)])
    event.payload = b"x" * (MAX_BYTES_FIELD + 1)
    ack = dealer.send(event)
    assert (ack.event_id, ack.status) == (event.event_id, ev.ERROR)
    assert "payload" in ack.error_message
    assert counted(gw.metrics.dropped) == {("critical_events", "oversized_field"): 1.0}


def dropped(gw) -> float:
    return sum(counted(gw.metrics.dropped).values())


# -- batches: many events in flight share their database round trips ----------------------

ACTIVE = [(ev.ACTIVE_SESSION, True)]


def burst(dealer, events: list[ev.UserEvent]) -> None:
    """Send without waiting for acks, as a container with many events pending does."""
    for event in events:
        dealer.sock.send_multipart([b"", *encode(event)])


def acks_of(dealer, n: int) -> list[ev.EventAck]:
    acks: list[ev.EventAck] = []
    while len(acks) < n:
        assert dealer.sock.poll(20_000), f"{len(acks)} acks of {n}"
        acks.append(expect(decode(dealer.sock.recv_multipart()[1:]), ev.EventAck))
    return acks


def delivered(ws, n: int) -> Counter[str]:
    """The events a session receives, counted once ``n`` have come and then until a ping's
    pong, which the gateway queues behind every message queued before it."""
    got: Counter[str] = Counter()
    pinged = n == 0
    if pinged:  # none to wait for: only what is queued before the pong
        ws.send(json.dumps({"op": "ping"}))
    while True:
        msg = json.loads(ws.recv(timeout=20))
        if msg["type"] == "event":
            got[msg["event_id"]] += 1
        elif msg["type"] == "pong" and pinged:
            return got
        if not pinged and got.total() >= n:
            ws.send(json.dumps({"op": "ping"}))
            pinged = True


def test_a_burst_is_acked_once_per_copy_delivered_once_and_committed_in_batches(
    gw_env, make_gateway, container, monkeypatch
) -> None:
    gw = make_gateway(gw_env, gw_config(session_queue=1000))
    committed: list[int] = []
    record = gw.directory.record

    async def counting(answers) -> None:
        await record(answers)
        committed.append(len(answers))

    monkeypatch.setattr(gw.directory, "record", counting)
    user = new_user()
    ws = sign_in(gw_env, user)
    events = [user_event(user, ev.CRITICAL, ACTIVE) for _ in range(200)]
    resent = events[::5]  # a resend right behind its original: the same batch
    invalid = user_event(user, ev.CRITICAL, ACTIVE)
    invalid.event_id = "x" * 200  # wider than the key column: refused, alone
    sent = [e for event in events for e in ([event, event] if event in resent else [event])]
    dealer = container(gw_env)
    burst(dealer, [*sent, invalid])
    acks = acks_of(dealer, len(sent) + 1)
    assert Counter(a.event_id for a in acks) == Counter(e.event_id for e in [*sent, invalid])
    by_id = {a.event_id: a.status for a in acks}
    assert by_id.pop(invalid.event_id) == ev.ERROR
    assert set(by_id.values()) == {ev.DELIVERED}
    assert delivered(ws, len(events)) == Counter(e.event_id for e in events)  # once each
    assert gw.metrics.critical.labels("duplicate")._value.get() == len(resent)
    assert sum(committed) == len(events)  # every answer stored once ...
    assert max(committed) >= 10  # ... many to a statement
    ws.close()


def one_slow_among_fast(gw_env: Settings, gw, monkeypatch, n: int):
    """A signed-in user with a Telegram chat whose Telegram calls are held (see
    :func:`held_telegram`): the session, (entered, go on), one event for Telegram and ``n``
    for the session."""
    user = new_user()
    gw.directory.set_user(user, telegram_chat_id="5")
    ws = sign_in(gw_env, user)
    slow = user_event(user, ev.CRITICAL, TELEGRAM_ONLY)
    fast = [user_event(user, ev.CRITICAL, ACTIVE) for _ in range(n)]
    return ws, held_telegram(gw, monkeypatch), slow, fast


def test_a_slow_channel_holds_up_only_its_own_event_of_a_burst(
    gw_env, telegram, make_gateway, container, monkeypatch
) -> None:
    gw = make_gateway(gw_env, gw_config(telegram, session_queue=1000))
    ws, (entered, go_on), slow, fast = one_slow_among_fast(gw_env, gw, monkeypatch, 30)
    dealer = container(gw_env)
    try:
        burst(dealer, [slow, *fast])  # read in one loop turn: one batch
        assert entered.wait(20)
        acks = acks_of(dealer, len(fast))  # recorded and acked while Telegram holds its own
        assert Counter(a.event_id for a in acks) == Counter(e.event_id for e in fast)
        assert {a.status for a in acks} == {ev.DELIVERED}
        assert delivered(ws, len(fast)) == Counter(e.event_id for e in fast)
        assert dealer.sock.poll(300) == 0
    finally:
        go_on.set()
    (ack,) = acks_of(dealer, 1)
    assert (ack.event_id, ack.status) == (slow.event_id, ev.DELIVERED)
    assert refs(telegram.texts()) == [slow.event_id]
    ws.close()


def test_an_event_that_cannot_be_rendered_fails_alone_and_its_batch_is_acked(
    gw_env, telegram, make_gateway, container, monkeypatch
) -> None:
    gw = make_gateway(gw_env, gw_config(telegram, session_queue=1000))
    user = new_user()
    ws = sign_in(gw_env, user)
    poison, *fast = [user_event(user, ev.CRITICAL, ACTIVE) for _ in range(20)]
    render = gw.symbols.render

    def failing(event: ev.UserEvent):
        if event.event_id == poison.event_id:
            raise RuntimeError("a bug")
        return render(event)

    monkeypatch.setattr(gw.symbols, "render", failing)
    dealer = container(gw_env)
    burst(dealer, [poison, *fast])  # read in one loop turn: one batch
    acks = acks_of(dealer, len(fast))
    assert Counter(a.event_id for a in acks) == Counter(e.event_id for e in fast)
    assert {a.status for a in acks} == {ev.DELIVERED}
    assert delivered(ws, len(fast)) == Counter(e.event_id for e in fast)
    assert dealer.sock.poll(500) == 0  # no answer: the container sends it again
    ws.close()


def test_a_delivery_past_the_claim_s_lease_is_cut_off_unanswered_and_the_rest_acked(
    gw_env, telegram, make_gateway, container, monkeypatch, caplog
) -> None:
    gw = make_gateway(gw_env, gw_config(telegram, session_queue=1000, claim_lease_s=5.0))
    ws, (entered, go_on), slow, fast = one_slow_among_fast(gw_env, gw, monkeypatch, 10)
    dealer = container(gw_env)
    caplog.set_level(logging.ERROR, "candlewire.gateway")

    def cut_off() -> bool:
        return any(
            slow.event_id in r.getMessage() and "not handled" in r.getMessage()
            for r in caplog.records
        )

    try:
        burst(dealer, [slow, *fast])
        acks = acks_of(dealer, len(fast))
        assert Counter(a.event_id for a in acks) == Counter(e.event_id for e in fast)
        assert delivered(ws, len(fast)) == Counter(e.event_id for e in fast)
        # The session's events are answered at once; the slow one's call may begin after
        # their acks (it looks the user's address up first), and it is in flight meanwhile.
        assert entered.wait(20)
        wait_for(cut_off, timeout=30)  # at 0.8 of the lease: no answer ...
        assert dealer.sock.poll(500) == 0  # ... so no ack: the container resends it
    finally:
        go_on.set()
    time.sleep(0.5)
    assert telegram.texts() == []  # the call was cancelled before it sent
    ws.close()


def test_a_batcher_gives_each_group_its_own_answers_in_batches_of_whole_groups() -> None:
    runs: list[list[int]] = []

    async def run(items: list[int]) -> list[int]:
        runs.append(items)
        await asyncio.sleep(0)
        return [x * 10 for x in items]

    groups = [[1], [2, 3, 4, 5, 6], [7, 8], [9], [10, 11, 12]]

    async def main() -> list[list[int]]:
        batcher = Batcher(run, max_batch=4)
        return await asyncio.gather(*(batcher(g) for g in groups))

    assert asyncio.run(main()) == [[x * 10 for x in g] for g in groups]
    # All five queued before the first run: [1] alone, as [2..6] does not fit beside it; a
    # group over the limit goes alone; none is split.
    assert runs == [[1], [2, 3, 4, 5, 6], [7, 8, 9], [10, 11, 12]]

    async def short(items: list[int]) -> list[int]:
        return items[1:]

    with pytest.raises(RuntimeError, match="2 answers to a batch of 3"):
        asyncio.run(Batcher(short)([1, 2, 3]))


def test_no_ack_before_the_commit_and_a_failed_commit_leaves_the_events_to_resend(
    gw_env, make_gateway, container, monkeypatch, caplog
) -> None:
    gw = make_gateway(gw_env, gw_config(session_queue=1000))
    record, commit = gw.directory.record, threading.Event()

    async def crashing(answers) -> None:  # the database dies before it commits
        await asyncio.to_thread(commit.wait, 60)
        raise ConnectionError("server closed the connection before the commit")

    monkeypatch.setattr(gw.directory, "record", crashing)
    user = new_user()
    ws = sign_in(gw_env, user)
    events = [user_event(user, ev.CRITICAL, ACTIVE) for _ in range(50)]
    ids = Counter(e.event_id for e in events)
    dealer = container(gw_env)
    caplog.set_level(logging.ERROR, "candlewire.gateway")
    burst(dealer, events)
    try:
        assert delivered(ws, len(ids)) == ids  # past their channel, before their commit ...
        assert dealer.sock.poll(0) == 0  # ... so not acked
    finally:
        commit.set()
    wait_for(lambda: sum("not handled" in r.getMessage() for r in caplog.records) == len(ids))
    monkeypatch.setattr(gw.directory, "record", record)  # the database is back
    burst(dealer, events)  # the container resends what was never acked
    acks = acks_of(dealer, len(events))
    assert Counter(a.event_id for a in acks) == ids  # no ack came from the failed commit
    assert {a.status for a in acks} == {ev.DELIVERED}
    # Delivered once: the resend records the answer the failed commit lost, and nothing
    # reaches the session again (before, each was delivered a second time).
    assert delivered(ws, 0) == Counter()
    ws.close()


# -- real processes: kill -9 with events in flight, two gateways ---------------------------


def delivered_by(settings: Settings) -> float:
    body = get(settings.metrics_url("gateway_metrics")).decode()
    m = re.search(r'candlewire_gateway_critical_total\{result="delivered"\} (\S+)', body)
    return float(m.group(1)) if m else 0.0


def test_kill_9_of_a_gateway_with_events_in_flight_loses_none_and_duplicates_none(
    gw_env, telegram, make_gateway, make_publisher
) -> None:
    a, b = gw_env, second_env(gw_env)
    # One delivery at a time: the kill can cut short at most one channel call. Its claim
    # lapses after 10 s, and the other gateway delivers it.
    one = {"CANDLEWIRE_GATEWAY_MAX_INFLIGHT": "1", "CANDLEWIRE_GATEWAY_CLAIM_LEASE_S": "10"}
    procs = [spawn_gateway(a, telegram.url, one), spawn_gateway(b, telegram.url, one)]
    try:
        pub = make_publisher(
            gw_env,
            gateways=[a.connect("critical_events"), b.connect("critical_events")],
            ack_timeout=2.0,  # resent when a gateway is gone, and when it is slow
        )
        user = new_user()
        from gateway.directory import Directory

        directory = Directory(gw_env.sql_url())
        directory.set_user(user, telegram_chat_id="11")
        directory.close()
        sent: list[str] = []
        killed_at = restarted_at = None
        # 150 events, then the kill once each gateway has delivered some (round robin; checked
        # then, not at a fixed event, so a slow metrics read does not fail it); 70 more, the
        # restart, and 80 after it.
        for i in range(600):
            if killed_at is None and i >= 150 and delivered_by(a) > 0 and delivered_by(b) > 0:
                procs[0].send_signal(signal.SIGKILL)  # events are in flight to it
                procs[0].wait()
                killed_at = i
            elif killed_at is not None and i == killed_at + 70:
                procs[0] = spawn_gateway(a, telegram.url, one)
                restarted_at = i
            elif restarted_at is not None and i == restarted_at + 80:
                break
            event = user_event(user, ev.CRITICAL, TELEGRAM_ONLY, payload={"n": i})
            pub.publish(event)
            sent.append(event.event_id)
            time.sleep(0.01)
        assert killed_at is not None, "each gateway never delivered some of the first events"
        assert restarted_at is not None, "the killed gateway was not started again in time"
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


def test_the_purge_forgets_answers_and_lapsed_claims_past_the_window_and_keeps_the_rest(
    gw_env, make_gateway
) -> None:
    """``gateway_acks`` and ``gateway_claims`` stay bounded as a gateway runs for months: an
    answer older than the dedup window goes, and a claim whose lease lapsed that long ago;
    an answer within the window and a claim still held stay."""
    import sqlalchemy as sa

    from gateway.directory import acks, claims

    gw = make_gateway(gw_env, gw_config())
    window, now = 300.0, time.time()
    old, recent, lapsed, held = (f"purge-{new_user()}" for _ in range(4))
    with gw.directory.engine.begin() as db:
        db.execute(
            sa.insert(acks),
            [
                {
                    "event_id": old,
                    "status": ev.DELIVERED,
                    "error": "",
                    "acked_at": now - window - 5,
                },
                {"event_id": recent, "status": ev.DELIVERED, "error": "", "acked_at": now - 5},
            ],
        )
        db.execute(
            sa.insert(claims),
            [
                {"event_id": lapsed, "owner": "gone", "until": now - window - 5},
                {"event_id": held, "owner": "here", "until": now + 60},
            ],
        )
    assert gw.directory.purge(window) >= 1
    with gw.directory.engine.connect() as db:
        kept_acks = set(db.execute(sa.select(acks.c.event_id)).scalars())
        kept_claims = set(db.execute(sa.select(claims.c.event_id)).scalars())
    assert recent in kept_acks and old not in kept_acks
    assert held in kept_claims and lapsed not in kept_claims
