"""pyspark and the Spark jars fetched by Maven must be the same Spark release."""

from __future__ import annotations

import re
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
    assert any(j.startswith("iceberg-spark-runtime-4.0_2.13-") for j in jars)
    kafka = {p.name for p in (REPO / ".cache" / "jvm" / "kafka").glob("kafka_2.13-*.jar")}
    assert kafka == {"kafka_2.13-4.1.0.jar"}
