"""Apache Kafka brokers in KRaft mode, from the jars `make jvm` fetched: one node, or a
quorum of N (each broker its own controller too, on its own loopback address)."""

from __future__ import annotations

import base64
import os
import shutil
import subprocess
import uuid
from dataclasses import dataclass
from pathlib import Path

from candlewire.config import REPO_ROOT, Settings
from candlewire.errors import CandlewireError
from candlewire.kafka import scram_jaas
from candlewire.runtime import JVM_SMALL_HEAP, archive_options, dump_options, publish_archive

LOG4J = REPO_ROOT / "jvm" / "log4j2-kafka.properties"
ARCHIVE = "broker.jsa"  # the class archive, beside the jars (``-cp jars/*`` takes jars only)


class KafkaSetupError(CandlewireError, RuntimeError):
    """The broker cannot be set up here; the message says what to install or run."""


@dataclass(frozen=True)
class Scram:
    """The broker's SCRAM user: its credential is stored when the log dir is formatted, and
    the listener asks for it when ``required``."""

    mechanism: str
    username: str
    password: str
    required: bool

    def credential(self) -> str:
        return f"{self.mechanism}=[name={self.username},password={self.password}]"


class KafkaBroker:
    """Broker + controller in one JVM, storage formatted once. ``quorum`` lists every
    node's address (this one is ``node_id``, from 1); alone, it is 127.0.0.1."""

    def __init__(
        self,
        home: Path,
        jars: Path,
        port: int,
        controller_port: int,
        heap: str = "768m",
        scram: Scram | None = None,
        node_id: int = 1,
        quorum: tuple[str, ...] = ("127.0.0.1",),
        cluster_id: Path | None = None,
    ) -> None:
        self.scram = scram
        self.node_id = node_id
        self.quorum = quorum
        self.address = quorum[node_id - 1]
        # Every node of a quorum is formatted with the same cluster id, kept in this file.
        self.cluster_id_file = cluster_id or home / "cluster-id"
        self.home = home
        self.jars = jars
        self.port = port
        self.controller_port = controller_port
        self.heap = heap
        self.data = home / "data"
        self.config = home / "server.properties"
        self.scram_marker = home / "scram-user"  # written when the format stored a credential

    @property
    def bootstrap(self) -> str:
        return f"{self.address}:{self.port}"

    def check_prerequisites(self) -> None:
        if shutil.which("java") is None:
            raise KafkaSetupError(
                "java not found: install a JDK 17 (apt-get install openjdk-17-jdk-headless)"
            )
        if not any(self.jars.glob("kafka_2.13-*.jar")):
            raise KafkaSetupError(f"Kafka jars missing in {self.jars}: run `make jvm`")

    def write_config(self) -> None:
        """server.properties, owner-only: with SASL it holds the broker's own login."""
        self.home.mkdir(parents=True, exist_ok=True)
        at, replicas = self.address, str(min(len(self.quorum), 3))
        insync = str(max(1, min(len(self.quorum), 3) - 1))
        voters = ",".join(f"{i}@{a}:{self.controller_port}" for i, a in enumerate(self.quorum, 1))
        props = {
            "process.roles": "broker,controller",
            "node.id": str(self.node_id),
            "controller.quorum.voters": voters,
            "listeners": f"PLAINTEXT://{at}:{self.port},CONTROLLER://{at}:{self.controller_port}",
            "advertised.listeners": f"PLAINTEXT://{at}:{self.port}",
            "controller.listener.names": "CONTROLLER",
            "inter.broker.listener.name": "PLAINTEXT",
            "listener.security.protocol.map": "CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT",
            "log.dirs": str(self.data),
            "num.partitions": "3",
            "auto.create.topics.enable": "false",
            "default.replication.factor": replicas,
            "min.insync.replicas": insync,
            "offsets.topic.replication.factor": replicas,
            "offsets.topic.num.partitions": "3",
            "transaction.state.log.replication.factor": replicas,
            "transaction.state.log.min.isr": insync,
            "share.coordinator.state.topic.replication.factor": replicas,
            "share.coordinator.state.topic.min.isr": insync,
            "group.initial.rebalance.delay.ms": "0",
            "log.retention.hours": "168",
            # The log cleaner's offset map is one heap buffer, 128 MiB by default, allocated
            # and zeroed at start whether or not a topic is compacted: it was 150 of the
            # broker's 178 MiB of live heap idle (#36). 16 MiB maps about 600,000 keys a
            # pass, far beyond what the compacted topics here hold.
            "log.cleaner.dedupe.buffer.size": str(16 * 2**20),
        }
        if self.scram is not None and self.scram.required:
            mech = self.scram.mechanism
            sasl = f"SASL_PLAINTEXT://{at}:{self.port}"
            props |= {
                "listeners": f"{sasl},CONTROLLER://{at}:{self.controller_port}",
                "advertised.listeners": sasl,
                "inter.broker.listener.name": "SASL_PLAINTEXT",
                "listener.security.protocol.map": "CONTROLLER:PLAINTEXT,SASL_PLAINTEXT:SASL_PLAINTEXT",
                "sasl.enabled.mechanisms": mech,
                "sasl.mechanism.inter.broker.protocol": mech,
                f"listener.name.sasl_plaintext.{mech.lower()}.sasl.jaas.config": scram_jaas(
                    self.scram.username, self.scram.password
                ),
            }
        fd = os.open(self.config, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write("".join(f"{k}={v}\n" for k, v in props.items()))
        self.config.chmod(0o600)

    def java(self, main: str, *args: str) -> list[str]:
        return [
            "java",
            "-Xms64m",
            f"-Xmx{self.heap}",
            *JVM_SMALL_HEAP,
            *archive_options(self.jars / ARCHIVE),
            "-Djava.awt.headless=true",
            f"-Dlog4j2.configurationFile={LOG4J}",
            "-cp",
            f"{self.jars}/*",
            main,
            *args,
        ]

    def format_once(self) -> None:
        """Format the storage on first use only; a formatted log dir is kept (data survives)."""
        self.check_prerequisites()
        self.write_config()
        if (self.data / "meta.properties").exists():
            if self.scram is not None and self.scram.required and not self.scram_marker.exists():
                raise KafkaSetupError(
                    f"Kafka's log dir {self.data} was formatted without a SCRAM user, so with "
                    "[kafka] sasl on no client could log in: turn sasl off, or remove "
                    f"{self.home} (its records are lost) and start again to re-format it"
                )
            return
        cluster_id = self.cluster_id()
        # "=" form: one id in 64 starts with "-", which the tool would read as an option.
        out = subprocess.run(
            self.java(
                "kafka.tools.StorageTool",
                "format",
                f"--cluster-id={cluster_id}",
                "-c",
                str(self.config),
                *(["--add-scram", self.scram.credential()] if self.scram else []),
            ),
            capture_output=True,
            text=True,
        )
        if out.returncode != 0:
            failed = f"{out.stdout}{out.stderr}"
            if self.scram is not None:
                failed = failed.replace(self.scram.password, "***")
            raise KafkaSetupError(f"kafka storage format failed: {failed}")
        if self.scram is not None:
            self.scram_marker.write_text(self.scram.username + "\n")

    def cluster_id(self) -> str:
        """The quorum's id: made by the first node formatted, read by the others."""
        if not self.cluster_id_file.exists():
            self.cluster_id_file.parent.mkdir(parents=True, exist_ok=True)
            made = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
            self.cluster_id_file.write_text(made + "\n")
        return self.cluster_id_file.read_text().strip()

    def argv(self) -> list[str]:
        return self.java("kafka.Kafka", str(self.config))


def dump_class_archive(jars: Path) -> Path:
    """Run a broker that makes the platform's topics and takes a few records, and dump the
    classes it loaded as it stops (``make archives``)."""
    import tempfile

    from candlewire.testing import free_settings
    from launcher.stack import kafka_service

    archive = jars / ARCHIVE
    archive.unlink(missing_ok=True)  # a JVM that maps an archive cannot dump one
    with tempfile.TemporaryDirectory(prefix="candlewire-archive-") as tmp:
        settings = free_settings(tmp, jvm_dir=jars.parent)
        broker = kafka_service(settings)
        # Through the environment: the options apply to the broker, not to its format.
        broker.env["JDK_JAVA_OPTIONS"] = " ".join(dump_options(archive))
        broker.stop_timeout = 120  # its shutdown, then the dump
        broker.start()
        try:
            _take_records(settings)
        finally:
            broker.stop()
    return publish_archive(archive)


def _take_records(settings: Settings) -> None:
    """The platform's topics made, and records produced to one; the producer is gone on
    return, before its broker stops."""
    from confluent_kafka import Producer

    from candlewire.kafka import TICKS, ensure_topics, producer_config

    ensure_topics(settings)
    producer = Producer(producer_config(settings))
    for i in range(100):
        producer.produce(TICKS.name, key=b"archive", value=str(i).encode())
    if producer.flush(30):
        raise KafkaSetupError("the class archive's broker took no records")


if __name__ == "__main__":  # make archives
    dump_class_archive(Settings().jvm_dir / "kafka")
