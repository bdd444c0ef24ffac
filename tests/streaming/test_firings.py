"""CEP triggers fired by the real stream job on crafted ticks: each kind, its near-miss, once,
cooldown, removal, and a kill -9 between the crossing and its commit."""

from __future__ import annotations

import os
import re
import signal
import time
import uuid
from pathlib import Path

import pytest
import sqlalchemy as sa
from aiosmtpd.controller import Controller
from confluent_kafka import Producer

from candlewire import Client, TriggerRefused, condition
from candlewire.kafka import TICKS, producer_config
from candlewire.testing import list_symbols, new_user
from gateway import Gateway
from proto import cep_pb2 as cep
from proto import market_pb2
from proto.envelope import to_record
from streaming.progress import Progress
from tests.gateway.conftest import gw_config, next_of, sign_in
from tests.gateway.test_channels import Inbox
from tests.support import RUNNING, free_port, start_job, wait_for

S = 1_000_000_000


def produce(settings, ticker: str, ticks: list[tuple[int, str, str]]) -> tuple[int, int]:
    """The ticks in the ticks topic; the (partition, offset) of the last."""
    producer, last = Producer(producer_config(settings)), []

    def delivered(err, msg) -> None:
        assert err is None, err
        last[:] = [msg.partition(), msg.offset()]

    for i, (t_ns, price, size) in enumerate(ticks):
        tick = market_pb2.Tick(
            ticker=ticker,
            trade_id=f"{t_ns}-{i}",
            price=price,
            size=size,
            side=market_pb2.BUY,
            exchange_time_ns=t_ns,
        )
        producer.produce(
            TICKS.name, key=ticker.encode(), value=to_record(tick), on_delivery=delivered
        )
    assert producer.flush(30) == 0
    return last[0], last[1]


def add(client: Client, ticker: str, name: str, cond, **kw) -> str:
    """Register, waiting out the desk's symbol reload (at most every 5 s) for new tickers."""
    trigger_id = f"{client.client_id}-{name}"

    def accepted() -> bool:
        try:
            client.add_trigger(ticker, cond, trigger_id=trigger_id, **kw)
        except TriggerRefused as exc:
            assert exc.reason == "UNKNOWN_TICKER", exc
            return False
        return True

    wait_for(accepted, timeout=30, interval=1.0)
    return trigger_id


def firings(client: Client, quiet_s: float = 6.0, timeout: float = 90.0) -> list:
    """Firings until none came for ``quiet_s`` (after the first, or ``timeout``)."""
    out, deadline = [], time.monotonic() + timeout
    while time.monotonic() < deadline:
        event = client.next_firing(timeout=quiet_s if out else 1.0)
        if event is not None:
            out.append(event)
        elif out:
            break
    return out


@pytest.fixture(scope="module")
def tickers(live_pipeline):
    names = [f"CEPT:{uuid.uuid4().hex[:6].upper()}{i}/USDT" for i in range(8)]
    list_symbols(live_pipeline, names)
    return names


def minute_aligned_past() -> int:
    """An hour ago, on a minute: the feed replays the past, so triggers go by event time."""
    return (int(time.time()) - 3600) // 60 * 60 * S


def test_each_kind_fires_and_its_near_miss_does_not(live_pipeline, tickers) -> None:
    ticker, t0 = tickers[0], minute_aligned_past()
    with Client(live_pipeline, client_id=f"k-{uuid.uuid4().hex[:6]}") as client:
        up, down = "up", "down"
        ids = {
            "cross": ("price_cross", {"level": "100", "direction": up}),
            "cross_miss": ("price_cross", {"level": "99.98", "direction": down}),  # a tick short
            "pct": ("percent_move", {"percent": "3", "window_s": 300, "direction": up}),
            "pct_miss": ("percent_move", {"percent": "3", "window_s": 299, "direction": up}),
            "vol": ("window_volume", {"volume": "12", "window_s": 60}),
            "vol_miss": ("window_volume", {"volume": "12.001", "window_s": 60}),
            "close": ("candle_close", {"period_s": 60, "level": "103", "direction": up}),
            "close_miss": ("candle_close", {"period_s": 60, "level": "103.01", "direction": up}),
            "breakout": ("range_breakout", {"period_s": 60, "candles": 2, "direction": up}),
            "breakout_miss": ("range_breakout", {"period_s": 60, "candles": 2, "direction": down}),
        }
        names = {add(client, ticker, n, condition(k, **p)): n for n, (k, p) in ids.items()}
        # Minute 0 ends at 100.2 with a high of 100.5; minutes 1-4 close at 100.3, 100.4, 100.6
        # (above the two before: the breakout), 100.8; minute 5 closes at 103. The low 99.99
        # is 299 s before the 103: inside a 300 s window, outside a 299 s one.
        ticks = [
            (0, "100", "1"),
            (10, "99.99", "1"),
            (20, "100.01", "1"),
            (30, "100.5", "7"),
            (40, "100.2", "2"),
            (90, "100.3", "1"),
            (150, "100.4", "1"),
            (210, "100.6", "1"),
            (270, "100.8", "1"),
            (309, "103", "1"),
            (400, "101", "1"),  # the clock passes 370 s: minute 5 closes
        ]
        produce(live_pipeline, ticker, [(t0 + s * S, p, q) for s, p, q in ticks])
        got = firings(client)
    fired = {names[e.trigger_id]: e for e in got}
    assert sorted(fired) == ["breakout", "close", "cross", "pct", "vol"], [
        (names[e.trigger_id], e.value) for e in got
    ]
    at = {n: (e.event_time_ms * 1_000_000 - t0) // S for n, e in fired.items()}
    assert at == {"cross": 20, "vol": 40, "breakout": 240, "pct": 309, "close": 360}
    assert (fired["cross"].value, fired["cross"].reference) == ("100.01", "100")
    assert (fired["vol"].value, fired["close"].value, fired["breakout"].value) == (
        "12",
        "103",
        "100.6",
    )
    assert fired["pct"].reference == "99.99" and fired["pct"].value.startswith("3.0103")
    assert all(e.firing == 1 and e.ticker == ticker for e in got)


def run_of(settings) -> str:
    return (Path(settings.checkpoints()) / "ticks.run-id").read_text().strip()


def recorded(settings, ticker: str, price: str) -> bool:
    """The triggers' last record has the ticker's last trade at ``price``: the state a
    restart restores holds the ticker's trades so far."""
    record = Progress(settings).last_cep(run_of(settings))
    feeds = [] if record is None else cep.CepState.FromString(record.state).feeds
    return any(f.ticker == ticker and f.last_price == price for f in feeds)


def zigzag(t0: int, n: int) -> list[tuple[int, str, str]]:
    """Crossing 100 upwards every 20 s."""
    return [(t0 + i * 10 * S, "99" if i % 2 == 0 else "101", "1") for i in range(n)]


def test_once_cooldown_and_removal(live_pipeline, tickers) -> None:
    ticker, t0 = tickers[1], minute_aligned_past()
    cross = condition("price_cross", level="100", direction="up")
    with Client(live_pipeline, client_id=f"o-{uuid.uuid4().hex[:6]}") as client:
        once = add(client, ticker, "once", cross)
        rearm = add(client, ticker, "rearm", cross, once=False, cooldown_s=45)
        removed = add(client, ticker, "removed", cross, once=False)
        client.remove_trigger(removed)
        produce(live_pipeline, ticker, zigzag(t0, 14))
        got = firings(client)
        by = {
            tid: [
                (e.firing, (e.event_time_ms * 1_000_000 - t0) // S)
                for e in got
                if e.trigger_id == tid
            ]
            for tid in (once, rearm, removed)
        }
        assert by == {once: [(1, 10)], rearm: [(1, 10), (2, 70), (3, 130)], removed: []}
        # The one-shot trigger is gone from the registry once it fired.
        wait_for(lambda: [t.trigger_id for t in client.list_triggers()] == [rearm], timeout=15)
        # Added again under its id, it is a new registration: its firing 1 is not a repeat.
        client.add_trigger(ticker, cross, trigger_id=once)
        produce(live_pipeline, ticker, zigzag(t0 + 3600 * S, 2))
        again = [(e.trigger_id, e.firing) for e in firings(client) if e.trigger_id == once]
        assert again == [(once, 1)]


def test_a_one_shot_added_again_the_moment_it_fired_is_armed(live_pipeline, tickers) -> None:
    """Its owner hears of the firing and registers it again at once, before the desk reads
    the registry again: a new registration, listed and firing from 1, not taken for a
    retry of the one that fired and then removed with it."""
    ticker, t0 = tickers[6], minute_aligned_past()
    cross = condition("price_cross", level="100", direction="up")
    with Client(live_pipeline, client_id=f"r-{uuid.uuid4().hex[:6]}") as client:
        once = add(client, ticker, "once", cross)
        first = client.list_triggers()[0].registered_ms
        produce(live_pipeline, ticker, zigzag(t0, 2))
        fired = client.next_firing(timeout=90)
        assert fired is not None and (fired.trigger_id, fired.firing) == (once, 1)
        client.add_trigger(ticker, cross, trigger_id=once)
        time.sleep(3)  # past the desk's reading of the registry (every 2 s)
        listed = client.list_triggers()
        assert [t.trigger_id for t in listed] == [once] and listed[0].registered_ms > first
        produce(live_pipeline, ticker, zigzag(t0 + 3600 * S, 2))
        again = [(e.trigger_id, e.firing, e.registered_ms) for e in firings(client)]
        assert again == [(once, 1, listed[0].registered_ms)]


def test_a_firing_crosses_a_kill_9_exactly_once(live_pipeline, tickers) -> None:
    """The crossing reaches Kafka, the job dies before it can evaluate it; the restarted job
    restores the state before it (the trade below the level) and the firing arrives once."""
    ticker, t0 = tickers[2], minute_aligned_past()
    with Client(live_pipeline, client_id=f"x-{uuid.uuid4().hex[:6]}") as client:
        trigger_id = add(
            client, ticker, "x", condition("price_cross", level="100", direction="up"), once=False
        )
        produce(live_pipeline, ticker, [(t0, "99", "1")])
        wait_for(lambda: recorded(live_pipeline, ticker, "99"), timeout=90, interval=0.5)
        job = RUNNING.pop()
        os.kill(job.pid, signal.SIGSTOP)  # the driver cannot commit what comes next
        produce(live_pipeline, ticker, [(t0 + S, "101", "1")])
        os.kill(job.pid, signal.SIGKILL)
        job.wait(60)
        got_before = client.next_firing(timeout=0.5)
        RUNNING.append(start_job(live_pipeline))
        got = ([got_before] if got_before else []) + firings(client, quiet_s=8.0)
    assert [(e.trigger_id, e.firing, e.value) for e in got] == [(trigger_id, 1, "101")]


def test_a_critical_alert_for_a_user_without_a_session_reaches_email(
    live_pipeline, tickers
) -> None:
    """The firing becomes the user's ALERT_TRIGGERED event on the gateway's acked path; with
    no session open, email (a real SMTP server) carries it."""
    ticker, t0 = tickers[3], minute_aligned_past()
    inbox, port = Inbox(), free_port()
    smtpd = Controller(inbox, hostname="127.0.0.1", port=port)
    smtpd.start()
    config = gw_config(smtp_host="127.0.0.1", smtp_port=port, smtp_starttls=False)
    gateway = Gateway(live_pipeline, config, metrics=False).start()
    try:
        user = new_user()
        gateway.directory.set_user(user, email=f"{user}@example.test")
        with Client(live_pipeline, client_id=f"a-{uuid.uuid4().hex[:6]}") as client:
            trigger_id = add(
                client,
                ticker,
                "alert",
                condition("price_cross", level="100", direction="up"),
                user_id=user,
                critical=True,
            )
            produce(live_pipeline, ticker, [(t0, "99", "1"), (t0 + S, "101", "1")])
            wait_for(lambda: len(inbox.mail) >= 1, timeout=90, interval=0.5)
        time.sleep(2)  # a second copy would have come by now
        assert len(inbox.mail) == 1
        _tls, to, mail = inbox.mail[0]
        assert to == [f"{user}@example.test"]
        text = mail.get_body(("plain",)).get_content()
        assert f"trigger_id: {trigger_id}" in text and "value: 101" in text, text
        assert ticker in mail["Subject"], mail["Subject"]
    finally:
        gateway.stop()
        smtpd.stop()


def test_an_alert_for_a_user_with_a_session_shows_on_the_live_page(live_pipeline, tickers) -> None:
    """A trigger that is not critical: its alert goes the informational path, from the job's
    own XPUB through the gateway to the user's open WebSocket session, once."""
    ticker, t0 = tickers[4], minute_aligned_past()
    gateway = Gateway(live_pipeline, gw_config(), metrics=False).start()
    user = new_user()
    ws = sign_in(live_pipeline, user)
    try:
        with Client(live_pipeline, client_id=f"s-{uuid.uuid4().hex[:6]}") as client:
            trigger_id = add(
                client,
                ticker,
                "page",
                condition("price_cross", level="100", direction="up"),
                user_id=user,
            )
            # Informational events go only where someone watches: the gateway's SUB must be
            # connected to the job's XPUB, and its subscription to the user's topic follow.
            wait_for(lambda: gateway_watches(live_pipeline), timeout=10)
            time.sleep(1.0)
            produce(live_pipeline, ticker, [(t0, "99", "1"), (t0 + S, "101", "1")])
            shown = next_of(ws, "event", timeout=60)
        assert shown["event_type"] == "ALERT_TRIGGERED" and shown["priority"] == "INFORMATIONAL"
        # One firing of one registration: the desk's time of it, the firing's number, then
        # the time the evaluator's line of states began (the module's job started afresh).
        assert re.fullmatch(rf"cep:{trigger_id}:\d{{13}}:1:\d{{13}}", shown["event_id"])
        assert shown["data"]["ticker"] == ticker and shown["data"]["value"] == "101"
        with pytest.raises(TimeoutError):
            next_of(ws, "event", timeout=4)  # not twice
    finally:
        ws.close()
        gateway.stop()


def gateway_watches(settings) -> bool:
    """Whether a connection to the job's alert XPUB (stream_events) is established."""
    port = f"{settings.port('stream_events'):04X}"
    with open("/proc/net/tcp") as f:
        rows = [line.split() for line in f.readlines()[1:]]
    return any(r[2].endswith(f":{port}") and r[3] == "01" for r in rows)


def restart(settings, engine: str) -> None:
    """The module's job stopped as an operator stops it, and started on ``engine``."""
    job = RUNNING.pop()
    job.terminate()
    job.wait(120)
    RUNNING.append(start_job(settings.model_copy(update={"stream_live_engine": engine})))


@pytest.mark.long
def test_each_engine_goes_on_from_the_other_ones_record(live_pipeline, tickers) -> None:
    """The real-time engine evaluates in the JVM, the micro-batch one in a query of its own;
    both record the same state (proto/cep.proto's CepState), so a job restarted on the other
    engine numbers the next firing on, and fires nothing twice."""
    ticker, times = tickers[5], []
    with Client(live_pipeline, client_id=f"e-{uuid.uuid4().hex[:6]}") as client:
        trigger_id = add(
            client, ticker, "e", condition("price_cross", level="100", direction="up"), once=False
        )
        got, engine = [], "realtime"
        try:
            for n, then in enumerate(["microbatch", "realtime", None]):
                # Each round an hour behind now: the feed's idle marks moved its clock on
                # meanwhile, as far as wall time went, and older trades would be late.
                t, price = (time.time_ns() - 3600 * S) // S * S, str(101 + n)
                times.append(t + S)
                produce(live_pipeline, ticker, [(t, "99", "1"), (t + S, price, "1")])
                got += firings(client)
                if then is not None:  # recorded (SIGTERM records too, this is sooner)
                    wait_for(lambda: recorded(live_pipeline, ticker, price), timeout=60)  # noqa: B023
                    restart(live_pipeline, then)
                    engine = then
        finally:
            if engine != "realtime":
                restart(live_pipeline, "realtime")
    assert [(e.trigger_id, e.firing, e.event_time_ms, e.value) for e in got] == [
        (trigger_id, n + 1, t // 1_000_000, str(101 + n)) for n, t in enumerate(times)
    ]
    assert len({e.evaluator_started_ms for e in got}) == 1  # one line, across both engines


def committed_past(settings, partition: int, offset: int) -> bool:
    """The committing query's record stands past ``offset``: a restart reads on from there."""
    last = Progress(settings).last_candles(run_of(settings))
    return last is not None and last.offsets.get(partition, 0) > offset


def test_a_start_with_no_record_numbers_its_firings_as_a_line_of_their_own(
    live_pipeline, tickers
) -> None:
    """The triggers' record lost (a new checkpoint, or a record another release cannot read):
    the restarted job takes the triggers from the registry and numbers their firings from 1
    again, under the same registration. They are a line of their own, so the client (and the
    gateways, by the alert's id) take them for new firings, not for repeats of the first."""
    ticker, got = tickers[7], []
    with Client(live_pipeline, client_id=f"l-{uuid.uuid4().hex[:6]}") as client:
        trigger_id = add(
            client, ticker, "l", condition("price_cross", level="100", direction="up"), once=False
        )
        for price in ("101", "102"):
            t = (time.time_ns() - 3600 * S) // S * S  # an hour ago: no idle mark made it late
            crossing = produce(live_pipeline, ticker, [(t, "99", "1"), (t + S, price, "1")])
            got += firings(client)
            if price == "101":
                # Committed past the crossing, so the restart does not evaluate it again.
                wait_for(lambda: committed_past(live_pipeline, *crossing), timeout=90)  # noqa: B023
                job = RUNNING.pop()
                job.terminate()
                job.wait(120)
                with Progress(live_pipeline).engine.begin() as conn:
                    conn.execute(
                        sa.text("DELETE FROM cw_cep_commits WHERE run = :r"),
                        {"r": run_of(live_pipeline)},
                    )
                RUNNING.append(start_job(live_pipeline))
    assert [(e.trigger_id, e.firing, e.value) for e in got] == [
        (trigger_id, 1, "101"),
        (trigger_id, 1, "102"),
    ]
    first, second = got
    assert second.registered_ms == first.registered_ms
    assert second.evaluator_started_ms > first.evaluator_started_ms > 0
    # The new line was recorded: a restart now goes on from it, its firing ids the same.
    record = Progress(live_pipeline).last_cep(run_of(live_pipeline))
    assert record is not None
    assert cep.CepState.FromString(record.state).started_ms == second.evaluator_started_ms


def test_a_start_with_no_record_judges_only_what_comes_after_it(live_pipeline, tickers) -> None:
    """With their state lost, the registry's triggers start at the ticks topic's end, as if
    registered then: judging the topic's past again (all of it, after a new checkpoint)
    would send its old firings again, to users who had them."""
    from types import SimpleNamespace

    from streaming.firings import FiringDesk

    partition, offset = produce(live_pipeline, tickers[7], [(minute_aligned_past(), "99", "1")])
    no_record = SimpleNamespace(last_cep=lambda run: None)
    desk = FiringDesk.__new__(FiringDesk)
    desk.ctx, desk.run_id = SimpleNamespace(settings=live_pipeline, progress=no_record), "new"
    state, _, offsets = desk.restore()
    assert offsets[partition] > offset
    assert dict(cep.CepState.FromString(state).offsets) == offsets


def test_an_alerts_event_id_names_the_registration() -> None:
    """A trigger added again under its id fires from 1 again: its alert is another event."""
    from streaming.firings import firing_event_id

    def firing(registered_ms: int, line: int = 0) -> cep.CEPTriggerEvent:
        return cep.CEPTriggerEvent(
            trigger_id="t", firing=1, registered_ms=registered_ms, evaluator_started_ms=line
        )

    assert firing_event_id(firing(1_000)) == "cep:t:1000:1"
    assert firing_event_id(firing(2_000)) == "cep:t:2000:1"
    # A restart with no record of the triggers' state numbers from 1 again, in a new line.
    assert firing_event_id(firing(2_000, 7)) == "cep:t:2000:1:7"
