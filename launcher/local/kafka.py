"""A single-node Apache Kafka broker in KRaft mode, from the jars `make jvm` fetched."""

from __future__ import annotations

import base64
import os
import shutil
import subprocess
import uuid
from dataclasses import dataclass
from pathlib import Path

from candlewire.config import REPO_ROOT

LOG4J = REPO_ROOT / "jvm" / "log4j2-kafka.properties"


class KafkaSetupError(RuntimeError):
    pass


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
    """Broker + controller in one JVM, bound to 127.0.0.1, storage formatted once."""

    def __init__(
        self,
        home: Path,
        jars: Path,
        port: int,
        controller_port: int,
        heap: str = "768m",
        scram: Scram | None = None,
    ) -> None:
        self.scram = scram
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
        return f"127.0.0.1:{self.port}"

    def check_prerequisites(self) -> None:
        if shutil.which("java") is None:
            raise KafkaSetupError(
                "java not found: install a JDK 17 (apt-get install openjdk-17-jre-headless)"
            )
        if not any(self.jars.glob("kafka_2.13-*.jar")):
            raise KafkaSetupError(f"Kafka jars missing in {self.jars}: run `make jvm`")

    def write_config(self) -> None:
        """server.properties, owner-only: with SASL it holds the broker's own login."""
        self.home.mkdir(parents=True, exist_ok=True)
        props = {
            "process.roles": "broker,controller",
            "node.id": "1",
            "controller.quorum.voters": f"1@127.0.0.1:{self.controller_port}",
            "listeners": f"PLAINTEXT://127.0.0.1:{self.port},CONTROLLER://127.0.0.1:{self.controller_port}",
            "advertised.listeners": f"PLAINTEXT://127.0.0.1:{self.port}",
            "controller.listener.names": "CONTROLLER",
            "inter.broker.listener.name": "PLAINTEXT",
            "listener.security.protocol.map": "CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT",
            "log.dirs": str(self.data),
            "num.partitions": "3",
            "auto.create.topics.enable": "false",
            "offsets.topic.replication.factor": "1",
            "offsets.topic.num.partitions": "3",
            "transaction.state.log.replication.factor": "1",
            "transaction.state.log.min.isr": "1",
            "share.coordinator.state.topic.replication.factor": "1",
            "share.coordinator.state.topic.min.isr": "1",
            "group.initial.rebalance.delay.ms": "0",
            "log.retention.hours": "168",
        }
        if self.scram is not None and self.scram.required:
            from candlewire.kafka import scram_jaas

            mech = self.scram.mechanism
            sasl = f"SASL_PLAINTEXT://127.0.0.1:{self.port}"
            props |= {
                "listeners": f"{sasl},CONTROLLER://127.0.0.1:{self.controller_port}",
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
            "-Xms256m",
            f"-Xmx{self.heap}",
            "-XX:+UseG1GC",
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
        cluster_id = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
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

    def argv(self) -> list[str]:
        return self.java("kafka.Kafka", str(self.config))
