"""Trigger registration through the real relay to the real stream job's desk, durable in
Kafka across restarts of both."""

from __future__ import annotations

import asyncio
import json
import re
import signal
import uuid

import pytest

from candlewire import AsyncClient, Client, RequestRejected, TriggerRefused, condition
from proto import cep_pb2 as cep
from proto import requests_pb2 as rq
from proto.envelope import VERSION_FRAME
from relay import Relay
from tests.support import RELAYS, RUNNING, counted, relay_call, relay_frames, start_job, wait_for

CROSS = condition("price_cross", level="31000", direction="up")


@pytest.fixture(scope="module")
def pipeline(live_pipeline):
    with Client(live_pipeline) as client:
        client.refresh_metadata("SIM", timeout=120)  # the desk checks tickers against it
    return live_pipeline


def client_of(settings) -> Client:
    return Client(settings, client_id=f"c-{uuid.uuid4().hex[:8]}")


def test_add_list_remove_and_the_reasons_for_refusal(pipeline) -> None:
    with client_of(pipeline) as client, client_of(pipeline) as other:
        ack = client.add_trigger("SIM:BTC/USDT", CROSS, trigger_id=f"{client.client_id}-a")
        assert ack.accepted and ack.trigger_id == f"{client.client_id}-a"
        client.add_trigger(
            "SIM:ETH/USDT",
            condition("percent_move", percent="3", window_s=300, direction="either"),
            trigger_id=f"{client.client_id}-b",
            once=False,
            cooldown_s=60,
            critical=True,
            user_id="alice",
        )
        listed = client.list_triggers()
        assert [t.trigger_id for t in listed] == [f"{client.client_id}-a", f"{client.client_id}-b"]
        assert listed[1].percent_move.window_s == 300 and listed[1].critical
        assert other.list_triggers() == []
        # The same registration again (a retry) is accepted and stored once.
        client.add_trigger("SIM:BTC/USDT", CROSS, trigger_id=f"{client.client_id}-a")
        assert len(client.list_triggers()) == 2

        def refused(call) -> str:
            with pytest.raises(TriggerRefused) as err:
                call()
            return err.value.reason

        other_cond = condition("price_cross", level="1", direction="down")
        assert (
            refused(
                lambda: client.add_trigger(
                    "SIM:BTC/USDT", other_cond, trigger_id=f"{client.client_id}-a"
                )
            )
            == "DUPLICATE_TRIGGER"
        )
        # Ids are one namespace: another client's is taken, and said so without its condition.
        with pytest.raises(TriggerRefused, match="is in use: choose another id") as err:
            other.add_trigger("SIM:BTC/USDT", other_cond, trigger_id=f"{client.client_id}-a")
        assert err.value.reason == "DUPLICATE_TRIGGER"
        assert refused(lambda: client.add_trigger("SIM:NOPE/USDT", CROSS)) == "UNKNOWN_TICKER"
        assert refused(lambda: other.remove_trigger(f"{client.client_id}-a")) == "NO_SUCH_TRIGGER"
        client.remove_trigger(f"{client.client_id}-a")
        assert [t.trigger_id for t in client.list_triggers()] == [f"{client.client_id}-b"]
        assert refused(lambda: client.remove_trigger(f"{client.client_id}-a")) == "NO_SUCH_TRIGGER"


def test_the_relay_refuses_what_is_wrong_on_its_face_and_counts_malformed_frames(
    pipeline,
) -> None:
    bad = cep.CEPTriggerRequest(
        trigger_id="t",
        client_id="c",
        ticker="SIM:BTC/USDT",
        action=cep.ADD,
        once=True,
        price_cross=cep.PriceCross(level="-5", direction=cep.UP),
    )
    resp = relay_call(pipeline, bad)
    assert resp.status == rq.SUBMIT_REJECTED and resp.reason == rq.BAD_TRIGGER_REQUEST
    assert "above 0" in resp.error_message
    relay = RELAYS[-1]
    before = counted(relay.metrics.rejections).get(("malformed",), 0)
    resp = relay_frames(pipeline, [VERSION_FRAME, bytes([cep_type()]) + b"\xff\xff\xff"])
    assert resp.reason == rq.MALFORMED
    assert counted(relay.metrics.rejections)[("malformed",)] == before + 1
    with client_of(pipeline) as client:  # and the relay serves on
        client.add_trigger("SIM:SOL/USDT", CROSS)


def cep_type() -> int:
    from proto.envelope_pb2 import CEP_TRIGGER_REQUEST

    return CEP_TRIGGER_REQUEST


def test_triggers_survive_restarts_of_the_relay_and_the_job(pipeline) -> None:
    """The relay keeps nothing, the job's desk reads the registry back from Kafka; the job
    comes back with a limit of 3 triggers per owner, which the 4th one meets."""
    client_id = f"c-{uuid.uuid4().hex[:8]}"
    with Client(pipeline, client_id=client_id) as client:
        for i in range(3):
            client.add_trigger("SIM:BTC/USDT", CROSS, trigger_id=f"{client_id}-{i}")
        client.remove_trigger(f"{client_id}-1")

    RELAYS[-1].stop()
    RELAYS.append(Relay(pipeline, metrics=False).start())
    job = RUNNING.pop()
    job.send_signal(signal.SIGKILL)
    job.wait(60)
    # With no desk, a registration is refused at once, as retryable.
    wait_for(lambda: "cep" not in RELAYS[-1]._served, timeout=30)
    with pytest.raises(RequestRejected) as err, client_of(pipeline) as client:
        client._core.submit_timeout = 10.0  # refused at once; the margin is for a loaded CI
        client.add_trigger("SIM:BTC/USDT", CROSS)
    assert err.value.reason == "NO_TRIGGER_DESK" and err.value.retryable
    limited = pipeline.model_copy(update={"cep_max_triggers_per_owner": 3})
    RUNNING.append(start_job(limited))

    async def listed() -> list[str]:
        async with AsyncClient(pipeline, client_id=client_id) as aclient:
            return [t.trigger_id for t in await aclient.list_triggers()]

    try:
        assert asyncio.run(listed()) == [f"{client_id}-0", f"{client_id}-2"]
        with Client(pipeline, client_id=client_id) as client:
            client.add_trigger("SIM:ETH/USDT", CROSS, trigger_id=f"{client_id}-3")
            with pytest.raises(TriggerRefused) as err:
                client.add_trigger("SIM:ETH/USDT", CROSS, trigger_id=f"{client_id}-4")
            assert err.value.reason == "OVER_LIMIT"
    finally:  # the module's job again, without the limit
        job = RUNNING.pop()
        job.terminate()
        job.wait(120)
        RUNNING.append(start_job(pipeline))


def test_the_cli_adds_lists_and_removes(pipeline, capsys, monkeypatch) -> None:
    from launcher.cli import main

    for name, value in pipeline.to_env().items():  # the CLI reads its settings from there
        monkeypatch.setenv(name, value)
    client_id = f"cli-{uuid.uuid4().hex[:8]}"
    base = ["trigger", "--client-id", client_id]
    add = ["add", "SIM:BTC/USDT", "percent_move", "--percent", "3", "--window", "300"]
    assert main([*base, *add, "--direction", "either", "--rearm", "60", "--id", "p1"]) == 0
    assert "trigger p1 registered" in capsys.readouterr().out
    assert main([*base, "ls"]) == 0
    assert re.search(r"p1 .+ moves 3 % within 300 s .+ again after 60 s", capsys.readouterr().out)
    assert main([*base, "ls", "--format", "json"]) == 0
    listed = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [(t["triggerId"], t["percentMove"]["windowS"], t["cooldownS"]) for t in listed] == [
        ("p1", 300, 60)
    ]
    assert main([*base, "rm", "p1"]) == 0
    assert main([*base, "rm", "p1"]) == 1  # refused: one line on stderr, no traceback
    assert "NO_SUCH_TRIGGER" in capsys.readouterr().err
    with pytest.raises(SystemExit):  # argparse refuses it, with usage
        main([*base, *add, "--direction", "sideways"])
