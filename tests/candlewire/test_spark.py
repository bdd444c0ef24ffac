"""Spark with the platform's session factory: Kafka in, Iceberg out, pyiceberg alongside."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import uuid

import pyarrow as pa
import pytest

from candlewire.config import Settings
from candlewire.lake import catalog
from candlewire.spark import build_session, class_archive, spark_conf
from candlewire.testing import maps_file
from tests.candlewire.test_kafka import new_topic, produce

NS = "sparktest"


@pytest.fixture(scope="module")
def spark(lakehouse, kafka):
    session = build_session(lakehouse, "candlewire-tests")
    session.sql(f"CREATE NAMESPACE IF NOT EXISTS {lakehouse.catalog_name}.{NS}")
    yield session
    session.stop()


def test_the_driver_maps_the_class_archive_make_install_dumped(lakehouse, spark) -> None:
    """Its classes come from the archive (``candlewire.runtime``), not loaded again."""
    archive = class_archive(lakehouse)
    assert archive.is_file(), f"no {archive}: `make install` dumps it"
    assert maps_file(spark.sparkContext._gateway.proc.pid, archive)


def new_table(settings, spark) -> tuple[str, str]:
    """(Spark name, pyiceberg identifier) of a fresh table of Kafka coordinates."""
    name = f"t_{uuid.uuid4().hex[:8]}"
    full = f"{settings.catalog_name}.{NS}.{name}"
    spark.sql(f"CREATE TABLE {full} (k STRING, v STRING, part INT, off BIGINT) USING iceberg")
    return full, f"{NS}.{name}"


def kafka_frame(spark, settings, topic: str, stream: bool = False):
    reader = spark.readStream if stream else spark.read
    return (
        reader.format("kafka")
        .option("kafka.bootstrap.servers", settings.kafka_servers())
        .option("subscribe", topic)
        .option("startingOffsets", "earliest")
        .load()
        .selectExpr(
            "CAST(key AS STRING) k", "CAST(value AS STRING) v", "partition part", "offset off"
        )
    )


def test_batch_read_from_kafka_into_iceberg_and_pyiceberg_reads_it(lakehouse, spark) -> None:
    topic = new_topic(lakehouse)
    produce(lakehouse, topic, [f"row{i}".encode() for i in range(300)])
    full, ident = new_table(lakehouse, spark)
    kafka_frame(spark, lakehouse, topic).writeTo(full).append()
    assert spark.table(full).count() == 300
    # pyiceberg reads the table while the Spark session is still open.
    rows = catalog(lakehouse).load_table(ident).scan().to_arrow()
    assert sorted(rows["v"].to_pylist()) == sorted(f"row{i}" for i in range(300))


def test_streaming_read_from_kafka_resumes_from_checkpoint(lakehouse, spark, tmp_path) -> None:
    topic = new_topic(lakehouse)
    full, ident = new_table(lakehouse, spark)

    def run_once() -> None:
        query = (
            kafka_frame(spark, lakehouse, topic, stream=True)
            .writeStream.format("iceberg")
            .option("checkpointLocation", str(tmp_path / "ckpt"))
            .trigger(availableNow=True)
            .toTable(full)
        )
        query.awaitTermination(120)
        assert query.exception() is None

    produce(lakehouse, topic, [f"a{i}".encode() for i in range(100)])
    run_once()
    produce(lakehouse, topic, [f"b{i}".encode() for i in range(50)])
    run_once()
    values = catalog(lakehouse).load_table(ident).scan().to_arrow()["v"].to_pylist()
    assert len(values) == 150 and len(set(values)) == 150


def test_pyiceberg_append_is_seen_by_open_spark_session(lakehouse, spark) -> None:
    full, ident = new_table(lakehouse, spark)
    spark.sql(f"INSERT INTO {full} VALUES ('spark', 'x', 0, 1)")
    table = catalog(lakehouse).load_table(ident)
    table.append(
        pa.table(
            {
                "k": ["py"],
                "v": ["y"],
                "part": pa.array([1], pa.int32()),
                "off": pa.array([2], pa.int64()),
            }
        )
    )
    spark.sql(f"REFRESH TABLE {full}")
    assert sorted(r.k for r in spark.table(full).collect()) == ["py", "spark"]


CONCURRENT_APP = textwrap.dedent(
    """
    import sys
    from candlewire.config import Settings
    from candlewire.spark import build_session
    table, tag = sys.argv[1], sys.argv[2]
    spark = build_session(Settings(), f"writer-{tag}")
    for i in range(5):
        spark.sql(f"INSERT INTO {table} VALUES ('{tag}', '{i}', 0, {i})")
    spark.stop()
    """
)


def test_two_spark_applications_commit_concurrently(lakehouse, spark, tmp_path) -> None:
    full, ident = new_table(lakehouse, spark)
    script = tmp_path / "writer.py"
    script.write_text(CONCURRENT_APP)
    env = {**os.environ, **lakehouse.to_env()}
    procs = [
        subprocess.Popen(
            [sys.executable, str(script), full, tag], env=env, stderr=subprocess.PIPE, text=True
        )
        for tag in ("one", "two")
    ]
    errors = [p.communicate(timeout=240)[1] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], "\n".join(e[-3000:] for e in errors)
    rows = catalog(lakehouse).load_table(ident).scan().to_arrow()
    assert sorted(zip(rows["k"].to_pylist(), rows["v"].to_pylist(), strict=True)) == sorted(
        (tag, str(i)) for tag in ("one", "two") for i in range(5)
    )


FILES_APP = textwrap.dedent(
    """
    import sys
    from pathlib import Path
    from candlewire.config import Settings
    from candlewire.spark import build_session, one_stateful_batch
    table, checkpoint, ran = sys.argv[1:]
    spark = build_session(Settings(), "files")
    Path(ran).unlink(missing_ok=True)  # Spark's start marks its jars executable, once
    spark.sql(f"INSERT INTO {table} VALUES ('k', 'v', 0, 1)")
    query = one_stateful_batch(spark, checkpoint)
    assert query.exception() is None, query.exception()
    spark.stop()
    """
)


def test_the_jvm_writes_tables_and_checkpoints_without_starting_a_program(
    lakehouse, spark, tmp_path
) -> None:
    """Hadoop's local file system ran ``chmod`` for every file it made and ``readlink`` for
    every checkpoint rename (``LocalFiles``): here each is a stand-in that writes down that it
    ran, first on the PATH of a driver that inserts into Iceberg and runs a stateful query."""
    full, ident = new_table(lakehouse, spark)
    bin_dir, ran = tmp_path / "bin", tmp_path / "ran"
    bin_dir.mkdir()
    for program in ("chmod", "readlink", "stat"):
        stand_in = bin_dir / program
        stand_in.write_text(
            f'#!/bin/sh\necho {program} "$@" >> {ran}\nexec /usr/bin/{program} "$@"\n'
        )
        stand_in.chmod(0o755)
    script = tmp_path / "files.py"
    script.write_text(FILES_APP)
    env = {**os.environ, **lakehouse.to_env(), "PATH": f"{bin_dir}:{os.environ['PATH']}"}
    done = subprocess.run(
        [sys.executable, str(script), full, str(tmp_path / "checkpoint"), str(ran)],
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert not ran.exists(), ran.read_text()[:2000]
    # The modes are Hadoop's defaults under its umask of 022, set without the program.
    data = catalog(lakehouse).load_table(ident).inspect.files()["file_path"].to_pylist()
    path = data[0].removeprefix("file:")
    assert (os.stat(path).st_mode & 0o777, os.stat(os.path.dirname(path)).st_mode & 0o777) == (
        0o644,
        0o755,
    )
    assert sorted((tmp_path / "checkpoint").iterdir())  # the query wrote its checkpoint


def test_only_local_checkpoints_leave_sparks_own_checkpoint_manager(tmp_path) -> None:
    """Through FileSystem, a local rename is rename(2); an object store's keeps Spark's way."""
    key = "spark.sql.streaming.checkpointFileManagerClass"
    local = spark_conf(Settings(checkpoint_dir=str(tmp_path)), "x")
    assert local[key].endswith(".FileSystemBasedCheckpointFileManager")
    assert key not in spark_conf(Settings(checkpoint_dir="s3://bucket/checkpoints"), "x")
