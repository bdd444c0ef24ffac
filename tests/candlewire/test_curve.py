"""Keys and the allow-list: what ``candlewire keys`` makes, with safe permissions."""

from __future__ import annotations

import json
import stat

import pytest

from candlewire.config import Settings
from candlewire.curve import SERVERS, SERVICE_KEYS, Keyring, Peer
from launcher.cli import main


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
