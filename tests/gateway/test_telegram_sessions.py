"""Telegram sessions (spec: "subscribes USER:{id} when the user's WebSocket/Telegram session
connects"): /start through getUpdates opens one, informational events reach the chat, /stop
ends it. The protocol core without a network first, then a real gateway against the Bot API
stand-in."""

from __future__ import annotations

import json
import random
import time

from candlewire.events import Route
from candlewire.testing import new_user, user_event
from gateway.telegram_sessions import ChatSessions, UpdatesProtocol, bot_command
from proto import events_pb2 as ev
from tests.gateway.conftest import gw_config, next_of, sign_in
from tests.support import wait_for


def ok(*updates: object) -> bytes:
    return json.dumps({"ok": True, "result": list(updates)}).encode()


def said(update_id: int, chat: int, text: str) -> dict:
    return {"update_id": update_id, "message": {"chat": {"id": chat}, "text": text}}


# -- sans I/O --------------------------------------------------------------------------------


def test_offset_confirms_what_was_read_and_commands_come_out() -> None:
    p = UpdatesProtocol(poll_s=25)
    assert p.request() == {"timeout": 25, "limit": 100, "allowed_updates": ["message"]}
    poll = p.receive(200, ok(said(7, 42, "/start"), said(8, 42, "hello"), said(9, -5, "/stop@Bot")))
    assert [(c.kind, c.chat_id, c.update_id) for c in poll.commands] == [
        ("start", "42", 7),
        ("stop", "-5", 9),
    ]
    assert (poll.ignored, poll.malformed, poll.delay_s) == (1, 0, 0)
    assert p.request()["offset"] == 10
    # A server that repeats confirmed updates: passed over, and no spinning on them.
    again = p.receive(200, ok(said(9, -5, "/stop")))
    assert again.commands == [] and again.ignored == 1 and again.delay_s > 0
    assert p.receive(200, ok()).delay_s == 0  # a long poll that timed out: poll again now
    assert p.rewind(8) > 0 and p.request()["offset"] == 8  # not applied: asked for again


def test_failures_back_off_and_a_429_waits_its_retry_after() -> None:
    p = UpdatesProtocol(min_backoff_s=1, max_backoff_s=8)
    assert [p.unreachable().delay_s for _ in range(5)] == [1, 2, 4, 8, 8]
    conflict = p.receive(409, b'{"ok":false,"error_code":409,"description":"Conflict"}')
    assert (conflict.result, conflict.delay_s) == ("conflict", 8)
    assert p.receive(502, b"<html>bad gateway</html>").result == "error"
    limited = p.receive(429, b'{"ok":false,"parameters":{"retry_after":17}}')
    assert (limited.result, limited.delay_s) == ("rate_limited", 17)
    assert p.receive(200, ok()).result == "ok"
    assert p.unreachable().delay_s == 1  # a success reset the backoff


def test_malformed_answers_and_updates_are_counted_not_raised() -> None:
    p = UpdatesProtocol()
    assert p.receive(200, b"not json").result == "error"
    assert p.receive(200, b'{"ok": true, "result": {"no": "list"}}').malformed == 1
    poll = p.receive(
        200,
        ok(
            "garbage",
            {"update_id": "1"},
            {"update_id": True, "message": {}},
            {"update_id": 3, "message": "text"},
            {"update_id": 4, "message": {"chat": {}, "text": "/start"}},
            {"update_id": 5, "message": {"chat": {"id": "42"}, "text": "/start"}},
            {"update_id": 6, "message": {"chat": {"id": 42}, "text": ["/start"]}},
            {"update_id": 7, "message": {"chat": {"id": 42}, "photo": []}},
            {"update_id": 8, "edited_message": {"chat": {"id": 42}, "text": "/start"}},
            said(9, 42, "/start alice"),
        ),
    )
    assert (poll.malformed, poll.ignored) == (7, 2)
    assert [(c.kind, c.payload) for c in poll.commands] == [("start", "alice")]
    assert p.request()["offset"] == 10
    # Only garbage without ids: the offset cannot move, so the next poll waits.
    assert p.receive(200, ok("x", None)).delay_s > 0


def test_bot_commands() -> None:
    assert bot_command("/start") == ("start", "")
    assert bot_command("  /START@CandlewireBot  alice ") == ("start", "alice")
    assert bot_command("/stop") == ("stop", "")
    assert bot_command("/stopped") is None
    assert bot_command("start") is None


def test_a_user_is_watched_from_the_first_chat_to_the_last() -> None:
    calls: list[str] = []
    chats = ChatSessions(lambda u: calls.append(f"+{u}"), lambda u: calls.append(f"-{u}"))
    chats.start("1", ["alice"])
    chats.start("1", ["alice"])  # a second /start changes nothing
    chats.start("2", ["alice", "bob"])
    assert chats.chats("alice") == ["1", "2"] and len(chats) == 2
    assert chats.stop("1") == ["alice"]
    assert chats.stop("1") == []
    assert chats.stop("2") == ["alice", "bob"]
    assert calls == ["+alice", "+bob", "-alice", "-bob"]


def test_a_command_that_always_fails_is_passed_over_and_a_transient_one_retried() -> None:
    """An update left unconfirmed holds back every one after it, from every chat: only a
    failure that may pass (the database away) is asked for again; a /start followed by what
    is no user id, or one the store refuses for good, is answered and confirmed."""
    import asyncio

    import sqlalchemy as sa

    from candlewire.testing import TelegramStandIn
    from gateway.channels.telegram import TelegramChannel
    from gateway.metrics import GatewayMetrics
    from gateway.telegram_sessions import TelegramSessions
    from tests.gateway.conftest import BOT_TOKEN

    class Store:  # SessionStore's calls
        def __init__(self) -> None:
            self.asked: list[str] = []
            self.started: list[str] = []
            self.outage = 1  # the database answers chat 333's first call with an outage

        def linked(self, chat: str, only: str = "") -> list[str]:
            self.asked.append(chat)
            assert "\x00" not in only, "an invalid user id reached the database"
            if chat == "111":  # refused for good, as psycopg2 refuses a NUL
                raise ValueError("A string literal cannot contain NUL (0x00) characters.")
            if chat == "333" and self.outage:
                self.outage -= 1
                raise sa.exc.OperationalError("SELECT", {}, ConnectionRefusedError())
            return ["u" + chat]

        def start(self, chat: str, users: list[str]) -> None:
            self.started.append(chat)

    async def main(telegram: TelegramStandIn) -> tuple[Store, TelegramSessions]:
        ts = TelegramSessions(
            TelegramChannel(BOT_TOKEN, telegram.url, 5),
            None,  # type: ignore[arg-type]
            GatewayMetrics(),
            on_first=lambda _u: None,
            on_last=lambda _u: None,
            poll_s=0,
        )
        store = ts.store = Store()  # type: ignore[assignment]
        ts.protocol.backoff.min_s = ts.protocol.backoff.max_s = 0.01
        telegram.say(111, "/start")
        telegram.say(444, "/start alice\x00")
        telegram.say(333, "/start")
        telegram.say(222, "/start")
        for _ in range(5):  # each poll takes what is pending at once (poll_s=0)
            await ts._poll()
        await ts.channel.close()
        return store, ts

    telegram = TelegramStandIn(BOT_TOKEN)
    try:
        store, ts = asyncio.run(main(telegram))
        assert store.started == ["333", "222"]
        assert store.asked == ["111", "333", "333", "222"]  # only the outage was asked again
        assert telegram.pending == []
    finally:
        telegram.close()
    replies: dict[str, str] = {}
    while not ts.outbox.empty():
        item = ts.outbox.get_nowait()
        replies[item.chat_id] = item.text
    assert "failed" in replies["111"]
    assert "not a user id" in replies["444"]
    assert "events of u333" in replies["333"] and "events of u222" in replies["222"]
    kinds = ts.metrics.telegram_updates.labels
    assert [kinds(k)._value.get() for k in ("failed", "invalid", "start")] == [1, 1, 2]


# -- a real gateway --------------------------------------------------------------------------


def linked_user(gw) -> tuple[str, int]:
    user, chat = new_user(), random.randint(10**8, 10**9)
    gw.directory.set_user(user, telegram_chat_id=str(chat))
    return user, chat


def started(gw, telegram) -> tuple[str, int]:
    """A linked user whose chat has sent /start and been answered: a session is open."""
    user, chat = linked_user(gw)
    telegram.say(chat, "/start")
    wait_for(lambda: texts_with(telegram, chat, "/stop"))
    return user, chat


def texts_with(telegram, chat: int, needle: str) -> list[str]:
    return [t for t in telegram.texts_to(chat) if needle in t]


def test_start_brings_events_to_the_chat_and_stop_ends_it(
    gw_env, telegram, make_gateway, make_publisher
) -> None:
    gw = make_gateway(gw_env, gw_config(telegram))
    pub = make_publisher(gw_env)
    user, chat = linked_user(gw)
    event = user_event(user, ev.INFORMATIONAL)
    assert pub.publish(event) is Route.DROPPED  # no session yet
    telegram.say(chat, "/start")
    wait_for(lambda: pub.watched(user))
    assert wait_for(lambda: texts_with(telegram, chat, "/stop"))  # the bot says how to stop
    event = user_event(user, ev.INFORMATIONAL, payload={"ticker": "SIM:BTC/USDT"})
    assert pub.publish(event) is Route.XPUB
    [text] = wait_for(lambda: texts_with(telegram, chat, event.event_id))
    assert text.startswith("Order filled: SIM:BTC/USDT\n")
    assert telegram.polls[-1]["allowed_updates"] == ["message"]
    wait_for(lambda: not telegram.pending)  # the next poll's offset confirmed the /start

    ws = sign_in(gw_env, user)  # keeps the user's events flowing to this gateway
    telegram.say(chat, "/stop")
    wait_for(lambda: gw.metrics.telegram_updates.labels("stop")._value.get() == 1)
    after = user_event(user, ev.INFORMATIONAL)
    assert pub.publish(after) is Route.XPUB
    assert next_of(ws, "event")["event_id"] == after.event_id
    time.sleep(0.5)
    assert texts_with(telegram, chat, after.event_id) == []  # the browser got it; the chat not
    assert pub.watched(user)  # the browser's subscription outlived the chat's
    ws.close()
    wait_for(lambda: not pub.watched(user))
    assert gw.metrics.telegram_sessions._value.get() == 0
    # 2 replies, 1 event: the /stop reply may still be on its way when the update is counted.
    sent = gw.metrics.telegram_messages.labels("sent")
    wait_for(lambda: sent._value.get() >= 3)
    assert sent._value.get() == 3
    assert len(telegram.texts_to(chat)) == 3 and "stopped" in telegram.texts_to(chat)[-1]


def test_a_chat_nobody_linked_gets_no_session(
    gw_env, telegram, make_gateway, make_publisher
) -> None:
    gw = make_gateway(gw_env, gw_config(telegram))
    pub = make_publisher(gw_env)
    user, _ = linked_user(gw)
    stranger = random.randint(10**8, 10**9)
    telegram.say(stranger, f"/start {user}")  # a deep link naming someone else's account
    [reply] = wait_for(lambda: telegram.texts_to(stranger))
    assert f"id {stranger}" in reply and "not linked" in reply
    assert gw.metrics.telegram_updates.labels("unlinked")._value.get() == 1
    assert not pub.watched(user)
    assert pub.publish(user_event(user, ev.INFORMATIONAL)) is Route.DROPPED
    assert len(gw.telegram.chats) == 0


def test_a_start_with_an_invalid_user_id_is_answered_and_later_commands_are_applied(
    gw_env, telegram, make_gateway, make_publisher
) -> None:
    gw = make_gateway(gw_env, gw_config(telegram))
    pub = make_publisher(gw_env)
    stranger = random.randint(10**8, 10**9)
    telegram.say(stranger, "/start alice\x00")  # PostgreSQL can hold no NUL: refused for good
    user, chat = linked_user(gw)
    telegram.say(chat, "/start")
    wait_for(lambda: pub.watched(user))
    [reply] = wait_for(lambda: telegram.texts_to(stranger))
    assert "not a user id" in reply
    assert gw.metrics.telegram_updates.labels("invalid")._value.get() == 1
    wait_for(lambda: not telegram.pending)


def test_malformed_updates_are_counted_and_the_poller_goes_on(
    gw_env, telegram, make_gateway, make_publisher
) -> None:
    bad = [
        "garbage",
        {"update_id": "x"},
        {"message": "not an object"},
        {"message": {"chat": {}, "text": "/start"}},
        {"message": {"chat": {"id": 1}, "text": 5}},
    ]
    for update in bad:
        telegram.inject(update)
    telegram.inject({"edited_message": {"chat": {"id": 1}, "text": "/start"}})  # not ours
    pub = make_publisher(gw_env)
    gw = make_gateway(gw_env, gw_config(telegram))  # its first poll takes them in one batch
    user, chat = linked_user(gw)
    telegram.say(chat, "/start")
    wait_for(lambda: pub.watched(user))
    event = user_event(user, ev.INFORMATIONAL)
    assert pub.publish(event) is Route.XPUB
    wait_for(lambda: texts_with(telegram, chat, event.event_id))
    wait_for(lambda: not telegram.pending)  # confirmed, garbage included
    assert gw.metrics.telegram_updates.labels("malformed")._value.get() == len(bad)
    assert gw.metrics.telegram_updates.labels("ignored")._value.get() == 1


def test_rate_limits_are_waited_out_on_both_calls(
    gw_env, telegram, make_gateway, make_publisher
) -> None:
    telegram.limit_updates(calls=1, retry_after=1)
    telegram.limit(calls=1, retry_after=1)  # the /start reply is refused once
    pub = make_publisher(gw_env)
    t0 = time.monotonic()
    gw = make_gateway(gw_env, gw_config(telegram))
    user, chat = linked_user(gw)
    telegram.say(chat, "/start")
    wait_for(lambda: pub.watched(user))
    assert time.monotonic() - t0 >= 1.0  # the poller waited retry_after
    event = user_event(user, ev.INFORMATIONAL)
    assert pub.publish(event) is Route.XPUB
    wait_for(lambda: texts_with(telegram, chat, event.event_id))
    assert len(texts_with(telegram, chat, "/stop")) == 1  # the reply, after its 429
    assert telegram.refused == 1
    assert gw.metrics.telegram_polls.labels("rate_limited")._value.get() == 1
    assert gw.metrics.telegram_messages.labels("rate_limited")._value.get() == 1


def test_a_stalled_telegram_never_holds_up_the_fast_path(
    gw_env, telegram, make_gateway, make_publisher
) -> None:
    gw = make_gateway(gw_env, gw_config(telegram, telegram_queue=2))
    pub = make_publisher(gw_env)
    user, chat = started(gw, telegram)
    ws = sign_in(gw_env, user)
    # Long enough that a loaded machine has passed every event to the browser before it ends.
    telegram.limit(calls=1, retry_after=12)
    events = [user_event(user, ev.INFORMATIONAL) for _ in range(10)]
    wait_for(lambda: pub.watched(user))
    assert pub.publish(events[0]) is Route.XPUB
    wait_for(lambda: telegram.refused == 1)  # the sender now waits 12 s
    for event in events[1:]:
        assert pub.publish(event) is Route.XPUB
    assert [next_of(ws, "event")["event_id"] for _ in events] == [e.event_id for e in events]
    # The browser had every event while Telegram still held the first: only the /start
    # reply has reached the chat.
    assert len(telegram.texts_to(chat)) == 1
    assert gw.metrics.telegram_messages.labels("queue_full")._value.get() == 7
    wait_for(lambda: len(telegram.texts_to(chat)) == 4, timeout=40)
    assert [t.rsplit("ref: ", 1)[-1] for t in telegram.texts_to(chat)[1:]] == [
        e.event_id for e in events[:3]
    ]
    ws.close()


def test_a_user_who_blocks_the_bot_ends_the_session(
    gw_env, telegram, make_gateway, make_publisher
) -> None:
    gw = make_gateway(gw_env, gw_config(telegram))
    pub = make_publisher(gw_env)
    user, chat = started(gw, telegram)
    telegram.blocked.add(str(chat))
    wait_for(lambda: pub.watched(user))
    assert pub.publish(user_event(user, ev.INFORMATIONAL)) is Route.XPUB
    wait_for(lambda: not pub.watched(user))
    assert gw.metrics.telegram_messages.labels("blocked")._value.get() == 1
    assert len(gw.telegram.chats) == 0


def test_a_session_outlives_a_gateway_restart_without_replaying_start(
    gw_env, telegram, make_gateway, make_publisher
) -> None:
    first = make_gateway(gw_env, gw_config(telegram))
    pub = make_publisher(gw_env)
    user, chat = started(first, telegram)
    wait_for(lambda: not telegram.pending)
    first.stop()
    wait_for(lambda: not pub.watched(user))
    second = make_gateway(gw_env, gw_config(telegram))
    wait_for(lambda: pub.watched(user))  # restored from PostgreSQL, no new /start
    event = user_event(user, ev.INFORMATIONAL)
    assert pub.publish(event) is Route.XPUB
    wait_for(lambda: texts_with(telegram, chat, event.event_id))
    assert second.metrics.telegram_updates.labels("start")._value.get() == 0
    assert len(texts_with(telegram, chat, "/stop")) == 1  # one confirmation, not two
    assert second.metrics.telegram_sessions._value.get() == 1
