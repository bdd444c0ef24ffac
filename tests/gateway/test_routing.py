"""The spec's routing, end to end: EventPublisher → gateway → WebSocket or Telegram.

Each priority and session state: a browser signed in for the user or not.
"""

from __future__ import annotations

import itertools
import json
import socket
import threading
import time
from decimal import Decimal

import pyarrow as pa
import pytest
from websockets.client import ClientProtocol
from websockets.exceptions import ConnectionClosed
from websockets.protocol import State
from websockets.uri import parse_uri

from candlewire.events import Route
from candlewire.testing import new_user, session_messages, user_event
from gateway import issue_token
from proto import events_pb2 as ev
from tests.gateway.conftest import SECRET, gw_config, next_of, sign_in
from tests.support import counted, wait_for

FALLBACK = [(ev.ACTIVE_SESSION, True), (ev.TELEGRAM, False)]


@pytest.mark.parametrize(
    ("priority", "signed_in", "route", "lands"),
    [
        (ev.INFORMATIONAL, True, Route.XPUB, "session"),
        (ev.INFORMATIONAL, False, Route.DROPPED, None),
        (ev.NORMAL, True, Route.XPUB, "session"),
        (ev.NORMAL, False, Route.DEALER, "telegram"),
        (ev.CRITICAL, True, Route.DEALER, "session"),
        (ev.CRITICAL, False, Route.DEALER, "telegram"),
    ],
)
def test_priority_by_session_state(
    gw_env, telegram, make_gateway, make_publisher, priority, signed_in, route, lands
) -> None:
    gw = make_gateway(gw_env, gw_config(telegram))
    pub = make_publisher(gw_env)
    user = new_user()
    gw.directory.set_user(user, telegram_chat_id="4242")
    ws = sign_in(gw_env, user) if signed_in else None
    if ws is not None:
        wait_for(lambda: pub.watched(user))
    event = user_event(user, priority, FALLBACK)
    assert pub.publish(event) is route
    if lands == "session":
        msg = next_of(ws, "event")
        assert msg["event_id"] == event.event_id
        assert msg["path"] == ("critical" if priority == ev.CRITICAL else "informational")
    elif lands == "telegram":
        wait_for(lambda: telegram.messages)
        assert telegram.messages[0]["chat_id"] == "4242"
        assert event.event_id in telegram.messages[0]["text"]
    if route is Route.DEALER:
        wait_for(lambda: pub.unacked() == 0)
        assert pub.acks == {"DELIVERED": 1}
    if lands != "telegram":
        assert telegram.messages == []
    if ws is not None:
        ws.close()


def test_several_sessions_share_one_subscription_until_the_last_leaves(
    gw_env, make_gateway, make_publisher
) -> None:
    make_gateway(gw_env, gw_config())
    pub = make_publisher(gw_env)
    user = new_user()
    first, second = sign_in(gw_env, user), sign_in(gw_env, user)
    wait_for(lambda: pub.watched(user))
    event = user_event(user, ev.INFORMATIONAL)
    assert pub.publish(event) is Route.XPUB
    assert next_of(first, "event")["event_id"] == event.event_id
    assert next_of(second, "event")["event_id"] == event.event_id
    first.close()
    other = user_event(user, ev.INFORMATIONAL)
    wait_for(lambda: pub.publish(other) is Route.XPUB)  # still watched: one session left
    assert next_of(second, "event")["event_id"] == other.event_id
    second.close()
    wait_for(lambda: not pub.watched(user))
    assert pub.publish(user_event(user, ev.INFORMATIONAL)) is Route.DROPPED


def test_sign_in_needs_a_valid_token(gw_env, make_gateway) -> None:
    from websockets.sync.client import connect

    from gateway import issue_token

    gw = make_gateway(gw_env, gw_config())
    url = f"ws://127.0.0.1:{gw_env.port('gateway_http')}/ws"
    forged = issue_token("another-secret-0123456789", "alice")
    token = issue_token(SECRET, "alice")
    firsts = (
        json.dumps({"op": "auth", "token": forged}),
        "not json",
        '{"op": "chart"}',
        json.dumps({"op": "auth", "token": token, "batch": "yes"}),
        "[" * 5000,  # nested past the parser's depth, well within the size limit
    )
    for first in firsts:
        with connect(url) as ws:
            ws.send(first)
            assert json.loads(ws.recv(timeout=5))["type"] == "error"
            with pytest.raises(ConnectionClosed) as closed:
                ws.recv(timeout=5)
            assert closed.value.rcvd.code == 1008
    assert gw.metrics.auth_failures._value.get() == 5
    assert gw.sessions.users() == 0


def test_a_malformed_command_is_answered_counted_and_the_session_goes_on(
    gw_env, make_gateway
) -> None:
    """Whatever a signed-in page sends, an unknown or unreadable command gets an error and
    is counted; the session stays open."""
    gw = make_gateway(gw_env, gw_config())
    ws = sign_in(gw_env, "alice")
    for command in ("not json", '{"op": 5}', "[" * 5000, "[" * 500 + "]" * 500):
        ws.send(command)
        assert "unknown command" in next_of(ws, "error")["message"]
    ws.send(json.dumps({"op": "ping"}))
    assert next_of(ws, "pong") == {"type": "pong"}
    assert counted(gw.metrics.dropped)[("websocket", "bad_command")] == 4
    ws.close()


def test_a_page_from_another_origin_cannot_open_a_session(gw_env, make_gateway) -> None:
    """A browser sends its page's Origin: another site's page, which could carry the user's
    token, is refused at the handshake; the gateway's own page and non-browsers are not."""
    from websockets.exceptions import InvalidStatus
    from websockets.sync.client import connect

    from gateway import issue_token

    gw = make_gateway(gw_env, gw_config(allowed_origins=["https://desk.example"]))
    port = gw_env.port("gateway_http")
    url, user = f"ws://127.0.0.1:{port}/ws", "alice"
    with pytest.raises(InvalidStatus) as refused:
        connect(url, origin="https://evil.example")  # type: ignore[arg-type]
    assert refused.value.response.status_code == 403
    assert gw.metrics.origin_refused._value.get() == 1
    for origin in (f"http://127.0.0.1:{port}", f"http://localhost:{port}", "https://desk.example"):
        sign_in(gw_env, user, origin=origin).close()
    with connect(url) as ws:  # no Origin: not a browser page
        ws.send(json.dumps({"op": "auth", "token": issue_token(SECRET, user)}))
        assert json.loads(ws.recv(timeout=5))["type"] == "welcome"
    assert gw.metrics.origin_refused._value.get() == 1


def test_a_session_that_floods_the_gateway_is_closed(gw_env, make_gateway) -> None:
    gw = make_gateway(gw_env, gw_config(ws_messages_per_s=5))
    calm, flood = sign_in(gw_env, "calm"), sign_in(gw_env, "flood")
    for _ in range(8):  # within the burst (twice the rate)
        calm.send(json.dumps({"op": "unchart"}))
    with pytest.raises(ConnectionClosed) as closed:
        for _ in range(200):
            flood.send(json.dumps({"op": "unchart"}))
        while True:
            flood.recv(timeout=5)
    assert closed.value.rcvd.code == 1008 and closed.value.rcvd.reason == "too many messages"
    assert gw.metrics.rate_limited._value.get() == 1
    calm.send(json.dumps({"op": "unchart"}))
    assert next_of(calm, "chart")["ticker"] is None  # the calm one goes on
    calm.close()


def stalled_client(port: int, token: str) -> socket.socket:
    """A client that signs in and then never reads: TCP fills, and the gateway must cope."""
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.connect(("127.0.0.1", port))
    proto = ClientProtocol(parse_uri(f"ws://127.0.0.1:{port}/ws"))
    proto.send_request(proto.connect())
    sock.sendall(b"".join(proto.data_to_send()))
    while proto.handshake_exc is None and proto.state is not State.OPEN:
        proto.receive_data(sock.recv(4096))
    proto.send_text(json.dumps({"op": "auth", "token": token}).encode())
    sock.sendall(b"".join(proto.data_to_send()))
    return sock


def test_a_client_that_does_not_read_is_disconnected_not_buffered(
    gw_env, make_gateway, make_publisher
) -> None:
    gw = make_gateway(gw_env, gw_config(session_queue=8))
    pub = make_publisher(gw_env)
    user = new_user()
    reader = sign_in(gw_env, user)
    got: list[str] = []

    def read() -> None:
        for _ in range(200):
            got.append(next_of(reader, "event")["event_id"])

    reading = threading.Thread(target=read)
    reading.start()
    stalled = stalled_client(gw_env.port("gateway_http"), issue_token(SECRET, user))
    wait_for(lambda: pub.watched(user))
    sent = []
    for i in range(200):
        event = user_event(user, ev.INFORMATIONAL, payload={"blob": "x" * 60_000})
        pub.publish(event)
        sent.append(event.event_id)
        # The reader keeps up: never more than 4 behind, half its queue, however busy the
        # machine (a fixed pace let it fall 8 behind on a loaded CI run); the stalled one
        # never reads.
        wait_for(lambda i=i: len(got) >= i - 3, timeout=10, interval=0.001)
    reading.join(30)
    assert got == sent  # the reader lost nothing
    assert gw.metrics.slow_disconnects._value.get() == 1
    assert len(gw.sessions.all()) == 1
    stalled.close()
    assert pub.watched(user)
    reader.close()


def test_an_event_of_a_type_this_build_does_not_know_is_shown_by_its_number(tmp_path) -> None:
    """Enum names come from a table read per event; a newer sender's value is its number."""
    from gateway.sessions import event_message
    from gateway.symbols import SymbolCatalog
    from tests.support import free_settings

    symbols = SymbolCatalog(free_settings(tmp_path))
    known = user_event("u1", ev.INFORMATIONAL, payload={"ticker": "SIM:BTC/USDT"})
    shown = event_message(known, symbols.render(known), "informational")
    assert (shown["event_type"], shown["priority"]) == (
        ev.EventType.Name(known.event_type),
        "INFORMATIONAL",
    )
    newer = user_event("u1", ev.INFORMATIONAL)
    newer.event_type, newer.delivery.priority = 250, 9
    shown = event_message(newer, symbols.render(newer), "informational")
    assert (shown["event_type"], shown["priority"], shown["title"]) == ("250", "9", "250")


def test_a_payload_with_a_lone_surrogate_still_makes_a_message_a_socket_can_send(
    tmp_path,
) -> None:
    """JSON from a browser may hold "\\ud800" (a string cut inside an emoji): the session's
    message carries it escaped, as text UTF-8 can hold, and parses back to the same."""
    from gateway.sessions import event_message, to_json
    from gateway.symbols import SymbolCatalog
    from tests.support import free_settings

    event = user_event("u1", ev.INFORMATIONAL)
    event.payload = b'{"note": "cut \\ud83d", "qty": 1}'
    rendered = SymbolCatalog(free_settings(tmp_path)).render(event)
    text = to_json(event_message(event, rendered, "informational"))
    text.encode()  # what the WebSocket does with a text message: raised before the fix
    assert json.loads(text)["data"] == {"event_id": event.event_id, "note": "cut \ud83d", "qty": 1}


@pytest.mark.parametrize(
    "message",
    [
        {"type": "event", "text": "line\nline", "data": {"i": 1, "f": 0.1, "n": None}},
        {"note": "cut \ud83d", "emoji": "\U0001f600", "quote": '"\\', "nested": [1, [2, {}]]},
        {"big": 10**30, "neg": -1.5e-300, "max": 1.7976931348623157e308, "t": True},
        {"unicode": "é中", "empty": "", "list": [], "key with space": {"k": "v"}},
        {"deep": [json.loads("[" * 20 + "1" + "]" * 20)] * 3, "u64": 2**64 - 1, "i": -(2**63)},
        {"past 255 levels": json.loads("[" * 300 + "]" * 300), "big": -(10**40)},
    ],
)
def test_a_sessions_text_is_strict_json_of_the_same_message(message: dict) -> None:
    """The gateway's encoder (orjson, and json's for what orjson refuses) writes JSON that a
    browser's strict ``JSON.parse`` reads back to the same message: integers past 64 bits
    exact, a lone surrogate escaped, so that the text also encodes to UTF-8 as a socket
    sends it."""
    from gateway.sessions import to_json

    text = to_json(message)
    text.encode()
    assert json.loads(text, parse_constant=_refuse) == json.loads(json.dumps(message))


def _refuse(token: str) -> None:  # JSON.parse: no NaN, Infinity or -Infinity
    raise ValueError(f"not JSON: {token}")


def test_a_number_json_cannot_hold_goes_out_as_null_and_every_frame_parses(tmp_path) -> None:
    """NaN, Infinity and 1e400 in a payload (json.loads reads them as floats) are not JSON:
    written bare, a browser's JSON.parse refuses the frame, a batched session's every
    message in it. They go out as null, as JSON.stringify writes them; the text still says
    what was sent."""
    from gateway.sessions import batch_frames, event_message, to_json
    from gateway.symbols import SymbolCatalog
    from tests.support import free_settings

    def strict(text: str) -> object:  # JSON.parse: no NaN, Infinity or -Infinity
        def refuse(token: str) -> None:
            raise ValueError(f"not JSON: {token}")

        return json.loads(text, parse_constant=refuse)

    symbols = SymbolCatalog(free_settings(tmp_path))
    event = user_event("u1", ev.INFORMATIONAL)
    event.payload = b'{"price": NaN, "qty": 1e400, "fills": [1.5, -Infinity, {"p": NaN}]}'
    text = to_json(event_message(event, symbols.render(event), "informational"))
    shown = strict(text)
    assert shown["data"] == {
        "event_id": event.event_id,
        "price": None,
        "qty": None,
        "fills": [1.5, None, {"p": None}],
    }
    assert "price: nan" in shown["text"] and "qty: inf" in shown["text"]
    pong = to_json({"type": "pong"})
    [frame] = batch_frames([pong, text, pong])
    assert [m["type"] for m in strict(frame)] == ["pong", "event", "pong"]  # type: ignore[union-attr]
    assert to_json({"c": float("nan"), "t": (1, float("inf"))}) == '{"c":null,"t":[1,null]}'


def test_a_payload_no_price_or_parser_can_hold_is_shown_not_raised(tmp_path, monkeypatch) -> None:
    """A price past what a tick size can round (infinite, or too many digits) is shown as
    sent, and JSON nested past the parser's depth is shown as bytes: rendering never raises,
    so one container's event cannot fail the batch it is answered with."""
    from candlewire.symbols import Symbol
    from gateway.symbols import SymbolCatalog
    from tests.support import free_settings

    symbols = SymbolCatalog(free_settings(tmp_path))
    btc = Symbol("SIM:BTC/USDT", "BTC", "USDT", Decimal("0.01"), "TRADING")
    monkeypatch.setattr(symbols, "get", lambda ticker: btc if ticker == btc.ticker else None)
    event = user_event("u1", ev.CRITICAL)
    for price, shown in (("Infinity", "Infinity"), ("1e30", "1E+30"), ("101.239", "101.24")):
        event.payload = f'{{"ticker": "SIM:BTC/USDT", "price": {price}}}'.encode()
        assert f"price: {shown}" in symbols.render(event).text.splitlines()
    event.payload = b"[" * 60_000
    assert symbols.render(event).text == "60000 bytes of payload"


def test_an_event_is_put_in_words_field_by_field(tmp_path, monkeypatch) -> None:
    """The title, the text's lines and the data a browser gets, with a ticker (its prices to
    the tick size, its market named) and without one; the event's own id is the data's
    first key and wins over the payload's."""
    from candlewire.symbols import Symbol
    from gateway.sessions import event_message
    from gateway.symbols import SymbolCatalog
    from tests.support import free_settings

    symbols = SymbolCatalog(free_settings(tmp_path))
    btc = Symbol("SIM:BTC/USDT", "BTC", "USDT", Decimal("0.01"), "TRADING")
    monkeypatch.setattr(symbols, "get", lambda ticker: btc if ticker == btc.ticker else None)
    event = user_event("u1", ev.INFORMATIONAL)
    event.event_type = ev.ORDER_FILLED
    event.payload = b'{"qty": 2, "event_id": "theirs", "note": null, "price": 101.239}'
    shown = event_message(event, symbols.render(event), "informational")
    assert (shown["event_type"], shown["priority"]) == ("ORDER_FILLED", "INFORMATIONAL")
    assert shown["title"] == "Order filled"
    assert (
        shown["text"]
        == f"qty: 2\nevent_id: theirs\nnote: None\nprice: 101.239\nref: {event.event_id}"
    )
    assert list(shown["data"].items()) == [
        ("event_id", event.event_id),
        ("qty", 2),
        ("note", None),
        ("price", 101.239),
    ]
    event.payload = b'{"ticker": "SIM:BTC/USDT", "price": "101.239", "stop": 99}'
    rendered = symbols.render(event)
    assert rendered.title == "Order filled: SIM:BTC/USDT"
    assert rendered.text.splitlines() == [
        "ticker: SIM:BTC/USDT",
        "price: 101.24",
        "stop: 99.00",
        "market: BTC/USDT",
        f"ref: {event.event_id}",
    ]
    event.payload = b'{"ticker": "X:Y/Z", "price": "1.5"}'  # a market it does not know
    assert symbols.render(event).text.splitlines()[1:] == ["price: 1.5", f"ref: {event.event_id}"]


def test_a_message_the_socket_refuses_closes_the_session() -> None:
    """Not a writer that ends while its session looks open and its messages pile up."""
    import asyncio

    from gateway.sessions import Session

    class Refusing:
        closed_with: tuple[int, str] | None = None

        async def send(self, _message: str) -> None:
            raise ValueError("refused")

        async def close(self, code: int, reason: str) -> None:
            self.closed_with = (code, reason)

    ws = Refusing()
    session = Session("u1", ws, 4)  # type: ignore[arg-type]
    assert session.offer({"type": "event"})
    asyncio.run(session.write())
    assert session.closed and ws.closed_with == (1011, "internal error")
    assert not session.offer({"type": "event"})


def test_what_a_session_has_queued_goes_out_in_order_in_few_writes() -> None:
    """A burst queued for a session reaches its browser whole and in order, the frames
    written together rather than one system call each."""
    import asyncio

    from websockets.asyncio.client import connect
    from websockets.asyncio.server import serve

    from gateway.sessions import WRITE_BATCH, Session

    n = 3 * WRITE_BATCH + 7
    writes: list[int] = []

    async def handler(ws) -> None:
        write = ws.transport.write
        ws.transport.write = lambda data: writes.append(len(data)) or write(data)
        session = Session("u1", ws, n)
        for i in range(n):
            assert session.offer({"type": "event", "i": i})
        writer = asyncio.create_task(session.write())
        await ws.wait_closed()
        writer.cancel()

    async def main() -> list[int]:
        async with serve(handler, "127.0.0.1", 0) as server:
            port = server.sockets[0].getsockname()[1]
            async with connect(f"ws://127.0.0.1:{port}") as client:
                return [json.loads(await client.recv())["i"] for _ in range(n)]

    assert asyncio.run(asyncio.wait_for(main(), 30)) == list(range(n))
    assert 0 < len(writes) <= n // WRITE_BATCH + 2, len(writes)


@pytest.mark.parametrize("coalesce_ms", [0.0, 100.0])
def test_events_coming_one_at_a_time_share_a_loop_turn(
    gw_env, make_gateway, make_publisher, coalesce_ms
) -> None:
    """With ``events_coalesce_ms``, events published a few milliseconds apart are taken from
    the SUB together (the gateway's CPU per event at moderate rates); without it, each is
    delivered without waiting for the next. Every event still arrives, in order."""
    gw = make_gateway(gw_env, gw_config(events_coalesce_ms=coalesce_ms))
    pub = make_publisher(gw_env)
    user = new_user()
    ws = sign_in(gw_env, user)
    wait_for(lambda: pub.watched(user))
    taken = gw.metrics.registry.get_sample_value
    turns0 = taken("candlewire_gateway_informational_batch_events_count") or 0.0
    events = [user_event(user, ev.INFORMATIONAL, payload={"i": i}) for i in range(20)]
    got: list[str] = []
    start = time.monotonic()
    for event in events:
        pub.publish(event)
        if coalesce_ms:
            time.sleep(0.003)
        else:
            # The next is published only once this one is delivered: a gateway that held
            # events for company would stall here until next_of's timeout.
            got.append(next_of(ws, "event", timeout=5.0)["event_id"])
    got += [next_of(ws, "event")["event_id"] for _ in events[len(got) :]]
    elapsed = time.monotonic() - start
    assert got == [e.event_id for e in events]
    turns = taken("candlewire_gateway_informational_batch_events_count") - turns0
    assert taken("candlewire_gateway_informational_batch_events_sum") >= len(events)
    if coalesce_ms:
        # A turn holds coalesce_ms before the next, and all were taken between the first
        # publish and the last arrival: normally the first event alone and the rest during
        # its hold, and however slowly a loaded machine published, at most
        # 1 + elapsed / hold turns (one more for slack).
        assert turns < len(events), f"{turns:.0f} loop turns for {len(events)} events"
        limit = 2 + elapsed / (coalesce_ms / 1000)
        assert turns <= limit, f"{turns:.0f} loop turns in {elapsed:.3f} s"
    else:
        assert turns == len(events), f"{turns:.0f} loop turns for 20 events one at a time"
    ws.close()


def test_a_message_to_many_sessions_is_made_text_once(monkeypatch) -> None:
    """A candle goes to every session drawing its chart: each gets the same text, encoded
    once for all of them, and a session too slow to take it is closed and told."""
    import gateway.sessions as sessions_module
    from gateway.sessions import Sessions

    encoded: list[dict] = []
    real = sessions_module.to_json
    monkeypatch.setattr(sessions_module, "to_json", lambda m: encoded.append(m) or real(m))
    slow: list[str] = []
    sessions = Sessions(1, 16, lambda _u: None, lambda _u: None, lambda s: slow.append(s.user_id))
    watchers = [sessions.open(f"u{i}", object()) for i in range(5)]  # type: ignore[arg-type]
    assert all(w is not None for w in watchers)
    candle = {"type": "candle", "ticker": "SIM:BTC/USDT", "close": "101.5"}
    assert sessions.offer_to(watchers, candle) == 5
    assert len(encoded) == 1
    assert {w.outbox.popleft() for w in watchers} == {real(candle)}
    watchers[0].outbox.append("queued")  # its one slot taken: too slow for the next
    assert sessions.offer_to(watchers, candle) == 4
    assert len(encoded) == 2 and slow == ["u0"] and not sessions.active("u0")


def test_a_critical_event_goes_only_to_a_session_that_keeps_up() -> None:
    """A session with half its outbox still to send may fill and be closed, its outbox with
    it: a critical event answered DELIVERED there could be lost. It goes to the user's
    sessions that keep up, else on to its next channel, and the slow one is left open."""
    from gateway.channels import Outcome
    from gateway.directory import UserAddress
    from gateway.sessions import SessionChannel, Sessions
    from gateway.symbols import Rendered

    sessions = Sessions(8, 16, lambda _u: None, lambda _u: None, lambda s: None)
    slow, quick = (sessions.open("u", object()) for _ in range(2))  # type: ignore[arg-type]
    assert slow is not None and quick is not None
    slow.outbox.extend(["queued"] * 4)
    channel = SessionChannel(ev.ACTIVE_SESSION, sessions)
    event = user_event("u", ev.CRITICAL, [(ev.ACTIVE_SESSION, True)])
    rendered = Rendered(event.event_id, "title", "text", {})
    assert channel.send_now(UserAddress("u"), event, rendered).outcome is Outcome.DELIVERED
    assert (len(slow.outbox), len(quick.outbox)) == (4, 1)
    quick.outbox.extend(["queued"] * 3)
    result = channel.send_now(UserAddress("u"), event, rendered)
    assert (result.outcome, result.detail) == (
        Outcome.SKIPPED,
        "no session on this gateway keeps up",
    )
    assert sessions.active("u") and not slow.closed and not quick.closed
    assert sessions.send("u", {"type": "candle"}) == 2  # market data: as before


def test_a_session_too_slow_for_a_reply_or_a_seed_candle_is_closed_like_any_other(
    tmp_path,
) -> None:
    """A session's own offers (a command's reply, a chart's seed candles) follow the
    fanout's slow-consumer rule: the session a full outbox refuses leaves the user's
    sessions, is counted, and its socket is closed with 1013, not left open and unfed."""
    import asyncio

    import zmq

    from gateway.service import Gateway
    from tests.support import free_settings

    class Socket:
        closed_with: tuple[int, str] | None = None

        async def close(self, code: int, reason: str) -> None:
            self.closed_with = (code, reason)

    async def main() -> None:
        gw = Gateway(free_settings(tmp_path), gw_config(session_queue=4), metrics=False)
        gw._events = zmq.Context.instance().socket(zmq.SUB)  # what _watch_user subscribes
        ws = Socket()
        session = gw.sessions.open("alice", ws)  # type: ignore[arg-type]
        assert session is not None
        offered = [session.offer({"type": "candle", "seed": True, "i": i}) for i in range(6)]
        assert offered == [True] * 4 + [False] * 2
        await asyncio.gather(*asyncio.all_tasks() - {asyncio.current_task()})  # the close
        assert ws.closed_with == (1013, "too slow")
        assert gw.metrics.slow_disconnects._value.get() == 1
        assert not gw.sessions.active("alice") and "alice" not in gw._watching
        gw._events.close(0)

    asyncio.run(main())


def test_batch_frames_hold_the_messages_in_order_within_their_bound() -> None:
    """A batched session's frames: consecutive messages as one JSON array up to the bound, a
    message alone (or one past the bound) as itself, nothing lost or reordered."""
    import random

    from gateway.sessions import batch_frames, to_json

    rng = random.Random(7)
    for _ in range(200):
        messages = [
            {
                "type": "event",
                "i": i,
                "text": rng.choice("xé中\U0001f600") * rng.choice((0, 10, 300, 5000)),
            }
            for i in range(rng.randint(1, 60))
        ]
        limit = rng.choice((64, 1000, 20_000))
        frames = batch_frames([to_json(m) for m in messages], limit)
        assert [m for f in frames for m in session_messages(f)] == messages
        for frame in frames:
            if frame.startswith("["):  # the bound is in bytes, as the socket sends them
                assert len(frame.encode()) <= limit + 1 and len(json.loads(frame)) > 1
            else:
                assert isinstance(json.loads(frame), dict)
        # Two neighbouring frames could not have been one.
        for a, b in itertools.pairwise(frames):
            first_of_b = to_json(session_messages(b)[0]).encode()
            assert len(a.encode()) + len(first_of_b) + 2 > limit


def test_a_batched_session_gets_what_is_queued_in_few_frames_and_a_plain_one_a_frame_each() -> None:
    """The same burst to a session that asked for batches and one that did not: both get
    every message in order; the batched one in arrays of several (a message past the frame
    bound alone), the other a frame a message, as before."""
    import asyncio

    from websockets.asyncio.client import connect
    from websockets.asyncio.server import serve

    from gateway.sessions import BATCH_FRAME_BYTES, WRITE_BATCH, Session

    n = 2 * WRITE_BATCH + 5
    messages = [{"type": "event", "i": i} for i in range(n)]
    messages[100]["text"] = "y" * BATCH_FRAME_BYTES  # past the bound: a frame of its own

    def run(batched: bool) -> list[str]:
        async def handler(ws) -> None:
            session = Session("u1", ws, n, batched)
            for m in messages:
                assert session.offer(m)
            writer = asyncio.create_task(session.write())
            await ws.wait_closed()
            writer.cancel()

        async def main() -> list[str]:
            async with serve(handler, "127.0.0.1", 0, max_size=None) as server:
                port = server.sockets[0].getsockname()[1]
                async with connect(f"ws://127.0.0.1:{port}", max_size=None) as client:
                    frames: list[str] = []
                    while sum(len(session_messages(f)) for f in frames) < n:
                        frames.append(await client.recv())
                    return frames

        return asyncio.run(asyncio.wait_for(main(), 30))

    batched, plain = run(True), run(False)
    for frames in (batched, plain):
        assert [m for f in frames for m in session_messages(f)] == messages
    assert len(plain) == n and not any(f.startswith("[") for f in plain)
    assert len(batched) <= n // WRITE_BATCH + 4, len(batched)
    assert any(json.loads(f) == messages[100] for f in batched)


def test_a_batched_session_gets_every_event_in_order_through_the_gateway(
    gw_env, make_gateway, make_publisher
) -> None:
    """End to end: a session signed in with ``"batch": true`` (as the gateway's page does)
    gets the welcome alone, then every event published, in order, from its frames."""
    make_gateway(gw_env, gw_config())
    pub = make_publisher(gw_env)
    user = new_user()
    ws = sign_in(gw_env, user, batch=True)  # asserts the welcome came alone
    wait_for(lambda: pub.watched(user))
    events = [user_event(user, ev.INFORMATIONAL, payload={"i": i}) for i in range(2000)]
    for event in events:
        assert pub.publish(event) is Route.XPUB
    got: list[str] = []
    while len(got) < len(events):
        got += [m["event_id"] for m in session_messages(ws.recv(timeout=10))]
    assert got == [e.event_id for e in events]
    ws.close()


def test_a_payload_parses_as_json_loads_parses_it() -> None:
    """The gateway's parse of an event's payload gives what ``json.loads`` gives, the same
    object or the same kind of error, whatever the bytes."""
    import random

    from gateway.symbols import payload_json

    corpus = [
        b'{"i": 12345}',
        b'{"i": 1} ',
        b'{"i": 1}\n',
        b'{"i": 1} x',
        b'{"i": 1}{"j": 2}',
        b'{"big": 123456789012345678901234567890, "f": 1e400, "n": NaN, "m": -Infinity}',
        b'{"note": "cut \\ud83d", "e": "\xc3\xa9", "u": "\\u00e9"}',
        b'{"bad": "\xff"}',
        b'{"ctl": "a\x01b"}',
        b"{",
        b"{}",
        b"{\x00",
        '{"i": 1}'.encode("utf-16-le"),
        '{"i": 1}'.encode("utf-8-sig"),
        '{"i": 1}'.encode("utf-32"),
        b' {"i": 1}',
        b"[1, 2]",
        b'"text"',
        b"{" * 100 + b"}" * 100,
        b'{"a": 1, "a": 2}',
        # flat, where orjson reads it: integers at and past 64 bits, floats as large
        b'{"u": 18446744073709551615, "v": 18446744073709551616}',
        b'{"m": -9223372036854775808, "n": -9223372036854775809}',
        b'{"f": 1e19, "g": 9223372036854775808.0, "h": -0.0, "s": "x"}',
    ]
    rng = random.Random(11)
    alphabet = b'{}[]":,0123456789.eE-+ \n\tabcfnrstu\\\x00\xc3\xa9\xff'
    corpus += [
        b"{" + bytes(rng.choice(alphabet) for _ in range(rng.randint(0, 12))) for _ in range(3000)
    ]

    def value(depth: int) -> object:
        kind = rng.randrange(7 if depth < 3 else 4)
        if kind == 0:
            return rng.randint(-(10**20), 10**20)
        if kind == 1:
            return rng.uniform(-1e6, 1e6)
        if kind == 2:
            return "".join(
                rng.choice('ab\u00e9\u4e2d\n"\\\ud83d') for _ in range(rng.randint(0, 6))
            )
        if kind == 3:
            return rng.choice([None, True, False])
        if kind in (4, 5):
            return {f"k{i}": value(depth + 1) for i in range(rng.randint(0, 4))}
        return [value(depth + 1) for _ in range(rng.randint(0, 4))]

    for _ in range(500):
        obj = {f"k{i}": value(0) for i in range(rng.randint(1, 5))}
        seps = rng.choice([(",", ":"), (", ", ": ")])
        text = json.dumps(obj, separators=seps, ensure_ascii=rng.random() < 0.5)
        corpus.append(text.encode("utf-8", "surrogatepass"))

    def outcome(parse, payload: bytes) -> tuple[str, str]:
        try:
            return "ok", repr(parse(payload))
        except Exception as exc:  # the kind of error is what must agree
            return "error", type(exc).__name__

    for payload in corpus:
        assert outcome(payload_json, payload) == outcome(json.loads, payload), payload


def test_an_event_the_fast_path_cannot_send_is_dropped_and_the_rest_still_flow(
    tmp_path,
) -> None:
    """A payload nested just under the parser's depth is read by render() and then nested
    past the encoder's (the message holds it two levels deeper): that one event is dropped
    and counted, and the fast path, which serves every user, goes on to deliver the next."""
    import asyncio
    import sys

    import zmq

    from candlewire.topics import user_topic
    from gateway.service import Gateway
    from proto.envelope import encode_topic
    from tests.support import free_settings

    class Quiet:  # no Telegram chats in session
        def deliver(self, _user: str, _rendered: object) -> int:
            return 0

    async def main() -> None:
        gw = Gateway(free_settings(tmp_path), gw_config(session_queue=1024), metrics=False)
        ctx = zmq.Context.instance()
        pub = ctx.socket(zmq.XPUB)  # tells when the gateway's subscriptions have arrived
        pub.bind(f"inproc://events-{id(gw)}")
        gw._events = ctx.socket(zmq.SUB)
        gw._events.connect(f"inproc://events-{id(gw)}")
        gw.telegram = Quiet()  # type: ignore[assignment]
        alice = gw.sessions.open("alice", object())  # type: ignore[arg-type]
        bob = gw.sessions.open("bob", object())  # type: ignore[arg-type]
        assert alice is not None and bob is not None
        assert {pub.recv(), pub.recv()} == {
            b"\x01" + user_topic(u).encode() for u in ("alice", "bob")
        }
        task = asyncio.create_task(gw._informational())

        def publish(user: str, payload: bytes) -> str:
            event = user_event(user, ev.INFORMATIONAL)
            event.payload = payload
            pub.send_multipart(encode_topic(user_topic(user), event))
            return event.event_id

        # Every depth up to the limit: the one where parsing passes and encoding fails lies
        # among them, wherever this test's own stack leaves the task.
        limit = sys.getrecursionlimit()
        for depth in range(limit - 400, limit):
            publish("alice", b'{"a": ' + b"[" * depth + b"]" * depth + b"}")
        after = publish("bob", b'{"ticker": "SIM:BTC/USDT"}')
        while not task.done() and not any(after in text for text in bob.outbox):
            await asyncio.sleep(0.01)
        assert not task.done(), task.exception()
        assert counted(gw.metrics.dropped)[("user_events", "too_deep")] >= 1
        task.cancel()
        pub.close(0)
        gw._events.close(0)

    asyncio.run(asyncio.wait_for(main(), 60))


def test_a_gateway_whose_main_task_fails_stops_and_says_so(
    gw_env, make_gateway, monkeypatch, caplog
) -> None:
    """Not a gateway left half alive: a main task ended by an error is logged as critical,
    and the gateway stops on it (``run()`` then exits with an error)."""
    from gateway.service import Gateway

    async def failing(self: Gateway) -> None:
        raise RuntimeError("the purge broke")

    monkeypatch.setattr(Gateway, "_purge", failing)
    gw = make_gateway(gw_env, gw_config())
    gw._thread.join(30)
    assert not gw._thread.is_alive()
    assert isinstance(gw._error, RuntimeError)
    assert isinstance(gw._error.__cause__, RuntimeError)
    assert str(gw._error.__cause__) == "the purge broke"
    assert gw.metrics.up._value.get() == 0
    assert any(
        r.levelname == "CRITICAL" and "the purge broke" in r.getMessage() for r in caplog.records
    )


def test_charts_seeds_are_one_a_session_and_a_few_read_at_once(tmp_path, monkeypatch) -> None:
    """A session may chart 20 times a second: each chart cancels its last seed, and at most
    SEED_READS reads of Iceberg run at once for all sessions (each holds a worker thread,
    and the default executor's queue has no bound). The last chart's seed is offered."""
    import asyncio

    import zmq

    import candlewire.history
    from gateway import service
    from gateway.service import Gateway
    from tests.support import free_settings

    running, most, lock = [0], [0], threading.Lock()
    read: list[str] = []

    def slow_read(_settings, ticker, *_args) -> pa.Table:
        with lock:
            running[0] += 1
            most[0] = max(most[0], running[0])
        time.sleep(0.2)
        with lock:
            running[0] -= 1
            read.append(ticker)
        return pa.table({"x": pa.array([], pa.int64())})

    monkeypatch.setattr(candlewire.history, "read_history", slow_read)

    class Socket:
        async def close(self, code: int, reason: str) -> None:
            pass

    async def main() -> None:
        gw = Gateway(free_settings(tmp_path), gw_config(), metrics=False)
        gw._seed_slots = asyncio.Semaphore(service.SEED_READS)
        ctx = zmq.Context.instance()
        gw._events, gw._market = ctx.socket(zmq.SUB), ctx.socket(zmq.SUB)
        gw.symbols.check_chart = lambda ticker, period: None  # type: ignore[method-assign]
        sessions = [gw.sessions.open(f"u{i}", Socket()) for i in range(4)]  # type: ignore[arg-type]
        for n in range(10):  # each session charts ten tickers, one after another
            for i, session in enumerate(sessions):
                assert session is not None
                gw._command(session, json.dumps({"op": "chart", "ticker": f"V:T{n}/S{i}"}))
            await asyncio.sleep(0.01)
        while pending := [t for t in gw._seeding.values() if not t.done()]:
            await asyncio.gather(*pending, return_exceptions=True)
        gw._events.close(0)
        gw._market.close(0)

    asyncio.run(main())
    assert most[0] <= service.SEED_READS
    assert {f"V:T9/S{i}" for i in range(4)} <= set(read)  # every session's last chart
    assert len(read) < 4 * 10 / 2, read  # not every chart's: the rest were cancelled waiting
