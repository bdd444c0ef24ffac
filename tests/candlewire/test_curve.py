"""Keys and the allow-list: what ``candlewire keys`` makes, with safe permissions, and the
file ``keys export`` writes for a client in another language."""

from __future__ import annotations

import json
import stat

import pytest
import zmq
import zmq.utils.monitor

from candlewire.config import Settings
from candlewire.curve import (
    CHANNEL_ENDPOINTS,
    CHANNELS,
    EXPORT_FORMAT,
    SERVERS,
    SERVICE_KEYS,
    Keyring,
    Peer,
)
from launcher.cli import main
from relay import Relay
from tests.support import secured_settings


def test_keys_init_add_client_and_ls(tmp_path, monkeypatch, capsys) -> None:
    monkeypatch.chdir(tmp_path)
    assert main(["keys", "init"]) == 0
    assert main(["keys", "add-client", "carol-box", "--role", "container", "--user", "carol"]) == 0
    assert main(["keys", "add-client", "bob-box", "--role", "container"]) == 2
    assert "bound to one user" in capsys.readouterr().err
    keys = tmp_path / ".candlewire" / "keys"
    assert stat.S_IMODE(keys.stat().st_mode) == 0o700
    assert all(stat.S_IMODE(p.stat().st_mode) == 0o600 for p in keys.iterdir())
    names = {p.name.removesuffix(".key_secret") for p in keys.glob("*.key_secret")}
    assert names == {*SERVERS, *SERVICE_KEYS, "carol-box"}
    allowed = json.loads((keys / "allowed.json").read_text())
    assert sorted(p["name"] for p in allowed.values()) == sorted([*SERVICE_KEYS, "carol-box"])
    assert main(["keys", "init"]) == 0  # again: nothing new, nothing lost
    assert "0 key pairs made" in capsys.readouterr().out
    assert json.loads((keys / "allowed.json").read_text()) == allowed
    # A settings object for this dir now has CURVE on, unless told otherwise.
    assert Settings().security.curve is True
    assert Settings(security={"curve": False}).security.curve is False


def test_a_client_key_keeps_its_name_role_and_user(tmp_path) -> None:
    ring = Keyring(Settings(state_dir=tmp_path))
    ring.add_client("alice", "client")
    ring.add_client("alice", "container", user="alice")  # re-added: one entry, the new role
    peers = [p for p in ring.allowed().values() if p.name == "alice"]
    assert peers == [Peer("container", "alice", "alice")]
    assert Peer.parse(peers[0].user_id()) == peers[0]
    for bad in ("a.b", "a/b", "", "relay"):
        with pytest.raises(ValueError):
            ring.add_client(bad, "client")
    with pytest.raises(ValueError, match="role"):
        ring.add_client("x", "admin")


def handshake(sock: zmq.Socket, endpoint: str) -> bool:
    """Whether a CURVE handshake with ``endpoint`` succeeds (the ZAP handler said yes)."""
    mon = sock.get_monitor_socket(
        zmq.EVENT_HANDSHAKE_SUCCEEDED
        | zmq.EVENT_HANDSHAKE_FAILED_AUTH
        | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL
        | zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL
    )
    sock.connect(endpoint)
    try:
        assert mon.poll(10_000), "no handshake event"
        event = zmq.utils.monitor.recv_monitor_message(mon)["event"]
    finally:
        sock.disable_monitor()
        mon.close(linger=0)
        sock.close(linger=0)
    return event == zmq.EVENT_HANDSHAKE_SUCCEEDED


def test_keys_export_is_one_0600_file_a_client_elsewhere_can_use(
    tmp_path, monkeypatch, capsys, ctx
) -> None:
    settings = secured_settings(tmp_path)
    for key, value in settings.to_env().items():
        monkeypatch.setenv(key, value)
    assert main(["keys", "add-client", "alice", "--role", "client"]) == 0
    path = tmp_path / "alice.json"
    path.write_text("{}")
    path.chmod(0o644)  # a file that was there: it is narrowed too
    assert main(["keys", "export", "alice", "--output", str(path)]) == 0
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert "relay's public key and 3 endpoints" in capsys.readouterr().err
    conf = json.loads(path.read_text())
    ring = Keyring(settings)
    assert (conf["format"], conf["name"], conf["role"], conf["curve"]) == (
        EXPORT_FORMAT,
        "alice",
        "client",
        True,
    )
    assert zmq.curve_public(conf["secret_key"].encode()) == conf["public_key"].encode()
    assert conf["relay_public_key"] == ring.public("relay").decode()
    endpoints = conf["endpoints"]
    assert set(endpoints) == {"client_requests", "market_data", "journal"}  # a client's
    assert endpoints["market_data"]["connect"] == [settings.connect("market_data")]
    assert endpoints["journal"]["server_key"] == ring.public("journal").decode()
    # As a client in another language would: a plain socket, set from the file alone.
    relay = Relay(settings, metrics=False).start()
    try:
        market = endpoints["market_data"]
        sock = ctx.socket(zmq.SUB)
        sock.curve_publickey = conf["public_key"].encode()
        sock.curve_secretkey = conf["secret_key"].encode()
        sock.curve_serverkey = market["server_key"].encode()
        assert handshake(sock, market["connect"][0])
    finally:
        relay.stop()
    # A container binds its events socket where the stack's own services bind: 127.0.0.1
    # unless bind_host says otherwise, never every interface.
    assert main(["keys", "add-client", "box", "--role", "container", "--user", "bob"]) == 0
    assert main(["keys", "export", "box", "--output", str(tmp_path / "box.json")]) == 0
    events = json.loads((tmp_path / "box.json").read_text())["endpoints"]["user_events"]
    assert events["bind"] == f"tcp://127.0.0.1:{settings.port('user_events')}"
    out = tmp_path / "box-lan.json"
    assert main(["keys", "export", "box", "--bind-host", "10.0.0.7", "--output", str(out)]) == 0
    lan = json.loads(out.read_text())["endpoints"]["user_events"]["bind"]
    assert lan == f"tcp://10.0.0.7:{settings.port('user_events')}"  # for gateways elsewhere
    assert main(["keys", "export", "relay"]) == 2  # a server's secret stays with it
    assert main(["keys", "export", "nobody"]) == 2
    assert "keys add-client nobody" in capsys.readouterr().err
    assert main(["keys", "ls"]) == 0
    listed = capsys.readouterr().out.splitlines()
    assert f"{'relay':<16} {'server':<10} {'-':<12} {conf['relay_public_key']}" in listed
    assert any(line.startswith("alice ") and conf["public_key"] in line for line in listed)


def test_every_channel_has_an_endpoint_to_export() -> None:
    assert set(CHANNEL_ENDPOINTS) == set(CHANNELS)
    assert {server for server, _ in CHANNEL_ENDPOINTS.values()} == set(SERVERS)
