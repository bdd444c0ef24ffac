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
