"""S3Proxy, the local S3-compatible object store of an ``s3://`` warehouse: a directory
served through the S3 API (jclouds' filesystem provider), from the jars `make jvm` fetched."""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass
from pathlib import Path

from candlewire.runtime import JVM_SMALL_HEAP


class S3ProxySetupError(RuntimeError):
    pass


@dataclass(frozen=True)
class S3Proxy:
    """One S3 endpoint on ``host:port`` with one access key; its objects under ``data``."""

    home: Path
    jars: Path
    host: str
    port: int
    access_key: str
    secret_key: str

    @property
    def data(self) -> Path:
        return self.home / "data"

    @property
    def config(self) -> Path:
        return self.home / "s3proxy.properties"

    def prepare(self) -> None:
        """The properties file, owner-only: it holds the secret key."""
        if shutil.which("java") is None:
            raise S3ProxySetupError("java not found: install a JDK 17")
        if not any(self.jars.glob("s3proxy-*.jar")):
            raise S3ProxySetupError(f"S3Proxy jars missing in {self.jars}: run `make jvm`")
        self.data.mkdir(parents=True, exist_ok=True)
        props = {
            "s3proxy.endpoint": f"http://{self.host}:{self.port}",
            "s3proxy.authorization": "aws-v2-or-v4",
            "s3proxy.identity": self.access_key,
            "s3proxy.credential": self.secret_key,
            "jclouds.provider": "filesystem-nio2",
            "jclouds.filesystem.basedir": str(self.data),
        }
        fd = os.open(self.config, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write("".join(f"{k}={v}\n" for k, v in props.items()))
        self.config.chmod(0o600)

    def argv(self) -> list[str]:
        return [
            "java",
            "-Xms32m",
            "-Xmx256m",
            *JVM_SMALL_HEAP,
            "-cp",
            f"{self.jars}/*",
            "org.gaul.s3proxy.Main",
            "--properties",
            str(self.config),
        ]

    def make_bucket(self, bucket: str) -> None:
        """A bucket of the filesystem provider is a directory under ``data``."""
        (self.data / bucket).mkdir(parents=True, exist_ok=True)
