"""JVM class archives (``candlewire.runtime``): used when present, and never a reason for a
JVM not to start."""

from __future__ import annotations

import subprocess

import pytest

from candlewire.runtime import archive_options, dump_options, publish_archive


def test_no_archive_means_no_options(tmp_path) -> None:
    assert archive_options(tmp_path / "driver.jsa") == ()


def test_a_dump_is_published_only_once_the_jvm_wrote_it(tmp_path) -> None:
    archive = tmp_path / "driver.jsa"
    with pytest.raises(RuntimeError, match="wrote no class archive"):
        publish_archive(archive)
    assert not archive.exists()
    dumped = dump_options(archive)[-1].split("=", 1)[1]
    assert dumped == str(tmp_path / "driver.part")
    (tmp_path / "driver.part").write_bytes(b"classes")
    publish_archive(archive)
    assert archive.read_bytes() == b"classes" and not (tmp_path / "driver.part").exists()
    assert archive_options(archive)[-1] == f"-XX:SharedArchiveFile={archive}"


def test_a_jvm_starts_with_an_archive_it_cannot_use_and_says_nothing(tmp_path) -> None:
    archive = tmp_path / "stale.jsa"
    archive.write_bytes(b"not an archive" * 1000)
    out = subprocess.run(
        ["java", *archive_options(archive), "-version"], capture_output=True, text=True
    )
    assert out.returncode == 0
    assert "archive" not in (out.stdout + out.stderr).lower()
