"""Settings from a TOML file, a variable over the file, an argument over both; and the
nested ``[ingest.replay]`` reaching the services a launcher starts."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from candlewire.config import Settings


@pytest.fixture
def toml(tmp_path, monkeypatch) -> Path:
    path = tmp_path / "candlewire.toml"
    path.write_text(
        'stream_watermark_s = 5.0\n\n[ingest.replay]\nroot = "/data/vision"\nclock = "live"\n'
    )
    monkeypatch.setenv("CANDLEWIRE_CONFIG", str(path))
    for name in ("CANDLEWIRE_INGEST__REPLAY__ROOT", "CANDLEWIRE_STREAM_WATERMARK_S"):
        monkeypatch.delenv(name, raising=False)
    return path


def test_the_file_sets_flat_and_nested_settings(toml) -> None:
    s = Settings()
    assert s.stream_watermark_s == 5.0
    assert (s.ingest.replay.root, s.ingest.replay.clock) == (Path("/data/vision"), "live")
    assert s.ingest.replay.speed == 1.0  # not in the file: the default


def test_a_variable_overrides_the_file_and_an_argument_both(toml, monkeypatch) -> None:
    monkeypatch.setenv("CANDLEWIRE_INGEST__REPLAY__ROOT", "/elsewhere")
    assert Settings().ingest.replay.root == Path("/elsewhere")
    assert Settings(stream_watermark_s=7.0).stream_watermark_s == 7.0


def test_child_processes_get_the_replay_settings(toml, monkeypatch) -> None:
    env = Settings().to_env()
    assert env["CANDLEWIRE_INGEST__REPLAY__ROOT"] == "/data/vision"
    assert env["CANDLEWIRE_INGEST__REPLAY__CLOCK"] == "live"
    monkeypatch.delenv("CANDLEWIRE_CONFIG")
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    assert Settings().ingest.replay.root == Path("/data/vision")


def test_a_bad_value_in_the_file_is_a_clear_error(toml) -> None:
    toml.write_text('[ingest.replay]\nclock = "yesterday"\n')
    with pytest.raises(ValidationError, match=r"ingest\.replay\.clock"):
        Settings()


def test_no_file_means_the_defaults(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("CANDLEWIRE_CONFIG", str(tmp_path / "absent.toml"))
    assert Settings().ingest.replay.root is None


def test_a_command_inside_the_checkout_finds_its_state_and_file(tmp_path, monkeypatch) -> None:
    """Like git with ``.git``: a command run in any folder below the checkout's top (where
    ``pyproject.toml`` is) uses the checkout's ``.candlewire`` and ``candlewire.toml``, not
    new ones where it stands; the nearest wins; outside a checkout nothing is searched."""
    for name in ("CANDLEWIRE_CONFIG", "CANDLEWIRE_STATE_DIR", "CANDLEWIRE_STREAM_WATERMARK_S"):
        monkeypatch.delenv(name, raising=False)
    checkout = tmp_path / "checkout"
    deep = checkout / "docs" / "how-to"
    deep.mkdir(parents=True)
    (checkout / "pyproject.toml").write_text("")
    monkeypatch.chdir(deep)  # a fresh clone: `candlewire up` makes its state at the top
    assert Settings().state_dir.resolve() == (checkout / ".candlewire").resolve()
    (checkout / ".candlewire").mkdir()
    (checkout / "candlewire.toml").write_text("stream_watermark_s = 9.0\n")
    s = Settings()
    assert s.state_dir.resolve() == (checkout / ".candlewire").resolve()
    assert s.stream_watermark_s == 9.0
    (checkout / "docs" / ".candlewire").mkdir()  # nearer
    assert Settings().state_dir.resolve() == (checkout / "docs" / ".candlewire").resolve()
    monkeypatch.chdir(checkout)  # at the top: the same, spelled relative as before
    assert Settings().state_dir == Path(".candlewire")
    # Outside a checkout, a .candlewire above is not this stack's: a new state here.
    (tmp_path / ".candlewire").mkdir()
    elsewhere = tmp_path / "elsewhere" / "sub"
    elsewhere.mkdir(parents=True)
    monkeypatch.chdir(elsewhere)
    assert Settings().state_dir == Path(".candlewire")
    assert Settings().stream_watermark_s != 9.0


def test_book_appends_follow_the_ticks_interval_unless_set_and_reach_the_job(tmp_path) -> None:
    """The books query commits on ``stream_books_trigger_s``, else on the ticks' interval,
    and a job started as a child process gets the setting."""
    from types import SimpleNamespace

    from streaming.queries.books import BooksQuery

    def books(settings: Settings) -> BooksQuery:
        tables = SimpleNamespace(last_stamped_batch=lambda *_: -1)
        return BooksQuery(SimpleNamespace(settings=settings, tables=tables))

    plain = Settings(state_dir=tmp_path, stream_ticks_trigger_s=7.0)
    assert books(plain).trigger_s == 7.0
    assert "CANDLEWIRE_STREAM_BOOKS_TRIGGER_S" not in plain.to_env()
    own = plain.model_copy(update={"stream_books_trigger_s": 3.0})
    assert books(own).trigger_s == 3.0
    assert own.to_env()["CANDLEWIRE_STREAM_BOOKS_TRIGGER_S"] == "3.0"
    with pytest.raises(ValidationError, match="stream_books_trigger_s"):
        Settings(stream_books_trigger_s=0)
