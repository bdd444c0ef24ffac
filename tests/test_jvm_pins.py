"""pyspark and the Spark jars fetched by Maven must be the same Spark release."""

from __future__ import annotations

import re
import subprocess
import sys
import tomllib
import xml.etree.ElementTree as ET
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
NS = {"m": "http://maven.apache.org/POM/4.0.0"}


def test_pyspark_pin_matches_spark_jars() -> None:
    deps = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"][
        "platform"
    ]
    (pin,) = [re.match(r"pyspark==(.+)", d).group(1) for d in deps if d.startswith("pyspark")]
    pom = ET.parse(REPO / "jvm" / "spark.xml").getroot()
    assert pom.find("m:properties/m:spark.version", NS).text == pin


def test_fetched_jars_are_the_declared_versions() -> None:
    import pyspark

    jars = {p.name for p in (REPO / ".cache" / "jvm" / "spark").glob("*.jar")}
    assert f"spark-sql-kafka-0-10_2.13-{pyspark.__version__}.jar" in jars
    assert any(j.startswith("iceberg-spark-runtime-4.1_2.13-") for j in jars)
    kafka = {p.name for p in (REPO / ".cache" / "jvm" / "kafka").glob("kafka_2.13-*.jar")}
    assert kafka == {"kafka_2.13-4.1.0.jar"}


def test_the_decoder_is_built_against_the_same_spark_and_protoc() -> None:
    """Java and Python classes come from the same protoc release (protobuf-java 4.x.y is
    protoc x.y), and the UDF compiles against the Spark that runs it."""
    import pyspark

    pom = ET.parse(REPO / "jvm" / "decoder" / "pom.xml").getroot()
    props = {p.tag.split("}")[1]: p.text for p in pom.find("m:properties", NS)}
    assert props["spark.version"] == pyspark.__version__
    protoc = subprocess.run(
        [sys.executable, "-m", "grpc_tools.protoc", "--version"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()[-1]
    assert props["protobuf.version"] == f"4.{protoc}"
    assert (REPO / ".cache" / "jvm" / "spark" / "candlewire-decoder.jar").is_file()


def test_local_files_compiles_against_pysparks_hadoop() -> None:
    """``LocalFiles`` extends Hadoop's local file system from pyspark's own jar."""
    import pyspark

    pom = ET.parse(REPO / "jvm" / "decoder" / "pom.xml").getroot()
    version = pom.find("m:properties/m:hadoop.version", NS).text
    jars = Path(pyspark.__file__).parent / "jars"
    assert (jars / f"hadoop-client-api-{version}.jar").is_file()
    assert (REPO / ".cache" / "jvm" / "boot" / "candlewire-localfs.jar").is_file()
