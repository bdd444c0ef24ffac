"""The local broker with ``[kafka] sasl``: every client of the project logs in with SCRAM, and
one without the password is refused."""

from __future__ import annotations

import stat
from collections.abc import Iterator

import pytest
from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient

from candlewire.config import KAFKA_PASSWORD, Settings
from candlewire.kafka import TOPICS, client_auth, spark_options
from candlewire.spark import build_session
from candlewire.testing import free_settings, maps_file
from launcher.local.kafka import ARCHIVE, KafkaBroker, KafkaSetupError, Scram
from launcher.stack import kafka_service
from tests.candlewire.test_kafka import consume, new_topic, produce


@pytest.fixture(scope="module")
def sasl(tmp_path_factory, lakehouse) -> Iterator[Settings]:
    """A second broker, SASL only, beside the session's; the session's Iceberg catalog."""
    settings = free_settings(
        tmp_path_factory.mktemp("sasl"),
        kafka={"sasl": True},
        catalog_url=lakehouse.catalog_db(),
        warehouse=lakehouse.warehouse_uri(),
    )
    svc = kafka_service(settings)
    svc.start()  # its health check and topic creation log in already
    yield settings
    svc.stop()


def test_the_broker_maps_the_class_archive_make_install_dumped(lakehouse, kafka) -> None:
    archive = lakehouse.jvm_dir / "kafka" / ARCHIVE
    assert archive.is_file(), f"no {archive}: `make install` dumps it"
    assert maps_file(kafka.pid(), archive)


def test_the_projects_clients_log_in(sasl) -> None:
    assert {t.name for t in TOPICS} <= set(
        AdminClient(client_auth(sasl)).list_topics(timeout=10).topics
    )
    topic = new_topic(sasl)
    produce(sasl, topic, [b"a", b"b", b"c"])
    assert sorted(consume(sasl, topic, "sasl-test", want=3)) == [b"a", b"b", b"c"]


def test_sparks_kafka_source_logs_in(sasl) -> None:
    topic = new_topic(sasl)
    produce(sasl, topic, [f"v{i}".encode() for i in range(50)])
    spark = build_session(sasl, "candlewire-sasl-test")
    try:
        rows = (
            spark.read.format("kafka")
            .options(**spark_options(sasl))
            .option("subscribe", topic)
            .option("startingOffsets", "earliest")
            .load()
            .selectExpr("CAST(value AS STRING) v")
            .collect()
        )
    finally:
        spark.stop()
    assert sorted(r.v for r in rows) == sorted(f"v{i}" for i in range(50))


@pytest.mark.parametrize("login", ["none", "wrong password"])
def test_a_client_without_the_password_is_refused(sasl, monkeypatch, login) -> None:
    if login == "none":
        conf = {"bootstrap.servers": sasl.kafka_servers()}
    else:
        monkeypatch.setenv("CANDLEWIRE_SECRET_KAFKA_PASSWORD", "not-the-password")
        conf = client_auth(sasl)
    with pytest.raises(KafkaException):
        AdminClient({**conf, "log_level": 0}).list_topics(timeout=5)


def test_the_password_stays_in_the_state_dir(sasl) -> None:
    password = sasl.secret(KAFKA_PASSWORD)
    secret = sasl.state_dir / "secrets" / KAFKA_PASSWORD
    config = sasl.state_dir / "kafka" / "server.properties"
    for path in (secret, config):
        assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert password in config.read_text()
    assert password not in (sasl.state_dir / "logs" / "kafka.log").read_text()


def test_a_log_dir_formatted_without_a_scram_user_is_a_clear_error(tmp_path, kafka) -> None:
    settings = free_settings(tmp_path)
    home = tmp_path / "kafka"
    (home / "data").mkdir(parents=True)
    (home / "data" / "meta.properties").write_text("version=1\n")
    broker = KafkaBroker(
        home,
        settings.jvm_dir / "kafka",
        settings.port("kafka"),
        settings.port("kafka_controller"),
        scram=Scram("SCRAM-SHA-256", "candlewire", "pw", required=True),
    )
    with pytest.raises(KafkaSetupError, match="formatted without a SCRAM user"):
        broker.format_once()
