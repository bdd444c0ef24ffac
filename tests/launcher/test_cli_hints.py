"""What the CLI says when a first step goes nowhere: ``watch`` hearing nothing names where it
listens and what to check, instead of waiting in silence."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

import launcher.cli as cli
from candlewire.config import Settings
from candlewire.testing import this_tree
from tests.support import free_settings, secured_settings

# ``candlewire watch`` as run from a shell, its notice due after 0.2 s rather than 15.
WATCH = "import launcher.cli as c, sys; c.WATCH_SILENCE_S = 0.2; c.main(sys.argv[1:])"


def watched_in_silence(settings: Settings) -> str:
    """Standard error of ``watch`` against a relay that is not there, until its notice."""
    env = {**os.environ, **settings.to_env(), **this_tree()}
    proc = subprocess.Popen(
        [sys.executable, "-c", WATCH, "watch", "SIM:BTC/USDT"],
        env=env,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stderr is not None
        said = proc.stderr.readline()  # the notice is one line, after any log lines
        while said and not said.startswith("nothing in"):
            said = proc.stderr.readline()
        time.sleep(0.3)
        assert proc.poll() is None, "it says so and goes on waiting"
        return said
    finally:
        proc.kill()
        proc.wait()


def test_watch_with_nothing_coming_says_where_it_listens(tmp_path) -> None:
    plain = free_settings(tmp_path / "plain")
    said = watched_in_silence(plain)
    assert said.startswith("nothing in 0 s from " + plain.relays("market_data")[0])
    assert "CURVE off: no keys in" in said and "`candlewire status`" in said
    assert "Waiting on." in said
    assert "CURVE on, keys from" in watched_in_silence(secured_settings(tmp_path / "secured"))


def test_the_notice_is_not_said_once_a_message_came(
    tmp_path, capsys: pytest.CaptureFixture[str]
) -> None:
    timer = cli._silence_notice(free_settings(tmp_path), after_s=0.1)
    timer.cancel()
    time.sleep(0.3)
    assert capsys.readouterr().err == ""


@pytest.mark.parametrize(
    ("env", "says"),
    [
        (
            {"CANDLEWIRE_PORTS__MARKET_DATA": "abc"},
            "ports.market_data (CANDLEWIRE_PORTS__MARKET_DATA, or candlewire.toml): ",
        ),
        ({"CANDLEWIRE_STREAM_DEDUP_HORIZON_S": "1"}, "stream_dedup_horizon_s (1.0) must be"),
    ],
)
def test_settings_that_do_not_load_are_one_line_naming_the_setting(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], env: dict, says: str
) -> None:
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    assert cli.main(["endpoints"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: the settings: ") and says in err and err.count("\n") == 1


def test_a_settings_file_that_is_not_toml_is_named(
    tmp_path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = tmp_path / "candlewire.toml"
    bad.write_text("x = = 1\n")
    monkeypatch.setenv("CANDLEWIRE_CONFIG", str(bad))
    assert cli.main(["endpoints"]) == 2
    assert capsys.readouterr().err.startswith(f"error: the settings: {bad} is not valid TOML")


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["watch", "BTCUSDT"], "ticker 'BTCUSDT' is not EXCHANGE:BASE/QUOTE"),
        (["watch", "SIM:BTC/USDT", "--type", "candles"], "data type 'candles'"),
        (
            [
                "history",
                "SIM:BTC/USDT",
                "--period",
                "61",
                "--start",
                "2024-01-01",
                "--end",
                "2024-01-02",
            ],
            "period 61 is not one of",
        ),
    ],
)
def test_what_names_no_data_is_one_line_at_once(
    tmp_path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    argv: list[str],
    says: str,
) -> None:
    """Not a wait for ever (``watch``), nor the catalog's traceback (``history``); nor
    ``watch``'s notice of silence, later, for a subscription that never began."""
    for name, value in free_settings(tmp_path).to_env().items():
        monkeypatch.setenv(name, value)
    monkeypatch.setattr(cli, "WATCH_SILENCE_S", 0.1)
    assert cli.main(argv) == 1
    time.sleep(0.3)
    err = capsys.readouterr().err
    assert err.startswith("error: ") and says in err and err.count("\n") == 1


def test_status_of_a_stack_that_is_not_running_says_so_without_waiting_on_it(
    tmp_path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """No listening for ingestors through a relay that is not there, nor a read of a broker
    that is not there (whose client logged a line a retry to standard error)."""
    settings = free_settings(tmp_path)
    for name, value in settings.to_env().items():
        monkeypatch.setenv(name, value)
    assert cli.main(["status"]) == 1
    out, err = capsys.readouterr()
    said = " ".join(out.split())  # the console folds long lines to its width
    assert f"nothing of the stack runs from {settings.state_dir.resolve()}" in said
    assert "live ingestor" not in said and "gaps" not in said and err == ""


@pytest.mark.parametrize(("command", "rc"), [("status", 1), ("down", 0)])
def test_status_or_down_where_no_stack_was_made_makes_nothing(
    tmp_path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    command: str,
    rc: int,
) -> None:
    """Run outside a checkout, neither leaves a state dir (with secrets) behind."""
    state = tmp_path / ".candlewire"
    for name, value in free_settings(state).to_env().items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("COLUMNS", "1000")  # a long path is not folded mid-word
    assert cli.main([command]) == rc
    said = " ".join(capsys.readouterr().out.split())
    assert f"nothing of the stack runs from {state.resolve()}: there is no state there" in said
    assert not state.exists()
